"""`connection: ssh` hosts reached directly, on libssh2 (ssh2-python): the agent calls of every command.

libssh2 is a C library that makes a connection and its round trips for about a third of paramiko's CPU
(benchmarks/ssh_libs.py), and it has no reader thread: what a connection costs the controller is what its
calls cost. Shell commands and uploads (provisioning, preflight) are not on that path: they go through Fabric
on a paramiko connection of their own, opened the first time one is needed.

Trust is known_hosts', as OpenSSH reads it: a host that has entries there must present one of those keys (a key
of another type, or another key, is refused as CHANGED); a host with none is refused, or with
--accept-new-host-keys has its key appended.

A libssh2 session is not thread-safe: one call at a time uses it (a lock). close() from another thread only
shuts the socket down, which wakes a blocked call at once; the descriptor is closed when the session that uses
it is freed, never under libssh2. A channel is never freed while libssh2 would wait on it: ssh2-python frees a
channel without releasing the GIL, and libssh2 waits there for the host's close, which sshd sends only once the
agent has exited.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from primectl.deploy.access import access
from primectl.deploy.known_hosts import host_entry_name, host_key_blobs, record_host_key
from primectl.deploy.shipping import loader_command
from primectl.deploy.transport import (
    HostUnreachable,
    OnProgress,
    SSHTransport,
    agent_answer,
    agent_request,
    agent_timed_out,
    detect_dead_peer,
    kernel_gave_up_on_peer,
    peer_silent,
    start_agent_session,
)
from primectl.plan.model import HostPlan

# AES-GCM first, as on paramiko's connections: with AES-NI the cheapest cipher for both ends (chacha20, libssh2's
# first choice, costs the host's sshd more). Everything else libssh2 has stays offered after these.
CIPHERS_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
RSA_SIGNATURES = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")  # one `ssh-rsa` key, three signature algorithms
DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_rsa")
READ_SIZE = 65536
LIBSSH2_ERROR_EAGAIN = -37  # libssh2.h: a non-blocking step that has to be tried again
EXTENDED_DATA_MERGE = 2  # libssh2.h LIBSSH2_CHANNEL_EXTENDED_DATA_MERGE (ssh2-python does not export it)


def libssh2_available() -> bool:
    """Whether ssh2-python can be imported here."""
    try:
        import ssh2.session  # noqa: F401
    except ImportError:
        return False
    return True


def _blob_type(blob: bytes) -> str:
    """The key type a public key's wire blob starts with (`ssh-ed25519`, `ecdsa-sha2-nistp256`, ...)."""
    (n,) = struct.unpack(">I", blob[:4])
    return blob[4:4 + n].decode(errors="replace")


@functools.cache
def _ciphers() -> str:
    """libssh2's ciphers, CIPHERS_FIRST first."""
    from ssh2.session import LIBSSH2_METHOD_CRYPT_CS, Session

    offered = Session().supported_algs(LIBSSH2_METHOD_CRYPT_CS)
    return ",".join([*CIPHERS_FIRST, *(c for c in offered if c not in CIPHERS_FIRST)])


def _ms(seconds: float | None) -> int:
    """A libssh2 time limit (ms; 0 is none)."""
    return 0 if seconds is None else max(1, int(seconds * 1000))


class Libssh2Stream:
    """The agent's session on a libssh2 channel, as an AgentStream (stderr merged into stdout)."""

    def __init__(self, session: Any, chan: Any):
        self.session, self.chan = session, chan
        self._buf = b""

    def send(self, data: bytes) -> None:
        from ssh2.exceptions import Timeout

        view = memoryview(data)
        while view:
            try:
                _, n = self.chan.write(bytes(view[:READ_SIZE]))
            except Timeout:
                raise TimeoutError() from None
            view = view[n:]

    def readline(self) -> bytes:
        from ssh2.exceptions import Timeout

        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line, self._buf = self._buf[:i + 1], self._buf[i + 1:]
                return line
            try:
                size, data = self.chan.read(READ_SIZE)
            except Timeout:
                raise TimeoutError() from None
            if size > 0:
                self._buf += data
            elif size == 0 and self.chan.eof():
                line, self._buf = self._buf, b""
                return line

    def limit(self, seconds: float | None) -> None:
        self.session.set_timeout(_ms(seconds))

    def take_pending(self) -> None:
        """Read what has arrived for the session without waiting (its session set non-blocking), keeping any
        output for the next readline."""
        size, data = self.chan.read(READ_SIZE)
        if size > 0:
            self._buf += data


class Libssh2Transport:
    """A directly reached host: agent calls on libssh2; `run` and `put` through Fabric/paramiko (see above)."""

    def __init__(self, host: HostPlan, *, known_hosts: str, accept_new_host_keys: bool, connect_timeout: float = 10):
        from ssh2.session import LIBSSH2_METHOD_CRYPT_CS, LIBSSH2_METHOD_CRYPT_SC, Session

        self.host = host
        self.access = a = access(host)
        self._known_hosts, self._accept_new, self._connect_timeout = known_hosts, accept_new_host_keys, connect_timeout
        self._lock = threading.Lock()  # one call at a time on the session
        self._agent: Libssh2Stream | None = None
        self._closing: list[Any] = []  # channels whose close went out, kept until the host's close has come
        self._closed = False
        self._shell: SSHTransport | None = None
        self._shell_lock = threading.Lock()
        where = f"{host.name} ({host.address}:{a.port})"
        try:
            sock = socket.create_connection((host.address, a.port), timeout=connect_timeout)
        except OSError as exc:
            raise HostUnreachable(f"{where}: cannot connect: {exc}") from None
        sock.settimeout(None)  # libssh2 waits itself, with the session's time limit
        detect_dead_peer(sock)
        self._sock = sock
        session = Session()
        self._session: Any = session
        session.set_timeout(_ms(connect_timeout))
        known = host_key_blobs(known_hosts, host.address, a.port)
        try:
            for method in (LIBSSH2_METHOD_CRYPT_CS, LIBSSH2_METHOD_CRYPT_SC):
                session.method_pref(method, _ciphers())
            self._prefer_known_key_types(known)
            session.handshake(sock)
        except Exception as exc:
            failed = self._handshake_failed(where, exc)
            self._drop()
            raise failed from None
        self._check_host_key(where, known)
        self._log_in(where)

    def _prefer_known_key_types(self, known: dict[str, list[bytes]]) -> None:
        """Ask for a host key of a type known_hosts has for this host first (as OpenSSH and paramiko do), so a
        host with several keys presents the one that can be checked."""
        from ssh2.session import LIBSSH2_METHOD_HOSTKEY

        if not known:
            return
        offered = self._session.supported_algs(LIBSSH2_METHOD_HOSTKEY)
        first = [a for t in known for a in (RSA_SIGNATURES if t == "ssh-rsa" else (t,)) if a in offered]
        self._session.method_pref(LIBSSH2_METHOD_HOSTKEY, ",".join([*first, *(a for a in offered if a not in first)]))

    def _handshake_failed(self, where: str, exc: Exception) -> HostUnreachable:
        from ssh2.exceptions import Timeout

        if isinstance(exc, Timeout):
            return HostUnreachable(f"{where}: cannot connect: no SSH handshake within {self._connect_timeout:g}s")
        return HostUnreachable(f"{where}: cannot connect: SSH handshake failed: {type(exc).__name__}: "
                               f"{str(exc) or self._last_error()}")

    def _last_error(self) -> str:
        """libssh2's own message for the last failure (ssh2-python's exceptions often carry none)."""
        try:
            said = self._session.last_error() if self._session is not None else b""
        except Exception:
            said = b""
        return (said.decode(errors="replace") if isinstance(said, bytes) else str(said)) or "the connection closed"

    def _check_host_key(self, where: str, known: dict[str, list[bytes]]) -> None:
        """The host's key must be one known_hosts has for it; an unknown one is recorded with accept-new."""
        blob, _ = self._session.hostkey()
        keytype = _blob_type(blob)
        if blob in known.get(keytype, []):
            return
        if known:  # another key, or a key of a type it has none of: what a man in the middle would present
            listed = keytype if keytype in known else next(iter(known))
            expected = f"{listed} {base64.b64encode(known[listed][0]).decode()[:16]}..."
            self._drop()
            raise HostUnreachable(f"{where}: host key CHANGED (expected {expected}, got {keytype}); "
                                  "refusing to connect")
        if not self._accept_new:
            self._drop()
            raise HostUnreachable(f"{where}: unknown host key (not in {self._known_hosts}); verify it and add it "
                                  "(ssh-keyscan), or pass --accept-new-host-keys")
        record_host_key(self._known_hosts, host_entry_name(self.host.address, self.access.port), keytype,
                        base64.b64encode(blob).decode())

    def _log_in(self, where: str) -> None:
        """Public-key login: the recipe's identity file, else ssh-agent's keys and the user's default keys, as
        paramiko tries them."""
        from ssh2.exceptions import (
            AgentError,
            AuthenticationError,
            FileError,
            PublicKeyInitError,
            PublickeyUnverifiedError,
            Timeout,
        )

        refused = (AuthenticationError, PublickeyUnverifiedError)
        a, session = self.access, self._session
        try:
            if a.identity_file:
                path = os.path.expanduser(a.identity_file)
                try:
                    session.userauth_publickey_fromfile(a.user, path)
                except FileError:
                    raise HostUnreachable(f"{where}: cannot read the key {path}: {self._last_error()}") from None
                return
            if os.environ.get("SSH_AUTH_SOCK"):
                with contextlib.suppress(AgentError, PublicKeyInitError, *refused):
                    session.agent_auth(a.user)
                    return
            for name in DEFAULT_IDENTITIES:
                path = os.path.expanduser(f"~/.ssh/{name}")
                if os.path.exists(path):
                    with contextlib.suppress(FileError, *refused):
                        session.userauth_publickey_fromfile(a.user, path)
                        return
            raise HostUnreachable(f"{where}: Authentication failed (no identity_file; neither ssh-agent nor "
                                  f"~/.ssh/{{{','.join(DEFAULT_IDENTITIES)}}} had a key {a.user} may log in with)")
        except HostUnreachable:
            self._drop()
            raise
        except refused:
            self._drop()
            raise HostUnreachable(f"{where}: Authentication failed.") from None
        except Timeout:
            self._drop()
            raise HostUnreachable(f"{where}: cannot connect: no answer to the login within "
                                  f"{self._connect_timeout:g}s") from None
        except Exception as exc:
            why = str(exc) or self._last_error()
            self._drop()
            raise HostUnreachable(f"{where}: cannot connect: {type(exc).__name__}: {why}") from None

    def agent(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None = None) -> dict[str, Any]:
        """One agent call over a long-lived `serve` channel, as SSHTransport.agent (the first call's request
        goes with the command that starts the agent).

        libssh2 waits in C and retries a wait a signal interrupted, so Ctrl-C would reach the main thread only
        once the call returned. A call from the main thread runs on a thread of its own, which the main thread
        waits for where Ctrl-C reaches it at once; the call still goes on to its end (its answer read, so that
        the next call on this connection, which waits for it, does not get it instead)."""
        if threading.current_thread() is not threading.main_thread():
            return self._call(op, args, timeout, on_progress)
        outcome: list[dict[str, Any] | BaseException] = []

        def call() -> None:
            try:
                outcome.append(self._call(op, args, timeout, on_progress))
            except BaseException as exc:  # handed to the caller
                outcome.append(exc)

        worker = threading.Thread(target=call, name=f"primectl-agent-{self.host.name}", daemon=True)
        worker.start()
        worker.join()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _call(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None) -> dict[str, Any]:
        from ssh2.exceptions import Timeout

        request = agent_request(op, args)
        with self._lock:
            if self._closed:
                raise HostUnreachable(f"{self.host.name}: connection lost: it was closed")
            try:
                self._finish_closing()
                self._session.set_timeout(_ms(timeout))
                if self._agent is None:
                    self._agent = self._start_agent(request)
                else:
                    self._agent.send(request)
                return agent_answer(self._agent, timeout, on_progress)
            except (TimeoutError, Timeout):
                self._close_agent()
                return agent_timed_out(timeout)
            except Exception as exc:  # the link dropped: this host is unreachable now
                why = self._why_lost(exc)
                self._closed = True
                raise HostUnreachable(f"{self.host.name}: connection lost: {why}") from None
            finally:
                if self._closed:
                    self._drop()

    def _start_agent(self, first: bytes) -> Libssh2Stream:
        chan = self._session.open_session()
        stream = Libssh2Stream(self._session, chan)
        try:
            chan.handle_extended_data2(EXTENDED_DATA_MERGE)
            chan.execute(loader_command(self.host.workdir, "serve"))
            start_agent_session(stream, first)
        except BaseException:
            self._agent = stream
            self._close_agent()  # given back to sshd (it counts sessions: MaxSessions)
            raise
        return stream

    def _close_agent(self) -> None:
        """End the agent's session: its close goes out now (the agent reads EOF and exits), and the channel is
        kept until the host's close has come (see the module's docstring)."""
        stream, self._agent = self._agent, None
        if stream is not None:
            self._nonblocking(stream.chan.close)
            self._closing.append(stream.chan)

    def _finish_closing(self) -> None:
        """Let go of the closed channels the host has answered by now."""
        if self._closing:
            self._nonblocking(self._keep_unanswered)

    def _keep_unanswered(self) -> None:
        self._closing = [c for c in self._closing if c.close() == LIBSSH2_ERROR_EAGAIN]

    def _nonblocking(self, step: Callable[[], Any]) -> None:
        """Run one libssh2 step without waiting (its errors ignored: a step it could not finish is tried again
        or ends with the connection)."""
        self._session.set_blocking(False)
        try:
            with contextlib.suppress(Exception):
                step()
        finally:
            self._session.set_blocking(True)

    def _why_lost(self, exc: BaseException) -> str:
        """What ended the connection: a peer the kernel gave up on is named so, else what libssh2 said."""
        if kernel_gave_up_on_peer(self._sock):
            return peer_silent()
        return f"{type(exc).__name__}: {str(exc) or self._last_error()}"

    def alive(self) -> bool:
        """Whether the connection and its agent are still up (a kept one is checked before a command reuses it).
        With no call using it, what arrived while it was idle is read now: an agent session that ended (its agent
        killed) or a connection the host closed counts as down."""
        if self._closed:
            return False
        if not self._lock.acquire(blocking=False):
            return True  # a call is using it: it finds out for itself
        try:
            if self._closed:
                return False
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            if not poller.poll(0):
                return True
            if not self._sock.recv(1, socket.MSG_PEEK):
                return False  # the host closed the connection
            if self._agent is not None:
                self._nonblocking(self._agent.take_pending)  # an EOF, a keepalive request: taken in, none waited for
                return not self._agent.chan.eof()
            return True
        except Exception:
            return False
        finally:
            if self._closed:
                self._drop()
            self._lock.release()

    def _shell_transport(self) -> SSHTransport:
        """The paramiko connection that shell commands and uploads take, opened when first needed."""
        with self._shell_lock:
            if self._closed:
                raise HostUnreachable(f"{self.host.name}: connection lost: it was closed")
            if self._shell is None:
                self._shell = SSHTransport(self.host, known_hosts=self._known_hosts,
                                           accept_new_host_keys=self._accept_new,
                                           connect_timeout=self._connect_timeout)
            return self._shell

    def run(self, command: str, *, timeout: float | None = None, stream: bool = False) -> tuple[int, str, str]:
        """A shell command through Fabric (streaming, time limit, Ctrl-C)."""
        return self._shell_transport().run(command, timeout=timeout, stream=stream)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write bytes to a file on the host over SFTP (its parent directory is created)."""
        self._shell_transport().put(data, path, mode)

    def close(self) -> None:
        """Close the connection. The shutdown ends a call blocked in it at once (from any thread); the session is
        let go here or, when a call is using it, by that call."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._lock.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._lock.release()
        with self._shell_lock:
            shell, self._shell = self._shell, None
        if shell is not None:
            shell.close()

    def _drop(self) -> None:
        """Let the session go (the host's sshd ends the agent's session with the connection). The socket is shut
        down, not closed: libssh2 still uses its descriptor when it frees the session and its channels (which,
        the connection being down, wait for nothing), and the session closes it then."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._agent = None
        self._closing = []
        self._session = None

"""One interface to reach a host: Fabric over SSH, or Invoke locally.

Deploy code calls `agent(op, args)` and `put(data, path)` and never asks which
transport it has (pyinfra's connectors, Fabric/Invoke's shared surface). An
`on_progress` callback gets the progress lines the agent writes before its
result (`{"progress": ...}`, never `ok`), as they come.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import posixpath
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from primectl.deploy.access import access
from primectl.deploy.known_hosts import host_keys_for, record_host_key
from primectl.deploy.paramiko_patches import tune_paramiko, use_host_keys
from primectl.deploy.shipping import agent_bundle, loader_args, loader_command
from primectl.errors import DeployError
from primectl.host.wire import Progress
from primectl.plan.model import HostPlan


class HostUnreachable(DeployError):
    """Could not connect or authenticate to a host."""


class Transport(Protocol):
    """What the deploy code needs from a connection."""

    host: HostPlan

    def run(self, command: str, *, timeout: float | None = None, stream: bool = False) -> tuple[int, str, str]:
        """Run a shell command; (exit code, stdout, stderr). `stream` prints output as it comes."""
        ...

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write bytes to a file on the host (parent directory is created)."""
        ...

    def agent(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None = None) -> dict[str, Any]:
        """Run one host-agent operation; its JSON result (`on_progress` gets its progress lines)."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class SSHConnection(Transport, Protocol):
    """A connection to a host over SSH, which may be kept between commands."""

    def alive(self) -> bool:
        """Whether the connection is still up (a kept one is checked before a command reuses it)."""
        ...


OnProgress = Callable[[Progress], None]


def progress_line(obj: dict[str, Any], on_progress: OnProgress | None) -> bool:
    """Whether an agent output line is a progress line (handed to `on_progress`, whose failures are ignored)."""
    if "progress" not in obj or "ok" in obj:
        return False
    if on_progress is not None:
        try:
            on_progress(obj)  # type: ignore[arg-type]
        except Exception:  # showing progress must never fail the operation
            pass
    return True


class AgentStream(Protocol):
    """A started agent session, as the agent's line protocol uses it (over paramiko or libssh2)."""

    def send(self, data: bytes) -> None:
        """Write all of `data` to the agent's stdin."""
        ...

    def readline(self) -> bytes:
        """The agent's next output line (stdout and stderr merged); b"" once it has ended. TimeoutError when
        nothing came within the limit."""
        ...

    def limit(self, seconds: float | None) -> None:
        """The time limit for each send and read from now on (None: no limit)."""
        ...


class ChannelStream:
    """A paramiko channel as an AgentStream."""

    def __init__(self, chan: Any):
        self.chan = chan
        self._stdin, self._stdout = chan.makefile_stdin("wb"), chan.makefile("rb")

    def send(self, data: bytes) -> None:
        self._stdin.write(data)
        self._stdin.flush()

    def readline(self) -> bytes:
        line: bytes = self._stdout.readline()
        return line

    def limit(self, seconds: float | None) -> None:
        self.chan.settimeout(seconds)


def agent_request(op: str, args: dict[str, Any]) -> bytes:
    """One request line for a serving agent."""
    return (json.dumps({"op": op, "args": args}) + "\n").encode()


def agent_timed_out(timeout: float | None) -> dict[str, Any]:
    """The result of an agent call that got no answer within its limit."""
    return {"ok": False, "code": 4, "error": f"no answer from the host agent within {timeout}s"}


SAID_AFTER_FAILED_SEND_S = 10.0


def start_agent_session(stream: AgentStream, first: bytes) -> None:
    """The loader's side of a new session (see shipping.LOADER): send the `first` request, then the agent's bundle
    if the host asks for it; returns once the agent has started, its answer to `first` still to be read."""
    unsent = _send(stream, first)
    said: list[bytes] = []
    while True:
        try:
            line = stream.readline()
        except TimeoutError:
            if unsent is not None:  # a session that took no request and does not end either: the write's error
                raise unsent from None
            raise
        if not line:
            text = b"".join(said).decode(errors="replace").strip()[-2000:]
            if unsent is not None and not text:
                raise unsent
            raise EOFError(f"the host agent did not start: {text or 'no output'}")
        if line.startswith(b'{"agent": "send"}'):
            bundle = agent_bundle()
            unsent = _send(stream, b"%d\n" % len(bundle) + bundle) or unsent
        elif line.startswith(b'{"agent": "ready"}'):
            return
        else:
            said.append(line)


def _send(stream: AgentStream, data: bytes) -> Exception | None:
    """Write `data` to a starting session; the error, where the session had already ended (a host behind a head
    node whose ssh failed at once): what the session printed says why better than the write's error does."""
    try:
        stream.send(data)
    except TimeoutError:
        raise
    except Exception as exc:  # paramiko's OSError, a pipe's BrokenPipeError, libssh2's own kinds
        stream.limit(SAID_AFTER_FAILED_SEND_S)  # what an ended session printed is there at once
        return exc
    return None


def agent_answer(stream: AgentStream, timeout: float | None, on_progress: OnProgress | None) -> dict[str, Any]:
    """Read one call's progress lines (to `on_progress`), then its result. Progress lines do not extend the
    call's time limit."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        line = stream.readline()
        if not line:
            raise EOFError("agent session closed")
        if line.startswith(b"{"):
            result: dict[str, Any] = json.loads(line)
            if not progress_line(result, on_progress):
                return result
            if deadline is not None:
                stream.limit(max(0.01, deadline - time.monotonic()))


def agent_here(workdir: str, op: str, args: dict[str, Any], timeout: float | None,
               on_progress: OnProgress | None) -> dict[str, Any]:
    """Run one agent operation on this machine (`connection: local`) and read its output as it comes: progress
    lines, then the result. It runs with primectl's own interpreter (not whatever `python3` PATH finds first: a
    version manager's shim costs ~0.1 s of CPU per call) from the cached copy under `workdir`, as on a host."""
    argv = [sys.executable, "-I", "-S", "-c", *loader_args(workdir, op, json.dumps(args))]
    deadline = None if timeout is None else time.monotonic() + timeout
    result: dict[str, Any] | None = None
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        assert proc.stdin is not None and proc.stdout is not None
        fd, buf = proc.stdout.fileno(), b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            try:
                while True:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return {"ok": False, "code": 4, "error": f"no answer from the host agent within {timeout}s"}
                    if not sel.select(left):
                        continue
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        break
                    *lines, buf = (buf + chunk).split(b"\n")
                    for line in lines:
                        if line.startswith(b'{"agent": "send"}'):
                            bundle = agent_bundle()
                            proc.stdin.write(b"%d\n" % len(bundle) + bundle)
                            proc.stdin.close()
                        elif line.startswith(b'{"agent": "ready"}'):
                            if not proc.stdin.closed:
                                proc.stdin.close()
                        elif line.startswith(b"{"):
                            obj = json.loads(line)
                            if not progress_line(obj, on_progress):
                                result = obj
            finally:
                if proc.poll() is None and result is None:
                    proc.kill()
                proc.wait()
                proc.stdout.close()
                if not proc.stdin.closed:
                    proc.stdin.close()
        if result is not None:
            result.setdefault("code", proc.returncode)
            return result
        err.seek(0)
        text = err.read().decode(errors="replace").strip()
    return {"ok": False, "code": proc.returncode, "error": text[-2000:] or f"agent exited {proc.returncode}"}


class LocalTransport:
    """`connection: local`: Invoke's Context on this machine."""

    def __init__(self, host: HostPlan):
        self.host = host
        self._ctx: Any = None

    def run(self, command: str, *, timeout: float | None = None, stream: bool = False) -> tuple[int, str, str]:
        if self._ctx is None:  # Invoke costs ~30 ms of CPU to import: only commands that run shell commands pay it
            from invoke.config import Config
            from invoke.context import Context

            from primectl.deploy.interruptible import InterruptibleLocal

            self._ctx = Context(config=Config(overrides={"runners": {"local": InterruptibleLocal}}))
        r = self._ctx.run(command, hide=not stream, warn=True, timeout=timeout, in_stream=False)
        assert r is not None
        return r.exited, r.stdout, r.stderr

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)

    def agent(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None = None) -> dict[str, Any]:
        return agent_here(self.host.workdir, op, args, timeout, on_progress)

    def close(self) -> None:
        pass


class _AcceptNewPolicy:
    """Trust-on-first-use: record an unknown host key; a changed key is still refused by paramiko."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        record_host_key(self.known_hosts, hostname, key.get_name(), key.get_base64())


# A host that loses power or its link sends no FIN: a blocked read would wait for the call's own limit (a
# service's start-up budget: up to hours for a big model), a kept connection ~15 min of retransmissions. The
# kernel probes an idle connection instead, and gives up on data nobody acknowledges, after about as long as
# the head nodes' ssh clients take to (they probe at the same interval, as many times: via.py).
KEEPALIVE_IDLE_S = 15
KEEPALIVE_INTERVAL_S = 15
KEEPALIVE_PROBES = 3
DEAD_PEER_S = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES


def peer_silent(head: str | None = None) -> str:
    """Why a connection ended when the kernel gave up on a peer that answered nothing (detect_dead_peer): the
    host, or the head node it is reached through."""
    if head is not None:
        return f"no answer from its head node {head} for {DEAD_PEER_S:g}s (the head node, or the network to it, is down)"
    return (f"no answer for {DEAD_PEER_S:g}s (the host, or the network to it, is down; "
            "a host that only restarted sshd would have closed the connection)")


def detect_dead_peer(sock: Any) -> None:
    """Have the kernel end `sock` (its reads and writes fail with ETIMEDOUT) once the peer has answered nothing
    for DEAD_PEER_S seconds, idle or not. Costs no CPU here: the kernel sends the probes."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a ProxyCommand's pipe, a tunnel: the link's own end decides
    for level, name, value in ((socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
                               (socket.IPPROTO_TCP, "TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
                               (socket.IPPROTO_TCP, "TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                               (socket.IPPROTO_TCP, "TCP_KEEPCNT", KEEPALIVE_PROBES),
                               (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", DEAD_PEER_S * 1000)):
        # best effort: a kernel or sandbox without one of these still gets a working connection
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(level, getattr(socket, name), value)


def kernel_gave_up_on_peer(sock: socket.socket) -> bool:
    """Whether `sock`'s peer had acknowledged nothing for longer than keepalive lets a live one be silent (the
    kernel's TCP_INFO, still there once the connection has ended): the connection ended because the kernel gave
    up on the peer (detect_dead_peer), not because the peer closed it. For a client that does not keep the
    error its read got (libssh2)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        (last_ack_recv_ms,) = struct.unpack_from("I", info, 56)  # struct tcp_info: tcpi_last_ack_recv
    except (OSError, struct.error, AttributeError):
        return False
    return bool(last_ack_recv_ms >= (DEAD_PEER_S - KEEPALIVE_INTERVAL_S) * 1000)


_PKEYS: dict[tuple[str, int, int], Any] = {}
_PKEYS_LOCK = threading.Lock()


def _private_key(path: str) -> Any:
    """The key at `path`, read and parsed once per process (paramiko's key_filename parses the file for every
    connection, trying each key type in turn); None when paramiko must read it itself (a passphrase, an odd
    format), so its own errors say why."""
    import paramiko

    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (path, st.st_mtime_ns, st.st_size)
    with _PKEYS_LOCK:
        if stamp not in _PKEYS:
            try:
                _PKEYS[stamp] = paramiko.PKey.from_path(path)
            except Exception:
                _PKEYS[stamp] = None
        return _PKEYS[stamp]


class SSHTransport:
    """`connection: ssh`: one paramiko connection that verifies host keys against known_hosts. Agent calls and
    uploads use it directly; shell commands go through a Fabric Connection on the same link, made when first
    needed (Fabric's configuration costs more CPU per host than the handshake's own Python)."""

    def __init__(self, host: HostPlan, *, known_hosts: str, accept_new_host_keys: bool, connect_timeout: float = 10):
        import paramiko

        tune_paramiko()
        self.host = host
        self.access = a = access(host)
        self._agent: ChannelStream | None = None
        self._agent_lock = threading.Lock()
        self._fabric: Any = None
        self._sftp: Any = None
        kwargs: dict[str, Any] = {"timeout": connect_timeout, "banner_timeout": connect_timeout,
                                  "auth_timeout": connect_timeout}
        if a.identity_file:
            path = os.path.expanduser(a.identity_file)
            pkey = _private_key(path)
            kwargs |= {"pkey": pkey} if pkey is not None else {"key_filename": path}
            kwargs |= {"look_for_keys": False, "allow_agent": False}
        self.client = client = paramiko.SSHClient()
        # Only this host's entries: paramiko parses every line of the file (and checks it against all the
        # others) for each client, which is quadratic in the fleet size.
        use_host_keys(client, host_keys_for(known_hosts, host.address, a.port), known_hosts)
        policy = _AcceptNewPolicy(known_hosts) if accept_new_host_keys else paramiko.RejectPolicy()
        client.set_missing_host_key_policy(policy)
        try:
            client.connect(host.address, port=a.port, username=a.user, **kwargs)
        except paramiko.BadHostKeyException as exc:
            raise HostUnreachable(f"{host.name} ({host.address}:{a.port}): host key CHANGED "
                                  f"(expected {exc.expected_key.get_base64()[:16]}...); refusing to connect") from None
        except paramiko.SSHException as exc:
            msg = str(exc)
            if "not found in known_hosts" in msg:
                msg = (f"unknown host key (not in {known_hosts}); verify it and add it "
                       "(ssh-keyscan), or pass --accept-new-host-keys")
            raise HostUnreachable(f"{host.name} ({host.address}:{a.port}): {msg}") from None
        except (OSError, EOFError) as exc:
            raise HostUnreachable(f"{host.name} ({host.address}:{a.port}): cannot connect: {exc}") from None
        # paramiko's reader thread wakes every 0.1 s to look for a close: ~0.6 ms of CPU a second per host,
        # more than a fresh `up` spends on its handshake at 72 hosts. close() shuts the socket down, which
        # wakes the reader at once, so after the handshake the socket blocks: a socket with a timeout costs
        # two system calls a read or write (poll first), and sends and reads are most of the connection's cost.
        try:
            sock = client.get_transport().sock
            sock.settimeout(None)
            detect_dead_peer(sock)
        except OSError as exc:  # the host closed the connection right after logging us in
            client.close()
            raise HostUnreachable(f"{host.name} ({host.address}:{a.port}): connection lost: {exc}") from None

    def agent(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None = None) -> dict[str, Any]:
        """One agent call over a long-lived `serve` channel: the agent starts once per connection, with the
        first call's request sent along with its command."""
        request = agent_request(op, args)
        with self._agent_lock:
            try:
                if self._agent is None:
                    self._agent = self._start_agent(timeout, request)
                else:
                    self._agent.limit(timeout)
                    self._agent.send(request)
                return agent_answer(self._agent, timeout, on_progress)
            except TimeoutError:
                self._close_agent()
                return agent_timed_out(timeout)
            except Exception as exc:  # the link dropped: this host is unreachable now
                self._close_agent()
                raise HostUnreachable(f"{self.host.name}: connection lost: {self._why_lost(exc)}") from None

    def _why_lost(self, exc: BaseException) -> str:
        """What ended the connection: the reader's own error where it had one (a peer that stopped answering
        is named so), else what the call saw."""
        saved = getattr(self.client.get_transport(), "saved_exception", None)
        if isinstance(saved, OSError) and saved.errno == errno.ETIMEDOUT:
            return self._silence()
        return f"{type(exc).__name__}: {exc}"

    def _silence(self) -> str:
        """What a connection the kernel gave up on says: the host stopped answering."""
        return peer_silent()

    def alive(self) -> bool:
        """Whether the SSH connection is still up (a kept one is checked before each command reuses it)."""
        t = self.client.get_transport()
        return t is not None and t.is_active() and (self._agent is None or not self._agent.chan.closed)

    def _start_agent(self, timeout: float | None, first: bytes) -> ChannelStream:
        """Open the session the agent serves on, with its `first` request (uploading the agent's bundle once per
        host and version); returns once the agent has started, its answer to `first` still to be read."""
        chan = self.client.get_transport().open_session()
        try:
            chan.set_combine_stderr(True)
            chan.settimeout(timeout)
            chan.exec_command(self.command(loader_command(self.host.workdir, "serve")))
            stream = ChannelStream(chan)
            start_agent_session(stream, first)
            return stream
        except BaseException:
            chan.close()  # a session that did not start is given back to sshd (it counts them: MaxSessions)
            raise

    def _close_agent(self) -> None:
        if self._agent is not None:
            try:
                self._agent.chan.close()
            except Exception:
                pass
            self._agent = None

    def command(self, command: str) -> str:
        """A shell command as this transport's connection runs it (as is: it reaches this host directly)."""
        return command

    def _fabric_connection(self) -> Any:
        """A Fabric Connection on this transport's open link (Fabric's run: streaming, timeouts, Ctrl-C)."""
        if self._fabric is None:
            from fabric import Config, Connection

            from primectl.deploy.interruptible_remote import InterruptibleRemote

            conn = Connection(self.host.address, user=self.access.user, port=self.access.port,
                              config=Config(overrides={"runners": {"remote": InterruptibleRemote}}))
            conn.client, conn.transport = self.client, self.client.get_transport()  # connected: open() is a no-op
            self._fabric = conn
        return self._fabric

    def run(self, command: str, *, timeout: float | None = None, stream: bool = False) -> tuple[int, str, str]:
        try:
            r = self._fabric_connection().run(self.command(command), hide=not stream, warn=True, timeout=timeout,
                                              in_stream=False)
        except Exception as exc:  # paramiko/invoke raise many kinds when a link drops
            raise HostUnreachable(f"{self.host.name}: connection lost: {type(exc).__name__}: {exc}") from None
        return r.exited, r.stdout, r.stderr

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        try:
            if self._sftp is None:
                self._sftp = self.client.open_sftp()
            sftp = self._sftp
            _sftp_makedirs(sftp, posixpath.dirname(path))
            tmp = f"{path}.partial"
            sftp.putfo(io.BytesIO(data), tmp)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except Exception as exc:
            if self._sftp is not None:  # a broken SFTP session is not reused: the next upload opens another
                with contextlib.suppress(Exception):
                    self._sftp.close()
                self._sftp = None
            raise HostUnreachable(f"{self.host.name}: upload of {path} failed: {type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        """Close the connection. Its sessions end with it (sshd closes the agent's stdin), so they are not
        closed one by one. The shutdown sends the FIN at once, whatever paramiko's reader thread is blocked in."""
        self._agent = self._sftp = None
        t = self.client.get_transport()
        if t is not None:
            with contextlib.suppress(OSError):
                t.sock.shutdown(socket.SHUT_RDWR)
        self.client.close()


def _sftp_makedirs(sftp: Any, path: str) -> None:
    """mkdir -p over SFTP (no extra remote process)."""
    missing = []
    while path and path != "/":
        try:
            sftp.stat(path)
            break
        except OSError:
            missing.append(path)
            path = posixpath.dirname(path)
    for d in reversed(missing):
        sftp.mkdir(d)

"""Connections kept between commands: OpenSSH's ControlPersist, for primectl's host agents.

With `PRIMECTL_KEEP_CONNECTIONS=<seconds>` set, a command does not open its own SSH connections. It asks a
keeper, a background process of the same user, to run each agent operation. The keeper holds one SSH
connection and one running agent per host, and reuses them for the next command. A zero-change `up` or a
`status` then costs each host one JSON round trip on a channel that is already open: no SSH handshake and no
Python start-up there. Hosts reached through a head node (`via:`) are kept the same way: the keeper holds the
head's connection and one agent session per host through it. A connection no command has used for that many
seconds is closed (a recipe that dropped the host, a sweep that moved on to another deployment); the keeper
exits once no command has used it for that long, and `primectl disconnect` stops it at once.

A command talks to the keeper over one Unix connection per host: its first line names the host (and opens
the SSH connection), each later line is one agent operation, answered by its progress lines and result.
Trust is unchanged. A host's key is checked when its connection opens, with the known_hosts file and
host-key policy of the command that opened it. A command with another file or policy gets a connection of
its own, since the key of a kept connection includes both. The socket lives in a directory only its user
can enter, and the keeper serves only peers with its own uid (SO_PEERCRED). A keeper serves one agent
version and one version of this protocol: its socket is named after both (and the network namespace), so an
upgraded primectl starts a keeper of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any, cast

from primectl.deploy.access import access, record
from primectl.deploy.connect import open_ssh
from primectl.deploy.shipping import agent_hash
from primectl.deploy.transport import HostUnreachable, OnProgress, SSHConnection
from primectl.deploy.via import forget_head_failures
from primectl.errors import DeployError, Refused
from primectl.plan.model import HostPlan

ENV = "PRIMECTL_KEEP_CONNECTIONS"
PROTOCOL = 2  # 2: a command's Unix connection carries all of one host's operations, not one each
OPEN_S = 60  # how long the keeper may take to connect to a host (its own connect and login limits are shorter)


def persist_s() -> float:
    """How long a keeper outlives its last command (`PRIMECTL_KEEP_CONNECTIONS`); 0: no keeper."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise Refused(f"{ENV}={raw!r}: give the seconds a keeper outlives its last command (0 or unset: "
                      "none)") from None
    return max(0.0, value)


def run_dir() -> str:
    """The user's private directory for keeper sockets (created 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(base, "primectl")
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def socket_path() -> str:
    """The socket of the keeper for this agent version and network namespace (a keeper reaches hosts from the
    namespace it started in: a command in another one must not use its connections)."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return os.path.join(run_dir(), f"keeper-{agent_hash()[:12]}-p{PROTOCOL}-{netns}.sock")


_DIR_FDS: dict[str, int] = {}


def _reachable(path: str) -> str:
    """`path` as bind() and connect() can take it: a Unix socket's path has at most 107 bytes, so a longer one is
    named through an open descriptor of its directory (/proc/self/fd/N/name)."""
    if len(path.encode()) < 100:
        return path
    directory, name = os.path.split(path)
    fd = _DIR_FDS.get(directory)
    if fd is None:
        fd = _DIR_FDS[directory] = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{name}"


def _key(host: HostPlan, known_hosts: str, accept_new: bool) -> str:
    a = access(host)
    via = None
    if a.via is not None:
        head = access(a.via)
        via = [a.via.address, head.port, head.user, head.identity_file, a.via_identity_file]
    return json.dumps([host.address, a.port, a.user, a.identity_file, host.workdir, via, known_hosts, accept_new])


class Keeper:
    """The background process: kept connections by key, and when it last served."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self.conns: dict[str, SSHConnection] = {}
        self.lock = threading.Lock()
        self.opening: dict[str, threading.Lock] = {}
        self.busy = 0
        self.last = time.monotonic()
        self.used: dict[str, float] = {}  # key -> when a request last finished with its connection
        self.inflight: dict[str, int] = {}  # key -> requests using its connection now

    def transport(self, key: str, host: HostPlan, opening: dict[str, Any]) -> SSHConnection:
        """The kept connection for `key`, opened (or opened again) when needed, with the trust settings of the
        stream's `opening` line."""
        with self.lock:
            gate = self.opening.setdefault(key, threading.Lock())
        with gate:
            t = self.conns.get(key)
            if t is not None and t.alive():
                return t
            if t is not None:
                t.close()
            t = self.conns[key] = open_ssh(host, known_hosts=opening["known_hosts"],
                                           accept_new_host_keys=opening["accept_new"])
            return t

    @contextlib.contextmanager
    def _holding(self, key: str) -> Iterator[None]:
        """`key`'s connection is in use meanwhile: evict_unused leaves it open."""
        with self.lock:
            self.inflight[key] = self.inflight.get(key, 0) + 1
        try:
            yield
        finally:
            with self.lock:
                self.inflight[key] -= 1
                self.used[key] = time.monotonic()

    def _answer(self, key: str, host: HostPlan, opening: dict[str, Any], req: dict[str, Any],
                progress: OnProgress) -> dict[str, Any]:
        """What one line of a stream gets: its `opening` line connects, anything else runs an agent operation."""
        t: SSHConnection | None = None
        try:
            t = self.transport(key, host, opening)
            if req.get("kind") == "open":
                return {"result": {"ok": True}}
            return {"result": t.agent(req["op"], req["args"], req.get("timeout"), progress)}
        except HostUnreachable as exc:
            # a link that looks up but does not answer: the next command connects again (only this one is
            # dropped: another request may have put a new one in its place already)
            with self.lock:
                dead = self.conns.pop(key) if t is not None and self.conns.get(key) is t else None
            if dead is not None:
                with contextlib.suppress(Exception):
                    dead.close()
            return {"unreachable": str(exc)}
        except Exception as exc:  # a bug here must not take the other commands' connections down
            return {"unreachable": f"primectl keeper: {type(exc).__name__}: {exc}"}

    def handle(self, conn: socket.socket) -> None:
        """One command's stream for one host: its first request names the host (`open`), and every line after
        it is an operation on that host, each answered with its progress lines and result. The host's
        connection counts as in use until the command closes the stream."""
        with self.lock:
            self.busy += 1
        try:
            with conn, conn.makefile("rwb") as f:
                line = f.readline()
                if not line:
                    return
                first = json.loads(line)
                if first.get("kind") == "stop":
                    f.write(b'{"ok": true}\n')
                    f.flush()
                    self.stop()
                    return

                def progress(p: Any) -> None:
                    f.write(json.dumps({"progress_of": p}).encode() + b"\n")
                    f.flush()

                host = HostPlan.model_validate(first["host"])
                key = _key(host, first["known_hosts"], first["accept_new"])
                with self._holding(key):
                    req = first
                    while True:
                        f.write(json.dumps(self._answer(key, host, first, req, progress)).encode() + b"\n")
                        f.flush()
                        line = f.readline()
                        if not line:
                            return
                        req = json.loads(line)
        except (OSError, ValueError):
            pass  # the command went away (Ctrl-C): the operation on the host finished or timed out on its own
        finally:
            with self.lock:
                self.busy -= 1
                self.last = time.monotonic()
                idle = self.busy == 0
            if idle:  # the commands are done: a head one of them found down is tried again by the next
                forget_head_failures()

    def evict_unused(self, now: float) -> list[str]:
        """Close the connections no request has used for `idle_s` (the recipe no longer names the host, or a
        sweep moved on to another deployment's workdir); one a request is using is never closed. Their keys."""
        with self.lock:
            stale = [k for k, when in self.used.items() if not self.inflight.get(k) and now - when > self.idle_s]
            dropped = [(k, self.conns.pop(k)) for k in stale if k in self.conns]
            for k in stale:
                del self.used[k]
                self.inflight.pop(k, None)
        for _, t in dropped:
            with contextlib.suppress(Exception):
                t.close()
        return [k for k, _ in dropped]

    def stop(self) -> None:
        """Close every kept connection and exit."""
        for t in list(self.conns.values()):
            with contextlib.suppress(Exception):
                t.close()
        os._exit(0)

    def idle_watch(self, path: str) -> None:
        """Exit once no command has used the keeper for `idle_s` (or its socket was removed or replaced)."""
        ino = os.stat(path).st_ino
        while True:
            time.sleep(min(1.0, self.idle_s / 4))
            self.evict_unused(time.monotonic())
            with self.lock:
                idle = not self.busy and time.monotonic() - self.last > self.idle_s
            try:
                gone = os.stat(path).st_ino != ino
            except OSError:
                gone = True
            if idle or gone:
                if not gone:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                self.stop()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def serve(path: str, idle_s: float) -> None:
    """Listen on `path` and serve commands until idle for `idle_s`."""
    keeper = Keeper(idle_s)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}"
    listener.bind(_reachable(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(256)
    os.replace(tmp, path)  # only now can a command reach it: never a half-made socket at `path`
    threading.Thread(target=keeper.idle_watch, args=(path,), daemon=True).start()
    while True:
        conn, _ = listener.accept()
        if _peer_uid(conn) != os.getuid():
            conn.close()
            continue
        threading.Thread(target=keeper.handle, args=(conn,), daemon=True).start()


def _dial(path: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(_reachable(path))
        return s
    except OSError:
        s.close()
        return None


_START_LOCK = threading.Lock()
_FOUND: set[str] = set()  # keepers this process has reached: a command asks once, not once per host


def _listening(path: str) -> bool:
    s = _dial(path)
    if s is None:
        return False
    s.close()
    return True


def ensure(idle_s: float) -> str:
    """The socket of a running keeper, started now (detached, in its own session) if there is none."""
    path = socket_path()
    with _START_LOCK:
        if path not in _FOUND and not _listening(path):
            _start(path, idle_s)
        _FOUND.add(path)
    return path


def _start(path: str, idle_s: float) -> None:
    with open(os.path.join(run_dir(), "keeper.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter at a time, across commands
        if _listening(path):
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a keeper that died left it
        log = open(os.path.join(run_dir(), "keeper.log"), "ab")
        subprocess.Popen([sys.executable, "-m", "primectl.deploy.keeper", "--socket", path, "--idle", str(idle_s)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if _listening(path):
                return
            time.sleep(0.02)
    raise DeployError(f"the connection keeper did not start (see {os.path.join(run_dir(), 'keeper.log')}); "
                      f"unset {ENV} to connect directly")


def stop_keeper() -> bool:
    """Stop this version's keeper, closing its connections; whether one ran."""
    s = _dial(socket_path())
    if s is None:
        return False
    with s, s.makefile("rwb") as f:
        f.write(b'{"kind": "stop"}\n')
        f.flush()
        f.readline()
    return True


def keeper_pid() -> int | None:
    """The pid of this version's keeper, if one runs (read from the socket's peer credentials)."""
    s = _dial(socket_path())
    if s is None:
        return None
    with s:
        creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return int(struct.unpack("3i", creds)[0])


class KeptTransport:
    """A command's view of a kept connection: agent operations go through the keeper; `run` and `put` (rare:
    provisioning, big bundles) open a direct connection of their own the first time one is needed."""

    def __init__(self, host: HostPlan, *, known_hosts: str, accept_new_host_keys: bool, path: str):
        self.host = host
        self._known_hosts, self._accept_new = known_hosts, accept_new_host_keys
        self._path = path
        self._direct: SSHConnection | None = None
        self._lock = threading.Lock()  # one operation at a time on the stream
        self._stream: tuple[socket.socket, IO[bytes]] | None = None
        self._closed = False
        with self._lock:
            self._open()  # connect now: an unreachable host fails here, as a direct one does

    def _own(self) -> SSHConnection:
        if self._direct is None:
            self._direct = open_ssh(self.host, known_hosts=self._known_hosts, accept_new_host_keys=self._accept_new,
                                   shell=True)
        return self._direct

    def agent(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None = None) -> dict[str, Any]:
        """Run one agent operation on the kept connection."""
        try:
            with self._lock:
                if self._closed:
                    raise HostUnreachable(f"{self.host.name}: its connection was closed")
                if self._stream is not None and not self._stream_open():
                    self._close_stream()  # the keeper ended it between operations (it stopped, or died)
                if self._stream is None:
                    self._open()
                return self._exchange({"op": op, "args": args, "timeout": timeout}, on_progress, timeout)
        except TimeoutError:
            return {"ok": False, "code": 4, "error": f"no answer from the host agent within {timeout}s (kept connection)"}

    def _open(self) -> None:
        """A new stream to the keeper, its first line naming this host: the keeper connects to it."""
        s = _dial(self._path)
        if s is None:
            _FOUND.discard(self._path)  # the next connection this process opens starts a keeper again
            raise HostUnreachable(f"{self.host.name}: the connection keeper went away; run the command again")
        self._stream = (s, cast(IO[bytes], s.makefile("rwb")))
        try:
            self._exchange({"kind": "open", "host": record(self.host),
                            "known_hosts": self._known_hosts, "accept_new": self._accept_new}, None, OPEN_S)
        except TimeoutError:
            self._close_stream()
            raise HostUnreachable(f"{self.host.name}: the connection keeper did not answer within "
                                  f"{OPEN_S + 30:g}s") from None
        except BaseException:
            self._close_stream()
            raise

    def _stream_open(self) -> bool:
        """Whether the keeper still holds the stream: nothing is due on it between operations, so anything to
        read now is its end."""
        assert self._stream is not None
        poller = select.poll()
        poller.register(self._stream[0], select.POLLIN)
        return not poller.poll(0)  # readable: its end (or bytes no request asked for)

    def _exchange(self, request: dict[str, Any], on_progress: OnProgress | None, timeout: float | None
                  ) -> dict[str, Any]:
        """Send one request on the stream and read its progress lines and result. A stream left mid-answer
        (a time limit, Ctrl-C, the keeper gone) is closed: the next operation opens another."""
        assert self._stream is not None
        s, f = self._stream
        answered = False
        try:
            s.settimeout(None if timeout is None else timeout + 30)  # the keeper answers a timed-out agent first
            f.write(json.dumps(request).encode() + b"\n")
            f.flush()
            while True:
                line = f.readline()
                if not line:
                    raise HostUnreachable(f"{self.host.name}: the connection keeper closed the request")
                msg = json.loads(line)
                if "progress_of" in msg:
                    if on_progress is not None:
                        with contextlib.suppress(Exception):
                            on_progress(msg["progress_of"])
                    continue
                answered = True
                if "unreachable" in msg:
                    raise HostUnreachable(msg["unreachable"])
                return dict(msg["result"])
        except BaseException as exc:
            if not answered:
                self._close_stream()
            if isinstance(exc, OSError) and not isinstance(exc, TimeoutError):  # a broken pipe: the keeper went
                _FOUND.discard(self._path)
                raise HostUnreachable(f"{self.host.name}: lost the connection keeper ({exc}); run the command "
                                      "again") from None
            raise

    def _close_stream(self) -> None:
        if self._stream is not None:
            s, f = self._stream
            self._stream = None
            with contextlib.suppress(OSError):
                f.close()
            s.close()

    def run(self, command: str, *, timeout: float | None = None, stream: bool = False) -> tuple[int, str, str]:
        """A shell command, on a direct connection."""
        return self._own().run(command, timeout=timeout, stream=stream)

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Upload a file, on a direct connection."""
        self._own().put(data, path, mode)

    def close(self) -> None:
        """Close the stream to the keeper and the direct connection, if one was opened; the kept connection
        stays for the next command. From any thread: an operation blocked on the stream ends at once."""
        self._closed = True
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(OSError):
                stream[0].shutdown(socket.SHUT_RDWR)
        if self._lock.acquire(blocking=False):  # else the operation using it closes it as it ends
            try:
                self._close_stream()
            finally:
                self._lock.release()
        if self._direct is not None:
            self._direct.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m primectl.deploy.keeper --socket PATH --idle SECONDS`: what `ensure` starts."""
    ap = argparse.ArgumentParser(description="primectl's connection keeper (started by primectl itself)")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--idle", type=float, required=True)
    opts = ap.parse_args(argv)
    serve(opts.socket, opts.idle)
    return 0


if __name__ == "__main__":
    sys.exit(main())


"""The host protocol: what primectl and its host agent say to each other, and where things live on a host.

Stdlib only, and importable on both sides: primectl imports it as a module,
and a host imports it from the agent's bundle (`shipping.agent_bundle`), run
with `python3 -I -S`. It holds:

- the host layout (`Layout`): every path under a host's workdir;
- the state.json schema (`HostState`, `ServiceRecord`);
- the request and result types of the agent operations (`agent.OPS` lists them);
- the `Supervisor` strategy: how a service's process is started, stopped
  and watched, by primectl itself (`process`) or by systemd (`systemd`).

Wire format: one JSON object per request `{"op": NAME, "args": {...}}` and one
per result; every result has `ok` and `code` (0 ok, 1 failed, 3 a service
exited while we waited, 4 timed out) and, when not ok, `error`.
"""

from __future__ import annotations

import os
import sys
import time

# A host agent starts for every connection, so this file imports only what every operation needs. typing, json,
# signal and re would double the agent's start-up (json and signal import re and enum): types are for mypy
# (TYPE_CHECKING here is False at run time without importing typing), JSON goes through json's own C accelerator
# (`json_loads`/`json_dumps`), signals are their numbers, and shutil, socket and subprocess are imported where
# they are used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any, TypedDict
elif "typing" in sys.modules:  # loaded already (primectl's own process): the real TypedDict costs nothing
    from typing import TypedDict
else:
    class TypedDict(dict):  # type: ignore[no-redef]
        """In the agent, a TypedDict only names a dict."""

        def __init_subclass__(cls, total: bool = True) -> None:
            pass

SIGKILL, SIGTERM = 9, 15  # Linux's numbers; every host is Linux


def _json_codec() -> tuple[Callable[[str | bytes], Any], Callable[[Any], str]]:
    """json.loads and json.dumps (with their defaults) made from the C functions behind them (`_json`), without
    importing json; json itself where `_json` is missing."""
    try:
        import _json
    except ImportError:
        import json

        return json.loads, json.dumps

    class Context:
        strict, object_hook, object_pairs_hook = True, None, None
        parse_float, parse_int, parse_constant = float, int, float

    scan = _json.make_scanner(Context())  # type: ignore[arg-type]  # it reads these attributes

    def not_serializable(obj: Any) -> Any:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    encode = _json.make_encoder(None, not_serializable, _json.encode_basestring_ascii, None, ": ", ", ",
                                False, False, True)

    def loads(text: str | bytes) -> Any:
        if isinstance(text, (bytes, bytearray)):
            text = text.decode()
        text = text.strip(" \t\n\r")
        try:
            obj, end = scan(text, 0)
        except StopIteration as stop:
            raise ValueError(f"not JSON (at character {stop.value})") from None
        if end != len(text):
            raise ValueError(f"not JSON: extra data at character {end}")
        return obj

    def dumps(obj: Any) -> str:
        return "".join(encode(obj, 0))

    return loads, dumps


json_loads, json_dumps = _json_codec()

STATE_SCHEMA = 2
KEEP_RELEASES = 5
CODE_OK, CODE_FAILED, CODE_EXITED, CODE_TIMEOUT = 0, 1, 3, 4
SYSTEMD_UNIT_DIR = "/etc/systemd/system"
# Stands for the release directory in command probes (the same marker the Plan uses).
RELEASE_MARK = "@release@"


def unit_name(deployment: str, service: str) -> str:
    """The systemd unit (and process-supervisor) name of a service."""
    return f"primectl-{deployment}-{service}"


class Layout:
    """Every path primectl keeps under a host's workdir."""

    # What `down --purge` removes (the runtime venv and wheelhouse stay: they are shared and costly).
    PURGED = ("releases", "current", "state.json", "logs", "run", "secrets", "incoming", "lock", "data", "discovery",
              "models")

    def __init__(self, workdir: str):
        self.workdir = workdir

    def path(self, *parts: str) -> str:
        """A path under the workdir."""
        return os.path.join(self.workdir, *parts)

    @property
    def releases(self) -> str:
        return self.path("releases")

    def release(self, revision: str) -> str:
        """releases/<revision>: one immutable bundle."""
        return self.path("releases", revision)

    @property
    def current(self) -> str:
        """The link to the release that runs."""
        return self.path("current")

    @property
    def state(self) -> str:
        return self.path("state.json")

    def log(self, service: str) -> str:
        return self.path("logs", f"{service}.log")

    def pidfile(self, service: str) -> str:
        """run/<service>.pid: "pid starttime", so a reused pid is never taken for the service."""
        return self.path("run", f"{service}.pid")

    def started_from(self, service: str) -> str:
        """run/<service>.release: the revision `current` named when primectl last started the service."""
        return self.path("run", f"{service}.release")

    @property
    def lock(self) -> str:
        return self.path("lock")

    @property
    def lock_owner(self) -> str:
        return self.path("lock", "owner.json")

    def secrets(self, deployment: str) -> str:
        """The 0600 env file run scripts source."""
        return self.path("secrets", f"{deployment}.env")

    def incoming(self, revision: str) -> str:
        """Where an uploaded release archive (`unpack_files`) waits to be staged."""
        return self.path("incoming", f"{revision}.release")

    def script(self, service: str) -> str:
        """The run script of a service, through the `current` link."""
        return self.path("current", "bin", f"{service}.sh")

    def unit_file(self, unit: str) -> str:
        """The unit file a release ships for a service."""
        return self.path("current", "systemd", f"{unit}.service")

    def runtime(self, key: str) -> str:
        """runtime/<key>: the host runtime venv for one pinned set (shared by deployments, kept by purge)."""
        return self.path("runtime", key)

    def scratch(self, run_id: str) -> str:
        """preflight/<run>: probes and their logs, removed afterwards."""
        return self.path("preflight", run_id)


# -- state.json -------------------------------------------------------------------------------------


class DrainSpec(TypedDict, total=False):
    """How a service leaves routing and empties before it stops (the Plan's Drain as JSON)."""

    how: str  # signal | balancer
    inflight_url: str | None
    inflight_metrics: list[str]
    socket: str | None
    server: str | None
    address: str | None
    timeout_s: float


class ReloadSpec(TypedDict, total=False):
    """How a running service re-reads its files in place (the Plan's Reload as JSON)."""

    signal: str
    socket: str | None
    backend: str | None
    servers: list[str]
    state_file: str | None
    check: list[str]
    timeout_s: float


class Drained(TypedDict, total=False):
    """What draining one service took: how long, and how many in-flight requests were cut at its timeout."""

    seconds: float
    cut: int
    how: str


class ProbeSpec(TypedDict, total=False):
    """A readiness probe (the Plan's Probe as JSON)."""

    kind: str
    url: str | None
    json_path: str | None
    json_expect: Any
    expect_text: str | None  # http: also require the answer to contain this text (else: TEXT_MISSING ...)
    host: str | None
    port: int | None
    command: list[str] | None
    expect_status: int
    timeout_s: float
    interval_s: float


class ServiceRecord(TypedDict, total=False):
    """What state.json records about one service."""

    hash: str  # run hash: argv, env, files, binding (a change restarts)
    files_hash: str
    expect_hash: str  # readiness and ordering (a change is recorded, no restart)
    fields: dict[str, str]  # a hash per Service field, so `diff` can say which changed
    unit: str
    role: str
    release: str
    listens: list[int]
    ready: ProbeSpec
    stop_timeout: float
    drain: DrainSpec


class HostState(TypedDict, total=False):
    """state.json: what runs on this host for one deployment."""

    schema: int
    deployment: str
    revision: str | None
    previous_revision: str | None
    supervisor: str
    secrets_hash: str
    updated: float
    services: dict[str, ServiceRecord]
    # every host of the deployment (HostPlan fields), so dropped hosts are found: on the roster's keepers only
    # (the head host and two others), so that no host's state grows with the fleet; {} on the others
    roster: dict[str, dict[str, Any]]
    roster_keepers: dict[str, dict[str, Any]]  # the hosts that keep the roster (HostPlan fields), on every host
    roster_stamp: float  # when the `up` that wrote this roster (and named its keepers) recorded it
    retired: bool


# -- requests and results -------------------------------------------------------------------------------


class ServiceRef(TypedDict, total=False):
    """A service an operation acts on (`drain`: empty it before it stops; `reload`: how it re-reads its files)."""

    name: str
    unit: str
    stop_timeout: float
    drain: DrainSpec
    reload: ReloadSpec


class WaitSpec(TypedDict, total=False):
    """Wait for `probe`; fail fast if `unit` is given and its process exits."""

    name: str
    unit: str
    probe: ProbeSpec


class Liveness(TypedDict, total=False):
    """Whether a service's process runs, as its supervisor sees it."""

    alive: bool
    pid: int | None
    state: str  # supervisor's view, e.g. "running", "activating (auto-restart)", "failed"
    restarts: int  # restarts the supervisor did by itself (systemd NRestarts)
    release: str  # the revision it was started from (a running service only; absent when not known)


class Result(TypedDict, total=False):
    """Fields every result has."""

    ok: bool
    code: int
    error: str
    service: str


class InspectResult(Result, total=False):
    state: HostState | None
    current: str | None
    services: dict[str, Liveness]
    lock: dict[str, Any] | None
    taken: list[int]
    releases: list[str]
    time: float
    probes: dict[str, dict[str, Any]]  # with `probes` in the request (`status`): name -> {ok, detail}


class LockResult(Result, total=False):
    owner: dict[str, Any]
    stale: bool


class StartResult(Result, total=False):
    pids: dict[str, int | None]
    ready: list[str]
    seconds: float
    drained: dict[str, Drained]


class ReloadResult(StartResult, total=False):
    reloaded: list[str]  # the others did not run and were started


class StopResult(Result, total=False):
    stopped: list[str]
    drained: dict[str, Drained]


class ProbeResult(Result, total=False):
    results: dict[str, dict[str, Any]]


class TailResult(Result, total=False):
    logs: dict[str, str]


class SpawnResult(Result, total=False):
    pid: int


class ReadResult(Result, total=False):
    text: str


class ServiceProgress(TypedDict, total=False):
    """How one awaited service stands (in a progress line of `wait`/`start_wait`)."""

    name: str
    phase: str  # "starting", "waiting" (its probe did not pass yet), "ready", "exited", "timeout"
    elapsed: float  # seconds since the wait began
    budget: float  # its probe's timeout_s
    probe: str  # what its probe saw last ("" before the first try)
    log: str  # the last line of its log file ("" when it has none)


class Progress(TypedDict):
    """A line an operation writes before its result when the request asks for it (`progress_s` in args).

    Results always have `ok`; progress lines never do, so a reader tells them apart by the `progress` key."""

    progress: list[ServiceProgress]


class InstallProgress(Result, total=False):
    """`install_progress`: how far a runtime install is, read from its venv and pip's log."""

    installed: int  # distributions in the venv's site-packages (*.dist-info)
    venv_mb: float  # size of the venv
    collected: int  # packages pip has collected (downloaded or found in the wheelhouse)
    downloaded_mb: float  # sizes pip printed for its downloads
    last: str  # the log's last line


# -- processes ------------------------------------------------------------------------------------------


def read_json(path: str) -> Any:
    """A JSON file's content, None when it does not exist."""
    try:
        with open(path) as f:
            return json_loads(f.read())
    except FileNotFoundError:
        return None


def unpack_files(archive: bytes, into: str) -> int:
    """Write the files of a release archive under the directory `into` (which must be new and empty); how many.
    The archive (`render.bundle.pack_files` makes it) is one record per file, in path order: `<octal mode>
    <compressed size> <path>\\n`, then the file zlib-compressed. Not tar: importing tarfile and gzip and walking
    tar headers cost a host agent ~20 ms of CPU, more than writing the files. ValueError for a path that is
    absolute, climbs out (`..`) or is not plain, or a broken archive; modes keep their permission bits only."""
    import zlib

    at, count = 0, 0
    made: set[str] = set()
    while at < len(archive):
        end = archive.find(b"\n", at)
        words = archive[at:end].split(b" ", 2) if end >= 0 else []
        if len(words) != 3 or not words[1].isdigit():
            raise ValueError(f"not a release archive (record at byte {at})")
        path, size, start = words[2].decode(errors="replace"), int(words[1]), end + 1
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or start + size > len(archive):
            raise ValueError(f"refusing to unpack {path!r}")
        try:
            data = zlib.decompress(archive[start:start + size])
        except zlib.error as exc:
            raise ValueError(f"not a release archive ({path}: {exc})") from None
        target = os.path.join(into, path)
        parent = os.path.dirname(target)
        if parent not in made:  # files come in path order: each directory is made once, not once per file
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, int(words[0], 8) & 0o777)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        at, count = start + size, count + 1
    return count


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write a file so readers see the old or the new content, never a mix."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# shutil imports re, fnmatch, bz2 and lzma: 8 ms of a host agent's CPU, as much as the rest of a stage. The
# agent's few tree operations are written on os instead.
def remove_tree(path: str) -> None:
    """Remove a file, a symlink or a directory tree, as `rm -rf` does: what cannot be removed is left."""
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    for root, dirs, names in os.walk(path, topdown=False):
        for name in names:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            sub = os.path.join(root, name)
            try:
                os.unlink(sub) if os.path.islink(sub) else os.rmdir(sub)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def copy_tree(src: str, dst: str, *, link: bool = False) -> None:
    """Copy a directory tree: files with their permission bits, symlinks as symlinks (`dst` must not exist).
    With `link`, a file becomes a hard link to its source where the filesystem allows one (no data copied, no
    inode allocated), a copy where not: for trees nobody writes to once made."""
    for root, dirs, names in os.walk(src):
        target = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(target, exist_ok=root != src)
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            source, copy = os.path.join(root, name), os.path.join(target, name)
            if os.path.islink(source):
                os.symlink(os.readlink(source), copy)
                continue
            if link:
                try:
                    os.link(source, copy)
                    continue
                except OSError:  # another filesystem, or one without hard links: copy it
                    link = False
            with open(source, "rb") as f, open(copy, "wb") as g:
                while chunk := f.read(1 << 20):
                    g.write(chunk)
            os.chmod(copy, os.stat(source).st_mode & 0o7777)


def json_pretty(obj: Any, level: int = 0) -> str:
    """`json.dumps(obj, indent=2, sort_keys=True)` for string-keyed data, without importing json (it imports re:
    7 ms of a host agent's CPU): files people read, such as state.json."""
    if not obj or not isinstance(obj, (dict, list, tuple)):
        return json_dumps(obj)
    pad = "  " * (level + 1)
    if isinstance(obj, dict):
        items = [f"{pad}{json_dumps(k)}: {json_pretty(v, level + 1) if v and isinstance(v, _NESTED) else json_dumps(v)}"
                 for k, v in sorted(obj.items())]
        opening, closing = "{", "}"
    else:
        items = [pad + (json_pretty(v, level + 1) if v and isinstance(v, _NESTED) else json_dumps(v)) for v in obj]
        opening, closing = "[", "]"
    return opening + "\n" + ",\n".join(items) + "\n" + "  " * level + closing


_NESTED = (dict, list, tuple)


def starttime(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def kill_session(pid: int, timeout: float) -> None:
    """SIGTERM a process group, SIGKILL after `timeout`; then kill what still holds its session id."""
    try:
        os.killpg(pid, SIGTERM)
    except ProcessLookupError:
        kill_session_members(pid)
        return
    deadline = time.time() + timeout
    while time.time() < deadline and starttime(pid) is not None:
        time.sleep(0.05)
    if starttime(pid) is not None:
        try:
            os.killpg(pid, SIGKILL)
        except ProcessLookupError:
            pass
        while starttime(pid) is not None:
            time.sleep(0.05)
    kill_session_members(pid)


WATCH_ENV = "PRIMECTL_WATCH_OF"
"""Set (to the service's unit name) on the watch a run script starts beside its service, and on nothing else."""


def session_of(pid: int) -> int:
    """The session a process runs in; its own pid once it is gone (a service leads its session)."""
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return pid


def end_watches(unit: str, session: int) -> list[int]:
    """SIGTERM the watches started beside `unit`'s service (found by WATCH_ENV in their environment). Its run
    script starts them in the service's `session`: only the environments of that session's processes are
    read, not those of every process on the host."""
    mark = f"{WATCH_ENV}={unit}".encode()
    ended = []
    for pid in session_members(session):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    os.kill(pid, SIGTERM)
                    ended.append(pid)
        except (OSError, ProcessLookupError):
            pass
    return ended


def session_members(sid: int) -> list[int]:
    """The pids of the processes in session `sid` (os.getsid of each, no file read)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    members.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return members


def kill_session_members(sid: int) -> list[int]:
    """SIGKILL every process still in session `sid` (children that left the group, or that outlived a leader
    that died: Linux never hands out a pid still in use as a session id, so they are ours)."""
    killed = []
    for pid in session_members(sid):
        try:
            os.kill(pid, SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def json_at(body: bytes, path: str) -> Any:
    """The value at a dotted path of a JSON document (None when absent or not JSON)."""
    try:
        node: Any = json_loads(body)
    except ValueError:
        return None
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def inflight(drain: DrainSpec) -> int | None:
    """In-flight requests a service reports on its metrics: the named gauges summed (None: unreadable)."""
    url, names = drain.get("inflight_url"), set(drain.get("inflight_metrics") or [])
    if not url or not names:
        return None
    try:
        status, body = http_fetch(str(url), timeout=2)
    except (OSError, ValueError):
        return None
    if status != 200:
        return None
    text = body.decode(errors="replace")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.split("{", 1)[0].split(" ", 1)[0] in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                pass
    return int(total)


# A draining worker has left discovery the moment it got SIGTERM, but a request the router had already
# picked it for may still be on its way: it counts as empty only after this long with nothing in flight.
DRAIN_QUIET_S = 1.0
DRAINED_STOP_S = 2.0  # how long a drained service gets to exit by itself before SIGKILL


def drain_by_signal(pid: int, drain: DrainSpec, alive: Any = None) -> Drained:
    """SIGTERM the service's main process only (Dynamo workers then leave discovery and stop taking work) and
    wait until its metrics show nothing in flight for DRAIN_QUIET_S, it exits, or `timeout_s` passes."""
    alive = alive or (lambda: starttime(pid) is not None)
    t0 = time.time()
    try:
        os.kill(pid, SIGTERM)
    except ProcessLookupError:
        return {"seconds": 0.0, "cut": 0, "how": "signal"}
    deadline = t0 + float(drain.get("timeout_s", 60))
    quiet_since: float | None = None
    last: int | None = None
    while time.time() < deadline and alive():
        last = inflight(drain)
        now = time.time()
        if last == 0:
            quiet_since = quiet_since or now
            if now - quiet_since >= DRAIN_QUIET_S:
                break
        else:
            quiet_since = None
        time.sleep(0.1)
    cut = (last or 0) if time.time() >= deadline and alive() else 0
    return {"seconds": round(time.time() - t0, 3), "cut": cut, "how": "signal"}


def balancer_command(sock_path: str, command: str) -> str:
    """One command on a load balancer's admin socket (HAProxy's runtime API); its answer."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(sock_path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def balancer_stat(sock_path: str) -> list[dict[str, str]]:
    """The balancer's `show stat` rows, each keyed by the CSV header's names."""
    lines = balancer_command(sock_path, "show stat").splitlines()
    if not lines:
        return []
    header = lines[0].lstrip("# ").split(",")
    return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:]]


def balancer_server(sock_path: str, server: str) -> dict[str, str]:
    """The `show stat` row of backend/server (empty when the balancer does not know it)."""
    backend, _, name = server.partition("/")
    return next((r for r in balancer_stat(sock_path) if r.get("pxname") == backend and r.get("svname") == name), {})


def drain_from_balancer(drain: DrainSpec) -> Drained:
    """Stop the balancer sending the server new work, then wait until its sessions end (or `timeout_s`)."""
    sock_path, server = str(drain.get("socket")), str(drain.get("server"))
    t0 = time.time()
    try:
        balancer_command(sock_path, f"set server {server} state drain")
    except OSError:
        return {"seconds": 0.0, "cut": 0, "how": "balancer"}  # no balancer running: nothing routes to it
    deadline = t0 + float(drain.get("timeout_s", 60))
    current = 0
    while time.time() < deadline:
        try:
            row = balancer_server(sock_path, server)
        except OSError:
            break
        current = int(row.get("scur") or 0) + int(row.get("qcur") or 0)
        if current == 0:
            break
        time.sleep(0.1)
    cut = current if time.time() >= deadline else 0
    return {"seconds": round(time.time() - t0, 3), "cut": cut, "how": "balancer"}


def balancer_address(address: str) -> str:
    """`address` (host:port) as the balancer shows and takes it: a host named by name is resolved to its IPv4
    address, as the balancer's configuration was (OSError when it does not resolve)."""
    import ipaddress
    import socket

    host, _, port = address.rpartition(":")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        host = str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])
    return f"{host}:{port}"


def repoint_in_balancer(sock_path: str, server: str, address: str, row: dict[str, str]) -> str | None:
    """Point the balancer's server at `address` (an IP:port) when its `show stat` row says another one: a replica
    that came back on a new port must not be health-checked, or routed to, at its old one (None: done)."""
    if not address or row.get("addr") == address:
        return None
    host, _, port = address.rpartition(":")
    answer = balancer_command(sock_path, f"set server {server} addr {host} port {port}").strip()
    now = balancer_server(sock_path, server).get("addr")
    return None if now == address else f"the balancer would not move {server} to {address}: {answer or 'no answer'}"


def back_into_balancer(drain: DrainSpec, timeout: float = 30) -> str | None:
    """Put the server back in rotation, at its planned address, and wait until the balancer's health check calls
    it UP (None: done)."""
    sock_path, server = str(drain.get("socket")), str(drain.get("server"))
    address = str(drain.get("address") or "")
    try:
        address = balancer_address(address) if address else ""
    except OSError as exc:
        return f"the balancer cannot move {server} to {drain.get('address')}: {exc}"
    deadline = time.time() + timeout
    status = "?"
    while time.time() < deadline:
        try:
            row = balancer_server(sock_path, server)
            if not row:
                return None  # a new server, not in the balancer's configuration yet: the balancer's reload adds it
            error = repoint_in_balancer(sock_path, server, address, row)
            if error:
                return error
            balancer_command(sock_path, f"set server {server} state ready")
            status = balancer_server(sock_path, server).get("status", "?")
        except (FileNotFoundError, ConnectionRefusedError):
            return None  # no balancer runs (a socket file left by one that stopped refuses): it starts with it UP
        except OSError as exc:
            return f"balancer socket {sock_path}: {exc}"
        if status.startswith("UP"):
            return None
        time.sleep(0.1)
    return f"the balancer still calls {server} {status} after {timeout:g}s"


def balancer_servers(sock_path: str, backend: str) -> list[str]:
    """The servers a load balancer's running worker has in `backend` (its `show stat`)."""
    return sorted(r["svname"] for r in balancer_stat(sock_path)
                  if r.get("pxname") == backend and r.get("svname") not in ("FRONTEND", "BACKEND"))


def balancer_worker_pid(sock_path: str) -> str:
    """The pid of the balancer worker that answers on its admin socket (`show info`), '' if it says none."""
    for line in balancer_command(sock_path, "show info").splitlines():
        if line.startswith("Pid:"):
            return line.split(":", 1)[1].strip()
    return ""


def reload_in_place(pid: int, spec: ReloadSpec) -> str | None:
    """Check the new files, signal a running process to re-read them, and wait until it has (None: done, else why
    not: the running process is left as it was).

    With a balancer socket, done is when a new worker answers on it with exactly the servers the new files list;
    otherwise when the process is still the same one after the signal."""
    if spec.get("check"):
        # a master given a bad configuration keeps its old worker and only logs it: refuse before the signal
        import subprocess

        r = subprocess.run(spec["check"], capture_output=True, text=True)
        if r.returncode != 0:
            detail = " ".join((r.stderr or r.stdout).split())[-600:]
            return f"the new configuration does not load ({' '.join(spec['check'])}: {detail}); still running the old one"
    start = starttime(pid)
    sock_path, backend = spec.get("socket"), spec.get("backend")
    old_worker = ""
    if sock_path:
        try:
            old_worker = balancer_worker_pid(sock_path)
            if spec.get("state_file"):
                # without them the new worker would call every server down until its first health check passes
                write_atomic(str(spec["state_file"]), balancer_command(sock_path, "show servers state").encode())
        except OSError as exc:
            return f"could not save the balancer's server states through {sock_path}: {exc}"
    import signal  # a reload's signal is named (SIGHUP, SIGUSR2): rare enough to import the names for

    os.kill(pid, getattr(signal, spec["signal"]))
    deadline = time.time() + float(spec.get("timeout_s", 30))
    want = sorted(spec.get("servers") or [])
    seen: list[str] | str = "nothing"
    while time.time() < deadline:
        if starttime(pid) != start:
            return f"process {pid} exited on {spec['signal']} instead of reloading"
        if not sock_path or not backend:
            return None
        try:
            worker = balancer_worker_pid(sock_path)
            seen = balancer_servers(sock_path, backend) if worker and worker != old_worker else f"worker {worker}"
        except OSError as exc:  # between the old worker's socket and the new one's
            seen = str(exc)
        if seen == want:
            if spec.get("state_file"):  # read once: a later start must not take ports or states from it
                try:
                    os.unlink(str(spec["state_file"]))
                except FileNotFoundError:
                    pass
            return None
        time.sleep(0.1)
    return (f"after {spec['signal']} no new worker of the balancer lists {want} in backend {backend} (it shows "
            f"{seen}, {spec.get('timeout_s', 30):g}s)")


TEXT_MISSING = "the answer lacks "
"""How an http probe with `expect_text` says the text was not there (the URL answered as expected otherwise)."""


Answers = dict[str, tuple[int, bytes]]
"""HTTP answers by URL, shared by the probes of one batch: each URL is fetched once per batch."""


def http_get(url: str, answers: Answers | None) -> tuple[int, bytes]:
    """Status and body (at most 8 MiB) of a GET; from `answers` when this batch already fetched `url`."""
    if answers is not None and url in answers:
        return answers[url]
    got = http_fetch(url, timeout=3)  # a not-ready /ready still says what it counts: any status comes back
    if answers is not None:
        answers[url] = got
    return got


HTTP_BODY_MAX = 8 << 20


def http_fetch(url: str, timeout: float) -> tuple[int, bytes]:
    """One HTTP/1.1 GET of a plain http:// URL with `Connection: close`: (status, body up to 8 MiB, chunked
    encoding undone); OSError or ValueError when there is no HTTP answer. Redirects are not followed: a probe
    reports what the address it names answers. Written on the C socket module because urllib costs a host agent
    ~20 ms of CPU to import, more than the rest of a probe batch; https goes through urllib."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError(f"not an http URL: {url!r}")
    if scheme.lower() == "https":
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, resp.read(HTTP_BODY_MAX)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(HTTP_BODY_MAX)
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, path = rest[:cut].rsplit("@", 1)[-1], rest[cut:].split("#", 1)[0]
    path = path if path.startswith("/") else "/" + path
    host, port = netloc, 80
    if host.startswith("["):  # [IPv6]:port
        literal, _, tail = host[1:].partition("]")
        host, port = literal, int(tail[1:]) if tail.startswith(":") else 80
    elif ":" in host:
        host, port_s = host.rsplit(":", 1)
        port = int(port_s)
    import _socket

    sock, error = None, None
    # an ASCII name as bytes: a str is encoded with the idna codec, whose import (unicodedata) costs more CPU than
    # the probe
    name = host.encode() if host.isascii() else host
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            break
        except OSError as exc:  # try the name's next address, as urllib does
            sock.close()
            sock, error = None, exc
    if sock is None:
        raise error or OSError(f"no address for {host}")
    try:
        head = f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        sock.sendall(head.encode("latin-1"))
        chunks: list[bytes] = []
        size = 0
        while size <= HTTP_BODY_MAX + 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        sock.close()
    return parse_http_response(b"".join(chunks))


def parse_http_response(raw: bytes) -> tuple[int, bytes]:
    """(status, body) of a whole HTTP/1.x response read until the server closed it."""
    header, sep, body = raw.partition(b"\r\n\r\n")
    lines = header.split(b"\r\n")
    words = lines[0].split(None, 2)
    if not sep or len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        raise ValueError(f"not an HTTP answer: {raw[:60]!r}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        out, rest = [], body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if n == 0:
                break
            out.append(rest[:n])
            rest = rest[n + 2:]
        body = b"".join(out)
    elif (length := fields.get(b"content-length", b"")).isdigit():
        body = body[:int(length)]
    return int(words[1]), body[:HTTP_BODY_MAX]


def run_probe(p: ProbeSpec, release: str, answers: Answers | None = None) -> tuple[bool, str]:
    """Run one readiness probe once: (passed, what it saw). Command probes get `release` for RELEASE_MARK;
    http probes in one batch share `answers` (the listing probes of every worker read one URL)."""
    kind = p["kind"]
    try:
        if kind == "http":
            status, body = http_get(str(p["url"]), answers)
            if status == p.get("expect_status", 200) and p.get("expect_text"):
                text = str(p["expect_text"])
                found = text.encode() in body
                return found, (f"HTTP {status}, lists {text}" if found else f"HTTP {status}, {TEXT_MISSING}{text}")
            if p.get("json_path") and (status == p.get("expect_status", 200) or body):
                seen = json_at(body, str(p["json_path"]))
                return seen == p.get("json_expect"), f"HTTP {status}, {p['json_path']} = {seen!r} (want {p.get('json_expect')!r})"
            return status == p.get("expect_status", 200), f"HTTP {status}"
        if kind == "tcp":
            import socket

            with socket.create_connection((str(p["host"]), int(p["port"] or 0)), timeout=3):
                return True, f"tcp {p['host']}:{p['port']} open"
        import subprocess

        command = [c.replace(RELEASE_MARK, release) for c in p.get("command") or []]
        try:
            r = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired as exc:
            return False, f"{kind} probe: {exc}"
        text = r.stdout if r.returncode == 0 and r.stdout.strip() else r.stderr or r.stdout
        last = text.strip().splitlines()[-1:] or [""]
        return r.returncode == 0, f"exit {r.returncode}: {last[0][:120]}"
    except (OSError, ValueError) as exc:
        return False, f"{kind} probe: {exc}"


# -- supervisors ----------------------------------------------------------------------------------------


class ProbeRetry:
    """When to probe each service that is not ready yet again.

    A service just started is rarely ready on the first try: retry soon (0.05 s) and grow the wait
    1.5x per miss up to its probe's interval_s. Doubling overshot readiness by up to the last wait (a
    service ready at 0.8 s was seen at 1.55 s); 1.5x bounds that at a third, for a few more cheap probes.
    """

    def __init__(self, probes: Mapping[str, ProbeSpec]):
        self.cap = {n: max(0.05, float(p.get("interval_s", 0.5))) for n, p in probes.items()}
        self.delay = {n: 0.05 for n in probes}
        self.next_try = {n: 0.0 for n in probes}

    def due(self, name: str, now: float) -> bool:
        """Whether `name` is to be probed at `now`."""
        return now >= self.next_try[name]

    def next_due(self, names: Iterable[str]) -> float:
        """The earliest time one of `names` is to be probed."""
        return min((self.next_try[n] for n in names), default=float("inf"))

    def missed(self, name: str, now: float) -> None:
        """`name`'s probe at `now` did not pass: schedule the next one."""
        self.next_try[name] = now + self.delay[name]
        self.delay[name] = min(self.delay[name] * 1.5, self.cap[name])


class Supervisor:
    """How a service's process is started, stopped and watched on a host."""

    name = "base"

    def __init__(self, layout: Layout):
        self.layout = layout
        self.drained: dict[str, Drained] = {}

    def liveness(self, name: str, unit: str) -> Liveness:
        """Whether the service runs (and the supervisor's own view of it)."""
        raise NotImplementedError

    def drain(self, svc: ServiceRef) -> bool:
        """Empty a running service that says how (its `drain`) before it is stopped; whether it drained."""
        spec = svc.get("drain")
        if not spec:
            return False
        live = self.liveness(svc["name"], svc.get("unit", svc["name"]))
        pid = live.get("pid")
        if not live.get("alive") or pid is None:
            return False
        end_watches(svc.get("unit", svc["name"]), session_of(pid))  # a draining service must not be ended by its watch
        if spec.get("how") == "balancer":
            self.drained[svc["name"]] = drain_from_balancer(spec)
        else:
            self.drained[svc["name"]] = drain_by_signal(pid, spec)
        return True

    def prepare(self, services: list[ServiceRef]) -> str | None:
        """Before starting services of the current release (systemd: install their units); an error or None."""
        return None

    def reload(self, svc: ServiceRef) -> tuple[bool, str | None]:
        """Have a running service re-read its files in place (its `reload`): (whether it ran, error or None).
        One that does not run is not reloaded: the caller starts it."""
        live = self.liveness(svc["name"], svc.get("unit", svc["name"]))
        pid = live.get("pid")
        if not live.get("alive") or pid is None:
            return False, None
        return True, reload_in_place(pid, svc["reload"])

    def start(self, svc: ServiceRef) -> tuple[int | None, str | None]:
        """(Re)start one service from `current`: (pid, error)."""
        raise NotImplementedError

    def stop(self, svc: ServiceRef, *, remove: bool) -> bool:
        """Stop one service (and with `remove`, forget it: systemd disables and deletes its unit); was it running?"""
        raise NotImplementedError

    def stop_many(self, services: list[ServiceRef], *, remove: bool) -> list[str]:
        """Stop a batch of services (of one start wave: no order among them); the names that were running."""
        return [svc["name"] for svc in services if self.stop(svc, remove=remove)]

    def journal(self, unit: str, lines: int) -> str:
        """What the supervisor itself logged about the service (systemd: the journal), '' if nothing."""
        return ""


def spawn_session(argv: list[str], *, cwd: str, log: str) -> int:
    """Start `argv` in a session of its own (stdin /dev/null, stdout and stderr appended to `log`, no other
    descriptor inherited) and return its pid without waiting for it; OSError when it cannot be executed.
    subprocess.Popen does the same, but importing subprocess costs a host agent ~10 ms of CPU."""
    err_r, err_w = os.pipe()  # close-on-exec: EOF here means the exec succeeded
    pid = os.fork()
    if pid == 0:  # the child: only os calls until exec, then _exit whatever happened
        what = cwd
        try:
            os.close(err_r)
            os.setsid()
            os.chdir(cwd)
            what = log
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            # only the descriptors that are open: a loop up to the open-file limit (a million, or more under
            # LimitNOFILE=infinity) takes seconds where close_range is missing
            for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
                if fd > 2 and fd != err_w:
                    try:
                        os.close(fd)
                    except OSError:
                        pass  # the directory listing's own descriptor, closed already
            import _signal  # the C module: Python ignores SIGPIPE and SIGXFSZ, and exec keeps what is ignored

            _signal.signal(13, _signal.SIG_DFL)
            _signal.signal(25, _signal.SIG_DFL)
            what = argv[0]
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(err_w, f"{exc.errno}:{exc.strerror}: {what}".encode())
        finally:
            os._exit(127)
    os.close(err_w)
    try:
        failure = os.read(err_r, 4096)
    finally:
        os.close(err_r)
    if failure:
        os.waitpid(pid, 0)
        errno, _, text = failure.decode(errors="replace").partition(":")
        raise OSError(int(errno) if errno.isdigit() else 0, text)
    return pid


def reap_exited() -> None:
    """Collect the exit status of every child of this process that has ended (services and helpers started by
    spawn_session): an agent that serves many requests in one session, as a kept connection's does, would
    otherwise hold each one that exits as a zombie until the session ends."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def mark_start(layout: Layout, name: str) -> None:
    """Append the `--- primectl: starting NAME at TIME ---` line to a service's log (every supervisor does)."""
    os.makedirs(layout.path("logs"), exist_ok=True)
    with open(layout.log(name), "ab") as log:
        log.write(f"--- primectl: starting {name} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n".encode())


class ProcessSupervisor(Supervisor):
    """`supervisor: process`: setsid + pidfile + log file, for laptops and hosts without systemd as PID 1."""

    name = "process"

    def _recorded(self, name: str) -> tuple[int, str] | None:
        try:
            with open(self.layout.pidfile(name)) as f:
                pid_s, start = f.read().split()
        except (OSError, ValueError):
            return None
        return int(pid_s), start

    def _pid(self, name: str) -> int | None:
        recorded = self._recorded(name)
        if recorded is None:
            return None
        pid, start = recorded
        return pid if starttime(pid) == start else None

    def liveness(self, name: str, unit: str) -> Liveness:
        pid = self._pid(name)
        return {"alive": pid is not None, "pid": pid, "state": "running" if pid else "stopped"}

    def start(self, svc: ServiceRef) -> tuple[int | None, str | None]:
        name = svc["name"]
        self.stop(svc, remove=False)
        os.makedirs(self.layout.path("run"), exist_ok=True)
        mark_start(self.layout, name)
        pid = spawn_session(["/bin/bash", self.layout.script(name)], cwd=self.layout.workdir,
                            log=self.layout.log(name))
        start = None
        for _ in range(100):
            start = starttime(pid)
            if start:
                break
            time.sleep(0.01)
        write_atomic(self.layout.pidfile(name), f"{pid} {start}\n".encode())
        return pid, None

    def stop(self, svc: ServiceRef, *, remove: bool) -> bool:
        name = svc["name"]
        running = self._pid(name) is not None
        drained = self.drain(svc)
        pid = self._pid(name)
        if pid is not None:
            # drained: nothing is left in flight, and a worker would only sit out its grace period
            kill_session(pid, DRAINED_STOP_S if drained else float(svc.get("stop_timeout", 30)))
        elif (recorded := self._recorded(name)) is not None:
            # the main process died (a crash, kill -9); what it started may live on in its session (vLLM's
            # engine core and workers do): stop them too
            kill_session_members(recorded[0])
        try:  # a process that exited by itself leaves its pidfile behind: it goes too
            os.unlink(self.layout.pidfile(name))
        except FileNotFoundError:
            pass
        return running


class SystemdSupervisor(Supervisor):
    """`supervisor: systemd`: units installed from the release, enabled so a reboot brings them back.

    Units run the same run script and append to the same log file as the process supervisor
    (StandardOutput=append:, so the journal holds only systemd's own lines about the unit). What
    this relies on, measured with systemd 252 as PID 1 (tests/integration/test_systemd_hosts.py):
    - `enable`/`disable` reload the whole manager unless --no-reload (0.4 s each on a loaded
      2-core machine): units are enabled/disabled with --no-reload and the manager is reloaded
      once per batch, which also keeps its UnitFileState current.
    - Type=simple: `restart` returns 0 as soon as the process is forked, so readiness is only
      ever primectl's probe, and a unit that is not `active (running)` while primectl waits
      (e.g. `activating (auto-restart)` after a crash) counts as exited.
    - NRestarts counts systemd's own restarts since the unit was last started by hand:
      `restart` and `reset-failed` set it to 0, so `status` shows systemd's restarts since
      primectl last started the unit.
    - A unit whose process died waits RestartSec in `activating (auto-restart)`; `stop` cancels
      that restart, so a rolled-back unit never comes back by itself.
    """

    name = "systemd"
    unit_dir = SYSTEMD_UNIT_DIR

    @staticmethod
    def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
        import subprocess

        return subprocess.run(["systemctl", *args], capture_output=True, text=True)

    @staticmethod
    def _unit(svc: ServiceRef) -> str:
        return f"{svc['unit']}.service"

    def liveness(self, name: str, unit: str) -> Liveness:
        r = self._ctl("show", "-p", "ActiveState", "-p", "SubState", "-p", "MainPID", "-p", "NRestarts",
                      "-p", "LoadState", "-p", "UnitFileState", f"{unit}.service")
        props = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        active, sub = props.get("ActiveState", "unknown"), props.get("SubState", "")
        pid = int(props.get("MainPID") or 0) or None
        restarts = int(props.get("NRestarts") or 0)
        alive = active == "active" and sub == "running"
        if props.get("LoadState") == "not-found":
            state = "not installed"
        else:
            state = f"{active} ({sub})" if sub else active
            enabled = props.get("UnitFileState", "")
            if enabled and enabled != "enabled":  # running but not brought back by a reboot: say so
                state += f", {enabled}"
        return {"alive": alive, "pid": pid if alive else None, "state": state, "restarts": restarts}

    def prepare(self, services: list[ServiceRef]) -> str | None:
        import shutil

        if not services:
            return None
        for svc in services:
            shutil.copyfile(self.layout.unit_file(svc["unit"]), os.path.join(self.unit_dir, self._unit(svc)))
        units = [self._unit(svc) for svc in services]
        r = self._ctl("enable", "--no-reload", *units)
        if r.returncode != 0:
            return f"systemctl enable {' '.join(units)}: {r.stderr.strip()}"
        r = self._ctl("daemon-reload")
        return None if r.returncode == 0 else f"systemctl daemon-reload: {r.stderr.strip()}"

    def start(self, svc: ServiceRef) -> tuple[int | None, str | None]:
        unit = self._unit(svc)
        if self.drain(svc):
            self._ctl("kill", "--signal=SIGKILL", unit)  # drained: nothing left in flight
        self._ctl("reset-failed", unit)  # a unit that failed before must not hit its start limit now
        mark_start(self.layout, svc["name"])
        r = self._ctl("restart", unit)
        if r.returncode != 0:
            return None, f"systemctl restart {unit}: {r.stderr.strip()}"
        return self.liveness(svc["name"], svc["unit"]).get("pid"), None

    def stop(self, svc: ServiceRef, *, remove: bool) -> bool:
        return bool(self.stop_many([svc], remove=remove))

    def stop_many(self, services: list[ServiceRef], *, remove: bool) -> list[str]:
        """disable + stop the batch in one systemctl call each (systemd stops them in parallel), then one reload."""
        if not services:
            return []
        was = [svc["name"] for svc in services if self.liveness(svc["name"], svc["unit"]).get("alive")]
        units = [self._unit(svc) for svc in services]
        drained = [self._unit(svc) for svc in services if self.drain(svc)]
        if drained:
            self._ctl("kill", "--signal=SIGKILL", *drained)  # drained: nothing left in flight
        # Disabled first: a stopped unit must not come back at the next boot. `stop` also cancels a
        # pending automatic restart; it waits for each unit's TimeoutStopSec, then systemd SIGKILLs.
        installed = [u for u in units if os.path.exists(os.path.join(self.unit_dir, u))]
        if installed:  # one missing unit file would make `disable` refuse the whole batch
            self._ctl("disable", "--no-reload", *installed)
        self._ctl("stop", *units)
        self._ctl("reset-failed", *units)
        if remove:
            for unit in units:
                try:
                    os.unlink(os.path.join(self.unit_dir, unit))
                except FileNotFoundError:
                    pass
        self._ctl("daemon-reload")
        return was

    def journal(self, unit: str, lines: int) -> str:
        import subprocess

        r = subprocess.run(["journalctl", "-u", f"{unit}.service", "-n", str(lines), "--no-pager", "-o", "short-iso"],
                           capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""


SUPERVISORS: dict[str, type[Supervisor]] = {"process": ProcessSupervisor, "systemd": SystemdSupervisor}

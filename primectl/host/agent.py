"""The host agent: every operation primectl performs on a host, its dispatcher, and its entry point.

primectl sends this package (stdlib only: the layout, the request/result types,
files, processes, probes, the balancer and the supervisors are its other
modules) as one bundle (`deploy.shipping`), so nothing has to be installed on a
host first. Over SSH it runs as `python3 -I -S -c <loader> serve`, one session
per connection: a JSON request line in, a JSON result line out, one round trip
per operation. Locally it runs as `... <op> <json-args>` and prints one JSON
result. In tests the fake transport calls `dispatch` in-process. A request
whose args hold `progress_s` also gets `{"progress": [...]}` lines before its
result while it waits (`wait`, `start_wait`): each awaited service's phase,
elapsed time, budget, what its probe saw and its log's last line, at least
every `progress_s` seconds.
"""

from __future__ import annotations

import os
import sys
import time

from primectl.host.files import copy_tree, read_json, remove_tree, unpack_files, write_atomic
from primectl.host.json_codec import json_dumps, json_loads, json_pretty
from primectl.host.logs import LazyPattern, last_log_line, readable, tail_file
from primectl.host.probes import ProbeRetry, probe_once
from primectl.host.processes import kill_session, reap_exited, spawn_session, starttime
from primectl.host.wire import CODE_EXITED, CODE_TIMEOUT, ServiceProgress
from primectl.plan.layout import Layout

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from primectl.host.probes import Answers
    from primectl.host.supervisor import Supervisor
    from primectl.host.wire import (
        InspectResult,
        InstallProgress,
        Liveness,
        LockResult,
        ProbeResult,
        ProbeSpec,
        Progress,
        ReadResult,
        ReloadResult,
        Result,
        ServiceRef,
        SpawnResult,
        StartResult,
        StopResult,
        TailResult,
        WaitSpec,
    )


def supervisor_for(name: str, layout: Layout) -> Supervisor:
    """The supervisor a host's deployment names (`process` or `systemd`); its module is imported here, as only
    one of them is ever used."""
    if name == "systemd":
        from primectl.host.systemd_supervisor import SystemdSupervisor

        return SystemdSupervisor(layout)
    if name != "process":
        raise KeyError(name)
    from primectl.host.process_supervisor import ProcessSupervisor

    return ProcessSupervisor(layout)


class Host:
    """One operation's view of the host: its layout, supervisor and prober (tests swap the last two)."""

    def __init__(self, args: dict[str, Any], supervisor: Supervisor | None = None,
                 prober: Callable[[str, ProbeSpec, str], tuple[bool, str]] | None = None,
                 emit: Callable[[Progress], None] | None = None):
        self.args = args
        self.layout = Layout(args["workdir"])
        self.supervisor = supervisor or supervisor_for(args.get("supervisor", "process"), self.layout)
        self._prober = prober
        self._emit = emit

    def emit(self, progress: Progress, *, last: bool = False) -> None:
        """Send a progress line ahead of the result, if the caller asked for them. The `last` one, written just
        before the result, goes out with it: one packet for the controller's connection to read, not two."""
        if self._emit is None or self.args.get("progress_s") is None:
            return
        if last and self._emit is write_line:
            write_line(progress, flush=False)
        else:
            self._emit(progress)

    def liveness(self, name: str, unit: str) -> Liveness:
        return self.supervisor.liveness(name, unit)

    def probe(self, name: str, probe: ProbeSpec, answers: Answers | None = None) -> tuple[bool, str]:
        """Run the readiness probe of `name` once (http probes of one batch share `answers`)."""
        if self._prober is not None:
            return self._prober(name, probe, self.layout.workdir)
        return probe_once(probe, self.layout.workdir, answers)


if TYPE_CHECKING:
    Op = Callable[[Host], Result]


def op_inspect(h: Host) -> InspectResult:
    """State, current revision, lock and liveness of every recorded service."""
    a, lay = h.args, h.layout
    state = read_json(lay.state)
    current = os.path.basename(os.readlink(lay.current)) if os.path.islink(lay.current) else None
    units: dict[str, str] = dict(a.get("services", {}))
    recorded = (state or {}).get("services", {})
    services = {}
    for name in sorted(set(units) | set(recorded)):
        unit = units.get(name) or recorded.get(name, {}).get("unit", name)
        services[name] = live = h.liveness(name, unit)
        if live.get("alive"):
            try:
                with open(lay.started_from(name)) as f:
                    live["release"] = f.read().strip()
            except OSError:
                pass
    try:
        os.makedirs(lay.workdir, exist_ok=True)
        probe = lay.path(f".primectl-write-test.{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        return {"ok": False, "error": f"workdir {lay.workdir} is not writable: {exc.strerror}"}
    releases = sorted(os.listdir(lay.releases)) if os.path.isdir(lay.releases) else []
    taken = _taken(a["address"], a["ports"]) if a.get("ports") else []
    result: InspectResult = {"ok": True, "state": state, "current": current, "services": services,
                             "lock": read_json(lay.lock_owner), "taken": taken, "releases": releases, "time": time.time()}
    if a.get("probes"):  # `status`: its probes ride with the inspection, one round trip per host
        try:
            result["probes"] = op_probe(h)["results"]
        except Exception as exc:  # a probe that broke makes its services not ready, not the host uninspectable
            result["probes"] = {p["name"]: {"ok": False, "detail": f"probe failed: {type(exc).__name__}: {exc}"}
                                for p in a["probes"]}
    return result


def _taken(address: str, ports: list[int]) -> list[int]:
    import _socket  # the C module: what socket.socket() wraps, without the import cost of socket.py's enums

    taken = []
    for port in ports:
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.settimeout(0.3)
        try:
            if s.connect_ex((address, port)) == 0:
                taken.append(port)
        finally:
            s.close()
    return taken


def op_lock(h: Host) -> LockResult:
    """Take the cluster lock, or say who holds it; `force` breaks a lock."""
    lay = h.layout
    os.makedirs(lay.workdir, exist_ok=True)
    if h.args.get("force"):
        remove_tree(lay.lock)
    try:
        os.mkdir(lay.lock)
    except FileExistsError:
        owner = read_json(lay.lock_owner) or {}
        return {"ok": False, "owner": owner, "stale": owner.get("expires", 0) < time.time(), "error": "locked"}
    write_atomic(lay.lock_owner, json_dumps(h.args["owner"]).encode())
    return {"ok": True}


def op_unlock(h: Host) -> LockResult:
    """Release the lock if `token` holds it (or unconditionally with `force`)."""
    owner = read_json(h.layout.lock_owner) or {}
    if h.args.get("force") or owner.get("token") == h.args.get("token"):
        remove_tree(h.layout.lock)
        return {"ok": True}
    return {"ok": False, "owner": owner, "error": "held by another run"}


def op_stage(h: Host) -> Result:
    """Unpack a release archive (`unpack_files`) into releases/<revision> (atomic rename; idempotent): the uploaded
    one, or the one the request carries (`archive_b64`: small bundles travel in the request, with no upload of
    their own)."""
    lay, revision = h.layout, h.args["revision"]
    rel = lay.release(revision)
    uploaded = lay.incoming(revision)
    inline = h.args.get("archive_b64")
    if os.path.isdir(rel):
        if os.path.exists(uploaded):
            os.unlink(uploaded)
        return {"ok": True}
    if inline is not None:
        import binascii

        archive = binascii.a2b_base64(inline)
    else:
        with open(uploaded, "rb") as f:
            archive = f.read()
    tmp = f"{rel}.partial"
    if os.path.exists(tmp):
        remove_tree(tmp)
    os.makedirs(tmp)
    try:
        unpack_files(archive, tmp)
    except ValueError as exc:
        return {"ok": False, "error": f"{exc} (revision {revision})"}
    os.replace(tmp, rel)
    if inline is None:
        os.unlink(uploaded)
    for sub in ("logs", "run", "secrets"):
        os.makedirs(lay.path(sub), exist_ok=True)
    _share_model(lay, rel)
    return {"ok": True}


def _share_model(lay: Layout, rel: str) -> None:
    """A generated model that names a shared copy gets one under models/ (once: the name is its content's)."""
    mark = os.path.join(rel, "model", ".primectl-shared-name")
    if not os.path.exists(mark):
        return
    with open(mark) as f:
        name = f.read().strip()
    shared = lay.path("models", name)
    if os.path.isdir(shared):
        return
    tmp = f"{shared}.partial"
    remove_tree(tmp)
    copy_tree(os.path.join(rel, "model"), tmp, link=True)  # releases are never written to once staged
    os.replace(tmp, shared)


def op_switch(h: Host) -> Result:
    """Point `current` at a release (atomic symlink swap)."""
    lay, revision = h.layout, h.args["revision"]
    target = os.path.join("releases", revision)
    if not os.path.isdir(lay.path(target)):
        return {"ok": False, "error": f"release {revision} is not on this host"}
    tmp = lay.path(f".current.{os.getpid()}")
    os.symlink(target, tmp)
    os.replace(tmp, lay.current)
    return {"ok": True}


def op_secrets(h: Host) -> Result:
    """Write the deployment's secrets env file with mode 0600 (content never echoed)."""
    path = h.layout.secrets(h.args["deployment"])
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, h.args["content"].encode(), 0o600)
    return {"ok": True}


def op_activate(h: Host) -> Result:
    """Write the secrets file and/or point `current` at a release, in one round trip."""
    if "secrets" in h.args:
        op_secrets(Host(h.args | h.args["secrets"], h.supervisor, h._prober))
    if "revision" in h.args:
        return op_switch(h)
    return {"ok": True}


def op_start(h: Host) -> StartResult:
    """(Re)start services from `current`: each one's running instance is stopped first."""
    services: list[ServiceRef] = h.args["services"]
    error = h.supervisor.prepare(services)
    if error:
        return {"ok": False, "error": error, "service": services[0]["name"] if services else ""}
    pids: dict[str, int | None] = {}
    lay = h.layout
    release = os.path.basename(os.path.realpath(lay.current)) if os.path.islink(lay.current) else ""
    for svc in services:
        pid, error = h.supervisor.start(svc)
        if error:
            return {"ok": False, "error": error, "service": svc["name"]}
        pids[svc["name"]] = pid
        if release:  # what an `up` killed before it recorded its work finds out about this service
            os.makedirs(lay.path("run"), exist_ok=True)
            write_atomic(lay.started_from(svc["name"]), release.encode())
    return {"ok": True, "pids": pids}


def op_start_wait(h: Host) -> StartResult:
    """Start services, then wait for their probes, in one round trip."""
    report = WaitReport(h, h.args["waits"], time.time())
    report.tick(force=True, logs=False)  # "starting" (the logs are old ones)
    started = op_start(h)
    if not started.get("ok"):
        return started
    result = op_wait(h, report)
    if result.get("ok"):
        for svc in h.args["services"]:  # ready again: back into the balancer's rotation it was drained from
            spec = svc.get("drain")
            if spec and spec.get("how") == "balancer":
                from primectl.host.haproxy import back_into_balancer

                error = back_into_balancer(spec)
                if error:
                    return {"ok": False, "error": error, "service": svc["name"]}
    result["drained"] = h.supervisor.drained
    return result


def op_reload(h: Host) -> ReloadResult:
    """Have running services re-read their files in place (each one's `reload`), then wait for their probes, in
    one round trip; one that does not run is started instead."""
    services: list[ServiceRef] = h.args["services"]
    dead = []
    for svc in services:
        ran, error = h.supervisor.reload(svc)
        if error:
            return {"ok": False, "error": error, "service": svc["name"]}
        if not ran:
            dead.append(svc)
    if dead:
        started = op_start(Host(h.args | {"services": dead}, h.supervisor, h._prober, h._emit))
        if not started.get("ok"):
            return started  # type: ignore[return-value]
    result: ReloadResult = {**op_wait(h), "reloaded": [svc["name"] for svc in services if svc not in dead]}
    return result


def op_stop(h: Host) -> StopResult:
    """Stop services (SIGTERM, SIGKILL after each one's timeout); `remove_units` also forgets them."""
    stopped = h.supervisor.stop_many(h.args["services"], remove=bool(h.args.get("remove_units")))
    return {"ok": True, "stopped": stopped, "drained": h.supervisor.drained}


class WaitReport:
    """The progress lines of one wait: every awaited service's phase, at most every `progress_s` and at changes."""

    def __init__(self, h: Host, waits: list[WaitSpec], started: float):
        self.h = h
        self.every = h.args.get("progress_s")
        self.started = started
        self.rows: dict[str, ServiceProgress] = {
            w["name"]: {"name": w["name"], "phase": "starting", "elapsed": 0.0,
                        "budget": float(w["probe"].get("timeout_s", 60)), "probe": "", "log": ""} for w in waits}
        self.last = 0.0
        self.changed = False

    def set(self, name: str, phase: str, probe: str | None = None) -> None:
        """Record what a service's probe saw (and its phase); ready/exited/timeout fix its elapsed time. A change
        to `waiting` (its first probe missed) is shown by the next line that is due, within `progress_s`: a
        line of its own would cost each host one more packet, for a service most often ready a moment later."""
        row = self.rows[name]
        self.changed |= row["phase"] != phase and phase != "waiting"
        row["phase"] = phase
        if probe is not None:
            row["probe"] = probe
        if phase in ("ready", "exited", "timeout"):
            row["elapsed"] = round(time.time() - self.started, 1)

    def next_due(self) -> float:
        """When the next periodic progress line is due (inf when the caller asked for none)."""
        return float("inf") if self.every is None else self.last + float(self.every)

    def tick(self, *, force: bool = False, logs: bool = True, last: bool = False) -> None:
        """Emit a progress line when one is due (or `force`); `logs`: with each service's last log line; `last`:
        the wait ends with it."""
        if self.every is None:
            return
        now = time.time()
        if not (force or self.changed or now - self.last >= float(self.every)):
            return
        for name, row in self.rows.items():
            if row["phase"] in ("starting", "waiting"):
                row["elapsed"] = round(now - self.started, 1)
            if logs and row["phase"] != "ready" and name != "gate":
                row["log"] = last_log_line(self.h.layout.log(name))
        self.h.emit({"progress": [ServiceProgress(**r) for r in self.rows.values()]}, last=last)
        self.last, self.changed = now, False


# How often a wait checks that the services it awaits still run (a probe that fails says less: it also fails
# while a service loads). Each check reads a pidfile and /proc (or asks systemd) per service.
LIVENESS_EVERY_S = 0.25


def op_wait(h: Host, report: WaitReport | None = None) -> StartResult:
    """Wait until every probe passes; fail fast if a watched service exits. `report`: the progress lines of a
    wait that has said where it stands already (start_wait's `starting`), so that the next is due later."""
    pending = {w["name"]: w for w in h.args["waits"]}
    retry = ProbeRetry({n: w["probe"] for n, w in pending.items()})
    started = time.time()
    report = report or WaitReport(h, h.args["waits"], started)
    detail: dict[str, str] = {}
    ready: list[str] = []
    next_liveness = 0.0
    while pending:
        now = time.time()
        watch = now >= next_liveness
        if watch:
            next_liveness = now + LIVENESS_EVERY_S
        for name, w in list(pending.items()):
            if watch and w.get("unit") and not h.liveness(name, w["unit"]).get("alive"):
                report.set(name, "exited")
                report.tick(force=True, last=True)
                return {"ok": False, "code": CODE_EXITED, "service": name, "ready": ready,
                        "error": f"{name} exited before it became ready"}
            if not retry.due(name, now):
                continue
            ok, detail[name] = h.probe(name, w["probe"])
            if ok:
                ready.append(name)
                del pending[name]
                report.set(name, "ready", detail[name])
                continue
            timeout = float(w["probe"].get("timeout_s", 60))
            if now - started > timeout:
                report.set(name, "timeout", detail[name])
                report.tick(force=True, last=True)
                return {"ok": False, "code": CODE_TIMEOUT, "service": name, "ready": ready,
                        "error": f"{name} not ready after {timeout:g}s ({detail[name]})"}
            report.set(name, "waiting", detail[name])
            retry.missed(name, now)
        report.tick(last=not pending)
        if pending:  # until the next probe, liveness check or progress line is due
            wake = min(next_liveness, retry.next_due(pending), report.next_due())
            time.sleep(min(max(wake - time.time(), 0.005), LIVENESS_EVERY_S))
    return {"ok": True, "ready": ready, "seconds": round(time.time() - started, 3)}


def op_probe(h: Host) -> ProbeResult:
    """Run each of `probes` once (for `status`)."""
    results = {}
    answers: Answers = {}
    for w in h.args["probes"]:
        ok, detail = h.probe(w["name"], w["probe"], answers)
        results[w["name"]] = {"ok": ok, "detail": detail}
    return {"ok": True, "results": results}


KEEP_RELEASES = 5  # releases a host keeps besides those its state names


def op_write_state(h: Host) -> Result:
    """Record what runs here, then drop releases nothing refers to (keeping the last few)."""
    lay, state = h.layout, h.args["state"]
    write_atomic(lay.state, (json_pretty(state) + "\n").encode())  # read by people too: indented
    keep = {state.get("revision"), state.get("previous_revision")}
    keep |= {s.get("release") for s in state.get("services", {}).values()}
    if os.path.isdir(lay.releases):
        releases = sorted(os.listdir(lay.releases), key=lambda r: os.path.getmtime(lay.release(r)))
        for r in releases[:-KEEP_RELEASES]:
            if r not in keep:
                remove_tree(lay.release(r))
    return {"ok": True}


def op_tail(h: Host) -> TailResult:
    """The last lines of each named service's log (and what the supervisor logged about it)."""
    lines = int(h.args.get("lines", 40))
    units: dict[str, str] = h.args.get("units", {})
    out = {}
    for name in h.args["services"]:
        text = tail_file(h.layout.log(name), lines)
        journal = h.supervisor.journal(units[name], 10) if name in units else ""
        if journal:
            text += f"\n--- {h.supervisor.name} about {units[name]} ---\n{journal}"
        out[name] = text
    return {"ok": True, "logs": out}


def op_purge(h: Host) -> Result:
    """Remove everything primectl put under the workdir (the agent's modules too, where they were cached there:
    this agent runs on from memory, with those it imports only when needed imported first). The copy in the
    login user's cache stays: other deployments share it."""
    from primectl.host import haproxy, process_supervisor, systemd_supervisor  # noqa: F401

    for sub in (*Layout.PURGED, AGENT_DIR):
        remove_tree(h.layout.path(sub))
    return {"ok": True}


def op_spawn(h: Host) -> SpawnResult:
    """Start a helper process in its own session (preflight probes): argv, cwd, log; its pid."""
    os.makedirs(h.args["cwd"], exist_ok=True)
    return {"ok": True, "pid": spawn_session(list(h.args["argv"]), cwd=h.args["cwd"], log=h.args["log"])}


def op_kill(h: Host) -> Result:
    """Stop a process `spawn` started, by pid, only if its command line still holds `marker`."""
    pid = int(h.args["pid"])
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return {"ok": True}
    if h.args["marker"].encode() in cmdline and starttime(pid) is not None:
        kill_session(pid, float(h.args.get("timeout", 5)))
    return {"ok": True}


def op_read(h: Host) -> ReadResult:
    """A small text file under the workdir (e.g. a release's run script for `diff`); '' when absent."""
    path = h.layout.path(h.args["path"])
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        text = ""
    return {"ok": True, "text": text}


def op_install_progress(h: Host) -> InstallProgress:
    """How far a runtime install is: distributions and MB in its venv, and what pip's log says it collected."""
    venv, installed, size = h.args["venv"], 0, 0
    for root, dirs, names in os.walk(venv):
        for d in dirs:
            if d.endswith(".dist-info") and root.endswith("site-packages") and \
                    not d.startswith(("pip-", "setuptools-", "wheel-", "~")):  # ~: pip moving one aside
                installed += 1
        for n in names:
            try:
                size += os.lstat(os.path.join(root, n)).st_size
            except OSError:
                pass
    collected, downloaded, last = 0, 0.0, ""
    try:
        with open(h.args["log"], encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("Collecting ") or line.startswith("Processing "):
                    collected += 1
                m = DOWNLOADED.search(line)
                if m:
                    downloaded += float(m.group(1)) * {"kB": 1e-3, "MB": 1.0, "GB": 1e3}[m.group(2)]
                last = line or last
    except OSError:
        pass
    return {"ok": True, "installed": installed, "venv_mb": round(size / 1e6, 1), "collected": collected,
            "downloaded_mb": round(downloaded, 1), "last": readable(last)[:200]}


AGENT_DIR = "agent"  # under the workdir: agent/<hash[:16]>/, the cached copy of the agent's bundle


DOWNLOADED = LazyPattern(r"^Downloading \S+ \(([0-9.]+) (kB|MB|GB)\)", lambda text: text.startswith("Downloading "))


def op_settle(h: Host) -> Result:
    """Wait until no other agent on this workdir is in an operation that changes what runs (one an `up` killed
    mid-call left going finishes it first), at most `timeout` seconds."""
    fd = workdir_lock(h.layout, time.time() + float(h.args.get("timeout", 600)))
    if fd is None:
        return {"ok": False, "error": "another primectl agent is still changing this host"}
    os.close(fd)
    return {"ok": True}


OPS: dict[str, Op] = {name[3:]: fn for name, fn in list(globals().items()) if name.startswith("op_")}


# Operations that change what runs: one at a time per workdir, so that a run that takes over from a killed one
# (`settle`) sees the end of the dead run's last call, not a service that call is about to start.
CHANGING = frozenset({"stage", "switch", "secrets", "activate", "start", "start_wait", "reload", "stop",
                      "write_state", "spawn", "kill"})


def workdir_lock(layout: Layout, deadline: float | None = None) -> int | None:
    """An exclusive flock on the workdir's run/agent.lock, held until its descriptor is closed: waits for it
    (with `deadline`, until then; None when it is still held elsewhere)."""
    import fcntl

    os.makedirs(layout.path("run"), exist_ok=True)
    fd = os.open(layout.path("run", "agent.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
            return fd
        except BlockingIOError:
            if deadline is None or time.time() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.2)


def dispatch(op: str, args: dict[str, Any], supervisor: Supervisor | None = None,
             prober: Callable[[str, ProbeSpec, str], tuple[bool, str]] | None = None,
             emit: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """Run one operation; every failure becomes an error result, never a traceback. `emit` gets its progress lines."""
    try:
        fn = OPS[op]
    except KeyError:
        return {"ok": False, "code": 1, "error": f"unknown agent operation {op!r}"}
    try:
        host = Host(args, supervisor, prober, emit)
        fd = workdir_lock(host.layout) if op in CHANGING else None
        try:
            result: dict[str, Any] = dict(fn(host))
        finally:
            if fd is not None:
                os.close(fd)
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    result.setdefault("code", 0 if result.get("ok") else 1)
    return result


def write_line(obj: Any, *, flush: bool = True) -> None:
    """One JSON line on stdout, sent at once (progress lines must not wait in a buffer), or with the next line
    that is (`flush=False`)."""
    sys.stdout.write(json_dumps(obj) + "\n")
    if flush:
        sys.stdout.flush()


def serve(first: str = "") -> int:
    """Session mode: one `{"op": ..., "args": ...}` JSON line in, progress lines and one result line out, until EOF
    (`first`: the request that came with the session, read by the loader)."""
    def lines() -> Iterator[str]:
        yield first
        yield from sys.stdin

    for line in lines():
        if line.strip():
            request = json_loads(line)
            reap_exited()  # what this session started and has ended since the last request
            write_line(dispatch(request["op"], request["args"], emit=write_line))
    return 0


def main(argv: list[str]) -> int:
    """Dispatch `<op> <json>` and print its progress lines and one JSON result, or `serve` a session."""
    if argv[1] == "serve":
        return serve(argv[2] if len(argv) > 2 else "")
    result = dispatch(argv[1], json_loads(argv[2]), emit=write_line)
    sys.stdout.write(json_dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result.get("ok") else int(result.get("code", 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Host-side agent: every operation primectl performs on a host, in one stdlib-only script.

primectl sends this source with the command, so nothing has to be installed on
a host first. Over SSH it runs as `python3 -I -S -c <source> serve`, one session
per connection: a JSON request line in, a JSON result line out, one round trip
per operation. Locally it runs as `... <op> <json-args>` and prints one JSON
result. Result codes: 0 ok, 1 failed (message in the JSON), 3 a service exited
while we waited, 4 timed out.

Layout under the workdir: releases/<revision>/, current -> releases/<revision>,
state.json (written atomically), logs/<service>.log, run/<service>.pid
("pid starttime" so a reused pid is never mistaken for the service),
lock/owner.json, secrets/<deployment>.env (0600), incoming/ (uploads).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from typing import Any

KEEP_RELEASES = 5


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _starttime(pid: int) -> str | None:
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


def _pidfile(workdir: str, name: str) -> str:
    return os.path.join(workdir, "run", f"{name}.pid")


def _proc_alive(workdir: str, name: str) -> int | None:
    """The service's pid if the recorded process is still the one we started."""
    try:
        with open(_pidfile(workdir, name)) as f:
            pid_s, start = f.read().split()
    except (OSError, ValueError):
        return None
    pid = int(pid_s)
    return pid if _starttime(pid) == start else None


def _systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True)


def _alive(a: dict[str, Any], name: str, unit: str) -> int | None:
    if a["supervisor"] == "systemd":
        if _systemctl("is-active", "--quiet", f"{unit}.service").returncode != 0:
            return None
        out = _systemctl("show", "-p", "MainPID", "--value", f"{unit}.service").stdout.strip()
        return int(out or 0) or 1
    return _proc_alive(a["workdir"], name)


def op_inspect(a: dict[str, Any]) -> dict[str, Any]:
    """State, current revision, lock and liveness of every recorded service."""
    wd = a["workdir"]
    state = _read_json(os.path.join(wd, "state.json"))
    current = None
    link = os.path.join(wd, "current")
    if os.path.islink(link):
        current = os.path.basename(os.readlink(link))
    services = {}
    names = set(a.get("services", {}))
    if state:
        names |= set(state.get("services", {}))
    for name in sorted(names):
        unit = a.get("services", {}).get(name) or (state or {}).get("services", {}).get(name, {}).get("unit", name)
        pid = _alive(a, name, unit)
        services[name] = {"alive": pid is not None, "pid": pid}
    try:
        os.makedirs(wd, exist_ok=True)
        probe = os.path.join(wd, f".primectl-write-test.{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.unlink(probe)
    except OSError as exc:
        return {"ok": False, "error": f"workdir {wd} is not writable: {exc.strerror}"}
    lock = _read_json(os.path.join(wd, "lock", "owner.json"))
    releases = sorted(os.listdir(os.path.join(wd, "releases"))) if os.path.isdir(os.path.join(wd, "releases")) else []
    taken = op_ports(a)["taken"] if a.get("ports") else []
    return {"ok": True, "state": state, "current": current, "services": services, "lock": lock, "taken": taken,
            "releases": releases, "time": time.time()}


def op_ports(a: dict[str, Any]) -> dict[str, Any]:
    """Which of the given ports something already accepts connections on."""
    taken = []
    for port in a["ports"]:
        s = socket.socket()
        s.settimeout(0.3)
        try:
            if s.connect_ex((a["address"], port)) == 0:
                taken.append(port)
        finally:
            s.close()
    return {"ok": not taken, "taken": taken}


def op_lock(a: dict[str, Any]) -> dict[str, Any]:
    """Take the cluster lock, or say who holds it; `force` breaks a lock."""
    d = os.path.join(a["workdir"], "lock")
    os.makedirs(a["workdir"], exist_ok=True)
    if a.get("force"):
        shutil.rmtree(d, ignore_errors=True)
    try:
        os.mkdir(d)
    except FileExistsError:
        owner = _read_json(os.path.join(d, "owner.json")) or {}
        stale = owner.get("expires", 0) < time.time()
        return {"ok": False, "owner": owner, "stale": stale}
    _write_atomic(os.path.join(d, "owner.json"), json.dumps(a["owner"]).encode())
    return {"ok": True}


def op_unlock(a: dict[str, Any]) -> dict[str, Any]:
    """Release the lock if `token` holds it (or unconditionally with `force`)."""
    d = os.path.join(a["workdir"], "lock")
    owner = _read_json(os.path.join(d, "owner.json")) or {}
    if a.get("force") or owner.get("token") == a.get("token"):
        shutil.rmtree(d, ignore_errors=True)
        return {"ok": True}
    return {"ok": False, "owner": owner}


def op_stage(a: dict[str, Any]) -> dict[str, Any]:
    """Unpack an uploaded bundle into releases/<revision> (atomic rename; idempotent)."""
    wd = a["workdir"]
    rel = os.path.join(wd, "releases", a["revision"])
    archive = os.path.join(wd, "incoming", f"{a['revision']}.tar")
    if os.path.isdir(rel):
        if os.path.exists(archive):
            os.unlink(archive)
        return {"ok": True, "existed": True}
    tmp = f"{rel}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, filter="data")
        else:  # Python without extraction filters (Debian 12's 3.11.2): allow only plain relative files/dirs
            for m in tar.getmembers():
                if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in m.name.split("/"):
                    return {"ok": False, "error": f"refusing to unpack {m.name!r} from {archive}"}
            tar.extractall(tmp)
    os.replace(tmp, rel)
    os.unlink(archive)
    for sub in ("logs", "run", "secrets"):
        os.makedirs(os.path.join(wd, sub), exist_ok=True)
    return {"ok": True, "existed": False}


def op_switch(a: dict[str, Any]) -> dict[str, Any]:
    """Point `current` at a release (atomic symlink swap)."""
    wd = a["workdir"]
    target = os.path.join("releases", a["revision"])
    if not os.path.isdir(os.path.join(wd, target)):
        return {"ok": False, "error": f"release {a['revision']} is not on this host"}
    tmp = os.path.join(wd, f".current.{os.getpid()}")
    os.symlink(target, tmp)
    os.replace(tmp, os.path.join(wd, "current"))
    return {"ok": True}


def op_activate(a: dict[str, Any]) -> dict[str, Any]:
    """Write the secrets file and/or point `current` at a release, in one round trip."""
    if "secrets" in a:
        op_secrets(a | a["secrets"])
    if "revision" in a:
        return op_switch(a)
    return {"ok": True}


def _start_process(wd: str, name: str) -> int:
    script = os.path.join(wd, "current", "bin", f"{name}.sh")
    os.makedirs(os.path.join(wd, "logs"), exist_ok=True)
    os.makedirs(os.path.join(wd, "run"), exist_ok=True)
    with open(os.path.join(wd, "logs", f"{name}.log"), "ab") as log:
        log.write(f"--- primectl: starting {name} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n".encode())
        log.flush()
        proc = subprocess.Popen(
            ["/bin/bash", script], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            cwd=wd, start_new_session=True, close_fds=True,
        )
    start = None
    for _ in range(100):
        start = _starttime(proc.pid)
        if start:
            break
        time.sleep(0.01)
    _write_atomic(_pidfile(wd, name), f"{proc.pid} {start}\n".encode())
    return proc.pid


def _stop_process(wd: str, name: str, timeout: float) -> bool:
    pid = _proc_alive(wd, name)
    if pid is None:
        return False
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.time() + timeout
    while time.time() < deadline and _starttime(pid) is not None:
        time.sleep(0.05)
    if _starttime(pid) is not None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while _starttime(pid) is not None:
            time.sleep(0.05)
    # children that left the group are still ours if they hold the session id
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == pid:
                    os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        os.unlink(_pidfile(wd, name))
    except FileNotFoundError:
        pass
    return True


def _install_unit(wd: str, unit: str) -> None:
    src = os.path.join(wd, "current", "systemd", f"{unit}.service")
    shutil.copyfile(src, f"/etc/systemd/system/{unit}.service")


def op_start(a: dict[str, Any]) -> dict[str, Any]:
    """(Re)start services: stop the running instance first, then start from `current`."""
    wd = a["workdir"]
    started = {}
    if a["supervisor"] == "systemd":
        for svc in a["services"]:
            _install_unit(wd, svc["unit"])
        _systemctl("daemon-reload")
    for svc in a["services"]:
        if a["supervisor"] == "systemd":
            r = _systemctl("restart", f"{svc['unit']}.service")
            if r.returncode != 0:
                return {"ok": False, "error": f"systemctl restart {svc['unit']}: {r.stderr.strip()}", "service": svc["name"]}
            started[svc["name"]] = _alive(a, svc["name"], svc["unit"])
        else:
            _stop_process(wd, svc["name"], svc.get("stop_timeout", 30))
            started[svc["name"]] = _start_process(wd, svc["name"])
    return {"ok": True, "pids": started}


def op_start_wait(a: dict[str, Any]) -> dict[str, Any]:
    """Start services, then wait for their probes, in one round trip."""
    started = op_start(a)
    return op_wait(a) if started.get("ok") else started


def op_stop(a: dict[str, Any]) -> dict[str, Any]:
    """Stop services (SIGTERM to the process group, SIGKILL after the timeout)."""
    stopped = []
    for svc in a["services"]:
        if a["supervisor"] == "systemd":
            _systemctl("stop", f"{svc['unit']}.service")
            if a.get("remove_units"):
                try:
                    os.unlink(f"/etc/systemd/system/{svc['unit']}.service")
                except FileNotFoundError:
                    pass
            stopped.append(svc["name"])
        elif _stop_process(a["workdir"], svc["name"], svc.get("stop_timeout", 30)):
            stopped.append(svc["name"])
    if a["supervisor"] == "systemd" and a.get("remove_units"):
        _systemctl("daemon-reload")
    return {"ok": True, "stopped": stopped}


RELEASE_MARK = "@release@"


def _probe_once(p: dict[str, Any], workdir: str = "") -> tuple[bool, str]:
    kind = p["kind"]
    try:
        if kind == "http":
            import urllib.error  # here, not at the top: it is a third of the agent's start-up time
            import urllib.request

            try:
                with urllib.request.urlopen(p["url"], timeout=3) as resp:
                    status = resp.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            return status == p.get("expect_status", 200), f"HTTP {status}"
        if kind == "tcp":
            with socket.create_connection((p["host"], p["port"]), timeout=3):
                return True, f"tcp {p['host']}:{p['port']} open"
        release = os.path.realpath(os.path.join(workdir, "current"))
        command = [c.replace(RELEASE_MARK, release) for c in p["command"]]
        r = subprocess.run(command, capture_output=True, text=True, timeout=30)
        text = r.stdout if r.returncode == 0 and r.stdout.strip() else r.stderr or r.stdout
        last = text.strip().splitlines()[-1:] or [""]
        return r.returncode == 0, f"exit {r.returncode}: {last[0][:120]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{kind} probe: {exc}"


def op_wait(a: dict[str, Any]) -> dict[str, Any]:
    """Wait until every probe passes; fail fast if a watched service exits."""
    pending = {w["name"]: w for w in a["waits"]}
    # A service just started is rarely ready on the first try: retry soon (0.05 s) and grow the wait
    # 1.5x per miss up to interval_s. Doubling overshot readiness by up to the last wait (a service
    # ready at 0.8 s was seen at 1.55 s); 1.5x bounds that at a third, for a few more cheap probes.
    cap = {n: max(0.05, float(w["probe"].get("interval_s", 0.5))) for n, w in pending.items()}
    delay: dict[str, float] = {n: 0.05 for n in pending}
    next_try = {n: 0.0 for n in pending}
    started = time.time()
    detail: dict[str, str] = {}
    ready: list[str] = []
    while pending:
        now = time.time()
        for name, w in list(pending.items()):
            if w.get("unit") and _alive(a, name, w["unit"]) is None:
                return {"ok": False, "code": 3, "service": name, "ready": ready,
                        "error": f"{name} exited before it became ready"}
            if now < next_try[name]:
                continue
            ok, detail[name] = _probe_once(w["probe"], a["workdir"])
            if ok:
                ready.append(name)
                del pending[name]
                continue
            if now - started > w["probe"].get("timeout_s", 60):
                return {"ok": False, "code": 4, "service": name, "ready": ready,
                        "error": f"{name} not ready after {w['probe'].get('timeout_s', 60):g}s ({detail[name]})"}
            next_try[name] = now + delay[name]
            delay[name] = min(delay[name] * 1.5, cap[name])
        if pending:
            time.sleep(0.05)
    return {"ok": True, "ready": ready, "seconds": round(time.time() - started, 3)}


def op_probe(a: dict[str, Any]) -> dict[str, Any]:
    """Run each probe once (for `status`)."""
    results = {}
    for w in a["probes"]:
        ok, detail = _probe_once(w["probe"], a["workdir"])
        results[w["name"]] = {"ok": ok, "detail": detail}
    return {"ok": True, "results": results}


def op_write_state(a: dict[str, Any]) -> dict[str, Any]:
    """Record what runs here, then drop releases nothing refers to (keeping the last few)."""
    wd = a["workdir"]
    _write_atomic(os.path.join(wd, "state.json"), (json.dumps(a["state"], indent=2, sort_keys=True) + "\n").encode())
    rel_dir = os.path.join(wd, "releases")
    keep = {a["state"].get("revision"), a["state"].get("previous_revision")}
    keep |= {s.get("release") for s in a["state"].get("services", {}).values()}
    if os.path.isdir(rel_dir):
        releases = sorted(os.listdir(rel_dir), key=lambda r: os.path.getmtime(os.path.join(rel_dir, r)))
        for r in releases[:-KEEP_RELEASES]:
            if r not in keep:
                shutil.rmtree(os.path.join(rel_dir, r), ignore_errors=True)
    return {"ok": True}


def op_secrets(a: dict[str, Any]) -> dict[str, Any]:
    """Write the deployment's secrets env file with mode 0600 (content never echoed)."""
    d = os.path.join(a["workdir"], "secrets")
    os.makedirs(d, mode=0o700, exist_ok=True)
    _write_atomic(os.path.join(d, f"{a['deployment']}.env"), a["content"].encode(), 0o600)
    return {"ok": True}


def op_tail(a: dict[str, Any]) -> dict[str, Any]:
    """The last lines of each named service's log."""
    out = {}
    for name in a["services"]:
        path = os.path.join(a["workdir"], "logs", f"{name}.log")
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 65536))
                lines = f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        out[name] = "\n".join(line[:400] + (" [...]" if len(line) > 400 else "") for line in lines[-a.get("lines", 40) :])
    return {"ok": True, "logs": out}


def op_purge(a: dict[str, Any]) -> dict[str, Any]:
    """Remove everything primectl put under the workdir."""
    wd = a["workdir"]
    for sub in ("releases", "current", "state.json", "logs", "run", "secrets", "incoming", "lock", "data", "discovery"):
        path = os.path.join(wd, sub)
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
    return {"ok": True}


OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    name[3:]: fn for name, fn in globals().items() if name.startswith("op_")
}


def _dispatch(op: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return OPS[op](args)
    except Exception as exc:  # report, never traceback, to the controller
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def serve() -> int:
    """Session mode: one `{"op": ..., "args": ...}` JSON line in, one result line out, until EOF."""
    for line in sys.stdin:
        if line.strip():
            request = json.loads(line)
            result = _dispatch(request["op"], request["args"])
            result.setdefault("code", 0 if result.get("ok") else 1)
            sys.stdout.write(json.dumps(result) + "\n")
            sys.stdout.flush()
    return 0


def main(argv: list[str]) -> int:
    """Dispatch `<op> <json>` and print one JSON result, or `serve` a session."""
    if argv[1] == "serve":
        return serve()
    result = _dispatch(argv[1], json.loads(argv[2]))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    if result.get("ok"):
        return 0
    return int(result.get("code", 1))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

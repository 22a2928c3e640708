"""`primectl smoke` against the real demo (Dynamo frontend + KV router, mocker workers, Mooncake master).

A copy of recipes/demo.yaml gets its own workdir under tmp_path and its own ports. The host
runtime is PRIMECTL_RUNTIME_PYTHON when set, otherwise primectl provisions one (~50 s cold).
The healthy demo must pass every applicable check (tool checks: n/a on the mocker); then the
demo is broken twice, by killing processes by the pids primectl recorded, and smoke must fail
naming what broke. Run inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && \
        PRIMECTL_RUNTIME_PYTHON=/opt/primectl-runtime-test/bin/python .venv/bin/pytest tests/integration/test_demo_smoke.py -q'
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import cliproc

from .sshhosts import isolated_netns

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
FRONTEND_PORT = 31000
PORTS = {
    "response_stream": 31004, "etcd_client": 31002, "etcd_peer": 31003, "worker_system": 31010, "tcp_rpc": 31020,
    "bootstrap": 31030, "kv_events": 31040, "mooncake_rpc": 31050, "mooncake_metadata": 31051,
    "mooncake_metrics": 31052, "nixl_side_channel": 31060, "dp_rpc": 31070,
    "frontend_replica": 31090,
}
LOST_GRACE_S = 45
HINT = ("run inside a loopback-only network namespace: unshare --net -- sh -c 'ip link set lo up && "
        "PRIMECTL_RUNTIME_PYTHON=... .venv/bin/pytest tests/integration/test_demo_smoke.py -q'")


def _only_loopback() -> bool:
    """True inside a private network namespace with only `lo` (/sys/class/net may still show the host's), apart
    from links this test session made there itself: the nspawn hosts' bridge and veths stay up for the session,
    and under pytest-xdist the worker that runs this module may have booted them first."""
    return isolated_netns()


def _cmd(*args: str | os.PathLike[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return cliproc.primectl(*args, timeout=timeout)


def processes_in(workdir: Path) -> list[tuple[int, str]]:
    """Processes whose working directory or command line is inside `workdir`."""
    found = []
    prefix = str(workdir)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd == prefix or cwd.startswith(prefix + "/") or prefix + "/" in cmdline:
            found.append((int(entry), cmdline.strip()[:160]))
    return found


@dataclass
class Demo:
    """The running demo: its recipe copy and workdir."""

    recipe: Path
    workdir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{FRONTEND_PORT}"

    def pid(self, service: str) -> int:
        """The recorded pid of a running service (checked to live in this workdir)."""
        pid = int((self.workdir / "run" / f"{service}.pid").read_text().split()[0])
        assert os.readlink(f"/proc/{pid}/cwd") == str(self.workdir), f"{service} pid {pid} not in {self.workdir}"
        return pid

    def kill(self, *services: str) -> None:
        """SIGKILL services by their recorded pids and wait until they are gone (a crash, not a clean stop)."""
        pids = [self.pid(s) for s in services]
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids):
            assert time.monotonic() < deadline, f"{services} still alive"
            time.sleep(0.05)

    def restore(self) -> None:
        """`up --no-smoke` restarts whatever is dead; then the gate must be 200 again."""
        r = _cmd("up", self.recipe, "--no-smoke")
        assert r.returncode == 0, f"up failed:\n{r.stdout}\n{r.stderr}"
        assert _gate(self.url) == 200

    def smoke(self, tmp: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], str]:
        """`primectl smoke RECIPE -o json --junit FILE`: the process, the JSON document, the JUnit text."""
        junit = tmp / f"smoke-{time.monotonic_ns()}.xml"
        r = _cmd("smoke", self.recipe, "-o", "json", "--junit", junit, timeout=240)
        assert r.returncode in (0, 1), f"smoke crashed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        return r, json.loads(r.stdout), junit.read_text()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gate(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/v1/models/demo/ready", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _listed(demo: Demo, worker: str) -> bool:
    """Whether the frontend's worker listing (/health, read from the discovery store) still holds `worker`."""
    from primectl.planner.build import plan_recipe

    plan = plan_recipe(demo.recipe)[1]
    listed_as = plan.service(worker).listed_as
    assert listed_as, f"{worker} has no listing text"
    try:  # the frontend's own /health: through the balancer it is unreadable while the model is not ready
        with urllib.request.urlopen(plan.worker_listing_url, timeout=5) as resp:
            return listed_as.encode() in resp.read()
    except (OSError, urllib.error.HTTPError):
        return True  # unreadable: not known to be gone


@contextmanager
def demo_up(tmp: Path, doc: dict[str, Any], name: str, port: int, ports: dict[str, int], runtime_env: str,
            up_timeout: float, down_timeout: float = 300) -> Iterator[tuple[Path, Path]]:
    """`doc` as its own deployment under tmp (name, workdir, ports; the runtime from $runtime_env when set), up
    with no smoke; yields (recipe, workdir). Then `down`, and no process of that workdir left (killed by pid)."""
    if not _only_loopback() and os.environ.get("PRIMECTL_ALLOW_HOST_NET") != "1":
        pytest.fail(HINT, pytrace=False)
    workdir = tmp / "wd"
    doc["name"] = doc["namespace"] = name
    doc["hosts"][0]["workdir"] = str(workdir)
    doc["frontend"]["port"] = port
    doc["ports"] = ports
    python = os.environ.get(runtime_env)
    if python:
        doc.setdefault("software", {})["python"] = python
    recipe = tmp / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        up = _cmd("up", recipe, "--no-smoke", timeout=up_timeout)
        assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
        yield recipe, workdir
    finally:
        down = _cmd("down", recipe, "--break-lock", timeout=down_timeout)
        left = processes_in(workdir)
        for pid, _ in left:  # safety net, by pid, only processes of this workdir
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert down.returncode == 0, f"down failed:\n{down.stdout}\n{down.stderr}"
        assert not left, f"processes left in {workdir} after down: {left}"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The demo recipe, up (no smoke), in its own workdir and ports; `down` and no leftovers afterwards."""
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    # room for status, smoke and diff to see a lost worker before its listing watch ends it (30 s by default)
    doc["control_plane"]["lost_worker_grace_s"] = LOST_GRACE_S
    with demo_up(tmp_path_factory.mktemp("demo-smoke"), doc, "smoke-demo", FRONTEND_PORT, PORTS,
                 "PRIMECTL_RUNTIME_PYTHON", up_timeout=600) as (recipe, workdir):
        yield Demo(recipe, workdir)


def _by_result(doc: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in doc["checks"]:
        out.setdefault(c["result"], []).append(c["check"])
    return out


def _failures(doc: dict[str, Any]) -> str:
    return "\n".join(f"{c['check']}: {c['evidence']}" for c in doc["checks"] if c["result"] == "fail")


WORKERS_CHECK = "workers: every prefill and decode worker answers on its metrics port"
UNREACHABLE = re.compile(r"\b(prefill|decode) worker (\S+) metrics \S+ unreachable")


def _check(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in doc["checks"] if c["check"] == name)


def _unreachable(text: str) -> list[tuple[str, str]]:
    """(role, service) of each worker the smoke test says it could not reach.

    Not a role named anywhere in the failures: the workers check's own name holds both roles."""
    return UNREACHABLE.findall(text)


def test_smoke_passes_on_the_healthy_demo(demo: Demo, tmp_path: Path) -> None:
    r, doc, junit = demo.smoke(tmp_path)
    assert r.returncode == 0, f"smoke failed on the healthy demo:\n{_failures(doc)}\n{r.stderr}"
    assert doc["ok"] is True and doc["engine"] == "mocker"
    checks = {c["check"]: c for c in doc["checks"]}
    tools = [n for n in checks if n.startswith("tools: ")]
    assert len(tools) >= 7
    assert all(checks[n]["result"] == "n/a" and checks[n]["evidence"] == "n/a (engine mocker serves no tool calls)"
               for n in tools)
    # the frontend refuses a prompt over the context limit itself, naming it (the mocker's token-budget bridge
    # publishes the limit; before, the mocker's admission control answered 500 and smoke only warned)
    over = checks["prompt over context limit -> 4xx"]
    limit = yaml.safe_load(demo.recipe.read_text())["model"]["max_context"]
    assert over["result"] == "pass" and "HTTP 400" in over["evidence"] and f'"limit": {limit}' in over["evidence"], over
    applicable = [n for n in checks if n not in tools]
    assert all(checks[n]["result"] == "pass" for n in applicable), _by_result(doc)
    assert "prefill-0 +" in checks["disaggregation: prefill and decode workers both served"]["evidence"]
    assert 'failures="0"' in junit and junit.count("<testcase") == len(doc["checks"])


def test_a_worker_the_frontend_lost_is_named_then_ends_itself_and_up_brings_it_back(demo: Demo, tmp_path: Path) -> None:
    """A worker stalled past Dynamo's file-store TTL (10 s: a busy disk, a paused VM; here SIGSTOP) loses its
    discovery entry to the other processes, and once it runs again it never writes it back: it answers its own
    /health while the frontend routes nothing to it. `status` and `smoke` must name it and `diff` plan its
    restart; within control_plane.lost_worker_grace_s its listing watch ends it, as etcd's lease loss would,
    and `up` starts it again."""
    demo.restore()
    pid = demo.pid("prefill-0")
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 45
        # both the router's view (the gate) and the store (the listing): on a busy machine the frontend can drop
        # the worker from routing before any process deletes its expired file, and a worker resumed before that
        # re-touches the file and is listed again
        while _gate(demo.url) == 200 or _listed(demo, "prefill-0"):
            assert time.monotonic() < deadline, "the frontend still lists a worker stopped for 45 s"
            time.sleep(0.5)
        dropped = time.monotonic()
    finally:
        os.kill(pid, signal.SIGCONT)
    time.sleep(4)  # running again, past a keep-alive round (ttl/3): still gone
    assert _gate(demo.url) == 503
    status = _cmd("status", demo.recipe, "-o", "json")
    assert status.returncode == 1, status.stdout
    rows = {r["service"]: r for r in json.loads(status.stdout)["services"]}
    lost = rows["prefill-0"]
    assert lost["running"] and not lost["ready"] and lost["pid"] == pid, lost
    assert "the frontend does not list it: its discovery registration is gone" in lost["detail"], lost
    # the endpoint is not ready either: the balancer's readiness is the model's, through it
    assert not rows["balancer"]["ready"] and "503" in rows["balancer"]["detail"], rows["balancer"]
    assert all(r["healthy"] for name, r in rows.items() if name not in ("prefill-0", "balancer")), rows
    r, doc, _ = demo.smoke(tmp_path)
    listed = _check(doc, "workers: the frontend lists every prefill and decode worker")
    assert r.returncode == 1 and listed["result"] == "fail", _failures(doc)
    assert listed["evidence"].startswith("prefill-0: the frontend does not list it"), listed
    diff = _cmd("diff", demo.recipe)
    assert diff.returncode == 3, diff.stdout + diff.stderr
    line = next(ln for ln in diff.stdout.splitlines() if " prefill-0 " in ln)
    assert "restart" in line and "the frontend does not list it" in line, diff.stdout
    assert "1 to change" in diff.stdout, diff.stdout
    assert time.monotonic() - dropped < LOST_GRACE_S, "too slow to see the lost worker before its watch acts"
    # its listing watch ends it (SIGKILL: a failure, which systemd restarts), grace after it saw it unlisted
    deadline = dropped + LOST_GRACE_S + 30
    while _alive(pid):
        assert time.monotonic() < deadline, f"prefill-0 (pid {pid}) still runs, unlisted, {LOST_GRACE_S}s on"
        time.sleep(0.5)
    log = (demo.workdir / "logs" / "prefill-0.log").read_text()
    assert "primectl worker_watch: the frontend" in log and f"ending pid {pid} so that it starts again" in log
    status = _cmd("status", demo.recipe, "-o", "json")
    row = next(r for r in json.loads(status.stdout)["services"] if r["service"] == "prefill-0")
    assert status.returncode == 1 and not row["running"], row
    up = _cmd("up", demo.recipe, "--no-smoke")
    assert up.returncode == 0, up.stdout + up.stderr
    assert demo.pid("prefill-0") != pid
    assert _gate(demo.url) == 200
    assert _cmd("status", demo.recipe).returncode == 0
    again = _cmd("diff", demo.recipe)
    assert again.returncode == 0 and "no changes" in again.stdout, again.stdout


def test_smoke_fails_when_the_prefill_worker_dies(demo: Demo, tmp_path: Path) -> None:
    demo.restore()
    demo.kill("prefill-0")
    r, doc, junit = demo.smoke(tmp_path)
    assert r.returncode == 1, doc
    workers = _check(doc, WORKERS_CHECK)
    assert workers["result"] == "fail", _failures(doc)
    assert _unreachable(workers["evidence"]) == [("prefill", "prefill-0")], workers["evidence"]
    # once discovery drops the worker, the gate itself names it
    deadline = time.monotonic() + 30
    while _gate(demo.url) == 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    r, doc, junit = demo.smoke(tmp_path)
    assert r.returncode == 1
    gate = doc["checks"][0]
    assert gate["result"] == "fail" and "503" in gate["evidence"] and "MISSING worker types: prefill" in gate["evidence"]
    assert "<failure" in junit
    table = _cmd("smoke", demo.recipe)
    assert table.returncode == 1 and "FAILED" in table.stdout
    row = next(line for line in table.stdout.splitlines() if line.startswith(WORKERS_CHECK))
    assert " fail " in row and _unreachable(row) == [("prefill", "prefill-0")], row


def test_smoke_fails_when_both_decode_workers_die(demo: Demo, tmp_path: Path) -> None:
    demo.restore()
    demo.kill("decode-0", "decode-1")
    r, doc, _ = demo.smoke(tmp_path)
    assert r.returncode == 1, doc
    both = [("decode", "decode-0"), ("decode", "decode-1")]
    workers = _check(doc, WORKERS_CHECK)
    assert workers["result"] == "fail" and _unreachable(workers["evidence"]) == both, _failures(doc)
    deadline = time.monotonic() + 30
    while _gate(demo.url) == 200 and time.monotonic() < deadline:
        time.sleep(0.5)
    r, doc, _ = demo.smoke(tmp_path)
    assert r.returncode == 1
    workers = _check(doc, WORKERS_CHECK)
    assert workers["result"] == "fail" and _unreachable(workers["evidence"]) == both, _failures(doc)
    demo.restore()  # leave it healthy for whatever runs next

"""The demo with monitoring, for real (issue 40): Prometheus, Alertmanager, node_exporter and the health loop.

A copy of recipes/demo-monitoring.yaml (ports and workdir of its own; Alertmanager's webhook pointed at a receiver
in this process) goes `up` with the process supervisor. Then, as an operator would see it:

- Prometheus scrapes every service of the plan that has a metrics URL, each up, labelled with its service;
- `primectl alerts` says nothing fires (exit 0) and prints where Prometheus and Alertmanager answer;
- decode-1 SIGKILLed: the webhook gets WorkersBelowPlan for decode (decode-1's own TargetDown, which it explains,
  is inhibited); `alerts` lists both, TargetDown with its runbook line (exit 1), and `status` marks decode-1 with
  it; `up` starts decode-1 again and the webhook gets the resolution;
- a change that restarts every decode worker silences their alerts while it runs, sends no notification, and
  leaves no silence in force once Prometheus has seen them up again;
- `down` stops every process it started.

Run inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python .venv/bin/pytest tests/integration/test_monitoring_demo.py -q'
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.bench.webhook import Receiver
from tests import cliproc

from .sshhosts import netns_problem, processes_under

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
RUN = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python "
       ".venv/bin/pytest tests/integration/test_monitoring_demo.py -q'")
# ports of its own: the suite runs other demos beside it
PORTS = {"etcd_client": 31379, "etcd_peer": 31380, "mooncake_rpc": 31051, "mooncake_metadata": 31060,
         "mooncake_metrics": 31003, "worker_system": 31081, "kv_events": 31180, "nixl_side_channel": 31600,
         "dp_rpc": 31550, "tp_master": 31501, "bootstrap": 31998, "response_stream": 31300,
         "frontend_replica": 31100, "tcp_rpc": 31400}
MONITORING_PORTS = {"prometheus": 31090, "alertmanager": 31093, "node_exporter": 31200, "balancer": 31404}
PROMETHEUS = f"http://127.0.0.1:{MONITORING_PORTS['prometheus']}"


def cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return cliproc.primectl(*args, timeout=timeout)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


class Demo:
    def __init__(self, tmp: Path, webhook: str):
        doc = yaml.safe_load((REPO / "recipes" / "demo-monitoring.yaml").read_text())
        doc.update(extends=str(REPO / "recipes" / "demo.yaml"), name="mon-it", ports=PORTS,
                   frontend={"port": 31000})
        doc["hosts"][0]["workdir"] = str(tmp / "workdir")
        doc["monitoring"]["alerts"]["webhook"] = webhook
        doc["monitoring"]["ports"] = MONITORING_PORTS
        doc.setdefault("software", {})["python"] = os.environ["PRIMECTL_RUNTIME_PYTHON"]
        self.doc = doc
        self.recipe = tmp / "recipe.yaml"
        self.workdir = tmp / "workdir"
        self.write()

    def write(self) -> None:
        self.recipe.write_text(yaml.safe_dump(self.doc, sort_keys=False))

    def pid(self, service: str) -> int:
        return int((self.workdir / "run" / f"{service}.pid").read_text().split()[0])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Demo, Receiver]]:
    problem = netns_problem(RUN)
    if problem:
        pytest.fail(problem)
    if not os.environ.get("PRIMECTL_RUNTIME_PYTHON"):
        pytest.fail("PRIMECTL_RUNTIME_PYTHON must name the host runtime's python (make test sets it)")
    rx = Receiver().start()
    d = Demo(tmp_path_factory.mktemp("monitoring"), rx.url)
    try:
        r = cli("up", d.recipe, "--skip-preflight", timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"prometheus {PROMETHEUS}" in r.stdout + r.stderr
        yield d, rx
    finally:
        cli("down", d.recipe)
        rx.stop()
        left = processes_under(d.workdir)
        for pid, _ in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"down left processes: {left}"


def wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.5)
    pytest.fail(f"not within {timeout:.0f} s: {what}")


def test_prometheus_scrapes_every_planned_service_with_metrics(demo: tuple[Demo, Receiver]) -> None:
    d, _ = demo
    plan = json.loads(cli("plan", d.recipe, "-o", "json").stdout)
    want = {s["name"] for s in plan["services"] if s.get("metrics_url")}
    assert {"frontend", "decode-0", "decode-1", "prefill-0", "mooncake-master", "balancer", "node-exporter-local",
            "prometheus", "alertmanager"} <= want

    def all_up() -> set[str] | None:
        targets = get(f"{PROMETHEUS}/api/v1/targets")["data"]["activeTargets"]
        up = {t["labels"]["service"] for t in targets if t["health"] == "up"}
        return up if up == want else None

    wait(all_up, 60, f"every one of {sorted(want)} scraped up")
    r = wait(lambda: (x := cli("alerts", d.recipe)).returncode == 0 and x, 60, "`alerts` to say nothing fires")
    assert "no alerts firing" in r.stdout and PROMETHEUS in r.stdout


def test_a_killed_worker_pages_shows_in_alerts_and_status_and_its_repair_resolves(
        demo: tuple[Demo, Receiver]) -> None:
    d, rx = demo
    t0 = time.monotonic()
    os.kill(d.pid("decode-1"), signal.SIGKILL)
    # the role's WorkersBelowPlan pages; decode-1's own TargetDown is held back by it (inhibited), not lost
    fired = rx.wait_for(t0, 40, status="firing", alert="WorkersBelowPlan", labels={"role": "decode"})
    assert fired is not None, [n.alert for n in rx.since(t0)]

    def target_down() -> tuple[subprocess.CompletedProcess[str], str] | None:
        # its own rule, evaluated in its own turn: it may fire an evaluation after WorkersBelowPlan
        r = cli("alerts", d.recipe)
        rows = [line for line in r.stdout.splitlines() if line.startswith("TargetDown")]
        return (r, rows[0]) if rows else None

    r, row = wait(target_down, 30, "`alerts` to list decode-1's TargetDown")
    assert r.returncode == 1
    assert "decode-1" in row and "(inhibited)" in row and "primectl" in row  # the runbook line says what to run
    st = json.loads(cli("status", d.recipe, "-o", "json").stdout)
    assert "TargetDown" in st["alerts"]["decode-1"]
    t1 = time.monotonic()
    assert cli("up", d.recipe, "--skip-preflight").returncode == 0
    assert rx.wait_for(t1, 60, status="resolved", alert="WorkersBelowPlan", labels={"role": "decode"}) is not None
    wait(lambda: cli("alerts", d.recipe).returncode == 0, 60, "`alerts` to say nothing fires after the repair")


def test_a_change_that_restarts_workers_sends_no_notification(demo: tuple[Demo, Receiver]) -> None:
    d, rx = demo
    wait(lambda: cli("alerts", d.recipe).returncode == 0, 60, "nothing firing before the change")
    am = f"http://127.0.0.1:{MONITORING_PORTS['alertmanager']}"
    seen: list[str] = []  # the matchers of the silences in force while the change runs
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for s in get(f"{am}/api/v2/silences"):
                if s["status"]["state"] == "active" and s["createdBy"] == "primectl:mon-it":
                    seen.append(" ".join(f"{m['name']}={m['value']}" for m in s["matchers"]))
            time.sleep(0.3)

    t0 = time.monotonic()
    d.doc["decode"] = {**d.doc.get("decode", {}), "max_num_seqs": 32}
    d.write()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = cli("up", d.recipe, "--skip-preflight", timeout=600)
    finally:
        done.set()
        watcher.join()
    assert r.returncode == 0, r.stdout[-3000:]
    assert "decode-0" in r.stdout + r.stderr  # it did restart the decode workers
    assert any("decode-0" in m and "decode-1" in m for m in seen), seen  # silenced while it ran
    time.sleep(25)  # past the silence's end: Prometheus has seen them up again, rules evaluated twice
    assert rx.since(t0) == [], [(n.status, n.alert, n.labels.get("service")) for n in rx.since(t0)]
    # what stays is the model's migrations, silenced for the alert's 5-minute window (requests the change moved)
    active = [" ".join(sorted(f"{m['name']}={m['value']}" for m in s["matchers"]))
              for s in get(f"{am}/api/v2/silences") if s["status"]["state"] == "active"]
    assert active == ["alertname=MigrationsRising deployment=mon-it"], active

"""Changes do not page: the silences a change sets in a real Alertmanager 0.25 (primectl/alerting/quiet.py).

Alertmanager runs with primectl's own configuration (alertmanager.py), its webhook pointed at a receiver in this
process; alerts are posted to it as Prometheus would post them. Run inside `unshare --net` (it binds loopback).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from primectl.alerting import alertmanager_api as api
from primectl.alerting import quiet
from primectl.bench.webhook import Receiver
from primectl.deploy.changes import Change
from primectl.monitoring.alertmanager import alertmanager_config
from primectl.monitoring.model import Alerts
from primectl.monitoring.rules import MIGRATION_WINDOW_S
from primectl.plan.model import MonitoringPlan, Plan
from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe
from tests.exposition import free_port

REPO = Path(__file__).resolve().parents[1]
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


@pytest.fixture
def am(tmp_path: Path) -> Iterator[tuple[str, Receiver]]:
    rx = Receiver().start()
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(alertmanager_config(Alerts(webhook=rx.url, group_wait="0s", group_interval="1s"), "demo"))
    log = (tmp_path / "am.log").open("w")
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{base}/-/ready", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "am.log").read_text()
                time.sleep(0.1)
        yield base, rx
    finally:
        proc.terminate()
        proc.wait(10)
        rx.stop()


def monitored_plan(base: str) -> Plan:
    plan = build_plan(load_recipe(REPO / "recipes" / "demo-monitoring.yaml").recipe)
    mon = MonitoringPlan(host="local", prometheus_url="http://127.0.0.1:1", alertmanager_url=base,
                         alertmanager_service="alertmanager", settle_s=2)
    return plan.model_copy(update={"monitoring": mon})


def post(base: str, service: str, *, resolved: bool = False, alert: str = "TargetDown", **labels: str) -> None:
    now = datetime.now(UTC)
    doc: dict[str, Any] = {"labels": {"alertname": alert, "deployment": "demo-monitoring", "service": service,
                                      "severity": "critical", **labels},
                           "startsAt": (now - timedelta(minutes=1)).isoformat()}
    if resolved:
        doc["endsAt"] = now.isoformat()
    req = urllib.request.Request(f"{base}/api/v2/alerts", json.dumps([doc]).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5)


def only_the_control_pages(base: str, rx: Receiver, t0: float) -> None:
    """A TargetDown of prefill-0, which no change here touches, is the control: it, and only it, must page."""
    post(base, "prefill-0")
    assert rx.wait_for(t0, 10, status="firing", service="prefill-0") is not None
    time.sleep(2)
    assert [n.alert for n in rx.since(t0)] == ["TargetDown"]


def touch(*services: str, action: str = "change") -> list[Change]:
    return [Change("local", s, action, "") for s in services]  # type: ignore[arg-type]


def test_a_change_silences_what_it_touches_and_nothing_else(am: tuple[str, Receiver]) -> None:
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    with quiet.quiet_change(plan, touch("decode-0"), lambda _: None, why="test"):
        post(base, "decode-0")
        post(base, "", alert="WorkersBelowPlan", role="decode")
        post(base, "prefill-0")
        assert rx.wait_for(t0, 10, status="firing", service="prefill-0") is not None
        time.sleep(2)
        assert [n.labels.get("service") for n in rx.since(t0)] == ["prefill-0"]


def test_the_silence_ends_soon_after_the_change_even_when_it_fails(am: tuple[str, Receiver]) -> None:
    base, _ = am
    plan = monitored_plan(base)
    with pytest.raises(RuntimeError), quiet.quiet_change(plan, touch("decode-0"), lambda _: None, why="test"):
        # the service, its role's worker count, the readiness gate, the model's migrations
        assert len(api.active_silences(base, quiet.created_by(plan))) == 4
        raise RuntimeError("the rollout failed and rolled back")
    assert plan.monitoring is not None
    time.sleep(plan.monitoring.settle_s + 0.5)
    left = api.active_silences(base, quiet.created_by(plan))
    assert [s.matchers for s in left] == [{"deployment": plan.name, "alertname": "MigrationsRising"}]
    outlasts = (left[0].ends - datetime.now(UTC)).total_seconds()
    assert MIGRATION_WINDOW_S - 10 < outlasts <= MIGRATION_WINDOW_S


def test_requests_a_worker_change_moves_do_not_page_until_the_alerts_window_has_passed(
        am: tuple[str, Receiver]) -> None:
    """Dynamo counts requests drained off a replaced worker as migrations; the alert is the model's, not the
    worker's, and counts them over 5 minutes: after the change only that silence stays, for that long."""
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    with quiet.quiet_change(plan, touch("decode-0"), lambda _: None, why="test"):
        pass
    post(base, "", alert="MigrationsRising", model="demo", migration_type="new_request")
    only_the_control_pages(base, rx, t0)


def test_adding_workers_moves_nothing_and_leaves_migrations_paging(am: tuple[str, Receiver]) -> None:
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    with quiet.quiet_change(plan, touch("decode-1", action="add"), lambda _: None, why="scale up"):
        post(base, "", alert="MigrationsRising", model="demo", migration_type="new_request")
        assert rx.wait_for(t0, 10, status="firing", alert="MigrationsRising") is not None


def test_a_change_of_what_serves_silences_the_readiness_gate(am: tuple[str, Receiver]) -> None:
    """The health loop reports the gate for the deployment (its service label is its node_exporter's), so the
    services' own silence does not cover it: a replaced Slurm job's gate is down while it loads."""
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    with quiet.quiet_change(plan, touch("frontend"), lambda _: None, why="test"):
        post(base, "node-exporter-local", alert="GateNotReady")
        only_the_control_pages(base, rx, t0)


def test_a_change_of_no_worker_leaves_migrations_paging(am: tuple[str, Receiver]) -> None:
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    with quiet.quiet_change(plan, touch("frontend"), lambda _: None, why="test"):
        post(base, "", alert="MigrationsRising", model="demo", migration_type="new_request")
        assert rx.wait_for(t0, 10, status="firing", alert="MigrationsRising") is not None


def test_a_dead_changes_silence_is_lifted_by_the_next(am: tuple[str, Receiver]) -> None:
    base, _ = am
    plan = monitored_plan(base)
    left = api.silence(base, {"deployment": plan.name, "service": "decode-0"}, minutes=60,
                       created_by=quiet.created_by(plan), comment="a controller killed mid-change")
    moved = api.silence(base, {"deployment": plan.name, "alertname": "MigrationsRising"}, minutes=60,
                        created_by=quiet.created_by(plan), comment="a controller killed mid-change")
    said: list[str] = []
    quiet.lift_stale(plan, said.append)
    # the requests it moved still count in the alert's window: that silence ends with the window, not now
    after = api.active_silences(base, quiet.created_by(plan))
    assert [s.id for s in after] == [moved]
    assert (after[0].ends - datetime.now(UTC)).total_seconds() <= MIGRATION_WINDOW_S + 2
    assert any(left in line for line in said)


def test_a_repair_of_a_service_already_paged_about_lets_its_resolution_through(am: tuple[str, Receiver]) -> None:
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    post(base, "decode-1")
    assert rx.wait_for(t0, 10, status="firing", service="decode-1") is not None
    t1 = time.monotonic()
    with quiet.quiet_change(plan, touch("decode-1", action="restart"), lambda _: None, why="repair"):
        post(base, "decode-1", resolved=True)
        assert rx.wait_for(t1, 10, status="resolved", service="decode-1") is not None


def test_a_change_that_starts_alertmanager_itself_sets_no_silence(am: tuple[str, Receiver]) -> None:
    base, _ = am
    plan = monitored_plan(base)
    with quiet.quiet_change(plan, [*touch("decode-0"), *touch("alertmanager", action="add")], lambda _: None,
                            why="first up"):
        assert api.active_silences(base, quiet.created_by(plan)) == []


def test_a_repair_while_migrations_already_page_lets_their_resolution_through(am: tuple[str, Receiver]) -> None:
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    post(base, "", alert="MigrationsRising", model="demo", migration_type="new_request")
    assert rx.wait_for(t0, 10, status="firing", alert="MigrationsRising") is not None
    t1 = time.monotonic()
    with quiet.quiet_change(plan, touch("decode-1", action="restart"), lambda _: None, why="repair"):
        post(base, "", alert="MigrationsRising", model="demo", migration_type="new_request", resolved=True)
        assert rx.wait_for(t1, 10, status="resolved", alert="MigrationsRising") is not None


def test_a_repair_while_its_roles_worker_count_already_fires_lets_that_resolution_through(
        am: tuple[str, Receiver]) -> None:
    """The role-wide alert can fire before the dead worker's own TargetDown does: the repair must not silence it."""
    base, rx = am
    plan = monitored_plan(base)
    t0 = time.monotonic()
    post(base, "", alert="WorkersBelowPlan", role="decode")
    assert rx.wait_for(t0, 10, status="firing", alert="WorkersBelowPlan") is not None
    t1 = time.monotonic()
    with quiet.quiet_change(plan, touch("decode-1", action="restart"), lambda _: None, why="repair"):
        post(base, "", alert="WorkersBelowPlan", role="decode", resolved=True)
        assert rx.wait_for(t1, 10, status="resolved", alert="WorkersBelowPlan") is not None

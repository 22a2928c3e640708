"""A fleet with `monitoring:`, for real (issues 39 and 40): `up` starts Prometheus, Alertmanager, node_exporter and
the health loop for the gateway tier beside its etcd, replicas and edge, and

- Prometheus (2 s scrapes) has every replica's /metrics, the edge's exporter and the gateway's etcd up as targets;
- every process of site a SIGKILLed and a few requests sent through the edge with a key: the shared breaker opens,
  and GatewayBreakerOpen about site a fires in Alertmanager, as `primectl alerts` and `primectl status` say.

Two copies of the demo sites (Dynamo's mocker) on ports of their own. Run inside a loopback-only namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python .venv/bin/pytest tests/integration/test_fleet_monitoring.py -q'
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from primectl.bench.fleet_copy import FleetCopy, write_fleet

from .fleetkit import cli, fleet_up, kill_all

pytestmark = pytest.mark.integration

RUN = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python "
       ".venv/bin/pytest tests/integration/test_fleet_monitoring.py -q'")
EDGE = 19_500
PROMETHEUS = f"http://127.0.0.1:{EDGE + 30}"
NAME = "monfleet"
MONITORING = {"scrape_interval": "2s", "evaluation_interval": "2s", "health_interval": "2s", "retention": "1d",
              "alerts": {"group_wait": "2s", "group_interval": "5s", "repeat_interval": "1h"}}




def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def chat(key: str) -> int:
    """One short chat through the edge: its HTTP status."""
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{EDGE}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)




@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetCopy]:
    copy = write_fleet(tmp_path_factory.mktemp("fleet"), port=EDGE, name=NAME, failures=2, cooldown_s=2.0,
                       monitoring=MONITORING)
    with fleet_up(copy, RUN):
        yield copy


def test_prometheus_scrapes_every_replica_the_edge_and_the_gateways_etcd(fleet: FleetCopy) -> None:
    want = {("fleet-gateway", "gateway-0"), ("fleet-gateway", "gateway-1"), ("haproxy", "edge"),
            ("etcd", "gateway-etcd")}
    health: dict[tuple[str, str], str] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        targets = get(f"{PROMETHEUS}/api/v1/targets?state=active")["data"]["activeTargets"]
        health = {(t["labels"]["job"], t["labels"]["service"]): t["health"] for t in targets}
        if all(health.get(k) == "up" for k in want):
            break
        time.sleep(1)
    assert {k: health.get(k) for k in want} == dict.fromkeys(want, "up"), health
    assert {t["labels"]["deployment"] for t in targets} == {f"{NAME}-gateway"}
    # what the rules read is there: the replicas' breaker gauges name the fleet's deployments
    q = urllib.parse.quote('primectl_gateway_breaker_open{job="fleet-gateway"}')
    series = get(f"{PROMETHEUS}/api/v1/query?query={q}")["data"]["result"]
    assert {(s["metric"]["service"], s["metric"]["exported_deployment"], s["value"][1]) for s in series} == {
        (f"gateway-{i}", f"{NAME}-site-{site}", "0") for i in (0, 1) for site in "ab"}


def test_a_lost_site_opens_its_breaker_and_the_alert_fires(fleet: FleetCopy) -> None:
    made = cli("keys", "create", fleet.recipe, "--team", "ops")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert chat(key) == 200
    kill_all(fleet.workdirs["a"])
    # each request that tries site a fails over to site b: two failures on a replica open the shared breaker
    statuses = [chat(key) for _ in range(12)]
    assert statuses == [200] * 12
    firing: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = cli("alerts", fleet.recipe, "-o", "json")
        assert r.returncode in (0, 1), r.stderr
        firing = json.loads(r.stdout)["firing"]
        if any(a["alert"] == "GatewayBreakerOpen" for a in firing):
            break
        time.sleep(2)
    opened = [a for a in firing if a["alert"] == "GatewayBreakerOpen"]
    assert [a["labels"]["exported_deployment"] for a in opened] == [f"{NAME}-site-a"], firing
    assert opened[0]["severity"] == "warning" and "primectl status" in opened[0]["runbook"]
    assert r.returncode == 1  # something fires
    assert not [a for a in firing if a["alert"] == "GatewayNoDeploymentAvailable"]  # site b still serves
    status = cli("status", fleet.recipe, "-o", "json")
    doc = json.loads(status.stdout)
    assert {"alert": "GatewayBreakerOpen", "about": f"{NAME}-site-a"}.items() <= next(
        a for a in doc["alerts"] if a["alert"] == "GatewayBreakerOpen").items()
    assert doc["monitoring"]["prometheus"] == PROMETHEUS

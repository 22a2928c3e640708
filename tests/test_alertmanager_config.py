"""primectl's Alertmanager configuration, checked by Alertmanager 0.25's own amtool and by a real Alertmanager:
every severity the rules use routes to the `primectl` receiver, the Watchdog to the heartbeat (or nowhere), and
WorkersBelowPlan hides the TargetDowns it explains while other roles' TargetDowns still go out.

The live test binds 127.0.0.1 only (make test runs the suite inside `unshare --net`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from primectl.monitoring import rules
from primectl.monitoring.alertmanager import SEVERITIES, alertmanager_config
from primectl.monitoring.model import Alerts, Slo
from tests.exposition import free_port

AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
pytestmark = pytest.mark.skipif(not Path(AMTOOL).exists(), reason="amtool is not installed (make system)")


def config_file(tmp_path: Path, name: str = "alertmanager.yml", **alerts: Any) -> Path:
    """primectl's alertmanager.yml for deployment x, written to tmp_path/name."""
    path = tmp_path / name
    path.write_text(alertmanager_config(Alerts(webhook="http://127.0.0.1:9099/alerts", **alerts), "x"))
    return path


def route(config: Path, receiver: str, *labels: str) -> subprocess.CompletedProcess[str]:
    """`amtool config routes test --verify.receivers=receiver labels...` (non-zero exit on another receiver)."""
    return subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={config}",
                           f"--verify.receivers={receiver}", *labels], capture_output=True, text=True, timeout=60)


def test_config_loads(tmp_path: Path) -> None:
    result = subprocess.run([AMTOOL, "check-config", str(config_file(tmp_path, heartbeat="http://127.0.0.1:9/hb"))],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_severity_the_rules_use_routes_to_primectl(tmp_path: Path) -> None:
    config = config_file(tmp_path)
    facts = rules.RuleFacts(deployment="x", slo=Slo(), workers={"decode": 1},
                            components=("dynamo-frontend", "dcgm-exporter", "node-exporter", "prometheus",
                                        "alertmanager"), infiniband=True, nvlink_domain=True)
    used = {r["labels"]["severity"] for g in rules.rule_groups(facts) for r in g["rules"]} - {"none"}
    assert used == set(SEVERITIES)
    for severity in SEVERITIES:
        result = route(config, "primectl", f"severity={severity}", "deployment=x", "alertname=TargetDown")
        assert result.returncode == 0, f"{severity}: {result.stdout}{result.stderr}"


def test_routing_to_the_wrong_receiver_is_refused(tmp_path: Path) -> None:
    """The check itself can fail: amtool exits non-zero when the alert goes elsewhere."""
    config = config_file(tmp_path)
    assert route(config, "null", "severity=critical", "deployment=x").returncode != 0
    assert route(config, "primectl", "severity=info", "deployment=x").returncode != 0  # no such severity: nowhere


def test_watchdog_goes_to_the_heartbeat_or_nowhere(tmp_path: Path) -> None:
    with_heartbeat = config_file(tmp_path, "with-heartbeat.yml", heartbeat="http://127.0.0.1:9/hb")
    assert route(with_heartbeat, "heartbeat", "alertname=Watchdog", "severity=none", "deployment=x").returncode == 0
    without = config_file(tmp_path, "without-heartbeat.yml")
    result = route(without, "null", "alertname=Watchdog", "severity=none", "deployment=x")
    assert result.returncode == 0, result.stdout + result.stderr
    assert route(without, "primectl", "alertname=Watchdog", "severity=none", "deployment=x").returncode != 0


class _Receiver(BaseHTTPRequestHandler):
    """Alertmanager's webhook: each POSTed notification's alert names, kept on the server."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.notified += [a["labels"]["alertname"] + "/" + a["labels"].get("role", "")  # type: ignore[attr-defined]
                                 for a in body["alerts"]]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def live_alertmanager(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A real Alertmanager on primectl's configuration, its webhook a local receiver: (API URL, notified)."""
    if not Path(ALERTMANAGER).exists():
        pytest.skip("prometheus-alertmanager is not installed (make system)")
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    hook.notified = []  # type: ignore[attr-defined]
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    config = tmp_path / "alertmanager.yml"
    config.write_text(alertmanager_config(Alerts(webhook=f"http://127.0.0.1:{hook.server_port}/alerts",
                                                 group_wait="1s", group_interval="1s"), "x"))
    port = free_port()
    proc = subprocess.Popen([ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "Alertmanager did not become ready"
                time.sleep(0.1)
        yield url, hook.notified  # type: ignore[attr-defined]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        hook.shutdown()


def _post(url: str, alerts: list[dict[str, str]]) -> None:
    body = json.dumps([{"labels": a} for a in alerts]).encode()
    req = urllib.request.Request(f"{url}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def test_workers_below_plan_hides_the_target_downs_it_explains(live_alertmanager: tuple[str, list[str]]) -> None:
    url, notified = live_alertmanager
    down = {"alertname": "TargetDown", "severity": "critical", "deployment": "x", "job": "dynamo-mocker",
            "host": "h1"}
    _post(url, [{**down, "service": "decode-1", "role": "decode"},
                {**down, "service": "frontend", "role": "frontend", "job": "dynamo-frontend"},
                {"alertname": "WorkersBelowPlan", "severity": "critical", "deployment": "x", "role": "decode"}])
    deadline = time.monotonic() + 30
    while not {"WorkersBelowPlan/decode", "TargetDown/frontend"} <= set(notified):
        assert time.monotonic() < deadline, f"notified so far: {notified}"
        time.sleep(0.2)
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=10) as resp:
        states = {(a["labels"]["alertname"], a["labels"]["role"]): a["status"] for a in json.load(resp)}
    assert states[("TargetDown", "decode")]["state"] == "suppressed"
    assert states[("TargetDown", "decode")]["inhibitedBy"]
    assert states[("TargetDown", "frontend")]["state"] == "active"
    assert "TargetDown/decode" not in notified

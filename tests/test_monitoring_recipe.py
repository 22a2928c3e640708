"""The recipe's `monitoring:` block as an operator writes it: refused with file:line and what is allowed, or planned
with Prometheus, Alertmanager and an exporter and health loop on every host."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, block: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\nmonitoring:\n{block}")
    return path


def test_a_monitoring_host_that_is_not_a_host_is_refused_at_its_line(cli: Callable[..., Any], tmp_path: Path) -> None:
    r = cli("validate", write(tmp_path, "  host: nosuchhost\n"))
    assert r.exit_code == 2
    assert f"{tmp_path / 'recipe.yaml'}:3:3: monitoring.host: 'nosuchhost' is not a host of this recipe; allowed: local" \
        in r.stderr


def test_a_duration_prometheus_cannot_read_is_refused_saying_how_to_write_it(cli: Callable[..., Any],
                                                                             tmp_path: Path) -> None:
    r = cli("validate", write(tmp_path, "  scrape_interval: 5 seconds\n"))
    assert r.exit_code == 2
    assert "monitoring.scrape_interval" in r.stderr and "5s, 1m, 1h30m" in r.stderr


def test_monitoring_plans_prometheus_alertmanager_and_an_exporter_and_health_loop_per_host(
        cli: Callable[..., Any], tmp_path: Path) -> None:
    import json

    r = cli("plan", write(tmp_path, "  alerts: {webhook: 'http://127.0.0.1:9/x'}\n"), "-o", "json")
    assert r.exit_code == 0, r.stderr
    plan = json.loads(r.stdout)
    assert Counter(s["component"] for s in plan["services"] if s["role"] == "auxiliary") == {
        "node-exporter": 1, "health-check": 1, "alertmanager": 1, "prometheus": 1}
    assert plan["monitoring"]["prometheus_url"] == "http://127.0.0.1:9090"
    r = cli("plan", REPO / "recipes" / "demo.yaml", "-o", "json")
    assert "monitoring" not in json.loads(r.stdout)  # no block: nothing planned, nothing in the plan

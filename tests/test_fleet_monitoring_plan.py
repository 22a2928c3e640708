"""A fleet's `monitoring:` (issues 39 and 40) is planned into its gateway tier's Plan: what Prometheus scrapes comes
from that Plan (every replica, the edge's exporter, the gateway's etcd), and the gateway rules appear only there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from primectl.fleet.plan import plan_fleet
from primectl.monitoring.rules import GATEWAY_JOB
from primectl.plan.model import Plan
from tests.conftest import REPO, CliResult

GATEWAY_ALERTS = {"GatewayReplicaDown", "GatewayReplicasBelowPlan", "GatewayBreakerOpen",
                  "GatewayNoDeploymentAvailable", "GatewayThrottling", "GatewayAdmissionSaturated"}


def fleet(tmp_path: Path, monitoring: dict[str, Any] | None, replicas: int = 3,
          site_a: dict[str, Any] | None = None) -> Path:
    """The demo fleet's recipe under tmp_path, with `monitoring` (None: none) and `replicas` replicas; site a's
    recipe extended by `site_a` where given."""
    doc = yaml.safe_load((REPO / "recipes" / "demo-fleet.yaml").read_text())
    doc.pop("monitoring", None)
    if monitoring is not None:
        doc["monitoring"] = monitoring
    doc["gateway"]["replicas"] = replicas
    for m in doc["deployments"]:
        m["recipe"] = str(REPO / "recipes" / m["recipe"])
    if site_a is not None:
        a = tmp_path / "site-a.yaml"
        a.write_text(yaml.safe_dump({"extends": doc["deployments"][0]["recipe"], **site_a}))
        doc["deployments"][0]["recipe"] = str(a)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def prometheus_config(plan: Plan) -> dict[str, Any]:
    svc = plan.service("prometheus")
    return dict(yaml.safe_load(next(f.content for f in svc.files if f.path.endswith("prometheus.yml"))))


def rule_alerts(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    svc = plan.service("prometheus")
    text = next(f.content for f in svc.files if f.path.endswith("rules.yml"))
    out: dict[str, list[dict[str, Any]]] = {}
    for group in yaml.safe_load(text)["groups"]:
        for rule in group["rules"]:
            out.setdefault(rule["alert"], []).append(rule)
    return out


def test_prometheus_scrapes_every_replica_the_edge_and_the_gateways_etcd(tmp_path: Path) -> None:
    f = plan_fleet(fleet(tmp_path, {"scrape_interval": "2s", "ports": {"balancer": 8304}}))
    g = f.gateway
    targets = {(job["job_name"], t["labels"]["service"]): t["targets"][0]
               for job in prometheus_config(g)["scrape_configs"] for t in job["static_configs"]}
    assert targets == {
        (GATEWAY_JOB, "gateway-0"): "127.0.0.1:8310", (GATEWAY_JOB, "gateway-1"): "127.0.0.1:8311",
        (GATEWAY_JOB, "gateway-2"): "127.0.0.1:8312", ("haproxy", "edge"): "127.0.0.1:8304",
        ("etcd", "gateway-etcd"): "127.0.0.1:8379", ("node-exporter", "node-exporter-local"): "127.0.0.1:9100",
        ("alertmanager", "alertmanager"): "127.0.0.1:9093", ("prometheus", "prometheus"): "127.0.0.1:9090"}
    labels = {job["job_name"]: t["labels"] for job in prometheus_config(g)["scrape_configs"]
              for t in job["static_configs"]}
    assert {lab["deployment"] for lab in labels.values()} == {"demo-fleet-gateway"}
    # the edge exports its metrics only because monitoring is on; the replicas always serve /metrics
    assert g.service("edge").ports["metrics"] == 8304
    assert g.service("gateway-0").metrics_url == "http://127.0.0.1:8310/metrics"
    assert g.monitoring is not None and g.monitoring.prometheus_url == "http://127.0.0.1:9090"
    assert g.monitoring.alertmanager_url == "http://127.0.0.1:9093"
    # the health loop's readiness gate is the fleet's public endpoint
    loop = g.service("health-local")
    assert loop.argv[loop.argv.index("--gate") + 1] == "http://127.0.0.1:8300/-/ready"
    assert "--gpus" not in loop.argv
    # the deployments' own plans are untouched: no monitoring of theirs
    assert all(p.monitoring is None for p in f.plans)


def test_without_monitoring_the_gateway_tier_plans_none(tmp_path: Path) -> None:
    g = plan_fleet(fleet(tmp_path, None)).gateway
    assert [s.name for s in g.services] == ["gateway-etcd", "gateway-0", "gateway-1", "gateway-2", "edge"]
    assert g.monitoring is None and "metrics" not in g.service("edge").ports
    off = plan_fleet(fleet(tmp_path, {"enabled": False})).gateway
    assert off.monitoring is None and len(off.services) == 5


def test_a_monitored_site_lends_the_gateway_neither_its_prometheus_nor_its_rules(tmp_path: Path) -> None:
    """The gateway's Plan starts as a copy of the first deployment's: its monitoring must not come with it."""
    site = {"monitoring": {"ports": {"prometheus": 9190, "alertmanager": 9193, "node_exporter": 9191,
                                     "balancer": 8404}}}
    g = plan_fleet(fleet(tmp_path, None, site_a=site)).gateway
    assert g.monitoring is None
    g = plan_fleet(fleet(tmp_path, {"ports": {"balancer": 8304}}, site_a=site)).gateway
    assert g.monitoring is not None and g.monitoring.prometheus_url == "http://127.0.0.1:9090"


def test_gateway_rules_appear_only_with_a_fleet_and_follow_its_plan(tmp_path: Path,
                                                                     cli: Callable[..., CliResult]) -> None:
    mon = {"slo": {"throttled_ratio": 0.2}}
    alerts = rule_alerts(plan_fleet(fleet(tmp_path, mon, replicas=3)).gateway)
    assert GATEWAY_ALERTS <= set(alerts)
    (below,) = alerts["GatewayReplicasBelowPlan"]
    assert "< 3 or absent(" in below["expr"] and 'job="fleet-gateway"' in below["expr"]
    assert " > 0.2 and " in alerts["GatewayThrottling"][0]["expr"]
    assert alerts["GatewayNoDeploymentAvailable"][0]["labels"]["severity"] == "critical"
    assert alerts["GatewayBreakerOpen"][0]["labels"] == {"severity": "warning", "deployment": "demo-fleet-gateway"}
    # a replica down is GatewayReplicaDown's, not TargetDown's as well
    critical_down = next(r for r in alerts["TargetDown"] if r["labels"]["severity"] == "critical")
    assert 'role!~"auxiliary|gateway"' in critical_down["expr"]
    # a deployment's own monitoring carries none of them
    out = tmp_path / "render"
    assert cli("render", REPO / "recipes" / "demo-monitoring.yaml", "-o", out).exit_code == 0
    (rules_file,) = out.glob("*/config/primectl.rules.yml")
    plain = {r["alert"] for g in yaml.safe_load(rules_file.read_text())["groups"] for r in g["rules"]}
    assert not plain & GATEWAY_ALERTS and "TargetDown" in plain


def test_a_monitoring_host_outside_the_fleets_hosts_is_refused_at_its_line(tmp_path: Path,
                                                                           cli: Callable[..., CliResult]) -> None:
    path = fleet(tmp_path, {"host": "elsewhere"})
    r = cli("validate", path)
    assert r.exit_code == 2
    assert "monitoring.host" in r.stderr and "'elsewhere' is not one of `hosts:`; allowed: local" in r.stderr

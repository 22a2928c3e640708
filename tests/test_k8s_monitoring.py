"""A monitored recipe on the kubernetes target: monitoring.yaml's PodMonitor and PrometheusRule.

What a user relies on: the PrometheusRule carries exactly the rules bare-metal Prometheus evaluates; the
PodMonitor finds the DGD's pods on the ports that serve their metrics, and the series it produces carry the
labels those rules read. No Kubernetes API runs here: the relabelling is checked with the real Prometheus,
fed the pods as a fake of Kubernetes pod discovery (file_sd targets carrying the `__meta_kubernetes_*` labels
the operator's pods would have) under a stand-in for the Prometheus operator's config generator.

monitoring.yaml and NOTES.txt of recipes/glm53.yaml (monitored, as a production rack is) are pinned under
tests/golden/k8s-glm53-monitored/; after an intended change:

    PRIMECTL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_k8s_monitoring.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.monitoring.rules import groups_yaml
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.render.bundle import render_host
from primectl.targets import k8s_schema as ks
from primectl.targets.k8s_monitoring import COMPONENT_LABEL, DGD_LABEL
from primectl.targets.kubernetes import KubernetesTarget
from tests.exposition import prometheus_targets

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "glm53.yaml"
GOLDEN = REPO / "tests" / "golden" / "k8s-glm53"  # beside the rest of its render (tests/test_k8s_golden.py)
UPDATE = os.environ.get("PRIMECTL_UPDATE_GOLDEN") == "1"
PROMETHEUS = "/usr/bin/prometheus"


@pytest.fixture
def crds() -> None:
    """The pinned CRDs (PodMonitor and PrometheusRule among them): outside CI their absence skips the test,
    saying how to get them; in CI it fails it."""
    missing = ks.crds_missing()
    if missing is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {missing}", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def plan() -> Plan:
    return plan_recipe(RECIPE, target="kubernetes")[1]


@pytest.fixture(scope="module")
def files(plan: Plan) -> dict[str, bytes]:
    return KubernetesTarget().render(plan)


def docs_of(files: dict[str, bytes], name: str) -> dict[str, dict[str, Any]]:
    """The resources of one rendered file, by kind, read back as kubectl reads them."""
    return {d["kind"]: d for d in ks.load_documents(files[name].decode())}


def test_monitoring_yaml_and_notes_match_golden(files: dict[str, bytes]) -> None:
    got = {name: files[name] for name in ("monitoring.yaml", "NOTES.txt")}
    if UPDATE:
        for name, data in got.items():
            (GOLDEN / name).write_bytes(data)
    for name, data in got.items():
        assert data == (GOLDEN / name).read_bytes(), f"{name} differs from {GOLDEN} (PRIMECTL_UPDATE_GOLDEN=1)"


def test_an_unmonitored_recipe_renders_no_monitoring_yaml() -> None:
    files = KubernetesTarget().render(plan_recipe(REPO / "recipes" / "demo.yaml", target="kubernetes")[1])
    assert "monitoring.yaml" not in files and "PodMonitor" not in files["NOTES.txt"].decode()


@pytest.mark.usefixtures("crds")
def test_podmonitor_and_prometheusrule_pass_their_pinned_crds(plan: Plan, files: dict[str, bytes]) -> None:
    docs = ks.load_documents(files["monitoring.yaml"].decode())
    assert [d["kind"] for d in docs] == ["PodMonitor", "PrometheusRule"]
    assert ks.validate_documents(docs) == []
    report = "\n".join(KubernetesTarget().render_report(plan))
    assert "schema: PodMonitor checked against github.com/prometheus-operator/prometheus-operator" in report
    assert "schema: PrometheusRule checked against github.com/prometheus-operator/prometheus-operator" in report
    broken = docs[0] | {"spec": {**docs[0]["spec"], "podMetricsEndpoints": [{"port": "http", "intervall": "5s"}]}}
    assert [p.path for p in ks.validate_resource(broken)] == ["$.spec.podMetricsEndpoints[0].intervall"]
    group = docs[1]["spec"]["groups"][0]
    for strategy, problems in (("Warn", 0), ("never", 1)):  # the CRD's RE2 pattern ^(?i)(abort|warn)?$
        rule = docs[1] | {"spec": {"groups": [group | {"partial_response_strategy": strategy}]}}
        assert len(ks.validate_resource(rule)) == problems, strategy


def test_prometheusrule_groups_are_byte_identical_to_the_bare_metal_rule_file(files: dict[str, bytes]) -> None:
    rule = docs_of(files, "monitoring.yaml")["PrometheusRule"]
    dumped = groups_yaml(rule["spec"]["groups"])  # as the bare-metal rule file dumps its groups
    ssh_plan = plan_recipe(RECIPE, target="ssh")[1]
    home = ssh_plan.service("prometheus").host
    on_disk = render_host(ssh_plan, ssh_plan.host(home)).files["config/primectl.rules.yml"].decode()
    body = "".join(line for line in on_disk.splitlines(keepends=True) if not line.startswith("#"))
    assert dumped == body
    assert [g["name"] for g in rule["spec"]["groups"]] and all(g["rules"] for g in rule["spec"]["groups"])


def test_the_podmonitor_scrapes_each_component_on_the_port_its_pods_declare(plan: Plan, files: dict[str, bytes]) -> None:
    mon = docs_of(files, "monitoring.yaml")["PodMonitor"]
    dgd = docs_of(files, "dgd.yaml")["DynamoGraphDeployment"]
    assert mon["metadata"]["namespace"] == dgd["metadata"]["namespace"]
    assert mon["spec"]["selector"] == {"matchLabels": {DGD_LABEL: dgd["metadata"]["name"]}}
    components = {c["name"]: c for c in dgd["spec"]["components"]}
    by_component = {}
    for ep in mon["spec"]["podMetricsEndpoints"]:
        keep = ep["relabelings"][0]
        assert keep["action"] == "keep" and keep["sourceLabels"] == [f"__meta_kubernetes_pod_label_{re.sub('[./-]', '_', COMPONENT_LABEL)}"]
        matched = [name for name in components if re.fullmatch(keep["regex"], name)]
        assert len(matched) == 1, keep
        by_component[matched[0]] = ep
    # the operator's port names (consts.go) on typed components, the pod's own declared port elsewhere
    assert {name: ep["port"] for name, ep in by_component.items()} == {
        "Frontend": "http", "prefill": "system", "decode": "system", "mooncake-master": "metrics"}
    master = components["mooncake-master"]["podTemplate"]["spec"]["containers"][0]
    metrics_port = next(p["containerPort"] for p in master["ports"] if p["name"] == "metrics")
    assert f":{metrics_port}/" in plan.service("mooncake-master").metrics_url
    assert {ep["interval"] for ep in by_component.values()} == {"5s"}


# -- the relabelling, by the real Prometheus -------------------------------------------------------------------

def _snake(fields: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor RelabelConfig as Prometheus config (the operator's generateRelabelConfig)."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): v for k, v in fields.items()}


def operator_scrape_configs(mon: dict[str, Any], sd_file: Path) -> list[dict[str, Any]]:
    """A stand-in for the Prometheus operator v0.93.0 (pkg/prometheus/promcfg.go generatePodMonitorConfig): per
    endpoint, its relabellings in its order (job to a meta label, running pods, the selector, the port, namespace/
    container/pod, job, endpoint, then the PodMonitor's own), with file_sd in place of Kubernetes pod discovery."""
    ns, name = mon["metadata"]["namespace"], mon["metadata"]["name"]
    out = []
    for i, ep in enumerate(mon["spec"]["podMetricsEndpoints"]):
        relabel: list[dict[str, Any]] = [
            {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}]
        for key, value in sorted(mon["spec"]["selector"]["matchLabels"].items()):
            meta = re.sub(r"[^A-Za-z0-9_]", "_", key)
            relabel.append({"action": "keep", "regex": f"({value});true", "source_labels": [
                f"__meta_kubernetes_pod_label_{meta}", f"__meta_kubernetes_pod_labelpresent_{meta}"]})
        relabel += [
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"]},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": f"{ns}/{name}"},
            {"target_label": "endpoint", "replacement": ep["port"]},
            *(_snake(r) for r in ep["relabelings"]),
        ]
        out.append({"job_name": f"podMonitor/{ns}/{name}/{i}", "scrape_interval": ep["interval"],
                    "metrics_path": ep["path"], "file_sd_configs": [{"files": [str(sd_file)]}],
                    "relabel_configs": relabel})
    return out


def fake_pods(namespace: str, dgd: str) -> list[dict[str, Any]]:
    """A fake of Kubernetes pod discovery: one target per declared container port, as the role `pod` gives them,
    with the labels the Dynamo operator stamps on its pods (consts.go)."""
    pods = [("glm53-frontend-7d9f", "node-a", "Frontend", "frontend", {"http": 8000}),
            ("glm53-decode-0-x2k", "node-b", "decode", "decode", {"system": 9090, "nixl": 19090}),
            ("glm53-prefill-1-ldr", "node-c", "prefill", "prefill", {"system": 9090, "nixl": 19090}),
            ("glm53-mooncake-master-5c", "node-a", "mooncake-master", None, {"rpc": 50051, "metadata": 8080, "metrics": 9003}),
            ("other-decode-0", "node-b", "decode", "decode", {"system": 9090})]  # another DGD's pod
    out = []
    for i, (pod, node, component, ctype, ports) in enumerate(pods):
        owner = "other" if pod.startswith("other") else dgd
        labels = {"nvidia_com_dynamo_graph_deployment_name": owner, "nvidia_com_dynamo_component": component,
                  **({"nvidia_com_dynamo_component_type": ctype} if ctype else {})}
        for port_name, port in ports.items():
            meta = {"__meta_kubernetes_namespace": namespace, "__meta_kubernetes_pod_name": pod,
                    "__meta_kubernetes_pod_node_name": node, "__meta_kubernetes_pod_phase": "Running",
                    "__meta_kubernetes_pod_container_name": "main",
                    "__meta_kubernetes_pod_container_port_name": port_name,
                    "__meta_kubernetes_pod_container_port_number": str(port)}
            for k, v in labels.items():
                meta[f"__meta_kubernetes_pod_label_{k}"] = v
                meta[f"__meta_kubernetes_pod_labelpresent_{k}"] = "true"
            out.append({"targets": [f"127.0.{i + 1}.1:{port}"], "labels": meta})
    return out



@pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason=f"{PROMETHEUS} is not installed")
def test_prometheus_gives_the_podmonitors_series_the_labels_the_rules_read(files: dict[str, bytes], tmp_path: Path) -> None:
    mon = docs_of(files, "monitoring.yaml")["PodMonitor"]
    ns, dgd = mon["metadata"]["namespace"], mon["spec"]["selector"]["matchLabels"][DGD_LABEL]
    sd = tmp_path / "pods.json"
    sd.write_text(json.dumps(fake_pods(ns, dgd)))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "5s"},
                                      "scrape_configs": operator_scrape_configs(mon, sd)}))
    assert subprocess.run(["/usr/bin/promtool", "check", "config", str(config)], capture_output=True).returncode == 0
    active, _ = prometheus_targets(config, tmp_path / "data", want=4)
    got = sorted((t["labels"]["service"], {k: t["labels"][k] for k in ("deployment", "host", "role", "job")})
                 for t in active)
    assert got == [
        ("glm53-decode-0-x2k", {"deployment": "glm53", "host": "node-b", "role": "decode", "job": "dynamo-vllm"}),
        ("glm53-frontend-7d9f", {"deployment": "glm53", "host": "node-a", "role": "frontend", "job": "dynamo-frontend"}),
        ("glm53-mooncake-master-5c", {"deployment": "glm53", "host": "node-a", "role": "cache", "job": "mooncake-master"}),
        ("glm53-prefill-1-ldr", {"deployment": "glm53", "host": "node-c", "role": "prefill", "job": "dynamo-vllm"}),
    ], (tmp_path / "prometheus.log").read_text()[-2000:]
    ports = {t["labels"]["service"]: t["scrapeUrl"].rsplit(":", 1)[1] for t in active}
    assert ports == {"glm53-decode-0-x2k": "9090/metrics", "glm53-frontend-7d9f": "8000/metrics",
                     "glm53-mooncake-master-5c": "9003/metrics", "glm53-prefill-1-ldr": "9090/metrics"}

"""A monitored recipe on Kubernetes: a PodMonitor and a PrometheusRule for the cluster's Prometheus operator.

Prometheus, Alertmanager and the node exporters are the cluster's (the Monitoring component's services are not
rendered as DGD components); what the deployment adds is `monitoring.yaml`:

- a PodMonitor (monitoring.coreos.com/v1) selecting the DGD's pods by the label the Dynamo operator stamps on
  every pod it creates, `nvidia.com/dynamo-graph-deployment-name` (ai-dynamo/dynamo
  deploy/operator/internal/consts/consts.go), with one endpoint per DGD component that has metrics in the Plan,
  on the named port that serves them: the operator's `http` (8000) on the frontend, `system` (9090) on workers,
  and the plan's own port name on a component without type (the Mooncake master's `metrics`). Each endpoint
  keeps only its component's pods (`nvidia.com/dynamo-component`) and relabels the series to the labels the
  bare-metal scrape gives them (monitoring/scrape.py), which the rules read:

      deployment  the plan's name (= the DGD's name, which the selector matches)
      service     the pod's name (bare metal: the service's, e.g. decode-3)
      host        the node's name (__meta_kubernetes_pod_node_name)
      role        the role of the component's planned services (frontend, prefill, decode, cache)
      job         the component of its planned services (dynamo-frontend, dynamo-vllm, mooncake-master)

- a PrometheusRule whose `spec.groups` are the planned rule file's groups, as loaded: the same rules as the
  bare-metal Prometheus evaluates (tests compare the bytes).

Only the Plan is read: the scrape interval and the rules come from the planned Prometheus's own files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yaml

from primectl.components import monitoring as mon
from primectl.plan.model import Plan, Service
from primectl.targets.k8s_manifests import MANAGED_BY, Manifests, dns_label
from primectl.targets.k8s_pod import KubernetesRenderError

API = "monitoring.coreos.com/v1"
DGD_LABEL = "nvidia.com/dynamo-graph-deployment-name"  # consts.KubeLabelDynamoGraphDeploymentName
COMPONENT_LABEL = "nvidia.com/dynamo-component"  # consts.KubeLabelDynamoComponent: the DGD component's name
# The port the operator declares for each component type's metrics (consts.go: DynamoContainerPortName `http`
# 8000 on the frontend; DynamoSystemPortName `system` 9090 on workers).
OPERATOR_METRICS_PORT = {"frontend": "http", "prefill": "system", "decode": "system", "worker": "system"}


@dataclass(frozen=True)
class Scraped:
    """One DGD component the PodMonitor scrapes: where, and the labels its series get."""

    component: str  # the DGD component's name
    port: str  # the container port's name
    path: str
    role: str
    job: str


def planned_file(plan: Plan, path: str) -> str:
    """A file of the planned Prometheus (KubernetesRenderError when the plan has none)."""
    prometheus = next((s for s in plan.services if s.component == "prometheus"), None)
    found = [f.content for f in prometheus.files if f.path == path] if prometheus else []
    if not found:
        raise KubernetesRenderError(f"the plan's Prometheus has no {path}: nothing to render monitoring from")
    return found[0]


def rule_groups(plan: Plan) -> list[dict[str, Any]]:
    """The planned rule file's groups, in its order."""
    groups: list[dict[str, Any]] = yaml.safe_load(planned_file(plan, mon.RULES))["groups"]
    return groups


def scrape_interval(plan: Plan) -> str:
    """The planned Prometheus's scrape interval (the recipe's monitoring.scrape_interval)."""
    return str(yaml.safe_load(planned_file(plan, mon.PROMETHEUS_CONFIG))["global"]["scrape_interval"])


def _one(values: set[str], what: str, component: str) -> str:
    if len(values) != 1:
        raise KubernetesRenderError(f"{component}: its services differ in {what} ({', '.join(sorted(values))}); "
                                    "its pods' series cannot carry one")
    return values.pop()


def _port_name(comp_type: str | None, svc: Service, declared: set[str], component: str) -> str:
    if comp_type is not None:
        try:
            return OPERATOR_METRICS_PORT[comp_type]
        except KeyError:
            raise KubernetesRenderError(f"{component}: no known metrics port for component type {comp_type}") from None
    port = urlsplit(svc.metrics_url or "").port
    names = [name for name, number in svc.ports.items() if number == port and name in declared]
    if not names:
        raise KubernetesRenderError(f"{component}: its metrics port {port} is not a declared container port")
    return names[0]


def scraped(m: Manifests) -> list[Scraped]:
    """The rendered components whose planned services have metrics, in the order they are rendered."""
    out = []
    for comp in m.components:
        with_metrics = [s for s in comp.services if s.metrics_url]
        if not with_metrics:
            continue
        paths = {urlsplit(s.metrics_url or "").path or "/metrics" for s in with_metrics}
        declared = {name for name, _ in comp.draft.ports}
        out.append(Scraped(
            comp.name, _port_name(comp.type, with_metrics[0], declared, comp.name), _one(paths, "metrics path", comp.name),
            _one({s.role for s in with_metrics}, "role", comp.name), _one({s.component for s in with_metrics}, "component", comp.name)))
    return out


def _label(name: str) -> str:
    """The meta label a pod label becomes in Kubernetes service discovery."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def _literal(text: str) -> str:
    """`text` as an RE2 regex matching only itself."""
    return re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", text)


def _endpoint(plan: Plan, s: Scraped, interval: str) -> dict[str, Any]:
    return {
        "port": s.port, "path": s.path, "interval": interval,
        "relabelings": [
            {"action": "keep", "sourceLabels": [_label(COMPONENT_LABEL)], "regex": _literal(s.component)},
            {"action": "replace", "targetLabel": "deployment", "replacement": plan.name},
            {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "service"},
            {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "host"},
            {"action": "replace", "targetLabel": "role", "replacement": s.role},
            {"action": "replace", "targetLabel": "job", "replacement": s.job},
        ],
    }


def _meta(plan: Plan) -> dict[str, Any]:
    return {"name": dns_label(f"{plan.name}-primectl"), "namespace": plan.namespace,
            "labels": {**MANAGED_BY, "primectl.io/deployment": plan.name}}


def resources(plan: Plan, m: Manifests) -> list[dict[str, Any]]:
    """The PodMonitor and the PrometheusRule of a monitored plan ([] when the recipe does not monitor)."""
    if plan.monitoring is None:
        return []
    interval = scrape_interval(plan)
    pod_monitor = {
        "apiVersion": API, "kind": "PodMonitor", "metadata": _meta(plan),
        "spec": {
            "selector": {"matchLabels": {DGD_LABEL: plan.name}},
            "namespaceSelector": {"matchNames": [plan.namespace]},
            "podMetricsEndpoints": [_endpoint(plan, s, interval) for s in scraped(m)],
        },
    }
    rule = {"apiVersion": API, "kind": "PrometheusRule", "metadata": _meta(plan), "spec": {"groups": rule_groups(plan)}}
    return [pod_monitor, rule]


def notes(plan: Plan, m: Manifests) -> list[str]:
    """NOTES.txt's lines on monitoring: what is rendered, what the cluster must provide, what is not rendered."""
    if plan.monitoring is None:
        return []
    name = _meta(plan)["name"]
    ports = ", ".join(f"{s.component} on `{s.port}`" for s in scraped(m))
    return [
        "Monitoring (monitoring.yaml; the recipe's monitoring: block)",
        f"  PodMonitor {name}: the pods labelled {DGD_LABEL}={plan.name}, every {scrape_interval(plan)}: {ports}.",
        "    Series carry the labels the rules read: deployment (the DGD's name), service (the pod's name),",
        "    host (the node's name), role and job (as on bare metal: frontend/dynamo-frontend, decode/<engine>...).",
        f"  PrometheusRule {name}: the same rule groups as the bare-metal Prometheus's primectl.rules.yml.",
        "  Needs the Prometheus operator (monitoring.coreos.com/v1) and a Prometheus that selects these: its",
        "  podMonitorSelector and ruleSelector must match them (kube-prometheus-stack selects `release: <its",
        f"  Helm release>` by default: kubectl -n {plan.namespace} label podmonitor/{name} prometheusrule/{name}",
        "  release=<it>),",
        f"  and its podMonitorNamespaceSelector / ruleNamespaceSelector must include namespace {plan.namespace}.",
        "  Not rendered: Prometheus, Alertmanager and its routes (the cluster's; no AlertmanagerConfig: set the",
        "  receivers there), node_exporter and dcgm-exporter (the cluster's, per node: their series carry the",
        "  cluster's labels, not deployment/service/host/role, so rules that select by those see none of them),",
        "  and the host health checks.",
        "  Dynamo's platform chart may scrape the same pods with its own PodMonitors (other labels): harmless.",
    ]

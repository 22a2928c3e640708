"""NOTES.txt of a Kubernetes render: what was written, how to run it, what was left out and why, what is untested."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from primectl.plan.model import Plan
from primectl.targets import k8s_monitoring, k8s_schema
from primectl.targets.k8s_manifests import COMPONENT_ORDER, Component, Manifests
from primectl.targets.k8s_pod import POD_IP, RELEASE_ROOT

PROVENANCE_PATH = "primectl/targets/data/crds/PROVENANCE"


def _component_line(c: Component) -> str:
    kind = f"type {c.type}" if c.type else "no type"
    shape = f"{c.replicas} replica{'s' if c.replicas != 1 else ''}"
    if c.nodes > 1:
        shape += f" x {c.nodes} nodes"
    if c.gpus:
        shape += f", {c.gpus} GPUs per pod"
    return f"  {c.name:16} {kind:14} {shape:36} from {', '.join(s.name for s in c.services)}"


def _grouped_drops(m: Manifests) -> list[str]:
    """One line per reason and set of components: the items dropped for that reason."""
    order = {name: i for i, name in enumerate(COMPONENT_ORDER)}
    users: dict[tuple[str, str], list[str]] = {}
    for d in m.dropped:
        found = users.setdefault((d.item, d.reason), [])
        if d.component not in found:
            found.append(d.component)
    lines: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (item, reason), comps in users.items():
        key = (reason, tuple(sorted(comps, key=lambda u: order.get(u, -1))))
        lines.setdefault(key, []).append(item)
    return [f"  {', '.join(items)} ({', '.join(comps)}): {reason}" for (reason, comps), items in lines.items()]


def _secret_command(plan: Plan, secret: str) -> str:
    parts = ["kubectl", "-n", plan.namespace, "create", "secret", "generic", secret]
    words = [shlex.join(parts)]
    for name in plan.secret_names:
        kind, _, ref = plan.secret_sources.get(name, "").partition(":")
        if kind == "file":
            words.append(f"--from-file={name}={shlex.quote(ref)}")
        else:
            words.append(f'--from-literal={name}="${ref or name}"')
    return " ".join(words)


def crd_lines(kinds: set[str]) -> list[str]:
    """Which CRD each rendered custom resource kind is checked against (from PROVENANCE, committed: no CRD file
    needed); the DynamoGraphDeployment's always."""
    lines = []
    for (_, kind), file in k8s_schema.VENDORED_CRDS.items():
        if kind not in kinds | {"DynamoGraphDeployment"}:
            continue
        pin = k8s_schema.crd_pins()[file]
        lines.append(f"  {kind}: {pin['repo']} {pin['path']} at {pin['ref']} (sha256 {pin['sha256'][:16]}...)")
    return lines


def _kinds(plan: Plan, m: Manifests) -> set[str]:
    kinds = {"DynamoGraphDeployment"} | ({"ComputeDomain"} if m.compute_domains else set())
    return kinds | ({"PodMonitor", "PrometheusRule"} if plan.monitoring else set())


def notes(plan: Plan, m: Manifests, files: Mapping[str, str]) -> str:
    """The text of NOTES.txt; `files` maps each written manifest file to what it holds."""
    out = [
        f"primectl render --target kubernetes: deployment {plan.name} (namespace {plan.namespace}, "
        f"recipe hash {plan.recipe_hash})",
        f"For the Dynamo operator of ai-dynamo {plan.pins.get('ai-dynamo', '?')}: "
        "DynamoGraphDeployment nvidia.com/v1beta1 with a spec.components list.",
        "",
        "Files",
        *(f"  {name:20} {what}" for name, what in files.items()),
        "",
        f"Components ({len(plan.services)} planned services)",
        *(_component_line(c) for c in m.components),
        "",
        "Checked offline",
        "  `primectl render` validates every resource before it writes it (a problem is a primectl bug and",
        "  stops the render, naming the JSON path). Custom resources are checked against the CRDs pinned in",
        f"  {PROVENANCE_PATH} (the CRD files themselves are not in the repository):",
        *crd_lines(_kinds(plan, m)),
        "  The DynamoGraphDeployment CRD is not the one tagged v1.6.1 (see PROVENANCE); every field",
        "  ai-dynamo 1.6.1's own DGD templates use is in it. Where a CRD file is absent the render prints",
        "  that the kind was not checked. ConfigMap and Service are checked against primectl's own small",
        "  schemas (no core OpenAPI is pinned).",
        "  Caught: types, enums, patterns, ranges, required and unknown fields, names and labels, and",
        "  the CRDs' CEL rules that apply to a create (evaluated offline; render names the others).",
        "  Not caught: the operator's admission webhooks, references between objects (the tests check",
        "  those for the reference recipes), and whether any pod starts: nothing here has been applied",
        "  to a cluster.",
        "",
        "To run it (primectl up/status/logs/down do not drive this target)",
        f"  kubectl create namespace {plan.namespace}",
    ]
    if m.secret:
        out.append(f"  {_secret_command(plan, m.secret)}")
    out += [
        "  kubectl apply -f DIR            (this directory; kubectl reads only its .yaml files)",
        f"  kubectl -n {plan.namespace} get dynamographdeployment {plan.name}",
        f"  kubectl -n {plan.namespace} port-forward svc/{plan.name}-frontend 8000:8000 &",
        f"  primectl smoke --url http://127.0.0.1:8000 --model {shlex.quote(plan.served_model)}",
        "",
        "Needs in the cluster",
        f"  - the Dynamo operator (ai-dynamo {plan.pins.get('ai-dynamo', '?')}) and its CRDs",
    ]
    if any(c.nodes > 1 for c in m.components):
        out.append("  - Grove or LeaderWorkerSet, which the operator places multinode components with")
    if any(c.gpus for c in m.components):
        out.append("  - the NVIDIA GPU device plugin (nvidia.com/gpu)")
    if m.compute_domains:
        out.append("  - the NVIDIA DRA driver for ComputeDomain (IMEX channels, so NIXL moves KV over MNNVL)")
    if plan.serving.model.generate:
        out.append(f"  - nothing for the model: the generated {plan.serving.model.generate} model is a ConfigMap (model.yaml)")
    else:
        out.append(f"  - the model at {plan.serving.model.path} on every node that runs a Frontend, prefill or decode pod (hostPath)")
    out += ["", "Left out: the operator provides it, or it only made sense on a host shared by several processes",
            *_grouped_drops(m)]
    out += ["", "Replaced"]
    if m.mooncake_service:
        out.append(f"  the Mooncake master's host:port -> Service {m.mooncake_service} (services.yaml)")
    out.append("  each process's own host address -> its pod's IP (env from status.podIP; $(POD_IP) in args)")
    out.append(f"  the release directory -> {RELEASE_ROOT} (ConfigMaps mounted read-only)")
    if any(POD_IP in f.content for c in m.components for f in c.draft.files):
        out += [
            "  files are shared by every pod of a component, so a process's own address written in a file",
            "  becomes the text $(POD_IP), which Kubernetes does not expand; the vLLM Mooncake store connector",
            "  takes its local hostname from MOONCAKE_REQUESTER_LOCAL_HOSTNAME (the pod IP), not the file.",
        ]
    monitoring = k8s_monitoring.notes(plan, m)
    if monitoring:
        out += ["", *monitoring]
    out += ["", "Not rendered, or not known to work"]
    if m.secret:
        out.append(f"  - the Secret {m.secret}: values are never rendered; create it as above (Frontend and workers read it).")
    if m.mooncake_service:
        out += [
            "  - the Mooncake master as a component without type, and its Service: not tried on a cluster;",
            "    the Service is checked only against primectl's own schema. Its readiness probe is the plan's.",
        ]
    image = plan.serving.image
    if image is not None and image.package and plan.pins.get(image.package):
        out.append(f"  - {image.repository}:{plan.pins.get('ai-dynamo')} carries the {image.package_name or image.package} "
                   f"that Dynamo release ships; the recipe pins {image.package} {plan.pins[image.package]}: not checked.")
    if m.mooncake_service:
        out.append("  - mooncake_master is assumed on the image's PATH.")
    out.append("  - placement inside an NVLink domain relies on the ComputeDomain claim alone." if m.compute_domains
               else "  - no NVLink domain: no ComputeDomain.")
    return "\n".join(out) + "\n"

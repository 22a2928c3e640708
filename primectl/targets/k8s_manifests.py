"""Plan -> the Kubernetes resources the Dynamo operator (ai-dynamo 1.6.1) runs a deployment from.

A DynamoGraphDeployment (`nvidia.com/v1beta1`, a `spec.components` list as
1.6.1's `dynamo/profiler/templates/dgd/*` write it) with one component per
kind of process, not per process: Plan services of one role whose pods are
equal once host addresses and per-slot ports are taken out collapse into one
component with `replicas` instances (`multinode.nodeCount` pods each when an
instance spans hosts). Beside it: a ComputeDomain per NVLink domain on
multi-host NVLink profiles (GB200 NVL72: every GPU pod claims its IMEX
channel), ConfigMaps for the generated model and the services' files, and a
Service for the Mooncake master, which is a component without `type`.

docs/kubernetes-notes.md has the field mapping; what the operator provides
is left out, and recorded (`Manifests.dropped`) so the render can list it.
Only the Plan is read.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from primectl.plan.model import RELEASE, Plan, Service, Slot
from primectl.render.bundle import MODEL_ROLES, model_files
from primectl.targets.k8s_pod import (
    POD_IP,
    RELEASE_ROOT,
    ContainerDraft,
    Dropped,
    KubernetesRenderError,
    container_draft,
    normalise_ports,
)

DGD_API = "nvidia.com/v1beta1"
COMPUTE_DOMAIN_API = "resource.nvidia.com/v1beta1"
OPERATOR_FRONTEND_PORT = 8000
GPU_RESOURCE = "nvidia.com/gpu"
CLAIM_NAME = "compute-domain"
MANAGED_BY = {"app.kubernetes.io/managed-by": "primectl"}
POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
MOONCAKE_COMPONENT = "mooncake-master"


# The order components are written in (the frontend first, as 1.6.1 writes it).
COMPONENT_ORDER = ("Frontend", "prefill", "decode", MOONCAKE_COMPONENT)


@dataclass
class Component:
    """One DGD component being built: its services, instance shape and the pod every instance runs."""

    name: str
    type: str | None
    services: list[Service]
    replicas: int
    nodes: int  # pods per instance
    gpus: int  # GPUs per pod
    draft: ContainerDraft
    uses_model: bool


@dataclass
class Manifests:
    """Everything the kubernetes target writes, as plain objects, plus what it left out."""

    dgd: dict[str, Any]
    compute_domains: list[dict[str, Any]] = field(default_factory=list)
    model_configmap: dict[str, Any] | None = None
    configmaps: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    components: list[Component] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    secret: str | None = None
    mooncake_service: str | None = None


def dns_label(text: str) -> str:
    """`text` as a DNS-1123 label (lowercase alphanumerics and `-`, at most 63)."""
    out = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:63].strip("-")
    if not out:
        raise KubernetesRenderError(f"{text!r} cannot be made a Kubernetes name")
    return out


def _meta(plan: Plan, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": plan.namespace, "labels": {**MANAGED_BY, "primectl.io/deployment": plan.name}}


def component_of(svc: Service) -> tuple[str, str | None] | str:
    """(DGD component name, type) for a Plan service: a worker by its role, anything else as its component says;
    else why it is not rendered."""
    from primectl.components import base as components
    from primectl.components import monitoring

    if svc.role in ("prefill", "decode"):
        return svc.role, svc.role
    owner = monitoring.Monitoring.name if svc.component in monitoring.SERVICE_COMPONENTS else svc.component
    try:
        component = components.get(owner)
    except KeyError:
        raise KubernetesRenderError(f"{svc.name}: no Kubernetes component for a {svc.component} service "
                                    f"(role {svc.role}): {svc.component} is not a registered component") from None
    form = components.kubernetes(component, svc)
    if isinstance(form, components.NotRendered):
        return form.reason
    return form.component, form.type


def _one(values: Iterable[int], what: str, name: str) -> int:
    distinct = sorted(set(values))
    if len(distinct) != 1:
        raise KubernetesRenderError(f"{name}: its processes differ in {what} ({distinct}); one component cannot carry both")
    return distinct[0]


def _first_difference(a: ContainerDraft, b: ContainerDraft) -> str:
    for what in ("command", "args", "env", "files", "ports", "probe"):
        x, y = getattr(a, what), getattr(b, what)
        if x != y:
            if isinstance(x, tuple) and isinstance(y, tuple):
                for i, (p, q) in enumerate(zip(x, y, strict=False)):
                    if p != q:
                        return f"{what}[{i}]: {p!r} vs {q!r}"
            return f"{what}: {x!r} vs {y!r}"
    return "nothing"


def _component(plan: Plan, name: str, ctype: str | None, services: list[Service], endpoints: dict[str, str],
               dropped: list[Dropped]) -> Component:
    slots: dict[str, Slot] = {s.name: s for s in plan.slots}
    own = [slots[s.slot] for s in services if s.slot in slots]
    nodes = _one((s.hosts_per_instance for s in own), "hosts per instance", name) if own else 1
    gpus = _one((len(s.gpus) for s in own) if own else (len(s.gpus) for s in services), "GPUs per process", name)
    instances = list(dict.fromkeys(s.group or s.name for s in services))
    drafts: list[ContainerDraft] = []
    for svc in services:
        draft, gone = container_draft(
            plan, svc, name, frontend=ctype == "frontend", multinode=nodes > 1, typeless=ctype is None,
            endpoints={} if svc.component == MOONCAKE_COMPONENT else endpoints,
        )
        drafts.append(draft)
        dropped += [d for d in gone if d not in dropped]
    first = drafts[0]
    for svc, draft in zip(services[1:], drafts[1:], strict=True):
        if draft != first and svc.slot in slots and services[0].slot in slots:
            draft = normalise_ports(draft, slots[svc.slot].ports, slots[services[0].slot or ""].ports)
        if draft != first:
            raise KubernetesRenderError(
                f"{svc.name} and {services[0].name} differ beyond addresses and ports ({_first_difference(first, draft)}): "
                f"one {name} component cannot run both")
    return Component(name, ctype, services, len(instances), nodes, gpus, first,
                     uses_model=any(s.role in MODEL_ROLES for s in services))


def _endpoints(plan: Plan, service_name: str) -> dict[str, str]:
    """Every host:port of the Mooncake master -> its Service's name:port (what workers and configs point at)."""
    masters = [s for s in plan.services if s.component == MOONCAKE_COMPONENT]
    return {f"{m.address}:{port}": f"{service_name}:{port}" for m in masters for port in m.ports.values()}


def compute_domain_name(plan: Plan) -> str | None:
    """The ComputeDomain every GPU pod joins on a multi-host NVLink profile (None elsewhere).

    One per NVLink domain: the prefill groups' domain, which decode pods join
    too so NIXL can move KV over MNNVL. A plan whose slots span several
    domains (several racks) is refused: that needs a component per domain.
    """
    gpu_slots = [s for s in plan.slots if s.gpus]
    if plan.hardware.hosts_per_nvlink_domain <= 1 or not gpu_slots:
        return None
    domains = sorted({s.domain for s in gpu_slots if s.domain})
    if len(domains) > 1:
        raise KubernetesRenderError(
            f"the plan places instances in {len(domains)} NVLink domains ({', '.join(domains)}); the kubernetes target "
            "renders one ComputeDomain shared by every GPU pod and cannot keep each instance inside its own domain yet")
    return dns_label(f"{plan.name}-{domains[0] if domains else 'nvlink'}")


def _shared_env(components: list[Component]) -> list[tuple[str, str]]:
    """Env every Dynamo component sets to the same literal value (goes to spec.env, written once)."""
    typed = [c for c in components if c.type is not None]
    if len(typed) < 2:
        return []
    common = [(k, v) for k, v in typed[0].draft.env if POD_IP not in v]
    return [kv for kv in common if all(kv in c.draft.env for c in typed[1:])]


def _file_volumes(plan: Plan, comp: Component) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """ConfigMaps for the component's files (one per directory), their volumes and mounts."""
    by_dir: dict[str, list[Any]] = {}
    for f in comp.draft.files:
        by_dir.setdefault(posixpath.dirname(f.path), []).append(f)
    configmaps, volumes, mounts = [], [], []
    for directory, files in sorted(by_dir.items()):
        if not directory:
            raise KubernetesRenderError(f"{comp.name}: files at the top of the release ({files[0].path}) have no mount")
        volume = dns_label(directory.replace("/", "-"))
        if volume == "model":
            raise KubernetesRenderError(f"{comp.name}: its files under {directory}/ would hide the model volume")
        cm_name = dns_label(f"{plan.name}-{comp.name}-{volume}")
        data = {posixpath.basename(f.path): f.content.replace(POD_IP, "$(POD_IP)") for f in files}
        configmaps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(plan, cm_name), "data": data})
        source: dict[str, Any] = {"name": cm_name}
        if any(f.mode != 0o644 for f in files):
            source["items"] = [{"key": posixpath.basename(f.path), "path": posixpath.basename(f.path), "mode": f.mode}
                               for f in files]
        volumes.append({"name": volume, "configMap": source})
        mounts.append({"name": volume, "mountPath": f"{RELEASE_ROOT}/{directory}", "readOnly": True})
    return configmaps, volumes, mounts


def _model_volume(plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model directory: the generated model's ConfigMap, or the hosts' path (hostPath on every node)."""
    model = plan.serving.model
    if model.generate:
        source: dict[str, Any] = {"configMap": {"name": f"{plan.name}-model"}}
    else:
        source = {"hostPath": {"path": model.path, "type": "Directory"}}
    mount = {"name": "model", "mountPath": model.path.replace(RELEASE, RELEASE_ROOT), "readOnly": True}
    return {"name": "model", **source}, mount


def model_configmap(plan: Plan) -> dict[str, Any] | None:
    """The generated model (tokenizer and config, no weights) as one ConfigMap; None for weights on the nodes."""
    files = model_files(plan)
    if not files:
        return None
    data = {}
    for path, content in sorted(files.items()):
        directory, name = posixpath.split(path)
        if directory != "model":
            raise KubernetesRenderError(f"generated model file {path} is not directly under model/")
        data[name] = content.decode()
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(plan, f"{plan.name}-model"), "data": data}


def _env_list(env: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, value in env:
        if value == POD_IP:
            out.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        else:
            out.append({"name": name, "value": value.replace(POD_IP, "$(POD_IP)")})
    return out


def _container(comp: Component, image: str, working_dir: str | None, env: list[tuple[str, str]], secret: str | None,
               claim: bool, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    d = comp.draft
    c: dict[str, Any] = {"name": "main", "image": image}
    if working_dir and comp.type in ("prefill", "decode"):
        c["workingDir"] = working_dir
    c["command"] = list(d.command)
    if d.args:
        c["args"] = [a.replace(POD_IP, "$(POD_IP)") for a in d.args]
    if any(name == "POD_IP" for name, _ in env):
        raise KubernetesRenderError(f"{comp.name}: the plan sets POD_IP, which the pod's own address needs")
    needs_pod_ip = any(POD_IP in a for a in d.args) or any(POD_IP in v and v != POD_IP for _, v in env)
    env_list = ([POD_IP_ENV] if needs_pod_ip else []) + _env_list(env)
    if env_list:
        c["env"] = env_list
    if secret:
        c["envFrom"] = [{"secretRef": {"name": secret}}]
    if d.ports:
        c["ports"] = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in d.ports]
    resources: dict[str, Any] = {}
    if comp.gpus:
        resources["limits"] = {GPU_RESOURCE: str(comp.gpus)}
    if claim:
        resources["claims"] = [{"name": CLAIM_NAME}]
    if resources:
        c["resources"] = resources
    if d.probe:
        c["readinessProbe"] = d.probe
    if mounts:
        c["volumeMounts"] = mounts
    return c


def build_manifests(plan: Plan) -> Manifests:
    """Every resource the kubernetes target renders for `plan` (KubernetesRenderError if it cannot)."""
    image_spec = plan.serving.image
    if image_spec is None:
        raise KubernetesRenderError(f"engine {plan.engine} declares no container image (EngineServing.image), "
                                    "so its workers have nothing to run from on Kubernetes")
    version = plan.pins.get("ai-dynamo")
    if not version:
        raise KubernetesRenderError("the plan pins no ai-dynamo version, so no image tag")
    image = f"{image_spec.repository}:{version}"
    has_master = any(s.component == MOONCAKE_COMPONENT for s in plan.services)
    mooncake = f"{plan.name}-mooncake" if has_master else None
    endpoints = _endpoints(plan, mooncake) if mooncake else {}
    dropped: list[Dropped] = []
    groups: dict[str, tuple[str | None, list[Service]]] = {}
    left_out: dict[tuple[str, str], list[str]] = {}  # (component, why) -> its services not rendered
    for svc in plan.services:
        kind = component_of(svc)
        if isinstance(kind, str):
            left_out.setdefault((svc.component, kind), []).append(svc.name)
            continue
        groups.setdefault(kind[0], (kind[1], []))[1].append(svc)
    for (what, why), names in left_out.items():
        # one line per kind of service: one per host would list a node exporter for every tray
        item = f"service {names[0]}" if len(names) == 1 else f"{len(names)} {what} services"
        dropped.append(Dropped(names[0] if len(names) == 1 else what, item, why))
    order = [*(n for n in COMPONENT_ORDER if n in groups), *(n for n in groups if n not in COMPONENT_ORDER)]
    components = [_component(plan, name, groups[name][0], groups[name][1], endpoints, dropped) for name in order]
    frontend = next((s for s in plan.services if s.role == "frontend"), None)
    if frontend is not None and frontend.ports.get("http", OPERATOR_FRONTEND_PORT) != OPERATOR_FRONTEND_PORT:
        dropped.append(Dropped("Frontend", f"port {frontend.ports['http']}",
                               f"the operator serves the frontend on {OPERATOR_FRONTEND_PORT}; the recipe's port does not apply"))

    shared = _shared_env(components)
    for comp in components:
        if comp.type is not None:
            comp.draft = replace(comp.draft, env=tuple(kv for kv in comp.draft.env if kv not in shared))
    domain = compute_domain_name(plan)
    secret = f"{plan.name}-secrets" if plan.secret_names else None
    model_cm = model_configmap(plan)
    out = Manifests(dgd={}, model_configmap=model_cm, components=components, dropped=dropped, secret=secret,
                    mooncake_service=mooncake)
    spec_components = []
    for comp in components:
        configmaps, volumes, mounts = _file_volumes(plan, comp)
        out.configmaps += configmaps
        if comp.uses_model:
            volume, mount = _model_volume(plan)
            volumes, mounts = [volume, *volumes], [mount, *mounts]
        claim = domain is not None and comp.gpus > 0
        pod: dict[str, Any] = {}
        if claim:
            pod["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimTemplateName": f"{domain}-channel"}]
        # Secrets go to Dynamo's processes only (the Mooncake master reads none).
        own_secret = secret if comp.type is not None else None
        pod["containers"] = [_container(comp, image, image_spec.working_dir, list(comp.draft.env), own_secret, claim, mounts)]
        if volumes:
            pod["volumes"] = volumes
        template: dict[str, Any] = {"spec": pod}
        entry: dict[str, Any] = {"name": comp.name}
        if comp.type is not None:
            entry["type"] = comp.type
        entry["replicas"] = comp.replicas
        if comp.nodes > 1:
            entry["multinode"] = {"nodeCount": comp.nodes}
        if comp.name == MOONCAKE_COMPONENT and mooncake:
            labels = {"primectl.io/deployment": plan.name, "primectl.io/component": comp.name}
            template = {"metadata": {"labels": labels}, **template}
            out.services.append(_service(plan, mooncake, labels, comp.draft.ports))
        entry["podTemplate"] = template
        spec_components.append(entry)

    spec: dict[str, Any] = {}
    if image_spec.backend_framework:
        spec["backendFramework"] = image_spec.backend_framework
    if shared:
        spec["env"] = _env_list(shared)
    spec["components"] = spec_components
    meta = _meta(plan, plan.name)
    meta["annotations"] = {"primectl.io/recipe-hash": plan.recipe_hash}
    out.dgd = {"apiVersion": DGD_API, "kind": "DynamoGraphDeployment", "metadata": meta, "spec": spec}
    if domain:
        out.compute_domains.append({
            "apiVersion": COMPUTE_DOMAIN_API, "kind": "ComputeDomain", "metadata": _meta(plan, domain),
            # numNodes is required by the pinned DRA driver (v25.12.0); 0 lets the IMEX daemons follow the pods.
            "spec": {"numNodes": 0, "channel": {"allocationMode": "Single", "resourceClaimTemplate": {"name": f"{domain}-channel"}}},
        })
    return out


def _service(plan: Plan, name: str, selector: dict[str, str], ports: tuple[tuple[str, int], ...]) -> dict[str, Any]:
    """The Mooncake master's Service: workers and store configs reach it by this name.

    Not `<name>-mooncake-master`: with Kubernetes discovery the operator
    creates a Service of that name for every component (port 9090 only).
    """
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": _meta(plan, name),
        "spec": {"selector": dict(selector),
                 "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports]},
    }

"""The kubernetes target (`target: kubernetes`): render a DynamoGraphDeployment for the Dynamo operator.

`primectl render RECIPE --target kubernetes -o DIR` writes, from the Plan
only (primectl/targets/k8s_manifests.py):

    dgd.yaml            the DynamoGraphDeployment (nvidia.com/v1beta1, ai-dynamo 1.6.1)
    computedomain.yaml  the ComputeDomain of the NVLink domain (multi-host NVLink profiles only)
    configmaps.yaml     the services' files (e.g. the Mooncake store config), one ConfigMap per directory
    model.yaml          the generated model (tokenizer and config) when the recipe generates one
    services.yaml       the Service the Mooncake master is reached by
    monitoring.yaml     a monitored recipe's PodMonitor and PrometheusRule (primectl/targets/k8s_monitoring.py)
    NOTES.txt           how to apply it, and what was left out because the operator provides it

Every resource is validated offline before anything is returned
(primectl/targets/k8s_schema.py; custom resources only where their pinned
CRD is present). Deploying is `kubectl apply -f DIR`: there is no API server
here to test against, so this is a render-only target (targets/base.py):
`up`, `diff`, `status`, `logs`, `down` and `unlock` refuse (exit 2) with the
kubectl command to run instead (`instead`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from primectl.plan.model import HostPlan, Plan
from primectl.recipe.model import Recipe
from primectl.targets import k8s_monitoring, k8s_schema
from primectl.targets.base import PlannedHosts

if TYPE_CHECKING:
    from primectl.targets.base import RenderTarget
from primectl.targets.k8s_manifests import Manifests, build_manifests, component_of
from primectl.targets.k8s_notes import notes
from primectl.targets.k8s_pod import KubernetesRenderError
from primectl.targets.k8s_yaml import dump_documents

Validate = Callable[[Any], list[k8s_schema.SchemaProblem]]


class ManifestSchemaError(KubernetesRenderError):
    """A rendered resource breaks its schema: a primectl bug, reported with every problem's JSON path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("rendered Kubernetes resources break their schema (a primectl bug):\n  " + "\n  ".join(problems))


def manifest_files(m: Manifests) -> dict[str, list[dict[str, Any]]]:
    """Resources by the file they are written to (files with nothing to hold are left out)."""
    files: dict[str, list[dict[str, Any]]] = {"dgd.yaml": [m.dgd]}
    if m.compute_domains:
        files["computedomain.yaml"] = m.compute_domains
    if m.configmaps:
        files["configmaps.yaml"] = m.configmaps
    if m.model_configmap:
        files["model.yaml"] = [m.model_configmap]
    if m.services:
        files["services.yaml"] = m.services
    return files


def rendered_files(plan: Plan, m: Manifests) -> dict[str, list[dict[str, Any]]]:
    """manifest_files, and monitoring.yaml where the recipe monitors."""
    files = manifest_files(m)
    monitoring = k8s_monitoring.resources(plan, m)
    if monitoring:
        files["monitoring.yaml"] = monitoring
    return files


def check_manifests(files: Mapping[str, Sequence[Any]], validate: Validate = k8s_schema.validate_resource) -> list[str]:
    """Validate every resource; the kinds that could not be checked (CRD absent). ManifestSchemaError on any problem."""
    problems: list[str] = []
    unchecked: list[str] = []
    for name, docs in files.items():
        for i, doc in enumerate(docs):
            try:
                found = validate(doc)
            except k8s_schema.CrdsUnavailable:
                kind = str(doc.get("kind"))
                if kind not in unchecked:
                    unchecked.append(kind)
                continue
            except ValueError as exc:  # a CRD file that differs from its pin
                raise KubernetesRenderError(f"cannot check {name}: {exc}") from None
            where = f"{name}[{i}] {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            problems += [f"{where} {p}" for p in found]
    if problems:
        raise ManifestSchemaError(problems)
    return unchecked


def _what(docs: Sequence[dict[str, Any]]) -> str:
    kinds = list(dict.fromkeys(str(d["kind"]) for d in docs))
    names = ", ".join(str(d["metadata"]["name"]) for d in docs)
    return f"{'/'.join(kinds)} {names}"


def render_manifests(plan: Plan, validate: Validate = k8s_schema.validate_resource) -> tuple[dict[str, bytes], list[str]]:
    """The files `render` returns, and the kinds that were not schema-checked (their CRD is absent)."""
    m = build_manifests(plan)
    docs = rendered_files(plan, m)
    unchecked = check_manifests(docs, validate)
    header = (f"for deployment {plan.name} (recipe hash {plan.recipe_hash}): rendered by primectl for the Dynamo "
              f"operator of ai-dynamo {plan.pins.get('ai-dynamo', '?')}; do not edit, see NOTES.txt")
    out = {name: dump_documents(d, f"{name}: {_what(d)} {header}") for name, d in docs.items()}
    out["NOTES.txt"] = notes(plan, m, {name: _what(d) for name, d in docs.items()}).encode()
    return out, unchecked


class KubernetesTarget:
    """`target: kubernetes`: render only (a RenderTarget); the cluster is driven with kubectl."""

    name = "kubernetes"
    surges = False

    def plan_hosts(self, recipe: Recipe, hosts: list[HostPlan]) -> PlannedHosts:
        """The recipe's hosts shape the render (GPUs per node, NVLink domains); pods are placed by the scheduler."""
        return PlannedHosts(hosts)

    def bind(self, plan: Plan) -> Plan:
        """Unchanged: the scheduler places pods, the plan's hosts only shape the render."""
        return plan

    def render(self, plan: Plan) -> dict[str, bytes]:
        """The manifests and NOTES.txt, validated (ManifestSchemaError naming the JSON path on a problem)."""
        return render_manifests(plan)[0]

    def render_report(self, plan: Plan) -> list[str]:
        """Lines for the operator after a render: which rendered kinds were checked, against which schema."""
        resources = [doc for docs in rendered_files(plan, build_manifests(plan)).values() for doc in docs]
        rendered = {str(doc["kind"]) for doc in resources}
        lines = []
        for (_, kind), file in k8s_schema.VENDORED_CRDS.items():
            if kind not in rendered:
                continue
            pin = k8s_schema.crd_pins()[file]
            try:
                k8s_schema.crd_file(file)
            except k8s_schema.CrdsUnavailable:
                lines.append(f"schema: {kind} NOT checked: {k8s_schema.CRD_ABSENT}")
                continue
            lines.append(f"schema: {kind} checked against {pin['repo']} {pin['path']} at {pin['ref'][:12]}")
        lines += k8s_schema.cel_report(resources)  # CEL rules: how many evaluated, and each one that is not
        core = sorted(rendered & {kind for _, kind in k8s_schema.CORE_SCHEMAS})
        return [*lines, f"schema: {', '.join(core)} checked against primectl's own schemas"] if core else lines

    # -- what kubectl does instead of the commands that deploy --------------------------------------

    def instead(self, plan: Plan, command: str, service: str | None) -> str:
        """The kubectl command to run instead of `primectl COMMAND` (the refusal of a render-only target quotes it)."""
        if command == "status":
            return (f"kubectl -n {plan.namespace} get dynamographdeployment {plan.name} "
                    f"&& kubectl -n {plan.namespace} get pods -l nvidia.com/dynamo-graph-deployment-name={plan.name}")
        if command == "logs" and service is not None:
            kind = component_of(plan.service(service))
            if kind is None:
                return f"nothing: {service} is not deployed on Kubernetes (the operator replaces it)"
            selector = f"nvidia.com/dynamo-graph-deployment-name={plan.name},nvidia.com/dynamo-component={kind[0]}"
            return f"kubectl -n {plan.namespace} logs -l {selector} --prefix --tail 100 [-f]"
        if command == "down":
            return (f"kubectl delete -f DIR (the render's directory), or kubectl -n {plan.namespace} "
                    f"delete dynamographdeployment {plan.name}")
        if command == "unlock":
            return "nothing: primectl holds no lock on a Kubernetes cluster"
        return ("kubectl apply -f DIR (kubectl diff -f DIR shows what would change; DIR/NOTES.txt lists what to create "
                "first). A change is handed to the Dynamo operator, which replaces the changed components' pods itself; "
                "primectl's surge, batches and drain do not apply there")


if TYPE_CHECKING:  # mypy checks the target against the protocol (render only: it takes no options)
    _target: RenderTarget = KubernetesTarget()

"""The kubernetes target: what a user applying the rendered files would rely on.

Structure tests read the rendered YAML back and need no CRD: the graph's shape, what the operator
provides staying out, references between the objects resolving, no host address reaching a pod.
Schema tests run twice over: with a small synthetic schema (always), and with the pinned CRDs
(skipped, saying so, where ../shared/crds is absent; failed instead in CI: primectl/targets/data/crds/PROVENANCE).
"""

from __future__ import annotations

import copy
import json
import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primectl.engines.vllm import MULTINODE_DP_FLAGS, POD_LOCAL_ENV
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.targets import k8s_schema as ks
from primectl.targets.k8s_manifests import build_manifests
from primectl.targets.k8s_pod import DROPPED_ENV, FRONTEND_FLAGS, KubernetesRenderError
from primectl.targets.kubernetes import KubernetesTarget, ManifestSchemaError, check_manifests, manifest_files

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def crds() -> None:
    """The pinned CRDs: outside CI their absence skips the test, saying how to get them; in CI (CI=true,
    CRDs at ../shared/crds) it fails it. A file that differs from its pin is an error either way."""
    missing = ks.crds_missing()  # ValueError naming the file and both sha256s on a pin mismatch
    if missing is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {missing}", pytrace=False)
    pytest.skip(missing)


needs_crds = pytest.mark.usefixtures("crds")


def plan_of(recipe: str) -> Plan:
    """The recipe planned for this target, as `primectl render --target kubernetes` plans it."""
    return plan_recipe(REPO / recipe, target="kubernetes")[1]


@pytest.fixture(scope="module")
def glm53_plan() -> Plan:
    return plan_of("recipes/glm53.yaml")


@pytest.fixture(scope="module")
def demo_plan() -> Plan:
    return plan_of("recipes/demo.yaml")


def docs_of(files: dict[str, bytes]) -> dict[str, list[dict[str, Any]]]:
    """The rendered YAML files read back, as a user's kubectl would."""
    return {name: ks.load_documents(data.decode()) for name, data in files.items() if name.endswith(".yaml")}


@pytest.fixture(scope="module")
def glm53(glm53_plan: Plan) -> dict[str, list[dict[str, Any]]]:
    return docs_of(KubernetesTarget().render(glm53_plan))


@pytest.fixture(scope="module")
def demo(demo_plan: Plan) -> dict[str, list[dict[str, Any]]]:
    return docs_of(KubernetesTarget().render(demo_plan))


def dgd(docs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (graph,) = docs["dgd.yaml"]
    return graph


def comp(docs: dict[str, list[dict[str, Any]]], name: str) -> dict[str, Any]:
    return next(c for c in dgd(docs)["spec"]["components"] if c["name"] == name)


def main(component: dict[str, Any]) -> dict[str, Any]:
    (container,) = component["podTemplate"]["spec"]["containers"]
    assert container["name"] == "main"
    return container


def env_names(component: dict[str, Any]) -> list[str]:
    return [e["name"] for e in main(component).get("env", [])]


# --- the graph's shape ------------------------------------------------------------------------------


def test_glm53_is_three_two_node_dep8_prefill_groups_and_twelve_tp4_decoders(glm53):
    shape = {c["name"]: (c.get("type"), c["replicas"], c.get("multinode", {}).get("nodeCount", 1))
             for c in dgd(glm53)["spec"]["components"]}
    assert shape == {"Frontend": ("frontend", 1, 1), "prefill": ("prefill", 3, 2), "decode": ("decode", 12, 1),
                     "mooncake-master": (None, 1, 1)}
    for name in ("prefill", "decode"):
        assert main(comp(glm53, name))["resources"]["limits"] == {"nvidia.com/gpu": "4"}  # per pod, not per instance
    assert "resources" not in main(comp(glm53, "Frontend"))
    assert dgd(glm53)["spec"]["backendFramework"] == "vllm"


def test_prefill_keeps_the_dp_size_and_leaves_per_node_dp_flags_to_the_operator(glm53, glm53_plan):
    args = main(comp(glm53, "prefill"))["args"]
    assert args[args.index("--data-parallel-size") + 1] == "8"
    assert "--enable-expert-parallel" in args
    assert not set(MULTINODE_DP_FLAGS) & set(args)
    assert set(MULTINODE_DP_FLAGS) <= set(glm53_plan.service("prefill-0-1").argv)  # the SSH plan has them


def test_worker_args_are_the_plans_argv_minus_the_interpreter(glm53, glm53_plan):
    decode = main(comp(glm53, "decode"))
    argv = glm53_plan.service("decode-7").argv
    assert decode["command"] == ["python3", "-m", "dynamo.vllm"]
    assert decode["args"] == argv[3:]
    assert decode["image"] == "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1"
    assert decode["workingDir"] == "/workspace/examples/backends/vllm"


def test_frontend_keeps_the_router_settings_and_drops_what_the_operator_provides(glm53, glm53_plan):
    fe = main(comp(glm53, "Frontend"))
    assert fe["command"] == ["python3"]
    argv = glm53_plan.service("frontend").argv
    kept = [w for i, w in enumerate(argv[1:], 1) if w not in FRONTEND_FLAGS and argv[i - 1] not in FRONTEND_FLAGS]
    assert fe["args"] == kept
    assert fe["args"][:2] == ["-m", "dynamo.frontend"]
    for flag, value in [("--router-mode", "kv"), ("--router-session-affinity-ttl-secs", "1800"),
                        ("--router-session-affinity-mode", "hard"), ("--kv-cache-block-size", "64"),
                        ("--migration-limit", "3")]:
        assert fe["args"][fe["args"].index(flag) + 1] == value
    assert "--router-kv-events" in fe["args"]


def test_demo_is_a_mocker_graph_of_one_prefill_two_decoders_and_the_mooncake_master(demo):
    shape = {c["name"]: (c.get("type"), c["replicas"]) for c in dgd(demo)["spec"]["components"]}
    assert shape == {"Frontend": ("frontend", 1), "prefill": ("prefill", 1), "decode": ("decode", 2),
                     "mooncake-master": (None, 1)}
    assert "backendFramework" not in dgd(demo)["spec"]  # as 1.6.1's mocker template
    for name in ("prefill", "decode"):
        c = main(comp(demo, name))
        # dynamo.mocker through its token-budget bridge (primectl/bridges), shipped in a ConfigMap beside it
        assert c["command"] == ["python3"] and c["args"][0] == "/opt/primectl/bridges/dynamo_mocker_token_budget_bridge.py"
        assert {"name": "bridges", "mountPath": "/opt/primectl/bridges", "readOnly": True} in c["volumeMounts"]
        (bridges,) = [m for m in demo["configmaps.yaml"] if m["metadata"]["name"] == f"demo-{name}-bridges"]
        assert "runpy.run_module(TARGET" in bridges["data"]["dynamo_mocker_token_budget_bridge.py"]
        assert c["image"] == "nvcr.io/nvidia/ai-dynamo/dynamo-planner:1.6.1"
        assert c["args"][c["args"].index("--disaggregation-mode") + 1] == name
        assert {"name": "DYN_SYSTEM_STARTING_HEALTH_STATUS", "value": "ready"} in c["env"]  # the mocker needs it
        assert "resources" not in c  # no GPUs on the CPU profile


def test_etcd_is_no_component_and_operator_provided_env_stays_out(glm53, demo):
    for docs in (glm53, demo):
        graph = dgd(docs)
        assert "etcd" not in {c["name"] for c in graph["spec"]["components"]}
        spec_env = {e["name"] for e in graph["spec"].get("env", [])}
        for c in graph["spec"]["components"]:
            assert not (set(env_names(c)) | spec_env) & {*DROPPED_ENV, *POD_LOCAL_ENV}, c["name"]
            for probe in ("livenessProbe", "startupProbe"):
                assert probe not in main(c)
            if c.get("type"):
                assert "readinessProbe" not in main(c) and "ports" not in main(c)
        assert {e["name"] for e in graph["spec"]["env"]} == {"DYN_REQUEST_PLANE", "DYN_EVENT_PLANE", "PYTHONUNBUFFERED",
                                                             "NO_COLOR", "DYN_SDK_DISABLE_ANSI_LOGGING"}


def test_no_host_address_reaches_any_rendered_manifest(glm53_plan, demo_plan):
    for plan in (glm53_plan, demo_plan):
        files = {k: v for k, v in KubernetesTarget().render(plan).items() if k.endswith(".yaml")}
        for host in plan.hosts:
            pattern = re.compile(r"(?<![\w.])" + re.escape(host.address) + r"(?![\w]|\.\d)")
            hits = [name for name, data in files.items() if pattern.search(data.decode())]
            assert not hits, f"{host.address} ({host.name}) in {hits}"


def test_own_addresses_become_the_pod_ip(glm53, demo):
    prefill_env = {e["name"]: e for e in main(comp(glm53, "prefill"))["env"]}
    for name in ("MOONCAKE_REQUESTER_LOCAL_HOSTNAME", "MC_TCP_BIND_ADDRESS"):
        assert prefill_env[name]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    for docs in (glm53, demo):
        master = main(comp(docs, "mooncake-master"))
        assert "--rpc_address=$(POD_IP)" in master["args"]
        # $(POD_IP) in args expands only if POD_IP is defined in the container's env, before use
        assert master["env"][0] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


# --- references between the objects ---------------------------------------------------------------


def _configmaps(docs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {cm["metadata"]["name"]: cm for name in ("configmaps.yaml", "model.yaml") for cm in docs.get(name, [])}


@pytest.mark.parametrize("name", ["glm53", "demo"])
def test_every_volume_mount_and_config_map_reference_resolves(name, request):
    docs = request.getfixturevalue(name)
    configmaps = _configmaps(docs)
    for c in dgd(docs)["spec"]["components"]:
        pod = c["podTemplate"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for mount in main(c).get("volumeMounts", []):
            assert mount["name"] in volumes, (c["name"], mount)
            assert mount["readOnly"] is True
        for volume in volumes.values():
            if "configMap" in volume:
                cm = configmaps[volume["configMap"]["name"]]
                assert {i["key"] for i in volume["configMap"].get("items", [])} <= set(cm["data"])
    assert all(cm["metadata"]["namespace"] == dgd(docs)["metadata"]["namespace"] for cm in configmaps.values())


def test_the_mooncake_store_config_is_mounted_where_the_prefill_env_says(glm53):
    prefill = comp(glm53, "prefill")
    env = {e["name"]: e.get("value") for e in main(prefill)["env"]}
    path = env["MOONCAKE_CONFIG_PATH"]
    mount = next(m for m in main(prefill)["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in prefill["podTemplate"]["spec"]["volumes"] if v["name"] == mount["name"])
    store = json.loads(_configmaps(glm53)[volume["configMap"]["name"]]["data"][posixpath.basename(path)])
    (service,) = glm53["services.yaml"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert store["master_server_address"] == f"{service['metadata']['name']}:{ports['rpc']}"
    assert store["metadata_server"] == f"http://{service['metadata']['name']}:{ports['metadata']}/metadata"
    assert store["protocol"] == "rdma" and store["global_segment_size"] == 100_000_000_000


@pytest.mark.parametrize("name", ["glm53", "demo"])
def test_the_mooncake_service_selects_the_master_pod_and_names_its_ports(name, request):
    docs = request.getfixturevalue(name)
    (service,) = docs["services.yaml"]
    master = comp(docs, "mooncake-master")
    labels = master["podTemplate"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    container_ports = {p["name"]: p["containerPort"] for p in main(master)["ports"]}
    assert {p["targetPort"]: p["port"] for p in service["spec"]["ports"]} == container_ports
    # the operator names its own per-component Service <dgd>-<component>: ours must not take that name
    assert service["metadata"]["name"] != f"{dgd(docs)['metadata']['name']}-mooncake-master"


def test_every_gpu_pod_claims_the_channel_of_the_one_compute_domain(glm53):
    (cd,) = glm53["computedomain.yaml"]
    assert cd["spec"]["numNodes"] == 0
    template = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    for c in dgd(glm53)["spec"]["components"]:
        pod = c["podTemplate"]["spec"]
        if "nvidia.com/gpu" not in main(c).get("resources", {}).get("limits", {}):
            assert "resourceClaims" not in pod, c["name"]
            continue
        claims = {r["name"]: r["resourceClaimTemplateName"] for r in pod["resourceClaims"]}
        assert set(claims.values()) == {template}
        assert {r["name"] for r in main(c)["resources"]["claims"]} == set(claims)


def test_cpu_demo_has_no_compute_domain_and_its_model_is_a_config_map(demo, demo_plan):
    assert "computedomain.yaml" not in demo
    (model,) = demo["model.yaml"]
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(model["data"])
    for name in ("Frontend", "prefill", "decode"):
        volume = next(v for v in comp(demo, name)["podTemplate"]["spec"]["volumes"] if v["name"] == "model")
        assert volume["configMap"]["name"] == model["metadata"]["name"]
    args = main(comp(demo, "prefill"))["args"]
    mount = next(m for m in main(comp(demo, "prefill"))["volumeMounts"] if m["name"] == "model")
    assert args[args.index("--model-path") + 1] == mount["mountPath"]


def test_secrets_are_referenced_never_rendered(glm53, glm53_plan, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_sentinel_value_42")
    files = KubernetesTarget().render(glm53_plan)
    assert not any(b"hf_sentinel_value_42" in data for data in files.values())
    for name in ("Frontend", "prefill", "decode"):
        assert main(comp(glm53, name))["envFrom"] == [{"secretRef": {"name": "glm53-secrets"}}]
    assert "envFrom" not in main(comp(glm53, "mooncake-master"))
    assert 'kubectl -n glm53 create secret generic glm53-secrets --from-literal=HF_TOKEN="$HF_TOKEN"' in files[
        "NOTES.txt"].decode()


def test_notes_list_what_the_operator_provides_and_which_crd_was_checked(glm53_plan):
    notes = KubernetesTarget().render(glm53_plan)["NOTES.txt"].decode()
    for line in ["service etcd (etcd): the operator's Kubernetes discovery replaces etcd",
                 "flag --namespace (Frontend): the operator sets DYN_NAMESPACE=<k8s namespace>-<DGD name>",
                 "flag --data-parallel-size-local, flag --data-parallel-start-rank",
                 "prefill          type prefill   3 replicas x 2 nodes, 4 GPUs per pod",
                 "at 2a6da14c83617f5412caba5777dbf0e2399e9c5f", "not the one tagged v1.6.1",
                 "kubectl -n glm53 get dynamographdeployment glm53"]:
        assert line in notes, line


# --- what the target refuses ---------------------------------------------------------------------


def test_a_plan_spread_over_two_nvlink_domains_is_refused_naming_them():
    with pytest.raises(KubernetesRenderError, match=r"2 NVLink domains \(r01-nvl72, r02-nvl72\)"):
        KubernetesTarget().render(plan_of("recipes/bench-4rack.yaml"))


def _with_argv(plan: Plan, edit: Callable[[Any], list[str]], names: list[str]) -> Plan:
    services = [s.model_copy(update={"argv": edit(s)}) if s.name in names else s for s in plan.services]
    return plan.model_copy(update={"services": services})


def test_per_slot_ports_collapse_but_a_real_difference_between_instances_is_refused(demo_plan):
    slots = {s.name: s for s in demo_plan.slots}
    # Two decoders on one host get different ports; in pods each has its own, so the first one's stands.
    ported = _with_argv(demo_plan, lambda s: [*s.argv, "--bootstrap-ports", str(slots[s.name].ports["bootstrap"])],
                        ["decode-0", "decode-1"])
    args = main(comp(docs_of(KubernetesTarget().render(ported)), "decode"))["args"]
    assert args[-2:] == ["--bootstrap-ports", str(slots["decode-0"].ports["bootstrap"])]
    different = _with_argv(demo_plan, lambda s: [*s.argv, "--speedup-ratio", "2"], ["decode-1"])
    with pytest.raises(KubernetesRenderError, match=r"decode-1 and decode-0 differ .*one decode component"):
        KubernetesTarget().render(different)


def test_a_host_address_with_no_pod_equivalent_is_refused(glm53_plan):
    # decode-3 pointing at another tray's address: no pod or Service stands for a tray
    leaky = _with_argv(glm53_plan, lambda s: [*s.argv, "--extra-host", "10.20.1.5"], ["decode-3"])
    with pytest.raises(KubernetesRenderError, match=r"host tray05 \(10.20.1.5\) would reach the pod"):
        KubernetesTarget().render(leaky)


@pytest.fixture
def k8s_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "demo-k8s.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\ntarget: kubernetes\n")
    return recipe


@pytest.mark.parametrize(("args", "says"), [
    (["up"], "kubectl apply -f DIR"),
    (["diff"], "kubectl diff -f DIR"),
    (["status"], "kubectl -n demo get dynamographdeployment demo"),
    (["logs", "RECIPE", "decode-1"], "logs -l nvidia.com/dynamo-graph-deployment-name=demo,nvidia.com/dynamo-component=decode"),
    (["down"], "kubectl delete -f DIR"),
    (["unlock"], "primectl holds no lock"),
    (["preflight"], "kubectl apply -f DIR"),
    (["provision"], "kubectl apply -f DIR"),
    (["drain", "RECIPE", "decode-1"], "primectl's surge, batches and drain do not apply there"),
])
def test_commands_that_drive_a_cluster_refuse_naming_the_kubectl_command(cli, k8s_recipe, args, says):
    argv = [str(k8s_recipe) if a == "RECIPE" else a for a in args]
    result = cli(*argv) if "RECIPE" in args else cli(*argv, k8s_recipe)
    assert result.exit_code == 2, result.stdout + result.stderr  # a render-only target: refused as bad input
    text = " ".join(result.stderr.split())
    assert "target kubernetes renders only; use `primectl render RECIPE -o DIR`" in text and "nothing was changed" in text
    assert says in text


def test_render_of_a_kubernetes_recipe_uses_its_target(cli, k8s_recipe, tmp_path):
    result = cli("render", k8s_recipe, "-o", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "out" / "dgd.yaml").is_file() and "for target kubernetes" in result.stdout


# --- the schema check before anything is returned ----------------------------------------------------

# A small OpenAPI schema in the CRD's shape: components with an integer replicas and no other fields.
SYNTHETIC_DGD = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": True,
            "properties": {"components": {"type": "array", "items": {
                "type": "object", "required": ["name"],
                "properties": {"name": {"type": "string"}, "type": {"type": "string", "enum": ["frontend", "prefill", "decode"]},
                               "replicas": {"type": "integer", "format": "int32", "minimum": 0},
                               "multinode": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                               "podTemplate": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }}},
        },
    },
}


def synthetic_validate(doc: Any) -> list[ks.SchemaProblem]:
    if doc.get("kind") != "DynamoGraphDeployment":
        return []
    return ks.validate_against(doc, ks.openapi_to_json_schema(SYNTHETIC_DGD))


def test_the_render_passes_a_synthetic_schema_and_a_wrong_field_fails_it_by_path(demo_plan):
    files = manifest_files(build_manifests(demo_plan))
    assert check_manifests(files, synthetic_validate) == []
    broken = copy.deepcopy(files)
    broken["dgd.yaml"][0]["spec"]["components"][2]["replicas"] = "two"
    broken["dgd.yaml"][0]["spec"]["components"][1]["gpus"] = 1
    with pytest.raises(ManifestSchemaError) as err:
        check_manifests(broken, synthetic_validate)
    assert err.value.problems == [
        "dgd.yaml[0] DynamoGraphDeployment demo $.spec.components[1].gpus: unknown field 'gpus'; known fields: "
        "multinode, name, podTemplate, replicas, type",
        "dgd.yaml[0] DynamoGraphDeployment demo $.spec.components[2].replicas: 'two' is not of type 'integer'",
    ]


def test_without_the_crds_the_render_is_the_same_and_says_what_was_not_checked(demo_plan, monkeypatch, tmp_path):
    with_crds = KubernetesTarget().render(demo_plan)
    monkeypatch.setenv(ks.CRD_DIR_ENV, str(tmp_path))  # an empty folder: no CRD anywhere
    ks.vendored_crd.cache_clear()
    ks._validator.cache_clear()
    try:
        assert KubernetesTarget().render(demo_plan) == with_crds
        assert check_manifests(manifest_files(build_manifests(demo_plan))) == ["DynamoGraphDeployment"]
        assert KubernetesTarget().render_report(demo_plan) == [
            f"schema: DynamoGraphDeployment NOT checked: {ks.CRD_ABSENT}",
            "schema: ConfigMap, Service checked against primectl's own schemas",
        ]
    finally:
        ks.vendored_crd.cache_clear()
        ks._validator.cache_clear()


def test_core_kinds_are_checked_even_without_the_crds(demo_plan):
    files = manifest_files(build_manifests(demo_plan))
    files["services.yaml"][0]["spec"]["ports"][0]["targetPort"] = "RPC_port"
    files["services.yaml"][0]["spec"]["selectr"] = {}
    with pytest.raises(ManifestSchemaError) as err:
        check_manifests({"services.yaml": files["services.yaml"]})
    assert err.value.problems == [
        "services.yaml[0] Service demo-mooncake $.spec.ports[0].targetPort: 'RPC_port' is none of: integer, string",
        "services.yaml[0] Service demo-mooncake $.spec.selectr: unknown field 'selectr'; known fields: clusterIP, ports, "
        "publishNotReadyAddresses, selector, type",
    ]


# --- with the pinned CRDs ------------------------------------------------------------------------


@needs_crds
@pytest.mark.parametrize("name", ["glm53", "demo"])
def test_rendered_resources_read_back_pass_the_pinned_crds(name, request):
    docs = request.getfixturevalue(name)
    kinds = {d["kind"] for ds in docs.values() for d in ds}
    assert "DynamoGraphDeployment" in kinds
    for file, ds in docs.items():
        assert ks.validate_documents(ds) == [], file
    assert KubernetesTarget().render_report(request.getfixturevalue(f"{name}_plan"))[0].startswith(
        "schema: DynamoGraphDeployment checked against github.com/ai-dynamo/dynamo")


@needs_crds
def test_with_the_crds_a_wrong_field_fails_the_render_naming_the_path(glm53_plan, monkeypatch):
    real = build_manifests

    def with_a_bug(plan: Plan) -> Any:
        m = real(plan)
        m.dgd["spec"]["components"][2]["replicas"] = "two"
        m.dgd["spec"]["components"][1]["gpus"] = 4  # an unknown key under a component
        m.compute_domains[0]["spec"]["numNodes"] = "0"
        return m

    monkeypatch.setattr("primectl.targets.kubernetes.build_manifests", with_a_bug)
    with pytest.raises(ManifestSchemaError) as err:
        KubernetesTarget().render(glm53_plan)
    assert err.value.problems[0].startswith(
        "dgd.yaml[0] DynamoGraphDeployment glm53 $.spec.components[1].gpus: unknown field 'gpus'; known fields:")
    assert err.value.problems[1:] == [
        "dgd.yaml[0] DynamoGraphDeployment glm53 $.spec.components[2].replicas: 'two' is not of type 'integer'",
        "computedomain.yaml[0] ComputeDomain glm53-r01-nvl72 $.spec.numNodes: '0' is not of type 'integer'",
    ]


@needs_crds
def test_with_the_crds_a_broken_cel_rule_fails_the_render_naming_the_path_and_the_rules_message(glm53_plan, monkeypatch):
    real = build_manifests

    def with_a_bug(plan: Plan) -> Any:
        m = real(plan)
        names = [c["name"] for c in m.dgd["spec"]["components"]]
        m.dgd["spec"]["components"][names.index("decode")]["name"] = "Prefill"  # the CRD's schema allows capitals
        return m

    monkeypatch.setattr("primectl.targets.kubernetes.build_manifests", with_a_bug)
    with pytest.raises(ManifestSchemaError) as err:
        KubernetesTarget().render(glm53_plan)
    (problem,) = err.value.problems
    assert problem.startswith("dgd.yaml[0] DynamoGraphDeployment glm53 $.spec.components: component names must be "
                              "unique case-insensitively (x-kubernetes-validations rule: self.all(c1, ")


@needs_crds
def test_the_render_report_counts_the_cel_rules_and_names_each_one_not_evaluated(glm53_plan):
    cel = [line for line in KubernetesTarget().render_report(glm53_plan) if line.startswith("cel: ")]
    version = ks.k8s_cel.library_version()
    assert cel == [
        f"cel: DynamoGraphDeployment nvidia.com/v1beta1: 18 x-kubernetes-validations rules, 17 evaluated ({version})",
        "cel: DynamoGraphDeployment not applicable to a create (transition rule, reads oldSelf): $.spec.components[*]: "
        "'minAvailable is immutable after creation' (rule: !has(oldSelf.minAvailable) || (has(self.minAvailable) && "
        "self.minAvailable == oldSelf.minAvailable))",
        f"cel: ComputeDomain resource.nvidia.com/v1beta1: 1 x-kubernetes-validations rules, 0 evaluated ({version})",
        "cel: ComputeDomain not applicable to a create (transition rule, reads oldSelf): $.spec: "
        "'A computeDomain.spec is immutable' (rule: self == oldSelf)",
        # glm53 is monitored: monitoring.yaml's two resources (their CRDs carry no CEL rules)
        f"cel: PodMonitor monitoring.coreos.com/v1: 0 x-kubernetes-validations rules, 0 evaluated ({version})",
        f"cel: PrometheusRule monitoring.coreos.com/v1: 0 x-kubernetes-validations rules, 0 evaluated ({version})",
    ]


@needs_crds
def test_the_cli_reports_a_schema_bug_with_its_path_and_exit_1(cli, monkeypatch, tmp_path):
    real = build_manifests

    def with_a_bug(plan: Plan) -> Any:
        m = real(plan)
        m.dgd["spec"]["components"][0]["type"] = "fronted"
        return m

    monkeypatch.setattr("primectl.targets.kubernetes.build_manifests", with_a_bug)
    result = cli("render", "recipes/demo.yaml", "--target", "kubernetes", "-o", tmp_path)
    assert result.exit_code == 1
    assert "$.spec.components[0].type: 'fronted' is not one of" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written


def test_single_node_data_parallel_keeps_its_flags_with_the_pod_ip(tmp_path):
    variant = tmp_path / "glm53-dep4.yaml"
    variant.write_text(f"extends: {REPO / 'recipes' / 'glm53.yaml'}\nprefill: {{groups: 6, parallel: DEP4}}\nratio: '1:2'\n")
    docs = docs_of(KubernetesTarget().render(plan_of(str(variant))))
    prefill = comp(docs, "prefill")
    assert (prefill["replicas"], "multinode" in prefill) == (6, False)
    args = main(prefill)["args"]  # the operator injects DP flags only for multinode instances: keep them
    assert args[args.index("--data-parallel-size-local") + 1] == "4"
    assert args[args.index("--data-parallel-address") + 1] == "$(POD_IP)"
    assert main(prefill)["env"][0]["name"] == "POD_IP"
    (cd,) = docs["computedomain.yaml"]  # no slot spans hosts, so no named domain: one for the plan
    assert cd["metadata"]["name"] == "glm53-nvlink"

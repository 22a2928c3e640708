"""Offline schema checks for the Kubernetes target: the hand-written demo and GLM-5.3
DynamoGraphDeployments pass the pinned CRDs, and broken manifests fail naming the field.

The CRDs are upstream data kept in ../shared/crds beside the checkout
(primectl/targets/data/crds/PROVENANCE); tests that need them are skipped, with the reason,
where they are absent, and fail instead under CI=true. The
converter and the ConfigMap schema are tested without them.
"""

from __future__ import annotations

import copy
import hashlib
import os
import pathlib
import warnings
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from primectl.targets import k8s_schema as ks

DATA = pathlib.Path(__file__).parent / "data" / "k8s"


# The CRDs are upstream data, not in the repository (CI has them at ../shared/crds).


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


def manifest(name: str) -> list[dict[str, Any]]:
    return ks.load_documents((DATA / name).read_text())


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def component(dgd: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in dgd["spec"]["components"] if c["name"] == name)


def problems(resource: Any) -> list[str]:
    return [str(p) for p in ks.validate_resource(resource)]


# --- the pinned CRDs ---------------------------------------------------------------


@needs_crds
def test_pinned_crd_files_match_provenance_sha256():
    for name, pin in ks.crd_pins().items():
        assert hashlib.sha256(ks.crd_file(name).read_bytes()).hexdigest() == pin["sha256"]


def test_a_crd_file_that_differs_from_its_pin_is_refused(tmp_path, monkeypatch):
    name = "resource.nvidia.com_computedomains.yaml"
    (tmp_path / name).write_text("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n")
    monkeypatch.setenv(ks.CRD_DIR_ENV, str(tmp_path))
    with pytest.raises(ValueError, match="PROVENANCE pins"):
        ks.crd_file(name)


def test_crds_are_looked_for_beside_the_checkout_and_beside_the_one_run_from(tmp_path, monkeypatch):
    monkeypatch.delenv(ks.CRD_DIR_ENV, raising=False)
    repo = pathlib.Path(__file__).resolve().parent.parent
    assert repo.parent / "shared" / "crds" in ks.crd_search_path()  # where CI has them: ../shared/crds
    checkout = tmp_path / "checkout"
    (checkout / "primectl" / "targets" / "data" / "crds").mkdir(parents=True)
    (checkout / "primectl" / "targets" / "data" / "crds" / "PROVENANCE").write_text("files: []\n")
    (checkout / "docs").mkdir()
    monkeypatch.chdir(checkout / "docs")  # an installed primectl run from inside another checkout
    assert tmp_path / "shared" / "crds" in ks.crd_search_path()


def test_missing_crds_say_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.setenv(ks.CRD_DIR_ENV, str(tmp_path))
    with pytest.raises(ks.CrdsUnavailable, match="shared/crds"):
        ks.crd_file("nvidia.com_dynamographdeployments.yaml")


@needs_crds
def test_dgd_serves_v1beta1_with_a_components_list_and_v1alpha1_with_a_services_map():
    crd = ks.vendored_crd("nvidia.com", "DynamoGraphDeployment")
    assert ks.crd_versions(crd) == ["v1alpha1", "v1beta1"]
    beta = ks.crd_json_schema(crd, "v1beta1")["properties"]["spec"]["properties"]
    alpha = ks.crd_json_schema(crd, "v1alpha1")["properties"]["spec"]["properties"]
    assert beta["components"]["type"] == "array" and "services" not in beta
    assert alpha["services"]["type"] == "object" and "components" not in alpha


@needs_crds
def test_converted_schemas_are_valid_draft_2020_12():
    for group, kind in ks.VENDORED_CRDS:
        crd = ks.vendored_crd(group, kind)
        for version in ks.crd_versions(crd):
            Draft202012Validator.check_schema(ks.crd_json_schema(crd, version))
    Draft202012Validator.check_schema(ks.configmap_schema())


# --- the hand-written deployments pass ----------------------------------------------


@needs_crds
@pytest.mark.parametrize("name", ["demo.yaml", "glm53.yaml"])
def test_hand_written_deployments_pass_the_schemas(name):
    docs = manifest(name)
    assert docs, name
    assert ks.validate_documents(docs) == []


@needs_crds
def test_demo_graph_is_a_kv_routed_frontend_one_prefill_and_two_decode_mockers():
    dgd = by_kind(manifest("demo.yaml"), "DynamoGraphDeployment")[0]
    kinds = {c["name"]: (c["type"], c["replicas"]) for c in dgd["spec"]["components"]}
    assert kinds == {"Frontend": ("frontend", 1), "prefill": ("prefill", 1), "decode": ("decode", 2)}
    frontend_args = component(dgd, "Frontend")["podTemplate"]["spec"]["containers"][0]["args"]
    assert frontend_args[frontend_args.index("--router-mode") + 1] == "kv"
    for name in ("prefill", "decode"):
        main = component(dgd, name)["podTemplate"]["spec"]["containers"][0]
        assert main["command"] == ["python3", "-m", "dynamo.mocker"]
        assert main["args"][main["args"].index("--disaggregation-mode") + 1] == name


@needs_crds
def test_glm53_graph_has_the_recipe_shape_on_one_compute_domain():
    docs = manifest("glm53.yaml")
    dgd = by_kind(docs, "DynamoGraphDeployment")[0]
    prefill, decode = component(dgd, "prefill"), component(dgd, "decode")
    assert (prefill["type"], prefill["replicas"], prefill["multinode"]["nodeCount"]) == ("prefill", 3, 2)
    assert (decode["type"], decode["replicas"], "multinode" in decode) == ("decode", 12, False)
    for comp in (prefill, decode):
        main = comp["podTemplate"]["spec"]["containers"][0]
        assert main["resources"]["limits"]["nvidia.com/gpu"] == "4"  # per node: 2 x 4 = DEP8
    prefill_args = prefill["podTemplate"]["spec"]["containers"][0]["args"]
    assert prefill_args[prefill_args.index("--data-parallel-size") + 1] == "8"
    # The operator injects the per-node DP flags; rendering them too would duplicate them.
    assert not {"--data-parallel-size-local", "--data-parallel-start-rank", "--data-parallel-address"} & set(prefill_args)

    templates = {cd["spec"]["channel"]["resourceClaimTemplate"]["name"] for cd in by_kind(docs, "ComputeDomain")}
    configmaps = {cm["metadata"]["name"] for cm in by_kind(docs, "ConfigMap")}
    for comp in (prefill, decode):
        pod = comp["podTemplate"]["spec"]
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in pod["resourceClaims"]}
        assert set(claims.values()) <= templates
        assert {c["name"] for c in pod["containers"][0]["resources"]["claims"]} <= set(claims)
        assert {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v} <= configmaps


# --- broken manifests fail, naming the field ----------------------------------------


@pytest.fixture
def glm53_dgd() -> dict[str, Any]:
    return copy.deepcopy(by_kind(manifest("glm53.yaml"), "DynamoGraphDeployment")[0])


def _prefill_index(dgd: dict[str, Any]) -> int:
    return next(i for i, c in enumerate(dgd["spec"]["components"]) if c["name"] == "prefill")


@needs_crds
def test_unknown_component_field_is_reported_at_its_path(glm53_dgd):
    i = _prefill_index(glm53_dgd)
    glm53_dgd["spec"]["components"][i]["replica"] = 3
    (found,) = problems(glm53_dgd)
    assert found.startswith(f"$.spec.components[{i}].replica: unknown field 'replica'")
    assert "replicas" in found  # the known fields are listed


@needs_crds
def test_unknown_container_field_inside_the_pod_template_is_reported(glm53_dgd):
    i = _prefill_index(glm53_dgd)
    glm53_dgd["spec"]["components"][i]["podTemplate"]["spec"]["containers"][0]["comand"] = ["python3"]
    (found,) = problems(glm53_dgd)
    assert found.startswith(f"$.spec.components[{i}].podTemplate.spec.containers[0].comand: unknown field")


@needs_crds
def test_v1alpha1_fields_in_a_v1beta1_graph_are_unknown(glm53_dgd):
    glm53_dgd["spec"]["services"] = {"Frontend": {"componentType": "frontend"}}
    assert problems(glm53_dgd) == [
        "$.spec.services: unknown field 'services'; known fields: annotations, backendFramework, components, env, "
        "experimental, labels, priorityClassName, providerOverride, restart, topologyConstraint"
    ]


@needs_crds
@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("replicas", "3", "replicas: '3' is not of type 'integer'"),
        ("replicas", -1, "replicas: -1 is less than the minimum of 0"),
        ("replicas", 2**31, "replicas: 2147483648 is greater than the maximum of 2147483647"),
        ("type", "prefil", "type: 'prefil' is not one of ['frontend', 'worker', 'prefill', 'decode', 'planner', 'epp']"),
        ("multinode", {"nodeCount": 1}, "multinode.nodeCount: 1 is less than the minimum of 2"),
        ("sharedMemorySize", "lots", "sharedMemorySize: 'lots' does not match"),
    ],
)
def test_wrong_type_range_or_enum_names_the_component_field(glm53_dgd, field, value, expected):
    i = _prefill_index(glm53_dgd)
    glm53_dgd["spec"]["components"][i][field] = value
    (found,) = problems(glm53_dgd)
    assert found.startswith(f"$.spec.components[{i}].{expected}")


@needs_crds
def test_gpu_count_must_be_a_quantity(glm53_dgd):
    i = _prefill_index(glm53_dgd)
    limits = glm53_dgd["spec"]["components"][i]["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/gpu"] = ["4"]
    path = f"$.spec.components[{i}].podTemplate.spec.containers[0].resources.limits['nvidia.com/gpu']"
    assert problems(glm53_dgd) == [f"{path}: ['4'] is none of: integer, string"]


@needs_crds
def test_missing_required_fields_are_named(glm53_dgd):
    i = _prefill_index(glm53_dgd)
    del glm53_dgd["spec"]["components"][i]["name"]
    del glm53_dgd["spec"]["components"][i]["podTemplate"]["spec"]["containers"]
    assert problems(glm53_dgd) == [
        f"$.spec.components[{i}].name: required field missing",
        f"$.spec.components[{i}].podTemplate.spec.containers: required field missing",
    ]


@needs_crds
def test_metadata_follows_the_api_servers_name_rules(glm53_dgd):
    glm53_dgd["metadata"]["name"] = "GLM_53"
    glm53_dgd["metadata"]["lables"] = {}
    found = problems(glm53_dgd)
    assert found[0].startswith("$.metadata.lables: unknown field")
    assert found[1].startswith("$.metadata.name: 'GLM_53' does not match")


@needs_crds
def test_api_version_and_kind_pick_the_schema(glm53_dgd):
    glm53_dgd["apiVersion"] = "nvidia.com/v1"
    assert problems(glm53_dgd) == [
        "$.apiVersion: DynamoGraphDeployment is served as nvidia.com/v1alpha1, nvidia.com/v1beta1, not nvidia.com/v1"
    ]
    glm53_dgd["apiVersion"] = "nvidia.com/v1alpha1"  # the same graph read as the old map-of-services API
    assert "$.spec.components: unknown field 'components'" in " ".join(problems(glm53_dgd))
    assert problems({"apiVersion": "apps/v1", "kind": "Deployment"})[0].startswith("$: no schema for Deployment apps/v1")


@needs_crds
def test_compute_domain_requires_num_nodes_and_a_known_allocation_mode():
    cd = copy.deepcopy(by_kind(manifest("glm53.yaml"), "ComputeDomain")[0])
    del cd["spec"]["numNodes"]
    cd["spec"]["channel"]["allocationMode"] = "Many"
    assert problems(cd) == [
        "$.spec.channel.allocationMode: 'Many' is not one of ['All', 'Single']",
        "$.spec.numNodes: required field missing",
    ]


def test_manifest_stream_problems_carry_the_document_index():
    bad_cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"n": 3}}
    good_cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "y"}, "data": {"a": "b"}}
    assert ks.validate_documents([good_cm, bad_cm]) == [(1, ks.SchemaProblem("$.data.n", "3 is not of type 'string'"))]


# --- ConfigMap (hand-written schema) --------------------------------------------------


def test_configmaps_of_both_deployments_pass():
    for name in ("demo.yaml", "glm53.yaml"):
        for cm in by_kind(manifest(name), "ConfigMap"):
            assert problems(cm) == [], cm["metadata"]["name"]


def test_configmap_rejects_bad_keys_values_and_fields():
    cm = copy.deepcopy(by_kind(manifest("glm53.yaml"), "ConfigMap")[0])
    cm["data"]["store json"] = "{}"
    cm["data"]["replicas"] = 3
    cm["date"] = {}
    assert problems(cm) == [
        "$.data: key 'store json': does not match '^[-._a-zA-Z0-9]+$'",
        "$.data.replicas: 3 is not of type 'string'",
        "$.date: unknown field 'date'; known fields: apiVersion, binaryData, data, immutable, kind, metadata",
    ]


def test_configmap_over_one_mebibyte_is_refused():
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"blob": "x" * (1024 * 1024)}}
    assert problems(cm) == [f"$.data: {1024 * 1024 + 4} bytes of data; a ConfigMap holds at most {1024 * 1024}"]


# --- the OpenAPI -> JSON Schema conversion, on small schemas -------------------------


def _check(schema: dict[str, Any], instance: Any) -> list[str]:
    return [str(p) for p in ks.validate_against(instance, ks.openapi_to_json_schema(schema))]


def test_nullable_admits_null_only_where_declared():
    schema = {"type": "object", "properties": {"a": {"type": "string", "nullable": True}, "b": {"type": "string"}}}
    assert _check(schema, {"a": None}) == []
    assert _check(schema, {"b": None}) == ["$.b: None is not of type 'string'"]
    enum = {"type": "string", "enum": ["x"], "nullable": True}
    assert _check(enum, None) == []


def test_int_or_string_takes_both_and_nothing_else():
    schema = {"type": "object", "properties": {"port": {"x-kubernetes-int-or-string": True}}}
    assert _check(schema, {"port": 8000}) == []
    assert _check(schema, {"port": "http"}) == []
    assert _check(schema, {"port": 1.5}) == ["$.port: 1.5 is none of: integer, string"]


def test_unknown_fields_are_refused_unless_preserved():
    closed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    open_ = {**closed, "x-kubernetes-preserve-unknown-fields": True}
    assert _check(closed, {"a": 1, "b": 2}) == ["$.b: unknown field 'b'; known fields: a"]
    assert _check(open_, {"a": 1, "b": 2}) == []
    free_map = {"type": "object", "additionalProperties": {"type": "string"}}
    assert _check(free_map, {"any": "thing"}) == []


def test_embedded_resource_must_name_its_api_version_and_kind():
    template = {"type": "object", "x-kubernetes-embedded-resource": True, "x-kubernetes-preserve-unknown-fields": True}
    schema = {"type": "object", "properties": {"template": template}}
    assert _check(schema, {"template": {"apiVersion": "v1", "kind": "Pod", "spec": {}}}) == []
    assert _check(schema, {"template": {"spec": {}}}) == [
        "$.template.apiVersion: required field missing",
        "$.template.kind: required field missing",
    ]


def test_integer_formats_bound_the_value_and_cel_rules_are_dropped():
    schema = {
        "type": "integer",
        "format": "int32",
        "minimum": 1,
        "x-kubernetes-validations": [{"rule": "self % 2 == 0", "message": "even"}],
    }
    assert _check(schema, 3) == []  # the JSON Schema conversion drops CEL (k8s_cel evaluates it): odd passes
    assert _check(schema, 0) == ["$: 0 is less than the minimum of 1"]
    assert _check(schema, 2**31) == ["$: 2147483648 is greater than the maximum of 2147483647"]


# --- CEL rules (x-kubernetes-validations), evaluated as on a create -------------------


def _cel(schema: dict[str, Any], value: Any) -> list[str]:
    return [f"{p.path}: {p.message}" for p in ks.k8s_cel.check(value, schema)]


def _rule(rule: str, message: str = "m", **extra: Any) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": rule, "message": message, **extra}]}


def test_a_rule_binds_self_to_the_node_it_is_declared_on():
    item = {"type": "object", "properties": {"n": {"type": "integer"}}, **_rule("self.n > 0", "n must be positive")}
    values = {"type": "integer", **_rule("self % 2 == 0", "even")}
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": item, **_rule("self.size() <= 2", "at most two")},
            "counts": {"type": "object", "additionalProperties": values},
        },
    }
    assert _cel(schema, {"items": [{"n": 1}, {"n": 0}, {"n": -1}], "counts": {"a": 2, "b": 3}}) == [
        "$.items: at most two (x-kubernetes-validations rule: self.size() <= 2)",
        "$.items[1]: n must be positive (x-kubernetes-validations rule: self.n > 0)",
        "$.items[2]: n must be positive (x-kubernetes-validations rule: self.n > 0)",
        "$.counts.b: even (x-kubernetes-validations rule: self % 2 == 0)",
    ]
    assert _cel(schema, {}) == []  # absent values: no rule is evaluated
    assert _cel(schema, {"items": None}) == []


def test_defaults_are_applied_before_the_rules_as_the_api_server_does():
    schema = {
        "type": "object",
        "properties": {"mode": {"type": "string", "default": "a"}, "x": {"type": "string"}},
        **_rule("!has(self.x) || self.mode == 'b'", "x needs mode b"),
    }
    assert _cel(schema, {"x": "1"}) == ["$: x needs mode b (x-kubernetes-validations rule: !has(self.x) || self.mode == 'b')"]
    assert _cel(schema, {"x": "1", "mode": "b"}) == []


def test_field_names_are_escaped_as_in_kubernetes_and_map_keys_are_not():
    schema = {
        "type": "object",
        "properties": {
            "foo-bar": {"type": "string"},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        **_rule("self.foo__dash__bar == self.__namespace__ && self.labels['a/b'] == 'x'"),
    }
    assert _cel(schema, {"foo-bar": "n", "namespace": "n", "labels": {"a/b": "x"}}) == []
    assert ks.k8s_cel.escape_field_name("a.b__c/d") == "a__dot__b__underscores__c__slash__d"


def test_field_path_message_expression_and_evaluation_errors():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}, "n": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "self.n < 3", "message": "small", "messageExpression": "'n is ' + string(self.n)", "fieldPath": ".n"},
            {"rule": "self.a.b == 1", "message": "b is 1"},
        ],
    }
    found = _cel(schema, {"a": {}, "n": 5})
    assert found[0] == "$.n: n is 5 (x-kubernetes-validations rule: self.n < 3)"
    assert found[1].startswith("$: CEL rule could not be evaluated (") and "rule: self.a.b == 1" in found[1]


def test_transition_rules_are_named_not_applicable_unless_old_self_is_optional():
    schema = {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"restart": {"type": "object"}, "n": {"type": "integer"}}}},
    }
    spec = schema["properties"]["spec"]
    spec["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": "immutable"},
        {"rule": "oldSelf.hasValue() || !has(self.restart)", "message": "unset on create", "optionalOldSelf": True},
    ]
    immutable, on_create = ks.k8s_cel.rules_of(schema)
    assert immutable.status is ks.k8s_cel.RuleStatus.TRANSITION and immutable.program is None
    assert on_create.status is ks.k8s_cel.RuleStatus.EVALUATED  # with oldSelf = optional.none(), as on a create
    assert _cel(schema, {"spec": {"n": 1}}) == []
    assert _cel(schema, {"spec": {"restart": {}}}) == [
        "$.spec: unset on create (x-kubernetes-validations rule: oldSelf.hasValue() || !has(self.restart))"
    ]
    assert ks.k8s_cel.rule_report("X", "g/v1", [immutable, on_create])[1:] == [
        "cel: X not applicable to a create (transition rule, reads oldSelf): $.spec: 'immutable' (rule: self == oldSelf)"
    ]


def test_a_rule_needing_a_kubernetes_cel_function_the_library_lacks_is_named():
    schema = {"type": "object", "properties": {"size": {"type": "string", **_rule("quantity(self).isGreaterThan(quantity('0'))")}}}
    (rule,) = ks.k8s_cel.rules_of(schema)
    assert rule.status is ks.k8s_cel.RuleStatus.UNSUPPORTED
    assert rule.reason == "cel-expr-python has no isGreaterThan(), quantity() (Kubernetes CEL library)"
    assert ks.k8s_cel.rule_report("X", "g/v1", [rule]) == [
        f"cel: X g/v1: 1 x-kubernetes-validations rules, 0 evaluated ({ks.k8s_cel.library_version()})",
        "cel: X NOT evaluated (cel-expr-python has no isGreaterThan(), quantity() (Kubernetes CEL library)): "
        "$.size: 'm' (rule: quantity(self).isGreaterThan(quantity('0')))",
    ]


# Per CRD version: (rules, evaluated on a create, transition rules, not evaluable).
CEL_RULE_COUNTS = {
    ("DynamoGraphDeployment", "v1alpha1"): (13, 11, 1, 1),
    ("DynamoGraphDeployment", "v1beta1"): (18, 17, 1, 0),  # what primectl renders
    ("ComputeDomain", "v1beta1"): (1, 0, 1, 0),  # spec is immutable: self == oldSelf
    ("PodMonitor", "v1"): (0, 0, 0, 0),  # a monitored recipe's monitoring.yaml
    ("PrometheusRule", "v1"): (0, 0, 0, 0),
}


@needs_crds
def test_every_cel_rule_of_the_pinned_crds_is_found_and_each_one_not_evaluated_is_named():
    counts, unsupported = {}, []
    for group, kind in ks.VENDORED_CRDS:
        crd = ks.vendored_crd(group, kind)
        for version in ks.crd_versions(crd):
            rules = ks.cel_rules(group, kind, version)
            assert len(rules) == ks.k8s_cel.count_rule_entries(ks.crd_openapi_schema(crd, version))  # none missed
            status = [r.status for r in rules]
            counts[(kind, version)] = (
                len(rules),
                status.count(ks.k8s_cel.RuleStatus.EVALUATED),
                status.count(ks.k8s_cel.RuleStatus.TRANSITION),
                status.count(ks.k8s_cel.RuleStatus.UNSUPPORTED),
            )
            unsupported += [f"{kind} {version} {r.describe()}: {r.reason}" for r in rules if r.status is ks.k8s_cel.RuleStatus.UNSUPPORTED]
    assert counts == CEL_RULE_COUNTS
    assert unsupported == [
        "DynamoGraphDeployment v1alpha1 $.spec.services[*].sharedMemory: 'size is required when disabled is false' (rule: "
        "(has(self.disabled) && self.disabled) || (has(self.size) && quantity(self.size).isGreaterThan(quantity('0')))): "
        "cel-expr-python has no isGreaterThan(), quantity() (Kubernetes CEL library)"
    ]
    for line in unsupported:  # said in the test output too, not only here
        warnings.warn(f"CEL rule not evaluated offline: {line}", stacklevel=1)


@needs_crds
@pytest.mark.parametrize("name", ["demo.yaml", "glm53.yaml"])
def test_hand_written_deployments_pass_every_cel_rule(name):
    for doc in manifest(name):
        group, _, version = doc["apiVersion"].rpartition("/")
        if (group, doc["kind"]) not in ks.VENDORED_CRDS:
            continue
        evaluated: list[tuple[str, Any]] = []
        schema = ks.crd_openapi_schema(ks.vendored_crd(group, doc["kind"]), version)
        assert ks.k8s_cel.check(doc, schema, evaluated) == []
        if doc["kind"] == "DynamoGraphDeployment":  # every component and container was reached
            n = len(doc["spec"]["components"])
            messages = [rule.message for _, rule in evaluated]
            assert messages.count("sidecar containers must specify a non-empty image") == n
            assert messages.count("eppConfig may only be set when type is epp") == n
            assert "component names must be unique case-insensitively" in messages
            assert "spec.restart must be unset on create; set spec.restart.id after creation to request a restart" in messages


def _main_container(dgd: dict[str, Any], i: int) -> dict[str, Any]:
    return dgd["spec"]["components"][i]["podTemplate"]["spec"]["containers"][0]


BROKEN_BY_RULE = {
    "a sidecar without an image": (
        lambda dgd, i: dgd["spec"]["components"][i]["podTemplate"]["spec"]["containers"].append({"name": "log-shipper"}),
        "$.spec.components[{i}].podTemplate.spec.containers[1]",
        "sidecar containers must specify a non-empty image",
    ),
    "an init container with an empty image": (
        lambda dgd, i: dgd["spec"]["components"][i]["podTemplate"]["spec"].update(initContainers=[{"name": "warm", "image": ""}]),
        "$.spec.components[{i}].podTemplate.spec.initContainers[0]",
        "init containers must specify a non-empty image",
    ),
    "two names equal but for case": (
        lambda dgd, i: dgd["spec"]["components"][i].update(name="Decode"),
        "$.spec.components",
        "component names must be unique case-insensitively",
    ),
    "minAvailable over replicas": (
        lambda dgd, i: dgd["spec"]["components"][i].update(minAvailable=4),
        "$.spec.components[{i}]",
        "minAvailable must be less than or equal to replicas unless replicas is 0",
    ),
    "eppConfig on a prefill component": (
        lambda dgd, i: dgd["spec"]["components"][i].update(eppConfig={"configMapRef": {"name": "epp", "key": "config.yaml"}}),
        "$.spec.components[{i}]",
        "eppConfig may only be set when type is epp",
    ),
    "a restart on create": (
        lambda dgd, i: dgd["spec"].update(restart={"id": "1"}),
        "$.spec",
        "spec.restart must be unset on create; set spec.restart.id after creation to request a restart",
    ),
    "an unknown executor backend": (
        lambda dgd, i: dgd["spec"]["components"][i]["podTemplate"].setdefault("metadata", {}).update(
            annotations={"nvidia.com/vllm-distributed-executor-backend": "MPI"}),
        "$.spec.components[{i}].podTemplate.metadata.annotations",
        "podTemplate backend annotation must be mp or ray, case-insensitively",
    ),
    "both labelKey and clusterTopologyName": (
        lambda dgd, i: dgd["spec"].update(experimental={"kvTransferPolicy": {
            "domain": "zone", "labelKey": "topology.kubernetes.io/zone", "clusterTopologyName": "racks"}}),
        "$.spec.experimental.kvTransferPolicy",
        "exactly one of labelKey or clusterTopologyName is required",
    ),
}


@needs_crds
@pytest.mark.parametrize("case", list(BROKEN_BY_RULE))
def test_a_resource_breaking_a_cel_rule_fails_with_its_path_and_message(glm53_dgd, case):
    breaks, path, message = BROKEN_BY_RULE[case]
    i = _prefill_index(glm53_dgd)
    breaks(glm53_dgd, i)
    (found,) = problems(glm53_dgd)
    assert found.startswith(f"{path.format(i=i)}: {message} (x-kubernetes-validations rule: "), found

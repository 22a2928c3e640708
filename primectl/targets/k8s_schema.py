"""Offline schema checks for the Kubernetes resources primectl renders.

No API server runs here (test-hosts.md), so a manifest is checked the way the
API server's structural-schema validation would check it: the CRD's
`spec.versions[].schema.openAPIV3Schema`, converted to JSON Schema draft
2020-12, validated with `jsonschema`. Core kinds without a vendored schema
(ConfigMap, Service) get small hand-written ones.

The CRD files themselves are upstream data, so they are not committed here:
they live in the steering repository's shared/crds/ (found at ../shared/crds
beside the checkout, where CI has them, or shared/crds inside it, or at
$PRIMECTL_CRD_DIR), and each must match the sha256 pinned in
primectl/targets/data/crds/PROVENANCE.

What the conversion enforces and what it cannot (docs/kubernetes-notes.md):
types, enums, patterns, min/max, required fields, int32/int64 ranges, and
unknown fields wherever the schema does not preserve them (the API server
rejects those under `fieldValidation=Strict`, kubectl's default, and prunes
them silently otherwise). A custom resource that passes is then checked
against the CRD's CEL rules (`x-kubernetes-validations`, primectl/targets/k8s_cel.py):
each evaluated as on a create, transition rules and rules needing a Kubernetes
CEL function the library lacks named by `cel_report`. List-map key uniqueness
and the operator's admission webhooks are not checked.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import yaml

from primectl.targets import k8s_cel
from primectl.yamltext import SafeLoader

if TYPE_CHECKING:  # jsonschema is imported where a resource is validated: every recipe load imports this module
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

JSONSchema = dict[str, Any]

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
CRD_DIR_ENV = "PRIMECTL_CRD_DIR"
PROVENANCE = "data/crds/PROVENANCE"  # inside the primectl.targets package
# Vendored CRDs by (group, kind); PROVENANCE beside them says where each came from.
VENDORED_CRDS = {
    ("nvidia.com", "DynamoGraphDeployment"): "nvidia.com_dynamographdeployments.yaml",
    ("resource.nvidia.com", "ComputeDomain"): "resource.nvidia.com_computedomains.yaml",
    ("monitoring.coreos.com", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
}
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
# OpenAPI keywords with a schema (or list of schemas) as value, converted recursively.
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
# Kubernetes-only keywords the conversion drops: JSON Schema has no equivalent.
_K8S_ONLY = (
    "nullable",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
CONFIGMAP_KEY = r"^[-._a-zA-Z0-9]+$"
CONFIGMAP_MAX_BYTES = 1024 * 1024  # the API server's limit on one ConfigMap's data


@dataclass(frozen=True)
class SchemaProblem:
    """One way a resource breaks its schema, at a JSON path such as `$.spec.components[1].type`."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def load_yaml(text: str) -> Any:
    """Parse YAML with libyaml when available (the DGD CRD is 1.6 MB: 0.2 s instead of 2 s)."""
    return yaml.load(text, Loader=SafeLoader)


def load_documents(text: str) -> list[Any]:
    """Every YAML document in `text` (a manifest stream), empty documents dropped."""
    return [doc for doc in yaml.load_all(text, Loader=SafeLoader) if doc is not None]


class CrdsUnavailable(FileNotFoundError):
    """The pinned CRD files are not where primectl looks for them."""


def crd_search_path() -> list[pathlib.Path]:
    """Where the CRD files may be: $PRIMECTL_CRD_DIR, else shared/crds inside or beside the checkout, then the
    ones committed here (committed_crds).

    "Beside" is `../shared/crds` from the repository root, where CI has them (read-only, next to
    its clean checkout). The checkout is the one this module was imported from (an editable
    install, its path as given and with symlinks resolved) and, for an installed primectl run
    from a checkout, the one holding the current directory.
    """
    if os.environ.get(CRD_DIR_ENV):
        return [pathlib.Path(os.environ[CRD_DIR_ENV])]
    here = pathlib.Path(__file__)
    roots = [here.absolute().parents[2], here.resolve().parents[2]]
    cwd = pathlib.Path.cwd()
    roots += [d for d in (cwd, *cwd.parents) if (d / "primectl" / "targets" / PROVENANCE).is_file()][:1]
    dirs = [d for root in roots for d in (root / "shared" / "crds", root.parent / "shared" / "crds")]
    return list(dict.fromkeys([*dirs, committed_crds()]))


def committed_crds() -> pathlib.Path:
    """The CRDs this repository carries itself (those no steering repository provides: prometheus-operator's)."""
    return pathlib.Path(str(files("primectl.targets").joinpath("data", "crds")))


@functools.cache
def crd_pins() -> Mapping[str, Mapping[str, Any]]:
    """PROVENANCE entries by file name: upstream repository, path, commit and sha256 of each CRD."""
    record = load_yaml(files("primectl.targets").joinpath(PROVENANCE).read_text(encoding="utf-8"))
    return {entry["file"]: entry for entry in record["files"]}


def crd_file(name: str) -> pathlib.Path:
    """The CRD file `name` from the first search-path directory that has it, checked against its pin."""
    pin = crd_pins()[name]
    for directory in crd_search_path():
        path = directory / name
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            if digest != pin["sha256"]:
                raise ValueError(
                    f"{path} has sha256 {digest}, PROVENANCE pins {pin['sha256']} "
                    f"({pin['repo']} {pin['path']} at {pin['commit']}); run scripts/refresh-crds.py --check"
                )
            return path
    looked = ", ".join(str(d) for d in crd_search_path())
    raise CrdsUnavailable(
        f"{name} not found (looked in {looked}); it is {pin['path']} of {pin['repo']} at {pin['commit']}: "
        f"put it in ../shared/crds beside the checkout (or shared/crds in it), or point ${CRD_DIR_ENV} at a folder "
        f"holding it (scripts/refresh-crds.py)"
    )


CRD_ABSENT = "CRD not present: see primectl/targets/data/crds/PROVENANCE"


def crds_missing() -> str | None:
    """None when every pinned CRD file is present (and matches its pin); else what is missing."""
    try:
        for name in crd_pins():
            crd_file(name)
    except CrdsUnavailable as exc:
        return f"{CRD_ABSENT} ({exc})"
    return None


@functools.cache
def vendored_crd(group: str, kind: str) -> Mapping[str, Any]:
    """The pinned CustomResourceDefinition for `kind` in API group `group`."""
    try:
        name = VENDORED_CRDS[(group, kind)]
    except KeyError:
        raise KeyError(f"no vendored CRD for {kind} in group {group}") from None
    crd = load_yaml(crd_file(name).read_text(encoding="utf-8"))
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise ValueError(f"{name} is not a CustomResourceDefinition")
    return crd


def crd_versions(crd: Mapping[str, Any]) -> list[str]:
    """The version names a CRD serves, in the order it lists them."""
    return [str(v["name"]) for v in crd["spec"]["versions"] if v.get("served", True)]


def crd_json_schema(crd: Mapping[str, Any], version: str) -> JSONSchema:
    """JSON Schema (draft 2020-12) for custom resources of `crd` at `version`.

    The root pins apiVersion and kind, requires metadata, and replaces the
    CRD's bare `metadata: {type: object}` with ObjectMeta's rules (the API
    server validates metadata itself, not through the CRD schema).
    """
    spec = crd["spec"]
    root = openapi_to_json_schema(crd_openapi_schema(crd, version))
    root.setdefault("properties", {})
    root["properties"]["apiVersion"] = {"const": f"{spec['group']}/{version}"}
    root["properties"]["kind"] = {"const": spec["names"]["kind"]}
    root["properties"]["metadata"] = object_meta_schema(namespaced=spec.get("scope") == "Namespaced")
    root["required"] = sorted({*root.get("required", []), "apiVersion", "kind", "metadata"})
    root["$schema"] = DRAFT_2020_12
    return root


def crd_openapi_schema(crd: Mapping[str, Any], version: str) -> Mapping[str, Any]:
    """The CRD's own `openAPIV3Schema` for `version` (CEL rules and all), as loaded."""
    spec = crd["spec"]
    matching = [v for v in spec["versions"] if v["name"] == version]
    if not matching:
        raise KeyError(f"{spec['names']['kind']} has no version {version} (has: {', '.join(crd_versions(crd))})")
    openapi = matching[0].get("schema", {}).get("openAPIV3Schema")
    if openapi is None:
        raise ValueError(f"{spec['names']['kind']} {version} declares no openAPIV3Schema")
    return openapi  # type: ignore[no-any-return]


def cel_rules(group: str, kind: str, version: str) -> list[k8s_cel.CelRule]:
    """The `x-kubernetes-validations` rules of a vendored CRD version, compiled, each with its status on a create."""
    return k8s_cel.rules_of(crd_openapi_schema(vendored_crd(group, kind), version))


def cel_report(resources: Iterable[Any]) -> list[str]:
    """For each vendored custom-resource kind and version among `resources` whose CRD is present: how many
    CEL rules it has, how many are evaluated, and each one that is not (and why)."""
    lines: list[str] = []
    seen = set()
    for resource in resources:
        api_version, kind = resource.get("apiVersion"), resource.get("kind")
        group, _, version = str(api_version).rpartition("/")
        if (group, kind) not in VENDORED_CRDS or (api_version, kind) in seen:
            continue
        seen.add((api_version, kind))
        try:
            rules = cel_rules(group, str(kind), version)
        except (CrdsUnavailable, KeyError):
            continue  # the schema line already says the kind was not checked
        lines += k8s_cel.rule_report(str(kind), str(api_version), rules)
    return lines


def openapi_to_json_schema(node: Mapping[str, Any]) -> JSONSchema:
    """Convert one structural OpenAPI v3 schema node (and everything below it).

    - `nullable: true` adds "null" to the type (and to an enum);
    - `x-kubernetes-int-or-string` becomes anyOf integer|string (the type is dropped);
    - an object with `properties` and neither `additionalProperties` nor
      `x-kubernetes-preserve-unknown-fields` refuses unknown fields;
    - `x-kubernetes-embedded-resource` requires apiVersion, kind and metadata;
    - `format: int32|int64` bounds the integer;
    - other `x-kubernetes-*` keywords (CEL rules, list types) are dropped (k8s_cel evaluates the CEL rules).
    """
    out: JSONSchema = {k: copy.deepcopy(v) for k, v in node.items() if k not in _K8S_ONLY}
    if isinstance(node.get("pattern"), str):
        out["pattern"] = python_pattern(node["pattern"])
    for key in ("properties", "patternProperties"):
        if key in node:
            out[key] = {name: openapi_to_json_schema(sub) for name, sub in node[key].items()}
    if isinstance(node.get("additionalProperties"), Mapping):
        out["additionalProperties"] = openapi_to_json_schema(node["additionalProperties"])
    if isinstance(node.get("items"), Mapping):
        out["items"] = openapi_to_json_schema(node["items"])
    for key in _SUBSCHEMA_LISTS:
        if key in node:
            out[key] = [openapi_to_json_schema(sub) for sub in node[key]]
    if "not" in node:
        out["not"] = openapi_to_json_schema(node["not"])

    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        if not any(k in out for k in _SUBSCHEMA_LISTS):
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("type") == "integer" and node.get("format") in INT_RANGES:
        low, high = INT_RANGES[node["format"]]
        out["minimum"] = max(out.get("minimum", low), low)
        out["maximum"] = min(out.get("maximum", high), high)
    if node.get("x-kubernetes-embedded-resource"):
        _embed_resource(out)
    if _refuses_unknown_fields(node):
        out["additionalProperties"] = False
    if node.get("nullable"):
        _allow_null(out)
    return out


_LEADING_FLAGS = re.compile(r"^\^(\(\?[imsU]+\))")


def python_pattern(pattern: str) -> str:
    """An OpenAPI `pattern` (the API server's Go RE2) that Python's `re` reads the same: RE2 takes flags after
    `^` (the PrometheusRule CRD's `^(?i)(abort|warn)?$`), Python only at the very start."""
    return _LEADING_FLAGS.sub(lambda m: m.group(1) + "^", pattern, count=1)


def _refuses_unknown_fields(node: Mapping[str, Any]) -> bool:
    """True where the API server treats a field outside `properties` as unknown."""
    return (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    )


def _embed_resource(out: JSONSchema) -> None:
    """An embedded object (RawExtension-like) must itself look like a resource."""
    props = out.setdefault("properties", {})
    props.setdefault("apiVersion", {"type": "string", "minLength": 1})
    props.setdefault("kind", {"type": "string", "minLength": 1})
    props.setdefault("metadata", {"type": "object"})
    out["required"] = sorted({*out.get("required", []), "apiVersion", "kind"})


def _allow_null(out: JSONSchema) -> None:
    """`nullable: true`: null is a valid value besides the declared type."""
    if "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = types if "null" in types else [*types, "null"]
    elif "anyOf" in out:
        out["anyOf"] = [*out["anyOf"], {"type": "null"}]
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]


def object_meta_schema(namespaced: bool) -> JSONSchema:
    """The ObjectMeta fields a manifest may carry, with the API server's name and label rules."""
    string_map = {"type": "object", "additionalProperties": {"type": "string"}}
    props: JSONSchema = {
        "name": {"type": "string", "maxLength": 253, "pattern": DNS1123_SUBDOMAIN},
        "generateName": {"type": "string"},
        "labels": {
            "type": "object",
            "propertyNames": {"pattern": LABEL_KEY, "maxLength": 317},
            "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
        },
        "annotations": {**string_map, "propertyNames": {"pattern": LABEL_KEY, "maxLength": 317}},
        "finalizers": {"type": "array", "items": {"type": "string"}},
        "ownerReferences": {"type": "array", "items": {"type": "object"}},
        # Set by the server; accepted so an object read back from a cluster validates.
        "uid": {"type": "string"},
        "resourceVersion": {"type": "string"},
        "generation": {"type": "integer"},
        "creationTimestamp": {"type": ["string", "null"]},
        "deletionTimestamp": {"type": ["string", "null"]},
        "deletionGracePeriodSeconds": {"type": "integer"},
        "managedFields": {"type": "array", "items": {"type": "object"}},
        "selfLink": {"type": "string"},
    }
    if namespaced:
        props["namespace"] = {"type": "string", "maxLength": 63, "pattern": DNS1123_LABEL}
    return {
        "type": "object",
        "properties": props,
        "additionalProperties": False,
        "anyOf": [{"required": ["name"]}, {"required": ["generateName"]}],
    }


def configmap_schema() -> JSONSchema:
    """A hand-written schema for core/v1 ConfigMap (no vendored OpenAPI for core kinds).

    Covers the fields a manifest sets: metadata, data, binaryData, immutable;
    key names as the API server allows them. The 1 MiB size limit is checked
    by `validate_resource`, not here.
    """
    keys = {"pattern": CONFIGMAP_KEY, "maxLength": 253}
    return {
        "$schema": DRAFT_2020_12,
        "type": "object",
        "properties": {
            "apiVersion": {"const": "v1"},
            "kind": {"const": "ConfigMap"},
            "metadata": object_meta_schema(namespaced=True),
            "data": {"type": "object", "propertyNames": keys, "additionalProperties": {"type": "string"}},
            "binaryData": {
                "type": "object",
                "propertyNames": keys,
                "additionalProperties": {"type": "string", "pattern": r"^[A-Za-z0-9+/]*={0,2}$"},
            },
            "immutable": {"type": "boolean"},
        },
        "required": ["apiVersion", "kind", "metadata"],
        "additionalProperties": False,
    }


def service_schema() -> JSONSchema:
    """A hand-written schema for the core/v1 Service fields primectl renders (no vendored core OpenAPI).

    A subset: selector, ports (name, port, targetPort, protocol, appProtocol),
    type, clusterIP, publishNotReadyAddresses. Anything else under spec is
    refused, so a field primectl starts rendering must be added here first.
    """
    port_name = {"type": "string", "maxLength": 15, "pattern": DNS1123_LABEL}
    port_number = {"type": "integer", "minimum": 1, "maximum": 65535}
    port = {
        "type": "object",
        "properties": {
            "name": port_name,
            "port": port_number,
            "targetPort": {"anyOf": [port_number, port_name]},
            "protocol": {"enum": ["TCP", "UDP", "SCTP"]},
            "appProtocol": {"type": "string"},
        },
        "required": ["port"],
        "additionalProperties": False,
    }
    spec = {
        "type": "object",
        "properties": {
            "selector": {
                "type": "object",
                "propertyNames": {"pattern": LABEL_KEY, "maxLength": 317},
                "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE},
            },
            "ports": {"type": "array", "items": port, "minItems": 1},
            "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]},
            "clusterIP": {"type": "string"},
            "publishNotReadyAddresses": {"type": "boolean"},
        },
        "additionalProperties": False,
    }
    meta = object_meta_schema(namespaced=True)
    # A Service name is a DNS-1035 label (RFC 1035: starts with a letter).
    meta["properties"]["name"] = {"type": "string", "maxLength": 63, "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$"}
    return {
        "$schema": DRAFT_2020_12,
        "type": "object",
        "properties": {
            "apiVersion": {"const": "v1"},
            "kind": {"const": "Service"},
            "metadata": meta,
            "spec": spec,
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
    }


# Core kinds checked against the hand-written schemas above.
CORE_SCHEMAS = {("v1", "ConfigMap"): configmap_schema, ("v1", "Service"): service_schema}


@functools.cache
def _validator(api_version: str, kind: str) -> Draft202012Validator:
    """The compiled validator for one apiVersion/kind (the DGD schema takes a while to build)."""
    from jsonschema import Draft202012Validator

    if (api_version, kind) in CORE_SCHEMAS:
        schema = CORE_SCHEMAS[(api_version, kind)]()
    else:
        group, _, version = api_version.rpartition("/")
        schema = crd_json_schema(vendored_crd(group, kind), version)
    return Draft202012Validator(schema)


def validate_against(resource: Any, schema: JSONSchema) -> list[SchemaProblem]:
    """Every problem `resource` has against `schema`, in document order."""
    from jsonschema import Draft202012Validator

    return _problems(Draft202012Validator(schema).iter_errors(resource))


def validate_resource(resource: Any) -> list[SchemaProblem]:
    """Every schema problem of one manifest, chosen by its apiVersion and kind.

    An unknown apiVersion/kind is itself a problem: nothing would check it.
    A custom resource without schema problems is then checked against its CRD's
    CEL rules (as the API server, which skips them on an invalid object).
    Raises CrdsUnavailable when the CRD a custom resource needs is not present.
    """
    if not isinstance(resource, Mapping):
        return [SchemaProblem("$", f"a resource must be a mapping, not {type(resource).__name__}")]
    api_version, kind = resource.get("apiVersion"), resource.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return [SchemaProblem("$", "apiVersion and kind must both be strings")]
    group, _, version = api_version.rpartition("/")
    if (api_version, kind) not in CORE_SCHEMAS:
        if (group, kind) not in VENDORED_CRDS:
            supported = ", ".join([*(f"{k} {v}" for v, k in CORE_SCHEMAS), *(f"{k} {g}/*" for g, k in VENDORED_CRDS)])
            return [SchemaProblem("$", f"no schema for {kind} {api_version} (can check: {supported})")]
        served = crd_versions(vendored_crd(group, kind))
        if version not in served:
            return [SchemaProblem("$.apiVersion", f"{kind} is served as {', '.join(f'{group}/{v}' for v in served)}, not {api_version}")]
    problems = _problems(_validator(api_version, kind).iter_errors(resource))
    if kind == "ConfigMap":
        problems += _configmap_size(resource)
    if not problems and (group, kind) in VENDORED_CRDS:
        # Like the API server, CEL rules are evaluated on a resource that passes the structural schema.
        openapi = crd_openapi_schema(vendored_crd(group, kind), version)
        problems = [SchemaProblem(p.path, p.message) for p in k8s_cel.check(resource, openapi)]
    return problems


def validate_documents(docs: Sequence[Any]) -> list[tuple[int, SchemaProblem]]:
    """Problems of every document in a manifest stream, tagged with the document's index."""
    return [(i, problem) for i, doc in enumerate(docs) for problem in validate_resource(doc)]


def _configmap_size(resource: Mapping[str, Any]) -> list[SchemaProblem]:
    """The API server refuses a ConfigMap whose data and binaryData exceed 1 MiB."""
    size = 0
    for field in ("data", "binaryData"):
        values = resource.get(field) or {}
        if isinstance(values, Mapping):
            size += sum(len(str(k).encode()) + len(str(v).encode()) for k, v in values.items())
    if size > CONFIGMAP_MAX_BYTES:
        return [SchemaProblem("$.data", f"{size} bytes of data; a ConfigMap holds at most {CONFIGMAP_MAX_BYTES}")]
    return []


def json_path(parts: Iterable[Any]) -> str:
    """`$.spec.components[1].podTemplate` from jsonschema's absolute path."""
    out = "$"
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.replace("_", "").replace("-", "").isalnum():
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


def _problems(errors: Iterator[ValidationError]) -> list[SchemaProblem]:
    """Readable problems from jsonschema errors, sorted by path."""
    problems: list[SchemaProblem] = []
    for error in errors:
        problems += _explain(error)
    return sorted(set(problems), key=lambda p: (p.path, p.message))


def _explain(error: ValidationError) -> list[SchemaProblem]:
    """One jsonschema error as problems naming the exact field where that helps."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and error.validator_value is False and isinstance(error.instance, dict):
        known = set(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in known)
        hint = f"; known fields: {', '.join(sorted(known))}" if len(known) <= 25 else ""
        return [SchemaProblem(json_path([*path, key]), f"unknown field {key!r}{hint}") for key in extra]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        return [SchemaProblem(json_path([*path, key]), "required field missing") for key in missing]
    if "propertyNames" in error.relative_schema_path:
        return [SchemaProblem(json_path(path), f"key {error.instance!r}: {error.message.removeprefix(repr(error.instance) + ' ')}")]
    if error.validator in ("anyOf", "oneOf") and error.context:
        # int-or-string and similar unions: say what was accepted, not "not valid under any".
        accepted = sorted({str(sub.schema.get("type", sub.validator)) for sub in error.context})
        return [SchemaProblem(json_path(path), f"{error.instance!r} is none of: {', '.join(accepted)}")]
    if error.validator == "const":
        return [SchemaProblem(json_path(path), f"must be {error.validator_value!r}, not {error.instance!r}")]
    return [SchemaProblem(json_path(path), error.message)]

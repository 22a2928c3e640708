"""The CEL rules (`x-kubernetes-validations`) of the pinned CRDs, evaluated offline on a create.

The API server evaluates each rule with `self` bound to the value of the schema
node the rule is declared on: an object, a whole list or map where the rule sits
on the array/map schema, one element or value where it sits on `items` /
`additionalProperties`. A rule is not evaluated where its value is absent (or
null). The schema's defaults are filled in first, as the API server does. This
module walks a resource against its CRD's `openAPIV3Schema` the same way and
evaluates every rule with cel-expr-python (Google's CEL runtime, cel-cpp), with
the CEL extensions the API server enables that it has: strings (`lowerAscii`,
`split`, ...), optional types and `cel.bind`.

A create, not an update, is what a render produces, so:
- a transition rule (one that reads `oldSelf`) is not applicable and is named as
  such (`RuleStatus.TRANSITION`), except
- a rule with `optionalOldSelf: true`, which the API server also evaluates on a
  create with `oldSelf` = `optional.none()`; so is it here.

A rule that needs a Kubernetes CEL library function this runtime lacks
(`quantity()`, `isURL()`, `format.*`, `url()`, `ip()`, `cidr()`, `semver()`,
list `isSorted()`/`sum()`, ...) does not compile; it is `RuleStatus.UNSUPPORTED`,
named with the functions it lacks by `rule_report`, and never silently passed.

Object field names are escaped as the API server does (`foo-bar` is
`self.foo__dash__bar`, `namespace` is `self.__namespace__`); map keys are not.
Type-specific formats (`date-time` as a timestamp, `byte` as bytes) are not
converted: no pinned rule reads such a field.
"""

from __future__ import annotations

import copy
import enum
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version as package_version
from typing import Any

CEL_LIBRARY = "cel-expr-python"
# CEL reserved words the API server escapes as __{word}__ when they are field names.
_RESERVED = frozenset(
    "true false null in as break const continue else for function if import let loop package namespace return var void while".split()
)
_ACCESSIBLE = re.compile(r"^[a-zA-Z_.\-/][a-zA-Z0-9_.\-/]*$")
_UNDECLARED = re.compile(r"undeclared reference to '([^']+)'")


class RuleStatus(enum.Enum):
    """Whether a rule is evaluated on a created resource."""

    EVALUATED = "evaluated"
    TRANSITION = "transition rule: not applicable to a create"
    UNSUPPORTED = "not evaluable"


@dataclass(frozen=True)
class CelRule:
    """One `x-kubernetes-validations` entry and the schema node it is declared on."""

    schema_path: str  # e.g. `$.spec.components[*].podTemplate.spec.containers[*]`
    rule: str
    message: str
    field_path: str | None = None
    message_expression: str | None = None
    optional_old_self: bool = False
    status: RuleStatus = RuleStatus.EVALUATED
    reason: str = ""  # why it is not evaluated, when it is not
    program: Any = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        """`$.spec.components[*]: 'message' (rule: ...)` for reports."""
        return f"{self.schema_path}: {self.message!r} (rule: {self.rule})"


@dataclass(frozen=True)
class CelProblem:
    """A rule that a value at `path` fails (or could not be evaluated on)."""

    path: str
    message: str


@functools.cache
def library_version() -> str:
    """`cel-expr-python 0.1.3`."""
    return f"{CEL_LIBRARY} {package_version(CEL_LIBRARY)}"


@functools.cache
def _envs() -> tuple[Any, Any]:
    """CEL environments: `self` only (for evaluation), and `self` + `oldSelf` (to compile transition rules)."""
    from cel_expr_python import cel
    from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

    def env(*names: str) -> Any:
        extensions = [ext_strings.ExtStrings(), ext_optional.ExtOptional(), ext_bindings.ExtBindings()]
        return cel.NewEnv(variables=dict.fromkeys(names, cel.Type.DYN), extensions=extensions)

    return env("self"), env("self", "oldSelf")


def _compile_error(env: Any, expression: str) -> str | None:
    """None when `expression` compiles in `env`, else the compiler's message."""
    try:
        env.compile(expression)
    except RuntimeError as exc:
        return str(exc)
    return None


def compile_rule(schema_path: str, entry: Mapping[str, Any]) -> CelRule:
    """One `x-kubernetes-validations` entry, compiled, with its status on a create."""
    rule = str(entry["rule"])
    base = CelRule(
        schema_path=schema_path,
        rule=rule,
        message=str(entry.get("message") or f"failed rule: {rule}"),
        field_path=entry.get("fieldPath"),
        message_expression=entry.get("messageExpression"),
        optional_old_self=bool(entry.get("optionalOldSelf")),
    )
    self_env, both_env = _envs()
    error = _compile_error(both_env, rule)
    if error is not None:
        missing = sorted(set(_UNDECLARED.findall(error)) - {"self", "oldSelf"})
        if missing:
            reason = f"{CEL_LIBRARY} has no {', '.join(f'{name}()' for name in missing)} (Kubernetes CEL library)"
        else:
            reason = f"{CEL_LIBRARY} cannot compile it: {error.splitlines()[0]}"
        return _with(base, status=RuleStatus.UNSUPPORTED, reason=reason)
    reads_old_self = "oldSelf" in (_compile_error(self_env, rule) or "")
    if reads_old_self and not base.optional_old_self:
        return _with(base, status=RuleStatus.TRANSITION, reason="it reads oldSelf, which a create does not have")
    # optionalOldSelf: on a create the API server binds oldSelf to optional.none().
    source = f"cel.bind(oldSelf, optional.none(), {rule})" if reads_old_self else rule
    return _with(base, program=self_env.compile(source))


def _with(rule: CelRule, **changes: Any) -> CelRule:
    return CelRule(**{**rule.__dict__, **changes})


def count_rule_entries(node: Any) -> int:
    """Every `x-kubernetes-validations` entry anywhere in `node`: as many as `rules_of` must find."""
    if isinstance(node, Mapping):
        own = len(node.get("x-kubernetes-validations") or [])
        return own + sum(count_rule_entries(v) for k, v in node.items() if k != "x-kubernetes-validations")
    if isinstance(node, list):
        return sum(count_rule_entries(v) for v in node)
    return 0


def _child(path: str, name: Any) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    if isinstance(name, str) and name.replace("_", "").replace("-", "").isalnum():
        return f"{path}.{name}"
    return f"{path}[{name!r}]"


# Compiled rules by id(schema node), per schema (kept here too, so the ids stay valid).
_COMPILED: dict[int, tuple[Mapping[str, Any], dict[int, list[CelRule]]]] = {}


def _compiled(schema: Mapping[str, Any]) -> dict[int, list[CelRule]]:
    """Compiled rules of every node under `schema` (a CRD's openAPIV3Schema, never mutated), by node id."""
    if id(schema) in _COMPILED:
        return _COMPILED[id(schema)][1]
    out: dict[int, list[CelRule]] = {}

    def walk(node: Mapping[str, Any], path: str) -> None:
        entries = node.get("x-kubernetes-validations") or []
        if entries:
            out[id(node)] = [compile_rule(path, entry) for entry in entries]
        for name, sub in (node.get("properties") or {}).items():
            walk(sub, _child(path, name))
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), Mapping):
                walk(node[key], f"{path}[*]")

    walk(schema, "$")
    _COMPILED[id(schema)] = (schema, out)
    return out


def rules_of(schema: Mapping[str, Any]) -> list[CelRule]:
    """Every rule of an `openAPIV3Schema`, compiled, in schema order."""
    return [rule for rules in _compiled(schema).values() for rule in rules]


def check(resource: Any, schema: Mapping[str, Any], evaluated: list[tuple[str, CelRule]] | None = None) -> list[CelProblem]:
    """The rules `resource` (being created) fails, evaluated against the CRD schema `schema`.

    The schema's defaults are applied first, as the API server does before it validates.
    `evaluated`, when given, receives (JSON path, rule) of every evaluation made.
    """
    compiled = _compiled(schema)
    problems: list[CelProblem] = []
    _check_node(schema, with_defaults(schema, resource), "$", compiled, problems, evaluated)
    return problems


def with_defaults(node: Mapping[str, Any], value: Any) -> Any:
    """A copy of `value` with the schema's `default`s filled in where a field is absent (structural defaulting)."""
    if isinstance(value, Mapping):
        props = node.get("properties") or {}
        extra = node.get("additionalProperties")
        out = dict(value)
        for name, sub in props.items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = with_defaults(sub, out[name])
        if isinstance(extra, Mapping):
            out.update({key: with_defaults(extra, item) for key, item in out.items() if key not in props})
        return out
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        return [with_defaults(node["items"], item) for item in value]
    return value


def _check_node(
    node: Mapping[str, Any],
    value: Any,
    path: str,
    compiled: dict[int, list[CelRule]],
    out: list[CelProblem],
    evaluated: list[tuple[str, CelRule]] | None,
) -> None:
    if value is None:
        return  # the API server evaluates no rule on an absent or null value
    for rule in compiled.get(id(node), []):
        if rule.program is not None:
            out += _evaluate(rule, node, value, path)
            if evaluated is not None:
                evaluated.append((path, rule))
    props = node.get("properties") or {}
    if isinstance(value, Mapping):
        for name, sub in props.items():
            if name in value:
                _check_node(sub, value[name], _child(path, name), compiled, out, evaluated)
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key, item in value.items():
                if key not in props:
                    _check_node(extra, item, _child(path, key), compiled, out, evaluated)
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for i, item in enumerate(value):
            _check_node(node["items"], item, _child(path, i), compiled, out, evaluated)


def _evaluate(rule: CelRule, node: Mapping[str, Any], value: Any, path: str) -> list[CelProblem]:
    where = path + (rule.field_path or "")
    try:
        result = rule.program.eval(data={"self": cel_value(node, value)})
        outcome = result.plain_value()
        failed = result.type().name() == "ERROR" or not isinstance(outcome, bool)
    except RuntimeError as exc:  # the runtime raises on some evaluation errors instead of returning one
        outcome, failed = str(exc), True
    if failed:
        return [CelProblem(where, f"CEL rule could not be evaluated ({outcome}); rule: {rule.rule}")]
    if outcome:
        return []
    return [CelProblem(where, f"{_message(rule, node, value)} (x-kubernetes-validations rule: {rule.rule})")]


def _message(rule: CelRule, node: Mapping[str, Any], value: Any) -> str:
    """The rule's message; its messageExpression where it has one that yields a string."""
    if rule.message_expression:
        try:
            result = _envs()[0].compile(rule.message_expression).eval(data={"self": cel_value(node, value)})
            if isinstance(result.plain_value(), str) and result.plain_value():
                return str(result.plain_value())
        except RuntimeError:
            pass  # the API server falls back to `message` too
    return rule.message


def escape_field_name(name: str) -> str | None:
    """The CEL identifier the API server gives an object field (None where it is not accessible from CEL)."""
    if name in _RESERVED:
        return f"__{name}__"
    if not _ACCESSIBLE.match(name):
        return None
    out = name.replace("__", "__underscores__")
    return out.replace(".", "__dot__").replace("-", "__dash__").replace("/", "__slash__")


def cel_value(node: Mapping[str, Any], value: Any) -> Any:
    """`value` as CEL sees it under schema `node`: object fields escaped and only declared ones kept; map keys as they are."""
    if isinstance(value, Mapping):
        props = node.get("properties") or {}
        extra = node.get("additionalProperties")
        if props:
            out: dict[str, Any] = {}
            for name, sub in props.items():
                escaped = escape_field_name(name)
                if name in value and escaped is not None:
                    out[escaped] = cel_value(sub, value[name])
            return out
        if isinstance(extra, Mapping):
            return {key: cel_value(extra, item) for key, item in value.items()}
        return dict(value)
    if isinstance(value, list):
        items = node.get("items")
        return [cel_value(items, item) if isinstance(items, Mapping) else item for item in value]
    if node.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # a `number` is a CEL double even when the manifest writes 2
    return value


def rule_report(kind: str, api_version: str, rules: Sequence[CelRule]) -> list[str]:
    """Lines saying how many rules of `kind` were evaluated, and naming each one that was not, and why."""
    evaluated = sum(r.status is RuleStatus.EVALUATED for r in rules)
    lines = [f"cel: {kind} {api_version}: {len(rules)} x-kubernetes-validations rules, {evaluated} evaluated ({library_version()})"]
    for rule in rules:
        if rule.status is RuleStatus.TRANSITION:
            lines.append(f"cel: {kind} not applicable to a create (transition rule, reads oldSelf): {rule.describe()}")
        elif rule.status is RuleStatus.UNSUPPORTED:
            lines.append(f"cel: {kind} NOT evaluated ({rule.reason}): {rule.describe()}")
    return lines

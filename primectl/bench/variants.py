"""Sweep variants: a base recipe plus overrides by dotted path, each written out and planned like any recipe.

An axis is a list of override sets; the variants are the cartesian product of the axes. `--vary
decode.workers=1,2,3` is an axis of three one-field sets; `--variant 'decode.parallel=TP8,decode.dcp=4'`
adds one set to the axis of explicit variants (fields that must change together); a sweep file's
`vary:` mapping holds both kinds. Every variant becomes `variants/<id>.yaml` (`extends:` the base), so it
is validated, planned and reported on exactly like a recipe an operator wrote, with file:line errors.

Worker counts follow the P:D ratio. A variant that sets `ratio`, or a parallel spec that changes how many
GPUs an instance takes, gets the counts that ratio needs on the recipe's hosts: the most prefill groups
(in steps of the ratio) that the planner can place. On hosts without GPUs the base's prefill groups are
kept. A variant that sets the counts itself gets its `ratio` rewritten to match them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from math import gcd
from pathlib import Path
from typing import Any

import yaml

from primectl.errors import PlanError, Problem, RecipeError
from primectl.recipe.model import PARALLEL_RE
from primectl.recipe.yamlpos import load_yaml

#: Fields whose change alters how many GPUs an instance takes, so the counts are derived again.
RESHAPING = ("ratio", "prefill.parallel", "decode.parallel")
COUNTS = ("prefill.groups", "decode.workers")

Overrides = dict[str, Any]


@dataclass(frozen=True)
class Axis:
    """One dimension of the sweep: its name and the override sets along it."""

    name: str
    sets: tuple[tuple[tuple[str, Any], ...], ...]
    source: str  # where it was written: `--vary ...`, `--variant`, or file:line


@dataclass
class Variant:
    """One point of the sweep: what was asked, what was derived, and its recipe file."""

    id: str
    overrides: Overrides
    derived: Overrides = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    file: Path | None = None
    plan_hash: str = ""

    @property
    def label(self) -> str:
        """The overrides as the operator would type them (`base` for none)."""
        return ", ".join(f"{k}={_show(v)}" for k, v in self.overrides.items()) or "base"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "label": self.label, "overrides": self.overrides, "derived": self.derived,
                "notes": self.notes, "file": str(self.file) if self.file else None, "plan_hash": self.plan_hash}


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def scalar(text: str) -> Any:
    """A value from the command line, typed as YAML would type it; `1:4` stays a string (YAML 1.1 reads 64)."""
    text = text.strip()
    if ":" in text:
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _check_path(path: str, source: str) -> str:
    parts = path.split(".")
    if not path or any(not p or p.isdigit() for p in parts):
        raise RecipeError([Problem(source, 0, 0, path, "an override path is dotted field names, e.g. "
                                   "decode.workers (list items cannot be varied)")])
    if parts[0] in ("name", "namespace", "extends", "hosts"):
        raise RecipeError([Problem(source, 0, 0, path, f"`{parts[0]}` cannot be varied: every variant is the same "
                                   "deployment on the same hosts, changed in place")])
    return path


def parse_vary(text: str) -> Axis:
    """`PATH=V1,V2,...` -> an axis of one-field override sets."""
    source = f"--vary {text}"
    path, eq, values = text.partition("=")
    if not eq or not values.strip():
        raise RecipeError([Problem(source, 0, 0, path.strip(), "expected PATH=VALUE[,VALUE...], "
                                   "e.g. decode.workers=1,2,3 or ratio=1:2,1:4")])
    path = _check_path(path.strip(), source)
    sets = tuple(((path, scalar(v)),) for v in values.split(","))
    return Axis(path, sets, source)


def parse_variant(text: str) -> tuple[tuple[str, Any], ...]:
    """`PATH=V,PATH=V` -> one override set (fields that change together)."""
    source = f"--variant {text}"
    out = []
    for part in text.split(","):
        path, eq, value = part.partition("=")
        if not eq:
            raise RecipeError([Problem(source, 0, 0, part.strip(), "expected PATH=VALUE[,PATH=VALUE...], "
                                       "e.g. decode.parallel=TP8,decode.dcp=4")])
        out.append((_check_path(path.strip(), source), scalar(value)))
    return tuple(out)


def read_sweep_file(path: Path) -> list[Axis]:
    """Axes from a sweep file's `vary:` mapping (FIELD: [values] or NAME: [{FIELD: value, ...}, ...])."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError([Problem(file, 0, 0, "", f"cannot read sweep file: {exc}")]) from None
    data, pos = load_yaml(text, file)
    if not isinstance(data, dict) or not isinstance(data.get("vary"), dict) or set(data) - {"vary"}:
        raise RecipeError([Problem(file, 1, 1, "vary", "a sweep file holds one `vary:` mapping: FIELD: [values], "
                                   "or NAME: [{FIELD: value, ...}, ...] for fields that change together")])
    axes = []
    for key, values in data["vary"].items():
        where = pos.get(("vary", key))
        source = f"{file}:{where.line}" if where else file

        def bad(msg: str, key: str = key, where: Any = where) -> RecipeError:
            return RecipeError([Problem(file, where.line if where else 0, where.column if where else 0,
                                        f"vary.{key}", msg)])

        if not isinstance(values, list) or not values:
            raise bad("must be a non-empty list of values, or of {FIELD: value} mappings")
        if all(isinstance(v, dict) for v in values):
            sets = []
            for v in values:
                if not v:
                    raise bad("an override set may not be empty")
                sets.append(tuple((_check_path(str(p), source), val) for p, val in v.items()))
            axes.append(Axis(str(key), tuple(sets), source))
        elif any(isinstance(v, dict | list) for v in values):
            raise bad("mixes values and mappings; use one or the other")
        else:
            p = _check_path(str(key), source)
            axes.append(Axis(p, tuple(((p, v),) for v in values), source))
    return axes


def combine(axes: list[Axis]) -> list[Variant]:
    """The cartesian product of the axes, in the order written (v01, v02, ...)."""
    if not axes:
        raise RecipeError([Problem("sweep", 0, 0, "--vary", "nothing to sweep: give --vary, --variant or --sweep-file")])
    out: list[Variant] = []
    seen: dict[str, str] = {}
    for n, combo in enumerate(itertools.product(*(a.sets for a in axes)), 1):
        overrides: Overrides = {}
        for part in combo:
            for path, value in part:
                if path in overrides and overrides[path] != value:
                    raise RecipeError([Problem("sweep", 0, 0, path, f"two axes set {path} "
                                               f"({_show(overrides[path])} and {_show(value)}) in one variant")])
                overrides[path] = value
        v = Variant(f"v{n:02d}", overrides)
        if v.label in seen:
            raise RecipeError([Problem("sweep", 0, 0, "", f"variants {seen[v.label]} and {v.id} are the same "
                                       f"({v.label})")])
        seen[v.label] = v.id
        out.append(v)
    return out


def nest(flat: Overrides) -> dict[str, Any]:
    """{'decode.workers': 2} -> {'decode': {'workers': 2}}."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def get(data: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a recipe mapping (None when absent)."""
    node: Any = data
    for p in path.split("."):
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def write_variant(v: Variant, base: Path, directory: Path) -> Path:
    """variants/<id>.yaml: `extends:` the base, plus the variant's overrides and derived counts."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{v.id}.yaml"
    header = [f"# primectl sweep variant {v.id}: {v.label}"]
    header += [f"# {note}" for note in v.notes]
    body = {"extends": str(base.resolve()), **nest({**v.overrides, **v.derived})}
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False))
    return path


def plan_hash(plan: Any) -> str:
    """A short hash of a Plan's data: a resumed sweep refuses variants whose plan changed since."""
    return hashlib.sha256(json.dumps(plan.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def _ratio(text: str) -> tuple[int, int]:
    p, _, d = str(text).partition(":")
    if not (p.isdigit() and d.isdigit() and int(p) > 0 and int(d) > 0):
        raise ValueError(f"ratio {text!r}: expected P:D, e.g. 1:4 (quote it in YAML: \"1:4\", or YAML reads 1:4 as 64)")
    g = gcd(int(p), int(d))
    return int(p) // g, int(d) // g


def materialise(variants: list[Variant], base: Path, directory: Path) -> dict[str, Any]:
    """Write and plan every variant; RecipeError naming each invalid one (file:line, field, reason).

    Returns {variant id: Plan}. Nothing is deployed.
    """
    from primectl.planner.build import plan_recipe

    base_loaded, base_plan = plan_recipe(base)  # a bad base is refused as itself, before any variant
    base_data = base_loaded.recipe.model_dump(mode="json")
    gpus_total = base_plan.capacity.gpus_total
    plans: dict[str, Any] = {}
    problems: list[Problem] = []
    for v in variants:
        try:
            v.derived, v.notes = _counts(v, base_data)
            v.file, plans[v.id] = _fit(v, base, directory, gpus_total, base_data)
            v.plan_hash = plan_hash(plans[v.id])
        except RecipeError as exc:
            problems += [Problem(p.file, p.line, p.column, p.field, f"variant {v.id} ({v.label}): {p.message}")
                         for p in exc.problems]
        except ValueError as exc:
            problems.append(Problem(str(v.file or "sweep"), 0, 0, "ratio", f"variant {v.id} ({v.label}): {exc}"))
    if problems:
        raise RecipeError(problems)
    return plans


def _counts(v: Variant, base: dict[str, Any]) -> tuple[Overrides, list[str]]:
    """What the variant's counts must be: its own, or a ratio to derive (prefill.groups None: search)."""
    ov = v.overrides
    if any(k in ov for k in COUNTS):
        groups = ov.get("prefill.groups", get(base, "prefill.groups"))
        workers = ov.get("decode.workers", get(base, "decode.workers"))
        if "ratio" in ov:
            raise ValueError("set either ratio or prefill.groups/decode.workers, not both")
        if get(base, "ratio") is None or not isinstance(groups, int) or not isinstance(workers, int) or groups < 1:
            return {}, []
        g = gcd(groups, workers) or 1
        ratio = f"{groups // g}:{workers // g}"
        return {"ratio": ratio}, [f"ratio {ratio} follows from prefill.groups={groups}, decode.workers={workers}"]
    if not any(k in ov for k in RESHAPING):
        return {}, []
    ratio_text = ov.get("ratio", get(base, "ratio")) or f"{get(base, 'prefill.groups')}:{get(base, 'decode.workers')}"
    _ratio(ratio_text)
    return {"ratio": str(ratio_text), "prefill.groups": None, "decode.workers": None}, []


def _gpus(v: Variant, base_data: dict[str, Any], role: str) -> int:
    """GPUs one instance of `role` takes: the n of its parallel spec (DEP8 -> 8)."""
    spec = str(v.overrides.get(f"{role}.parallel", get(base_data, f"{role}.parallel")) or "")
    m = PARALLEL_RE.match(spec)
    return int(m.group(2)) if m else 1


def _fit(v: Variant, base: Path, directory: Path, gpus_total: int, base_data: dict[str, Any]) -> tuple[Path, Any]:
    """Derive the counts for the variant's ratio: the most groups the planner places (CPU: the base's groups)."""
    from primectl.planner.build import plan_recipe

    if "prefill.groups" not in v.derived:
        path = write_variant(v, base, directory)
        return path, plan_recipe(path)[1]
    p, d = _ratio(v.derived["ratio"])
    if gpus_total == 0:
        base_groups = plan_recipe(base)[0].recipe.prefill.groups
        k = max(1, base_groups // p)
        v.derived.update({"prefill.groups": k * p, "decode.workers": k * d})
        v.notes = [f"ratio {p}:{d} on hosts without GPUs: the base's {base_groups} prefill group(s) kept -> "
                   f"prefill.groups={k * p}, decode.workers={k * d}"]
        path = write_variant(v, base, directory)
        return path, plan_recipe(path)[1]
    per_step = p * _gpus(v, base_data, "prefill") + d * _gpus(v, base_data, "decode")
    last: RecipeError | PlanError | None = None
    for k in range(max(1, gpus_total // per_step), 0, -1):
        v.derived.update({"prefill.groups": k * p, "decode.workers": k * d})
        v.notes = [f"ratio {p}:{d} on {gpus_total} GPUs: the most groups the planner could place -> "
                   f"prefill.groups={k * p}, decode.workers={k * d}"]
        path = write_variant(v, base, directory)
        try:
            return path, plan_recipe(path)[1]
        except RecipeError as exc:
            last = exc
    assert last is not None
    first = last.problems[0] if isinstance(last, RecipeError) and last.problems else None
    why = f"{first.field}: {first.message}" if first else str(last)
    raise ValueError(f"ratio {p}:{d} does not fit these hosts even once ({p} prefill group(s) + {d} decoder(s) "
                     f"on {gpus_total} GPUs): {why}")

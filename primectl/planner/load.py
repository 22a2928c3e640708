"""Read a recipe file into a validated `Recipe`, or every problem with it at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path as FsPath
from typing import Any

from pydantic import ValidationError

from primectl import registry
from primectl.engines.base import recipe_model
from primectl.errors import Finding, Problem, RecipeError
from primectl.recipe.model import EngineBlock, Recipe, recipe_json_schema
from primectl.recipe.suggest import did_you_mean
from primectl.recipe.yamlpos import Path, Position, dotted, load_yaml


@dataclass
class LoadedRecipe:
    """A validated recipe plus where each of its nodes was written."""

    recipe: Recipe
    file: str
    positions: dict[Path, Position] = field(default_factory=dict)

    def problem(self, finding: Finding) -> Problem:
        """Pin a finding to the closest written node."""
        return to_problem(finding.path, finding.message, self.file, self.positions)


def to_problem(path: Path, message: str, file: str, positions: dict[Path, Position]) -> Problem:
    """Locate `path` (or its nearest written ancestor) and build a Problem."""
    probe = path
    while probe not in positions and probe:
        probe = probe[:-1]
    pos = positions.get(probe)
    if pos is None:
        return Problem(file, 0, 0, dotted(path), message)
    return Problem(pos.file, pos.line, pos.column, dotted(path), message)


@lru_cache(maxsize=8)
def _schema(model: type[Recipe] = Recipe) -> dict[str, Any]:
    return model.model_json_schema()


def _pick(node: dict[str, Any], kind: str, defs: dict[str, Any]) -> dict[str, Any]:
    """Follow $refs and choose the union member of JSON type `kind`."""
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    for option in node.get("anyOf", []):
        option = _pick(option, kind, defs)
        if option.get("type") == kind:
            return option
    return node


def allowed_keys(path: Path, model: type[Recipe] = Recipe) -> list[str]:
    """Keys the schema of `model` allows in the mapping at `path` (for did-you-mean)."""
    node = _schema(model)
    defs = node.get("$defs", {})
    for part in path:
        if isinstance(part, int):
            node = _pick(node, "array", defs).get("items", {})
        else:
            node = _pick(node, "object", defs).get("properties", {}).get(part, {})
    return sorted(_pick(node, "object", defs).get("properties", {}))


def _data_path(loc: tuple[Any, ...], data: Any) -> Path:
    """Map a pydantic error location onto the user's data, dropping union-member tags."""
    out: list[str | int] = []
    cur = data
    for part in loc:
        if isinstance(cur, dict) and part in cur:
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            out.append(part)
            cur = cur[part]
        elif isinstance(part, str) and ("[" in part or part[:1].isupper()):
            continue  # a union member tag such as 'list[Host]' or 'Inventory'
        else:
            out.append(part)
            cur = None
    return tuple(out)


def _pydantic_problems(exc: ValidationError, data: Any, file: str, positions: dict[Path, Position],
                       model: type[Recipe] = Recipe) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[Path, str]] = set()
    for err in exc.errors():
        loc = err["loc"]
        if "hosts" in loc[:1]:
            hosts = data.get("hosts") if isinstance(data, dict) else None
            tag = "Inventory" if isinstance(hosts, list) else "list[Host]"
            if tag in loc:
                continue
        path = _data_path(loc, data)
        kind = err["type"]
        if kind == "extra_forbidden":
            key = str(path[-1])
            allowed = allowed_keys(path[:-1], model)
            msg = f"unknown key `{key}`{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}"
        elif kind == "missing":
            msg = "required field is missing"
        else:
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            if kind == "literal_error":
                got = err.get("input")
                expected = [s.strip(" '") for s in str(err.get("ctx", {}).get("expected", "")).replace(" or ", ", ").split(",")]
                msg = f"{got!r} is not allowed{did_you_mean(str(got), expected)}; allowed: {', '.join(expected)}"
        if (path, msg) in seen:
            continue
        seen.add((path, msg))
        problems.append(to_problem(path, msg, file, positions))
    return problems


class _Unreadable(Exception):
    """A file that cannot be read as UTF-8 text; `message` says why (with the byte offset)."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


def read_text(path: FsPath) -> str:
    """A file's text, strictly UTF-8; _Unreadable naming the OS error or the first bad byte's offset."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise _Unreadable(exc.strerror or str(exc)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unreadable(f"not UTF-8 text: byte {exc.start} is 0x{data[exc.start]:02x} ({exc.reason}); "
                          "save the file as UTF-8") from None


def _resolve_inventory(data: dict[str, Any], base: FsPath, file: str, positions: dict[Path, Position]) -> None:
    hosts = data.get("hosts")
    if not (isinstance(hosts, dict) and set(hosts) == {"inventory"} and isinstance(hosts["inventory"], str)):
        return
    inv_path = (base / hosts["inventory"]).resolve()
    try:
        text = read_text(inv_path)
    except _Unreadable as exc:
        raise RecipeError([to_problem(("hosts", "inventory"), f"cannot read inventory: {exc.message} ({inv_path})",
                                      file, positions)]) from None
    inv, inv_pos = load_yaml(text, str(inv_path))
    if not (isinstance(inv, dict) and isinstance(inv.get("hosts"), list)):
        raise RecipeError([Problem(str(inv_path), 1, 1, "hosts", "an inventory file must hold a `hosts:` list")])
    data["hosts"] = inv["hosts"]
    for p, pos in inv_pos.items():
        if p[:1] == ("hosts",) and len(p) > 1:
            positions[p] = pos


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `over` onto `base`: mappings merge, everything else is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read(fs_path: FsPath, file: str, chain: tuple[FsPath, ...] = ()) -> tuple[dict[str, Any], dict[Path, Position]]:
    """Read one recipe file, following `extends:` to the base recipe it overrides."""
    try:
        text = read_text(fs_path)
    except _Unreadable as exc:
        raise RecipeError([Problem(file, 0, 0, "", f"cannot read recipe: {exc.message}")]) from None
    data, positions = load_yaml(text, file)
    if not isinstance(data, dict):
        raise RecipeError([Problem(file, 1, 1, "", "a recipe must be a YAML mapping (key: value)")])
    _resolve_inventory(data, fs_path.parent, file, positions)
    parent = data.pop("extends", None)
    if parent is None:
        return data, positions
    if not isinstance(parent, str):
        raise RecipeError([to_problem(("extends",), "must be the path of a base recipe", file, positions)])
    base_path = (fs_path.parent / parent).resolve()
    here = (*chain, fs_path.resolve())
    if base_path in here:
        cycle = " -> ".join(p.name for p in (*here[here.index(base_path) :], base_path))
        raise RecipeError([to_problem(("extends",), f"extends cycle: {cycle}", file, positions)])
    if not base_path.is_file():
        raise RecipeError([to_problem(("extends",), f"cannot read base recipe: No such file or directory ({base_path})", file,
                                      positions)])
    base_data, base_pos = _read(base_path, str(base_path), here)
    # A value this file replaces takes its positions along: drop the base's positions under it,
    # or a problem in the replacement could be pinned to a line of the base file.
    replaced = _replaced(base_data, data)
    base_pos = {p: pos for p, pos in base_pos.items() if not any(p[: len(r)] == r for r in replaced)}
    return _merge(base_data, data), {**base_pos, **positions}


def _replaced(base: dict[str, Any], over: dict[str, Any], prefix: Path = ()) -> list[Path]:
    """Paths where `over` replaces (rather than merges into) a value of `base`."""
    out: list[Path] = []
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out += _replaced(base[key], value, (*prefix, key))
        elif key in base:
            out.append((*prefix, key))
    return out


def load_recipe(path: str | FsPath, *, check: bool = True) -> LoadedRecipe:
    """Parse and validate a recipe file; raise RecipeError listing every problem.

    A recipe may `extends: base.yaml` and write only what differs. With
    `check`, the semantic rules (GPU accounting, memory fit, KV formats,
    compatibility, engine flags) run too, so a returned recipe can be planned.
    """
    file = str(path)
    data, positions = _read(FsPath(path), file)
    engine = data.get("engine") if isinstance(data.get("engine"), str) else None
    target = data.get("target") if isinstance(data.get("target"), str) else None
    keys = [k for k in data if isinstance(k, str)]
    blocks = target_blocks(target, keys) + component_blocks(keys, file, positions)
    model = recipe_model(engine, blocks=blocks)
    try:
        recipe = model.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_pydantic_problems(exc, data, file, positions, model)) from None
    loaded = LoadedRecipe(recipe, file, positions)
    if check:
        from primectl.planner.rules import check_recipe

        findings = check_recipe(recipe)
        if findings:
            raise RecipeError([loaded.problem(f) for f in findings])
    return loaded


def schema_text() -> str:
    """The recipe's JSON Schema as text, with the blocks and pins of every registered engine (`primectl schema`)."""
    return recipe_json_schema(recipe_model(every=True, blocks=target_blocks(None, every=True) + component_blocks(None)))


def target_blocks(target: str | None, keys: list[str] | None = None, *, every: bool = False
                  ) -> tuple[EngineBlock, ...]:
    """The recipe blocks of `target` and of the built-in targets a recipe with these top-level `keys` carries a
    block of (another target's block, e.g. from a recipe it extends; a built-in target's block is the key of its
    own name); None: of every built-in one. `every`: of every registered target (the schema). A target that
    cannot be loaded adds nothing (the recipe's `target:` check says why). Only the targets needed are imported:
    loading them all cost each command ~60 ms of CPU."""
    from primectl.targets.base import get

    builtin = [n for n in registry.BUILTIN_TARGETS if keys is None or n in keys]
    names = registry.names("target") if every else [*builtin, *([target] if target else [])]
    out: list[EngineBlock] = []
    for name in dict.fromkeys(names):
        try:
            declared = getattr(get(name), "recipe_block", None)
        except (KeyError, registry.PluginError):
            continue
        block = declared() if callable(declared) else None
        if block is not None:
            out.append(block)
    return tuple(out)


def component_blocks(keys: list[str] | None, file: str = "", positions: dict[Path, Position] | None = None
                     ) -> tuple[EngineBlock, ...]:
    """The recipe blocks of the components a recipe with these top-level `keys` uses (None: of every registered
    component, for the schema). A plugin named by a key that cannot be loaded, or whose block is not under its own
    name, is a RecipeError at that key; for the schema it is left out."""
    from primectl.components import base as components

    names = registry.names("component") if keys is None else components.used_by(keys)
    out: list[EngineBlock] = []
    for name in names:
        try:
            block = components.recipe_block(components.get(name))
            if block is not None and not registry.entry("component", name).builtin and block[0] != name:
                raise registry.PluginError("component", name, (
                    f"component {name!r} declares its recipe block under {block[0]!r}; a plugin's block is the "
                    f"top-level key of its own name ({registry.entry('component', name).describe()})"))
        except registry.PluginError as exc:
            if keys is None:
                continue
            raise RecipeError([to_problem((name,), str(exc), file, positions or {})]) from None
        if block is not None:
            out.append(block)
    return tuple(out)

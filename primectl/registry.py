"""Which engines, targets and components primectl knows, by the name a recipe uses.

Engines, targets and components (services that are not engines) are found
through entry points, groups `primectl.engines`, `primectl.targets` and
`primectl.components`: an installed distribution that declares

    [project.entry-points."primectl.engines"]
    sglang = "my_module:MyEngine"

makes `engine: sglang` valid. The value names a class (instantiated once, with
no arguments) or an instance; its `name` must be the entry point's name.

The in-tree ones are declared the same way in primectl's pyproject.toml, and
are also listed here (BUILTIN_ENGINES, BUILTIN_TARGETS, BUILTIN_COMPONENTS, kept equal to
pyproject.toml by tests/test_plugins.py). primectl reads its own from these
dicts and never from its installed metadata, so an editable checkout whose
metadata is stale (an engine added since the last `pip install -e`) keeps
working. A plugin cannot replace a built-in name; when two distributions
declare one name, the first by distribution name is used and the other is
reported by `primectl plugins`.

Lazily: nothing is scanned at import time (`primectl --help` imports none of
this), a built-in name is looked up without scanning, and the scan (metadata
only, no plugin module imported) runs once, when a name that is not built in is
looked up or the names are listed. A plugin's module is imported only when a
recipe uses it, so a broken plugin (PluginError naming it and its
distribution) never breaks a recipe that does not.

This module is a leaf: it imports no implementation, so the recipe schema can
list the choices without importing the implementations (which themselves
import the recipe model).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Literal

Kind = Literal["engine", "target", "component"]

BUILTIN_ENGINES: dict[str, str] = {
    "vllm": "primectl.engines.vllm:VllmEngine",
    "mocker": "primectl.engines.mocker:MockerEngine",
}

# What a recipe without `engine:` runs.
DEFAULT_ENGINE = "vllm"

BUILTIN_TARGETS: dict[str, str] = {
    "ssh": "primectl.targets.ssh:SSHTarget",
    "kubernetes": "primectl.targets.kubernetes:KubernetesTarget",
    "slurm": "primectl.targets.slurm:SlurmTarget",
}

# In planning order: the planner asks each for its services in this order (see primectl/components/base.py).
BUILTIN_COMPONENTS: dict[str, str] = {
    "etcd": "primectl.components.etcd:Etcd",
    "mooncake-master": "primectl.components.mooncake:MooncakeMaster",
    "dynamo-frontend": "primectl.components.frontend:DynamoFrontend",
    "haproxy": "primectl.components.haproxy:Balancer",
    "monitoring": "primectl.components.monitoring:Monitoring",
}

# The names the earlier registry exported (the built-in ones).
ENGINES = BUILTIN_ENGINES
TARGETS = BUILTIN_TARGETS

GROUPS: dict[Kind, str] = {"engine": "primectl.engines", "target": "primectl.targets",
                           "component": "primectl.components"}
BUILTIN: dict[Kind, dict[str, str]] = {"engine": BUILTIN_ENGINES, "target": BUILTIN_TARGETS,
                                       "component": BUILTIN_COMPONENTS}
BUILTIN_ORIGIN = "primectl (built in)"


class PluginError(Exception):
    """An engine, target or component from a plugin cannot be loaded or is incomplete; the message names it and its distribution."""

    def __init__(self, kind: Kind, name: str, message: str):
        self.kind = kind
        self.name = name
        super().__init__(message)


@dataclass(frozen=True)
class Entry:
    """One registered engine or target: its name, the object reference, and the distribution that declares it."""

    kind: Kind
    name: str
    ref: str  # module:attribute
    dist: str | None = None  # None: built in
    version: str | None = None
    ignored: tuple[str, ...] = ()  # other distributions that declare the same name (not used)

    @property
    def builtin(self) -> bool:
        """Shipped inside primectl."""
        return self.dist is None

    @property
    def origin(self) -> str:
        """Where it comes from: 'primectl (built in)' or 'DIST VERSION'."""
        return BUILTIN_ORIGIN if self.dist is None else f"{self.dist} {self.version or '?'}"

    @property
    def module(self) -> str:
        """The module the reference names."""
        return self.ref.partition(":")[0].strip()

    def describe(self) -> str:
        """The entry point as its distribution declares it, for error messages."""
        if self.dist is None:
            return f"built in, {self.ref}"
        return f"entry point `{self.name} = {self.ref}` in group {GROUPS[self.kind]} of distribution {self.origin}"


def _canonical(dist: str) -> str:
    return dist.lower().replace("_", "-").replace(".", "-")


@cache
def entries(kind: Kind) -> dict[str, Entry]:
    """Every registered `kind` by name: the built-in ones first, then the plugins' entry points (scanned once)."""
    from importlib.metadata import entry_points

    out = {name: Entry(kind, name, ref) for name, ref in BUILTIN[kind].items()}
    found = []
    for ep in entry_points(group=GROUPS[kind]):
        dist = getattr(ep, "dist", None)
        dist_name = dist.name if dist is not None else None
        if dist_name and _canonical(dist_name) == "primectl":
            continue  # primectl's own entry points: the built-in dicts above are the truth
        found.append(Entry(kind, ep.name, ep.value, dist_name or "(unknown distribution)",
                           dist.version if dist is not None else None))
    for e in sorted(found, key=lambda e: (e.name, _canonical(e.dist or ""))):
        if e.name in out:
            first = out[e.name]
            out[e.name] = replace(first, ignored=(*first.ignored, e.origin))
        else:
            out[e.name] = e
    return out


def names(kind: Kind) -> list[str]:
    """The registered names of `kind` (built-in ones first)."""
    return list(entries(kind))


def known(kind: Kind, name: str) -> bool:
    """Whether `name` is a registered `kind` (a built-in name is answered without scanning)."""
    return name in BUILTIN[kind] or name in entries(kind)


def entry(kind: Kind, name: str) -> Entry:
    """The registration of `name` (KeyError if none)."""
    if name in BUILTIN[kind]:
        return Entry(kind, name, BUILTIN[kind][name])
    return entries(kind)[name]


def _resolve(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module.strip())
    for part in attr.strip().split(".") if attr.strip() else ():
        obj = getattr(obj, part)
    return obj() if isinstance(obj, type) else obj


@cache
def load(kind: Kind, name: str) -> Any:
    """The object registered as `name` (KeyError if none; PluginError if a plugin's cannot be loaded)."""
    e = entry(kind, name)
    if e.builtin:
        return _resolve(e.ref)  # primectl's own: a failure is a bug, and keeps its traceback
    try:
        obj = _resolve(e.ref)
    except Exception as exc:
        raise PluginError(kind, name, f"{kind} {name!r} cannot be loaded: {type(exc).__name__}: {exc} "
                                      f"({e.describe()}; fix or uninstall {e.dist})") from exc
    declared = getattr(obj, "name", None)
    if declared != name:
        raise PluginError(kind, name, f"{kind} {name!r} names itself {declared!r} (its `name` attribute); "
                                      f"they must be equal ({e.describe()})")
    return obj


def missing_members(obj: Any, protocol: type) -> list[str]:
    """The attributes and methods `protocol` (a typing.Protocol class) asks for that `obj` lacks."""
    wanted = {k for k, v in vars(protocol).items() if callable(v) and not k.startswith("_")}
    return sorted(m for m in wanted | set(getattr(protocol, "__annotations__", {})) if not hasattr(obj, m))


def engine(name: str) -> Any:
    """The engine registered as `name` (KeyError if none); typed as `Engine` by `primectl.engines.base.get`."""
    return load("engine", name)


def target(name: str) -> Any:
    """The target registered as `name` (KeyError if none); typed by `primectl.targets.base.get`."""
    return load("target", name)

"""`primectl plugins`: every registered engine, target and component, where it comes from, what it supports.

Engines' capabilities depend on the recipe (vLLM serves tool calls when a
parser is set), so each engine is asked about one probe recipe: the demo's
shape on a CPU host, tool-call parser set (PROBE_SAYS). Loading an entry is
importing its module: an entry that cannot be loaded is listed with its
error, and the command then exits 1.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from primectl import registry

PROBE_SAYS = "on a CPU host with the demo model and a tool-call parser set"
PROBE: dict[str, Any] = {
    "name": "plugins-probe",
    "model": {"served_name": "probe", "generate": "demo-tiny", "arch": "demo-tiny"},
    "hardware": {"profile": "cpu"},
    "hosts": [{"name": "local", "address": "127.0.0.1", "connection": "local"}],
    "frontend": {"host": "local"},
    "prefill": {"groups": 1, "parallel": "TP1"},
    "decode": {"workers": 1, "parallel": "TP1"},
    "tool_calling": {"tool_call_parser": "hermes"},
}
# Capabilities shown by name in the table when true (the JSON has every field).
FLAGS = {"tool_calls": "tool calls", "nixl_metrics": "NIXL metrics", "exercises_host_tier": "host KV tier",
         "reports_kv_cache": "KV cache report"}


@dataclass
class Listed:
    """One engine or target as `primectl plugins` shows it."""

    entry: registry.Entry
    error: str | None = None
    supports: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON form."""
        e = self.entry
        return {"kind": e.kind, "name": e.name, "from": e.origin, "distribution": e.dist or "primectl",
                "version": e.version if e.dist else _own_version(), "builtin": e.builtin, "ref": e.ref,
                "module": e.module, "ok": self.error is None, "error": self.error, "ignored": list(e.ignored),
                "supports": self.supports}

    def summary(self) -> str:
        """What it supports, in a few words."""
        if self.error is not None:
            return f"cannot be loaded: {self.error}"
        s = self.supports
        if self.entry.kind == "component":
            parts = [f"stage {s['stage']}", f"recipe block `{s['recipe_block']}`" if s["recipe_block"]
                     else "configured by the recipe's own blocks"]
            parts += [label for key, label in (("validate", "validates the recipe"), ("smoke_checks", "smoke checks"),
                                               ("kubernetes", "kubernetes form")) if s[key]]
            return "; ".join(parts)
        if self.entry.kind == "target":
            parts = ["render, deploy" if s["deploy"] else "render only"]
            if s.get("host_commands"):
                parts.append("preflight, provision, doctor, drain, restart")
            if s["surges"]:
                parts.append("surge twins")
            return "; ".join(parts)
        caps = s.get("capabilities")
        if caps is None:
            return f"capabilities n/a: {s.get('capabilities_error')}"
        shown = [label for key, label in FLAGS.items() if caps.get(key)]
        parts = [", ".join(shown) or "no tool calls, no NIXL metrics", f"over-long prompt: {caps['over_context']}",
                 f"bench workload {caps['workload']}"]
        runtime = ", ".join(f"{hw}: {flavour}" for hw, flavour in s["runtime"].items())
        parts.append(f"runtime {runtime}")
        parts.append(f"image {s['image']}" if s.get("image") else "no container image (renders for kubernetes: no)")
        return "; ".join(parts)


def _own_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("primectl")
    except PackageNotFoundError:
        return None


def _engine(name: str) -> dict[str, Any]:
    from primectl.engines.base import get
    from primectl.recipe.catalog import HARDWARE, MODELS
    from primectl.recipe.model import Recipe

    engine = get(name)
    out: dict[str, Any] = {"component": engine.component, "catalog_flags": len(engine.flag_catalog()),
                           "managed_flags": len(engine.managed_flags()), "probe": PROBE_SAYS}
    out["runtime"] = {hw: engine.runtime_flavour(spec).name for hw, spec in HARDWARE.items()}
    try:
        served = engine.serving(Recipe.model_validate(PROBE | {"engine": name}), MODELS["demo-tiny"], HARDWARE["cpu"])
    except Exception as exc:  # a plugin's serving() that cannot answer for the probe: shown, not fatal
        out["capabilities"] = None
        out["capabilities_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["capabilities"] = served.capabilities.model_dump(mode="json")
    out["image"] = served.image.repository if served.image else None
    return out


def _target(name: str) -> dict[str, Any]:
    from primectl.targets.base import ReachesHosts, deploys, load

    target = load(name)
    return {"render": True, "deploy": deploys(target), "host_commands": isinstance(target, ReachesHosts),
            "surges": bool(target.surges)}


def _component(name: str) -> dict[str, Any]:
    from primectl.components import base as components

    c = components.get(name)
    block = components.recipe_block(c)
    return {"stage": c.stage, "recipe_block": block[0] if block else None,
            **{m: callable(getattr(c, m, None)) for m in ("validate", "smoke_checks", "kubernetes")}}


def listing() -> list[Listed]:
    """Every engine, then every target, then every component, each loaded and asked what it supports."""
    out: list[Listed] = []
    for kind, describe in (("engine", _engine), ("target", _target), ("component", _component)):
        for e in registry.entries(kind).values():
            item = Listed(e)
            try:
                item.supports = describe(e.name)
            except registry.PluginError as exc:
                cause = exc.__cause__
                item.error = f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)
            except Exception as exc:  # a plugin that loads but fails when asked: listed, not fatal
                if e.builtin:
                    raise
                item.error = f"{type(exc).__name__}: {exc}"
            out.append(item)
    return out


def print_plugins(items: list[Listed], output: str) -> None:
    """The listing as a table (or JSON)."""
    if output == "json":
        sys.stdout.write(json.dumps([i.to_json() for i in items], indent=2) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Engines, targets and components (engine capabilities {PROBE_SAYS})")
    for col in ("kind", "name", "from", "module", "supports"):
        t.add_column(col, overflow="fold")
    for i in items:
        origin = i.entry.origin + "".join(f"\n(also declared by {d}: ignored)" for d in i.entry.ignored)
        t.add_row(i.entry.kind, i.entry.name, origin, i.entry.ref, i.summary())
    Console(width=max(Console().width, 160)).print(t)

"""Human-readable tables for `primectl plan`."""

from __future__ import annotations

import sys
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from primectl.plan.model import Plan, RoleCapacity


def _gpus(gpus: list[int]) -> str:
    if not gpus:
        return "-"
    if gpus == list(range(gpus[0], gpus[-1] + 1)) and len(gpus) > 1:
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(map(str, gpus))


def placement_table(plan: Plan) -> Table:
    """One row per service: where it runs, on which GPUs, ports and what it waits for."""
    t = Table(title=f"Placement: {plan.name} ({len(plan.services)} services, engine {plan.engine})")
    for col in ("service", "role", "host", "GPUs", "DP ranks", "ports", "after", "ready when"):
        t.add_column(col)
    for s in plan.services:
        dp = s.data_parallel
        ranks = f"{dp.start_rank}-{dp.start_rank + dp.local - 1}/{dp.size}" if dp else "-"
        ports = " ".join(f"{k}={v}" for k, v in sorted(s.ports.items()))
        after = ", ".join(s.depends_on) if len(s.depends_on) <= 3 else f"{len(s.depends_on)} services"
        probe = s.ready.url or (f"tcp {s.ready.host}:{s.ready.port}" if s.ready.kind == "tcp" else "command")
        t.add_row(s.name, s.role, s.host, _gpus(s.gpus), ranks, ports, after or "-", probe)
    return t


def _fmt_tokens(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n:,}"


def capacity_table(plan: Plan) -> Table:
    """Per-role memory split and KV capacity."""
    c = plan.capacity
    t = Table(title=f"Capacity (KV {c.kv_dtype}, sessions of {c.session_context_tokens:,} tokens)")
    t.add_column("figure")
    roles: list[tuple[str, RoleCapacity]] = [(n, r) for n, r in (("prefill", c.prefill), ("decode", c.decode)) if r]
    for name, _ in roles:
        t.add_column(name, justify="right")
    rows: list[tuple[str, Callable[[RoleCapacity], str]]] = [
        ("instances x GPUs",
         lambda r: f"{r.instances} x {r.gpus_per_instance} ({r.parallel}{f' + DCP{r.dcp}' if r.dcp > 1 else ''})"),
        ("HBM per GPU", lambda r: f"{r.hbm_gb:g} GB"),
        ("usable (x utilisation)", lambda r: f"{r.usable_gb:.1f} GB"),
        ("weights per GPU", lambda r: f"{r.weights_gb:.1f} GB"),
        ("reserve per GPU", lambda r: f"{r.reserve_gb:.1f} GB"),
        ("KV budget per GPU", lambda r: f"{r.kv_budget_gb:.1f} GB"),
        ("KV bytes per token", lambda r: f"{r.kv_bytes_per_token:,}"),
        ("KV tokens per GPU", lambda r: _fmt_tokens(r.kv_tokens_per_gpu)),
        ("ranks with distinct KV", lambda r: f"{r.kv_shards} of {r.gpus_per_instance}"),
        ("KV tokens per instance", lambda r: _fmt_tokens(r.kv_tokens_per_instance)),
        ("sessions in HBM", lambda r: str(r.sessions_in_hbm)),
        ("+ host tier tokens", lambda r: _fmt_tokens(r.host_tier_tokens_per_instance)),
        ("sessions with host tier", lambda r: str(r.sessions_with_host_tier)),
    ]
    for label, fn in rows:
        t.add_row(label, *[fn(r) for _, r in roles])
    return t


def print_plan(plan: Plan, output: str = "table", console: Console | None = None) -> None:
    """Placement, capacity and resolved defaults, as tables (or the whole Plan as JSON)."""
    if output == "json":
        sys.stdout.write(plan.model_dump_json(indent=2) + "\n")
        return
    console = console or Console()
    console.print(placement_table(plan))
    c = plan.capacity
    if c.prefill or c.decode:
        console.print(capacity_table(plan))
    console.print(f"GPUs used: {c.gpus_used} of {c.gpus_total}; endpoint {plan.endpoint}; gate {plan.gate.url}")
    for note in c.notes:
        console.print(f"note: {note}")
    t = Table(title="Resolved defaults (fields the recipe left out)")
    t.add_column("field")
    t.add_column("value")
    for key, value in sorted(plan.defaults.items()):
        if value not in (None, [], {}, ""):
            t.add_row(key, repr(value))
    console.print(t)

"""What clients lose while a change rolls through: one line per decision of the strategy, for `diff` and `up --dry-run`."""

from __future__ import annotations

from collections.abc import Sequence

from primectl.components import base as components
from primectl.deploy.changes import Change
from primectl.plan.model import Plan, Service
from primectl.rollout.strategy import (
    RoleBatches,
    Seen,
    Surge,
    check_moves,
    moved_check,
    moves,
    running_changes,
    wave_rollout,
    waves,
)


def expected_loss(plan: Plan, changes: Sequence[Change], seen: Seen) -> list[str]:
    """Per wave, how the running services that change are replaced, and what clients lose (0, or why not)."""
    out = []
    running = set(running_changes(changes, seen))
    moved = set(check_moves(plan, changes, seen))
    for wave in waves(plan, changes):
        step = wave_rollout(plan, changes, seen, wave)
        out += [_reload(plan, seen, n, moved=n in moved) for n in step.reloads]
        out += [_in_place(plan.service(n)) for n in step.at_once if n in running]
        if step.surge:
            out.append(_surge(plan, step.surge))
        out += [_batches(plan, seen, roll) for roll in step.rolls]
    return out


def drain_s(svc: Service) -> float:
    """How long a service may take to drain (0: it stops at once)."""
    return svc.drain.timeout_s if svc.drain else 0.0


def _reload(plan: Plan, seen: Seen, name: str, *, moved: bool) -> str:
    svc = plan.service(name)
    return (f"{name}: reloads in place ({svc.reload.signal if svc.reload else ''}: only its files change); it keeps "
            "its sockets and finishes the connections it holds; "
            + (_check_move(plan, seen, svc) if moved else "expected loss 0"))


def _check_move(plan: Plan, seen: Seen, svc: Service) -> str:
    """A reload whose readiness check moves: what its component says of that, and when the reload happens."""
    try:
        component: object | None = components.get(svc.component)
    except KeyError:
        component = None
    move = components.check_move(component, plan, svc, moved_check(plan, seen, svc.name) or "")
    return f"{move.why}, so it reloads as soon as the new workers have registered, before any replica rolls; {move.then}"


def _in_place(svc: Service) -> str:
    return (f"{svc.name}: single instance, no spare capacity: up to {svc.ready.timeout_s:g}s without this {svc.role} "
            "(it restarts in place)")


def _surge(plan: Plan, surge: Surge) -> str:
    kind = ("new generation (its own Dynamo namespace: the router never mixes the two)" if surge.new_generation
            else "same generation")
    order = "; ".join(", ".join(_twin(plan, n) for n in stage) for stage in surge.stages)
    joins = "register" if any(plan.service(n).listed_as for n in surge.services) else "take traffic at the balancer"
    drains = "; ".join(", ".join(stage) for stage in reversed(surge.stages))
    return (f"surge, {kind}: twins {order} start beside the running ones and {joins}"
            + (" (prefill first)" if len(surge.stages) > 1 else "")
            + f"; then {drains} drain (up to {max(drain_s(plan.service(n)) for n in surge.services):g}s) "
            "and restart; then the twins drain and stop; expected loss 0")


def _twin(plan: Plan, name: str) -> str:
    twin = plan.service(name).twin
    return twin.name if twin else name


def _batches(plan: Plan, seen: Seen, roll: RoleBatches) -> str:
    rollout, steps = roll.rollout, roll.batches
    first = plan.service(steps[0][0])
    if len(rollout.instances) == 1:
        why = ("no spare capacity" if first.twin is None else
               "its command line changes, and there is room for its twin but not for a whole second "
               "generation (Dynamo's router rejects a twin whose model card differs from the running one)")
        return f"{rollout.role}: single instance, {why}: up to {first.ready.timeout_s:g}s without this role"
    if roll.together:
        return (f"{rollout.role}: {', '.join(steps[0])} restart together: their command line changes, "
                "and Dynamo's router rejects workers whose model card differs from the running ones; "
                f"no room for a second generation here: up to {first.ready.timeout_s:g}s without "
                f"{'this role' if len(steps[0]) == len(rollout.instances) else 'them'}")
    drain = max((drain_s(plan.service(n)) for b in steps for n in b), default=0)
    every = len(steps) == 1 and len(steps[0]) >= len([n for i in rollout.instances for n in i])
    behind = any(plan.service(n).drain is not None for b in steps for n in b)
    back = (" -> registered with the router" if rollout.registered else "" if not behind else " -> back in the balancer"
            + (" at its new address" if any(moves(plan, seen, n) for b in steps for n in b) else ""))
    return (f"{rollout.role}: {len(steps)} batch(es) of at most {rollout.max_unavailable} instance(s): "
            f"drain (up to {drain:g}s) -> restart -> ready{back}"
            + ("; every instance at once: the role is out until they are ready" if every else "; expected loss 0"))

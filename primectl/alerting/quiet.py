"""Changes do not page: the silence a change sets in Alertmanager, scoped to the services it touches.

A change that drains, restarts or removes services silences the alerts about them (and the role-wide worker count
of their roles) for as long as it runs (not those of a service already firing: the change is its repair, and its
resolution must reach the receivers), and lifts the silence when it ends, rollback included: it shortens the
silence to end `settle_s` later, the time Prometheus needs to see the restarted services up again, so an alert
still pending from the change never pages. A controller killed mid-change leaves a silence that ends by itself
(`MAX_MINUTES`); the next change of the deployment, which holds its lock, lifts it first.

A change that drains workers also moves requests off them: Dynamo counts those as migrations, and
`MigrationsRising` is about the model, not a service, over a window longer than any settle. The change silences it
deployment-wide, and keeps that silence for the alert's window after it ends (a lifted dead change's too). A change
of what serves (workers, frontends, the balancer) also silences the readiness gate's alerts, which the health loop
reports for the deployment, not for those services (on Slurm the gate is down while a replaced job loads).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from primectl.alerting import alertmanager_api as api
from primectl.deploy.changes import Change
from primectl.monitoring.rules import GATE_CHECK_MISSING, GATE_NOT_READY, MIGRATION_WINDOW_S, MIGRATIONS_RISING
from primectl.plan.model import WORKER_ROLES, Plan

MAX_MINUTES = 60
WORKERS_BELOW_PLAN = "WorkersBelowPlan"
TOUCHING = ("add", "change", "restart", "remove")
DRAINING = ("change", "restart", "remove")  # what moves a worker's unfinished requests to others
SERVING = (*WORKER_ROLES, "frontend", "balancer")  # what the readiness gate answers through


def created_by(plan: Plan) -> str:
    """What primectl's silences of this deployment are created by (how a later change finds a dead one's)."""
    return f"primectl:{plan.name}"


def alternation(values: Iterable[str]) -> str:
    """One exact value, or a regex alternation of several (Alertmanager anchors regexes)."""
    vals = sorted(set(values))
    return vals[0] if len(vals) == 1 else "|".join(re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", v) for v in vals)


@dataclass(frozen=True)
class Hush:
    """One silence a change sets: what it matches, and how long it outlasts the change."""

    matcher: dict[str, str]
    after_s: float


def hushes(plan: Plan, changes: dict[str, str], firing: list[api.Firing]) -> list[Hush]:
    """The silences a change needs ({service: action}): the services' own alerts, the worker count of their roles,
    the readiness gate's alerts where it changes what serves, and the model's migrations where it drains workers;
    none for an alert that already fires (a role's count, the migrations, the gate): the change is its repair, and
    its resolution must reach the receivers."""
    assert plan.monitoring is not None
    settle = plan.monitoring.settle_s
    services = sorted(changes)
    out = [Hush({"deployment": plan.name, "service": alternation(services)}, settle)]
    role = {s.name: s.role for s in plan.services}
    touched = {role[s] for s in services if role.get(s) in WORKER_ROLES}
    drained = {role[s] for s, action in changes.items() if role.get(s) in WORKER_ROLES and action in DRAINING}
    short = {a.labels.get("role", "") for a in firing if a.name == WORKERS_BELOW_PLAN}
    fires = {a.name for a in firing}
    if touched - short:
        out.append(Hush({"deployment": plan.name, "alertname": WORKERS_BELOW_PLAN,
                         "role": alternation(touched - short)}, settle))
    gate = {GATE_NOT_READY, GATE_CHECK_MISSING} - fires
    if gate and any(role.get(s) in SERVING for s in services):
        out.append(Hush({"deployment": plan.name, "alertname": alternation(gate)}, settle))
    if drained and MIGRATIONS_RISING not in fires:
        out.append(Hush({"deployment": plan.name, "alertname": MIGRATIONS_RISING}, settle + MIGRATION_WINDOW_S))
    return out


def lift_stale(plan: Plan, say: Callable[[str], None]) -> None:
    """Lift silences an earlier change of this deployment left (its controller died before it could); its
    migrations' silence ends the alert's window from now instead, as its change would have made it."""
    if plan.monitoring is None:
        return
    base = plan.monitoring.alertmanager_url
    tail = timedelta(seconds=plan.monitoring.settle_s + MIGRATION_WINDOW_S)
    try:
        for left in api.active_silences(base, created_by(plan)):
            if left.matchers.get("alertname") != MIGRATIONS_RISING:
                api.expire(base, left.id)
                say(f"monitoring: lifted silence {left.id} an interrupted change left")
            elif left.ends > datetime.now(UTC) + tail:
                api.silence(base, left.matchers, minutes=tail.total_seconds() / 60, created_by=created_by(plan),
                            comment="an interrupted change's, shortened", silence_id=left.id)
                say(f"monitoring: silence {left.id} an interrupted change left ends in "
                    f"{tail.total_seconds() / 60:.0f} min (the requests it moved off workers)")
    except api.AlertmanagerError:
        return  # not running (yet): nothing it holds can page


@contextmanager
def quiet_change(plan: Plan, changes: list[Change], say: Callable[[str], None], *, why: str) -> Iterator[None]:
    """Silence the alerts about the services `changes` touch while the block runs (nothing where the plan has no
    monitoring, or where the change starts Alertmanager itself: nothing can page before it runs)."""
    actions = {c.service: c.action for c in changes if c.action in TOUCHING}
    services = list(actions)
    mon = plan.monitoring
    if mon is None or not services or any(c.action == "add" and c.service == mon.alertmanager_service
                                          for c in changes):
        yield
        return
    base = mon.alertmanager_url
    try:  # what already fires is not the change's doing: its resolution must reach the receivers
        now = api.firing(base, plan.name)
    except api.AlertmanagerError:
        now = []
    down = {a.service for a in now if a.service}
    services = [s for s in services if s not in down]
    if not services:
        yield
        return
    ids: list[tuple[str, Hush]] = []
    for hush in hushes(plan, {s: actions[s] for s in services}, now):
        try:
            ids.append((api.silence(base, hush.matcher, minutes=MAX_MINUTES, created_by=created_by(plan),
                                    comment=why), hush))
        except api.AlertmanagerError as exc:
            say(f"monitoring: no silence set ({exc}); alerts about {', '.join(services)} may fire during the change")
            break
    try:
        yield
    finally:
        for sid, hush in ids:
            try:
                api.silence(base, hush.matcher, minutes=hush.after_s / 60, created_by=created_by(plan),
                            comment=why, silence_id=sid)
            except api.AlertmanagerError as exc:
                say(f"monitoring: could not lift silence {sid} ({exc}); it ends by itself within {MAX_MINUTES} min")

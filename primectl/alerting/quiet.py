"""Changes do not page: the silence a change sets in Alertmanager, scoped to the services it touches.

A change that drains, restarts or removes services silences the alerts about them (and the role-wide worker count
of their roles) for as long as it runs (not those of a service already firing: the change is its repair, and its
resolution must reach the receivers), and lifts the silence when it ends, rollback included: it shortens the
silence to end `settle_s` later, the time Prometheus needs to see the restarted services up again, so an alert
still pending from the change never pages. A controller killed mid-change leaves a silence that ends by itself
(`MAX_MINUTES`); the next change of the deployment, which holds its lock, lifts it first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from primectl.alerting import alertmanager_api as api
from primectl.deploy.changes import Change
from primectl.plan.model import WORKER_ROLES, Plan

MAX_MINUTES = 60
WORKERS_BELOW_PLAN = "WorkersBelowPlan"
TOUCHING = ("add", "change", "restart", "remove")


def created_by(plan: Plan) -> str:
    """What primectl's silences of this deployment are created by (how a later change finds a dead one's)."""
    return f"primectl:{plan.name}"


def alternation(values: Iterable[str]) -> str:
    """One exact value, or a regex alternation of several (Alertmanager anchors regexes)."""
    vals = sorted(set(values))
    return vals[0] if len(vals) == 1 else "|".join(re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", v) for v in vals)


def matchers(plan: Plan, services: list[str], skip_roles: set[str] | None = None) -> list[dict[str, str]]:
    """The silences a change of `services` needs: their own alerts, and the worker count of their roles (but for
    `skip_roles`, whose count already fires)."""
    out = [{"deployment": plan.name, "service": alternation(services)}]
    by_name = {s.name: s for s in plan.services}
    roles = {by_name[s].role for s in services if s in by_name and by_name[s].role in WORKER_ROLES} - (skip_roles or set())
    if roles:
        out.append({"deployment": plan.name, "alertname": WORKERS_BELOW_PLAN, "role": alternation(roles)})
    return out


def lift_stale(plan: Plan, say: Callable[[str], None]) -> None:
    """Lift silences an earlier change of this deployment left (its controller died before it could)."""
    if plan.monitoring is None:
        return
    base = plan.monitoring.alertmanager_url
    try:
        for sid in api.active_silences(base, created_by(plan)):
            api.expire(base, sid)
            say(f"monitoring: lifted silence {sid} an interrupted change left")
    except api.AlertmanagerError:
        return  # not running (yet): nothing it holds can page


@contextmanager
def quiet_change(plan: Plan, changes: list[Change], say: Callable[[str], None], *, why: str) -> Iterator[None]:
    """Silence the alerts about the services `changes` touch while the block runs (nothing where the plan has no
    monitoring, or where the change starts Alertmanager itself: nothing can page before it runs)."""
    services = [c.service for c in changes if c.action in TOUCHING]
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
    short = {a.labels.get("role", "") for a in now if a.name == WORKERS_BELOW_PLAN}
    services = [s for s in services if s not in down]
    if not services:
        yield
        return
    ids: list[tuple[str, dict[str, str]]] = []
    for m in matchers(plan, services, skip_roles=short):
        try:
            ids.append((api.silence(base, m, minutes=MAX_MINUTES, created_by=created_by(plan), comment=why), m))
        except api.AlertmanagerError as exc:
            say(f"monitoring: no silence set ({exc}); alerts about {', '.join(services)} may fire during the change")
            break
    try:
        yield
    finally:
        for sid, m in ids:
            try:
                api.silence(base, m, minutes=mon.settle_s / 60, created_by=created_by(plan),
                            comment=why, silence_id=sid)
            except api.AlertmanagerError as exc:
                say(f"monitoring: could not lift silence {sid} ({exc}); it ends by itself within {MAX_MINUTES} min")

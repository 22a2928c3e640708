"""How a change rolls through the running services: pure decisions over the Plan, the diff and the recorded state.

Wave by wave (the plan's start order), a running service that changes is replaced one of four ways:

- it reloads in place: only its files change and it says how to re-read them (a balancer whose replica set
  changes);
- it surges: its twin (the new configuration, on ports of its own) starts beside it, then it drains and restarts
  as the new configuration, then the twin drains and stops. Where the plan has room for a whole second generation,
  each configuration of the workers registers in a namespace of its own, and a new one starts its prefill twins
  first;
- it rolls in batches with the other instances of its role: at most `max_unavailable` at once and never all of
  them, each batch drained first and back in the router's count before the next;
- it restarts at once: new, dead, or of no role to roll through.

A router that counts a role keeps the first configuration of its worker set and rejects workers whose model card
(made from their command line) differs: a new command line neither rolls in batches nor surges into the running
generation. Nothing here reaches a machine; a deploying target carries the decisions out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from primectl.deploy.changes import Change
from primectl.plan.model import RUN_FIELDS, Plan, RoleRollout, Service

if TYPE_CHECKING:
    from primectl.host.wire import DrainSpec, ServiceRecord


@dataclass(frozen=True)
class Seen:
    """What the machines reported, as the decisions read it: each service as its planned host recorded it."""

    records: Mapping[str, ServiceRecord]  # what the last `up` recorded of each service
    wanted: Mapping[str, Mapping[str, str]]  # each service's field hashes as this run renders it
    running: frozenset[str] = frozenset()  # the services (surge twins too) whose process runs
    current: frozenset[str] = frozenset()  # the running ones started from the revision this run applies

    def changed(self, service: str, key: str) -> bool:
        """Whether one field of a service differs from what was recorded of it."""
        have = (self.records.get(service) or {}).get("fields", {})
        return have.get(key) != self.wanted.get(service, {}).get(key)


def observe(plan: Plan, records: Mapping[str, ServiceRecord], running: Iterable[str] = (),
            current: Iterable[str] = (), wanted: Mapping[str, Mapping[str, str]] | None = None) -> Seen:
    """`Seen` from what was recorded and what runs; `wanted` (the field hashes as rendered) defaults to the plan's."""
    fields = wanted if wanted is not None else {s.name: s.hashes()["fields"] for s in plan.services}
    return Seen(records, fields, frozenset(running), frozenset(current))


@dataclass(frozen=True)
class Surge:
    """Running workers replaced with no moment short of capacity, each beside its twin."""

    services: list[str]
    new_generation: bool  # the twins register in a namespace of their own: the router never mixes the two
    stages: list[list[str]]  # the twins start stage by stage; the old instances drain and restart in reverse
    twins: dict[str, int]  # per rolled role: how many twins run beside its instances


@dataclass(frozen=True)
class RoleBatches:
    """A role's running instances that change, in the batches they restart in: each drained first, and back in
    the router's count (or the balancer) before the next starts."""

    rollout: RoleRollout
    batches: list[list[str]]
    together: bool  # their command line changes under a router that counts the role: one batch, never mixed


@dataclass(frozen=True)
class WaveRollout:
    """How the services of one wave are replaced."""

    at_once: list[str]  # started at once: new, dead, or of no role to roll through
    reloads: list[str]  # re-read their files in place
    surge: Surge | None
    rolls: list[RoleBatches]


@dataclass(frozen=True)
class Removals:
    """What `up` stops before anything starts."""

    stale_twins: list[str]  # surge twins of another revision an interrupted `up` left running
    adopted_twins: list[str]  # surge twins it started from this revision: they serve until this run's surge is done
    services: dict[str, list[str]]  # per host: the services the plan no longer has


@dataclass(frozen=True)
class Stops:
    """What a rollback stops on one host."""

    restarted: list[str]  # ran before this run started them again: stopped, then put back as recorded
    added: list[str]  # new in this run: stopped and forgotten (systemd: their units deleted)


def starting(changes: Iterable[Change]) -> set[str]:
    """The services `up` (re)starts."""
    return {c.service for c in changes if c.starts}


def waves(plan: Plan, changes: Iterable[Change]) -> list[list[str]]:
    """The services `up` (re)starts, grouped in the plan's dependency order."""
    names = starting(changes)
    return [[n for n in wave if n in names] for wave in plan.start_waves() if any(n in names for n in wave)]


def running_changes(changes: Iterable[Change], seen: Seen) -> list[str]:
    """The services that change and run now (a stopped one simply starts: nothing to roll or surge past)."""
    return [c.service for c in changes if c.action == "change" and c.service in seen.running]


def card_changes(seen: Seen, names: Iterable[str]) -> bool:
    """Whether any of these workers changes its command line (what its model card is made from)."""
    return any(seen.changed(n, "argv") for n in names)


def new_generation(seen: Seen, names: Iterable[str]) -> bool:
    """Whether the workers that change move to a generation (namespace) other than the running one."""
    return any(seen.changed(n, "generation") for n in names)


def stages(plan: Plan, seen: Seen, names: list[str]) -> list[list[str]]:
    """The order a surge starts its twins in (and drains the old instances in, reversed). A new generation with
    prefill workers starts their twins first: Dynamo 1.6.1's frontend routes to a generation as soon as its decode
    workers register, and rejects what it sends there while that generation's prefill router is still activating.
    Its old prefill workers drain last, once no decode worker of theirs is routed to."""
    prefill = [n for n in names if plan.service(n).role == "prefill"]
    rest = [n for n in names if n not in prefill]
    if not new_generation(seen, names) or not prefill or not rest:
        return [names]
    return [prefill, rest]


def surge(plan: Plan, seen: Seen, names: list[str]) -> Surge:
    """How running workers with a twin each are replaced beside their twins."""
    twins = {r.role: sum(1 for n in names if plan.service(n).role == r.role) for r in plan.rollouts}
    return Surge(names, new_generation(seen, names), stages(plan, seen, names), twins)


def batches(rollout: RoleRollout, changed: set[str]) -> list[list[str]]:
    """The changed instances of a role in restart batches: at most max_unavailable at once, and never every
    instance of a role that has more than one (each batch lists the services of its instances)."""
    touched = [inst for inst in rollout.instances if any(n in changed for n in inst)]
    size = max(1, min(rollout.max_unavailable, len(rollout.instances) - 1 if len(rollout.instances) > 1 else 1))
    return [[n for inst in touched[i:i + size] for n in inst if n in changed] for i in range(0, len(touched), size)]


def reloads(plan: Plan, changes: Iterable[Change], seen: Seen, wave: Collection[str]) -> list[str]:
    """The services of a wave that take their change in place: only their files change, and they say how to
    re-read them (a balancer whose replica set changes)."""
    run = [f for f in RUN_FIELDS if f != "files"]
    return [c.service for c in changes
            if c.action == "change" and c.service in wave and plan.service(c.service).reload is not None
            and not any(seen.changed(c.service, f) for f in run)]


def moved_check(plan: Plan, seen: Seen, name: str) -> str | None:
    """The readiness URL a running service was recorded with, where the plan's differs (else None)."""
    have = str(((seen.records.get(name) or {}).get("ready") or {}).get("url") or "")
    return have if have and have != plan.service(name).ready.url else None


def check_moves(plan: Plan, changes: Sequence[Change], seen: Seen) -> list[str]:
    """The reloading services whose readiness moves (a balancer whose health check follows a renamed model). They
    reload as soon as the new configuration's workers have registered, while the old name's still serve too: until
    then they would call every replica down, the ones that come back included."""
    return [n for n in reloads(plan, changes, seen, starting(changes)) if moved_check(plan, seen, n)]


def wave_rollout(plan: Plan, changes: Sequence[Change], seen: Seen, wave: list[str]) -> WaveRollout:
    """A wave's services split four ways: reloads; workers that change and have a surge twin each; per role, the
    batches the other running instances that change restart in; and the rest, started at once."""
    changing = set(running_changes(changes, seen)) & set(wave)
    # A worker's twin in the running generation's namespace must carry the same model card as the workers there:
    # only a plan with room for a whole generation (each worker in one) surges a new command line. A service no
    # router counts (a frontend behind the balancer) surges whatever changes.
    surged = [n for n in wave if n in changing and plan.service(n).twin is not None
              and (plan.service(n).generation is not None or plan.service(n).listed_as is None
                   or not card_changes(seen, [n]))]
    rolls = []
    taken: set[str] = set(surged)
    for rollout in plan.rollouts:
        mine = {n for inst in rollout.instances for n in inst} & changing - set(surged)
        if mine and rollout.registered is not None and card_changes(seen, mine):
            # Dynamo 1.6.1's router keeps the first configuration of a worker set and rejects workers whose model
            # card differs ("Rejected incompatible workers"): a new argv cannot roll in batches.
            rolls.append(RoleBatches(rollout, [sorted(mine, key=wave.index)], together=True))
        elif mine:
            rolls.append(RoleBatches(rollout, batches(rollout, mine), together=False))
        taken |= mine
    reloading = reloads(plan, changes, seen, wave)
    at_once = [n for n in wave if n not in taken and n not in reloading]
    return WaveRollout(at_once, reloading, surge(plan, seen, surged) if surged else None, rolls)


def registered_counts(plan: Plan, seen: Seen, names: list[str], twins: Mapping[str, int], *, fresh: bool
                      ) -> list[tuple[RoleRollout, int]]:
    """Per role of `names` that the router counts, how many it must count: every instance plus the twins still up
    (`fresh`, while a new generation's twins register: only the twins and the instances that do not change)."""
    out = []
    for rollout in plan.rollouts:
        if rollout.registered is None or not any(n in inst for inst in rollout.instances for n in names):
            continue
        changing = sum(1 for inst in rollout.instances if any(n in names for n in inst))
        unchanged = len(rollout.instances) - changing
        # a new generation counts apart: at first only its twins and the instances that did not change
        planned = unchanged if fresh and new_generation(seen, names) else len(rollout.instances)
        out.append((rollout, planned + twins.get(rollout.role, 0)))
    return out


def twin_drain_order(plan: Plan, twins: Collection[str]) -> list[list[Service]]:
    """The running surge twins, in the order they drain and stop: decode twins before prefill twins (a prefill
    worker leaves only once nothing routes through it)."""
    up = [svc.twin for svc in plan.services if svc.twin and svc.twin.name in twins]
    return [group for prefill in (False, True) if (group := [t for t in up if (t.role == "prefill") == prefill])]


def stop_order(plan: Plan, known: Collection[str]) -> list[list[str]]:
    """The order `down` stops services in: those the plan does not have first, then its start waves reversed."""
    planned = {n for wave in plan.start_waves() for n in wave}
    return [sorted(set(known) - planned), *reversed(plan.start_waves())]


def adoptable(plan: Plan, name: str) -> bool:
    """Whether a worker an interrupted `up` started from the revision being applied is kept as it runs: one with a
    surge twin is (its generation's registrations already count it; restarted, it would count twice while it
    surges)."""
    return plan.service(name).twin is not None


def leftover_twins(plan: Plan, seen: Seen, exclude: Collection[str] = ()) -> list[Change]:
    """Surge twins that run though no `up` is under way: left by one that was killed mid-surge. One started from
    the revision being applied serves on as this run's own twin until this run's surge is done; another is drained
    and stopped before anything starts (its generation's registrations would count it)."""
    out = []
    for svc in plan.services:
        if not svc.twin or svc.twin.name in exclude or svc.twin.name not in seen.running:
            continue
        why = ("it serves until this run's surge is done, then drains and stops" if svc.twin.name in seen.current
               else "drained and stopped before anything starts")
        out.append(Change(svc.host, svc.twin.name, "remove", f"surge twin left running by an interrupted `up`: {why}"))
    return out


def removals(plan: Plan, changes: Iterable[Change], seen: Seen) -> Removals:
    """What `up` stops before anything starts: the services the plan no longer has, and the surge twins an
    interrupted `up` left (those it started from this revision are kept as this run's own)."""
    twins = {svc.twin.name for svc in plan.services if svc.twin}
    orphans: list[str] = []
    gone: dict[str, list[str]] = {}
    for c in changes:
        if c.action == "remove" and c.service in twins:
            orphans.append(c.service)
        elif c.action == "remove":
            gone.setdefault(c.host, []).append(c.service)
    return Removals([n for n in orphans if n not in seen.current], [n for n in orphans if n in seen.current], gone)


def rollback_stops(plan: Plan, changes: Iterable[Change], started: Sequence[str]) -> dict[str, Stops]:
    """Per host, the planned services this run started, which a rollback stops."""
    added = {c.service for c in changes if c.action == "add"}
    planned = {s.name for s in plan.services}
    out: dict[str, Stops] = {}
    for n in started:
        if n in planned:
            stops = out.setdefault(plan.service(n).host, Stops([], []))
            (stops.added if n in added else stops.restarted).append(n)
    return out


def rollback_restores(changes: Sequence[Change], started: Collection[str], recorded: Mapping[str, Collection[str]]
                      ) -> dict[str, list[str]]:
    """Per host (of `recorded`: the services each one's state records), what a rollback starts again on the
    previous revision: the recorded services this run stopped (removed) or started anew."""
    out: dict[str, list[str]] = {}
    for h, names in recorded.items():
        for c in changes:
            if c.host == h and c.action in ("change", "remove") and c.service in names:
                if c.action == "remove" or c.service in started:
                    out.setdefault(h, []).append(c.service)
    return out


def recorded_drain(record: ServiceRecord) -> DrainSpec | None:
    """A recorded drain; a balancer's server recorded before drains carried their address gets the one its
    readiness URL names, so a service put back at its old port is re-pointed there."""
    drain = record.get("drain")
    if not drain or drain.get("how") != "balancer" or drain.get("address"):
        return drain
    url = urlsplit(str((record.get("ready") or {}).get("url") or ""))
    return cast("DrainSpec", {**drain, "address": f"{url.hostname}:{url.port}"}) if url.hostname and url.port else drain


def moves(plan: Plan, seen: Seen, name: str) -> bool:
    """Whether a service behind a balancer comes back at another address than the balancer has for it."""
    svc = plan.service(name)
    old = recorded_drain(seen.records.get(name) or cast("ServiceRecord", {}))
    return bool(svc.drain and old and svc.drain.address and old.get("address") != svc.drain.address)

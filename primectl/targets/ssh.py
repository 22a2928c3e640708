"""The SSH target (the default): push per-host bundles over SSH (or run locally) and supervise them there.

Every host operation is one call of the stdlib host agent (deploy/agent.py)
over one connection per host; services run under the recipe's supervisor
(`process` or `systemd`). Hosts bind at plan time: the recipe names them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from primectl.checks.preflight_rules import ours_listening
from primectl.deploy.changes import Change, compute_changes, file_diff, pending, script_path, secrets_hash
from primectl.deploy.client import HostError
from primectl.deploy.cluster import (
    Cluster,
    ConnectionPolicy,
    Say,
    fail_on_errors,
    lock,
    open_cluster,
    opened,
    unlock,
)
from primectl.deploy.fanout import parallel
from primectl.deploy.progress import WaitProgress
from primectl.deploy.protocol import (
    STATE_SCHEMA,
    DrainSpec,
    HostState,
    Layout,
    ProbeSpec,
    ReloadSpec,
    ServiceRecord,
    ServiceRef,
    WaitSpec,
    unit_name,
)
from primectl.errors import DeployError
from primectl.plan.model import RUN_FIELDS, HostPlan, Plan, RoleRollout, Service
from primectl.recipe.model import Recipe
from primectl.render.bundle import Bundle, render_plan
from primectl.targets.base import PlannedHosts, StartFailed, StepPlan

LOG_TAIL_LINES = 40
INLINE_BUNDLE_MAX = 192 << 10  # compressed: scripts + the demo model ~ 30 KiB; bigger bundles go over SFTP first
# A `connection: local` host's agent gets its request as one command-line argument, which holds at most 128 KiB
# (Linux's MAX_ARG_STRLEN; more is E2BIG, "Argument list too long"): base64 makes a bundle 4/3 its size.
INLINE_BUNDLE_MAX_LOCAL = 90 << 10


def _policy(options: Any) -> ConnectionPolicy:
    return options if isinstance(options, ConnectionPolicy) else ConnectionPolicy()


def _ref(name: str, unit: str, stop_timeout: float, drain: DrainSpec | None) -> ServiceRef:
    ref: ServiceRef = {"name": name, "unit": unit, "stop_timeout": stop_timeout}
    if drain:
        ref["drain"] = drain
    return ref


def _service_ref(plan: Plan, svc: Service) -> ServiceRef:
    """How the agent names a planned service (or a surge twin): unit, stop timeout, and how it drains."""
    drain = cast(DrainSpec, svc.drain.model_dump(mode="json")) if svc.drain else None
    ref = _ref(svc.name, unit_name(plan.name, svc.name), svc.stop_timeout_s, drain)
    if svc.reload:
        ref["reload"] = cast(ReloadSpec, svc.reload.model_dump(mode="json"))
    return ref


def _refs(plan: Plan, names: Iterable[str]) -> list[ServiceRef]:
    return [_service_ref(plan, plan.service(n)) for n in names]


def _recorded_refs(records: dict[str, ServiceRecord], names: Iterable[str]) -> list[ServiceRef]:
    return [_ref(n, records[n]["unit"], records[n].get("stop_timeout", 30), _recorded_drain(records[n])) for n in names]


def _recorded_drain(record: ServiceRecord) -> DrainSpec | None:
    """A recorded drain; a balancer's server recorded before drains carried their address gets the one its
    readiness URL names, so a service put back at its old port is re-pointed there."""
    drain = record.get("drain")
    if not drain or drain.get("how") != "balancer" or drain.get("address"):
        return drain
    url = urlsplit(str((record.get("ready") or {}).get("url") or ""))
    return {**drain, "address": f"{url.hostname}:{url.port}"} if url.hostname and url.port else drain


def batches(rollout: RoleRollout, changed: set[str]) -> list[list[str]]:
    """The changed instances of a role in restart batches: at most max_unavailable at once, and never every
    instance of a role that has more than one (each batch lists the services of its instances)."""
    touched = [inst for inst in rollout.instances if any(n in changed for n in inst)]
    size = max(1, min(rollout.max_unavailable, len(rollout.instances) - 1 if len(rollout.instances) > 1 else 1))
    return [[n for inst in touched[i:i + size] for n in inst if n in changed] for i in range(0, len(touched), size)]


def _record(svc: Service, bundle: Bundle) -> ServiceRecord:
    m: dict[str, Any] = bundle.services[svc.name]
    record: ServiceRecord = {
        "hash": m["hash"], "files_hash": m["files_hash"], "expect_hash": m["expect_hash"], "fields": m["fields"],
        "unit": m["unit"], "role": svc.role, "release": bundle.revision, "listens": svc.listens,
        "ready": cast(ProbeSpec, svc.ready.model_dump(mode="json")), "stop_timeout": svc.stop_timeout_s}
    if svc.drain:
        record["drain"] = cast(DrainSpec, svc.drain.model_dump(mode="json"))
    return record


def _group(plan: Plan, names: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(plan.service(n).host, []).append(n)
    return out


ROSTER_KEEPERS = 3


def roster_keepers(head: str, hosts: list[str]) -> list[str]:
    """The hosts whose state keeps the whole roster: the head host, then others spread evenly through the recipe's
    order (the middle, the last), so that one rack's loss does not take every copy."""
    others = [h for h in hosts if h != head]
    want = ROSTER_KEEPERS - (head in hosts)
    picks = sorted({(k + 1) * len(others) // want - 1 for k in range(want)} - {-1}) if others else []
    return ([head] if head in hosts else []) + [others[i] for i in picks]


class SSHRollout:
    """One `up` over SSH: the open cluster plus what the pipeline decided so far."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.plan = cluster.plan
        self.bundles = render_plan(self.plan)
        self.hosts = self.plan.deployed_hosts()
        self.changes: list[Change] = []
        self.secrets_hash = ""
        self.stale_secrets: list[str] = []
        self.started: list[str] = []
        self.twins: list[str] = []  # surge twins running now (stopped at the end of their surge, or by rollback)
        self.reloaded: list[str] = []  # services that re-read their files in place (rollback reloads them again)

    # -- lock and diff --------------------------------------------------------------------------------

    def lock(self, *, break_lock: bool) -> None:
        lock(self.cluster, break_lock=break_lock, command="up")

    def unlock(self) -> None:
        unlock(self.cluster)

    def diff(self, secrets: str | None, *, detail: bool = False) -> list[Change]:
        # a worker with a surge twin, started by an interrupted `up` from this revision, is kept as it runs: its
        # generation's registrations already count it (one restarted would be counted twice while it surges)
        self.changes = self._relisted(compute_changes(self.bundles, self.cluster.views,
                                                      self._script_diff if detail else None,
                                                      lambda n: self.plan.service(n).twin is not None))
        self.changes += self._orphaned_twins()
        if secrets is not None:
            self.secrets_hash = secrets_hash(self.plan.name, secrets)
            self.stale_secrets = [h for h in self.hosts if self.cluster.state(h).get("secrets_hash") != self.secrets_hash]
            recorded = any(self.cluster.state(h).get("secrets_hash") for h in self.stale_secrets)
            if self.stale_secrets and not pending(self.changes) and recorded:
                self.cluster.say("secrets changed: running services keep the values they started with until they restart")
        return self.changes

    def _orphaned_twins(self) -> list[Change]:
        """Surge twins that run though no `up` is under way: left by one that was killed mid-surge. One started
        from the revision being applied serves on as this run's own twin until this run's surge is done; another
        is drained and stopped before anything starts (its generation's registrations would count it)."""
        out = []
        for svc in self.plan.services:
            if not svc.twin or svc.twin.name in self.twins or not self.cluster.alive(svc.host, svc.twin.name):
                continue
            why = ("it serves until this run's surge is done, then drains and stops" if self._from_this_revision(svc.twin)
                   else "drained and stopped before anything starts")
            out.append(Change(svc.host, svc.twin.name, "remove", f"surge twin left running by an interrupted `up`: {why}"))
        return out

    def _from_this_revision(self, svc: Service) -> bool:
        """Whether a running service was started from the revision this run applies to its host."""
        started = self.cluster.views[svc.host].get("services", {}).get(svc.name, {}).get("release")
        return started == self.bundles[svc.host].revision

    def _relisted(self, changes: list[Change]) -> list[Change]:
        """Workers that run and pass their own probe but that the frontend lost: `restart` instead of `keep`
        (restarted, they register again)."""
        from primectl.checks.registration import LOST, unlisted

        plan = self.plan
        kept = [c.service for c in changes if c.action == "keep" and plan.service(c.service).listed_as]
        lost = unlisted(plan, kept, self.cluster.client(plan.head).probe) if kept else []
        if not lost:
            return changes
        by_host: dict[str, list[str]] = {}
        for n in lost:
            by_host.setdefault(plan.service(n).host, []).append(n)

        def probe(h: str) -> Any:
            return self.cluster.client(h).probe(
                [{"name": n, "probe": plan.service(n).ready.model_dump(mode="json")} for n in by_host[h]])

        ready = {n for h, res in parallel(probe, by_host).items() if isinstance(res, dict)
                 for n in by_host[h] if res.get(n, {}).get("ok")}
        return [Change(c.host, c.service, "restart", f"running, but {LOST}") if c.service in ready else c
                for c in changes]

    def _script_diff(self, host: str, service: str) -> str:
        """The service's run script: the host's recorded release against the new bundle."""
        release = self.cluster.recorded(host).get(service, {}).get("release")
        path = script_path(service)
        old = self.cluster.client(host).read(f"releases/{release}/{path}") if release else ""
        bundle = self.bundles[host]
        return file_diff(path, old, bundle.files[path].decode(), f"{host}:{release}", f"{host}:{bundle.revision}")

    def nothing_to_do(self) -> bool:
        return not pending(self.changes) and not self.stale_secrets

    @property
    def push_hosts(self) -> list[str]:
        return [h for h in self.hosts if self.cluster.views[h].get("current") != self.bundles[h].revision]

    @property
    def to_start(self) -> set[str]:
        return {c.service for c in self.changes if c.starts}

    def describe(self, *, preflight: bool, smoke: bool) -> list[StepPlan]:
        """What each step of `up` would do now."""
        c, plan = self.cluster, self.plan
        todo = pending(self.changes)
        idle = self.nothing_to_do()
        skip = "skipped: nothing to change"
        removed = [f"{x.service} on {x.host}" for x in todo if x.action == "remove"]
        updates = [f"{x.service} ({x.reason})" for x in todo if x.action == "update"]
        waves = [f"{i}: {', '.join(w)}" for i, w in enumerate(self.waves(), 1)]
        runtimes = sorted({f"{r.flavour} {r.key}" for h, r in plan.serving.runtime.items() if h in self.hosts and r.provisioned})
        ports = sorted({p for x in todo if x.starts for p in plan.service(x.service).listens})
        steps = [
            StepPlan("connect", f"{len(self.hosts)} host(s) inspected: {', '.join(self.hosts)}"
                     + (f"; dropped from the recipe: {', '.join(c.dropped)}" if c.dropped else "")),
            StepPlan("lock", f"take the deployment lock on {plan.head}"),
            StepPlan("diff", f"{len(todo)} to change, {len(self.changes) - len(todo)} unchanged",
                     [f"{x.action} {x.service} on {x.host}: {x.reason}" for x in todo]),
            StepPlan("preflight", skip if idle else ("check every host" if preflight else "skipped (--skip-preflight)")),
            StepPlan("provision", skip if idle else (f"create or reuse runtime {', '.join(runtimes)} on each host"
                                                      if runtimes else "skipped: software.python is given")),
            StepPlan("ports", skip if idle else f"check {len(ports)} port(s) are free"),
            StepPlan("push", skip if idle else (", ".join(f"{h} <- revision {self.bundles[h].revision}"
                                                          for h in self.push_hosts) or "nothing to upload")),
            StepPlan("activate", skip if idle else (", ".join(f"switch {h}" for h in self.push_hosts) or "no switch")
                     + ("; write secrets" if self.stale_secrets or plan.secret_names else "")),
            StepPlan("stop removed", ", ".join(removed) or "nothing to remove"),
            StepPlan("waves", "; ".join(waves) or "nothing to start", self.rollout_plan()),
            StepPlan("gate", skip if idle else f"GET {plan.gate.url} == 200 (up to {plan.gate.timeout_s:g}s)"),
            StepPlan("smoke", skip if idle else ("run the endpoint checks" if smoke else "skipped (--no-smoke)")),
            StepPlan("record", skip if idle else f"write state on {len(self.hosts)} host(s)"
                     + (f"; update expectations of {', '.join(updates)}" if updates else "")),
            StepPlan("retire", ", ".join(f"{h} leaves the deployment" for h in c.dropped) or "no host dropped"),
        ]
        return steps

    # -- steps before anything changes ---------------------------------------------------------------------

    def preflight(self) -> None:
        from primectl.checks.preflight import gate_up

        gate_up(self.cluster)

    def provision(self, wheelhouse: Any) -> None:
        if any(r.provisioned for r in self.plan.serving.runtime.values()):
            from primectl.deploy.provision import provision

            provision(self.cluster, wheelhouse=wheelhouse, say=self.cluster.say)

    def check_ports(self) -> None:
        """Every port a service about to start needs must be free, except ports our own services hold."""
        plan, c = self.plan, self.cluster
        need: dict[str, dict[int, str]] = {}
        for ch in self.changes:
            if ch.starts:
                for port in plan.service(ch.service).listens:
                    need.setdefault(ch.host, {})[port] = ch.service
        problems = []
        for host, ports in need.items():
            ours = ours_listening(c.views[host])
            for port in sorted((set(ports) - ours) & set(c.views[host].get("taken", []))):
                problems.append(f"port {port} on {host} ({plan.host(host).address}) is already in use; "
                                f"{ports[port]} needs it")
        if problems:
            raise DeployError("ports are taken; nothing was changed:\n  " + "\n  ".join(problems))

    def push(self) -> None:
        """Upload and unpack each host's release (atomic rename on the host)."""
        c = self.cluster
        hosts = self.push_hosts

        def one(h: str) -> None:
            b = self.bundles[h]
            if b.revision in c.views[h].get("releases", []):
                return
            archive = b.archive()
            limit = INLINE_BUNDLE_MAX_LOCAL if self.plan.host(h).connection == "local" else INLINE_BUNDLE_MAX
            if len(archive) <= limit:  # one round trip: the bundle rides in the stage request
                c.client(h).stage(b.revision, archive)
                return
            c.client(h).transport.put(archive, Layout(c.workdir(h)).incoming(b.revision))
            c.client(h).stage(b.revision)

        fail_on_errors(parallel(one, hosts), "pushing the release")
        for h in hosts:
            c.say(f"pushed {h}: revision {self.bundles[h].revision}")

    # -- steps that change what runs -----------------------------------------------------------------------

    def activate(self, secrets: str) -> None:
        c = self.cluster
        write = bool(self.plan.secret_names or self.stale_secrets)
        push = set(self.push_hosts)

        def one(h: str) -> None:
            c.client(h).activate(revision=self.bundles[h].revision if h in push else None,
                                 secrets={"deployment": self.plan.name, "content": secrets} if write else None)

        fail_on_errors(parallel(one, self.hosts if write else sorted(push)), "switching releases", before_changes=False)

    def stop_removed(self) -> None:
        c = self.cluster
        twins = {svc.twin.name: svc.twin for svc in self.plan.services if svc.twin}
        orphans = [ch.service for ch in self.changes if ch.action == "remove" and ch.service in twins]
        if stale := [n for n in orphans if not self._from_this_revision(twins[n])]:
            c.say(f"stopping {', '.join(stale)}: surge twin(s) of another revision an interrupted `up` left running")
            self.twins = stale
            self._stop_twins()
        if kept := [n for n in orphans if self._from_this_revision(twins[n])]:
            c.say(f"keeping {', '.join(kept)}: surge twin(s) an interrupted `up` started from this revision serve "
                  "until this run's surge is done")
            self.twins = kept
        removed: dict[str, list[str]] = {}
        for ch in self.changes:
            if ch.action == "remove" and ch.service not in twins:
                removed.setdefault(ch.host, []).append(ch.service)
        for h, names in removed.items():
            c.client(h).stop(_recorded_refs(c.recorded(h), names), remove_units=True)

    def waves(self) -> list[list[str]]:
        names = self.to_start
        return [[n for n in wave if n in names] for wave in self.plan.start_waves() if any(n in names for n in wave)]

    def rollout_plan(self) -> list[str]:
        """Per wave, how the running services that change are replaced, and what clients lose (0, or why not)."""
        plan, out = self.plan, []
        for wave in self.waves():
            at_once, surge, rolls = self.rolling(wave)
            running = set(self.running_changes())
            for n in self.reloads(wave):
                svc = plan.service(n)
                out.append(f"{n}: reloads in place ({svc.reload.signal if svc.reload else ''}: only its files "
                           "change); it keeps its sockets and finishes the connections it holds; "
                           + (self._check_move_text(n) if n in self.check_moves() else "expected loss 0"))
            for n in at_once:
                if n in running:
                    svc = plan.service(n)
                    out.append(f"{n}: single instance, no spare capacity: up to {svc.ready.timeout_s:g}s without "
                               f"this {svc.role} (it restarts in place)")
            if surge:
                new_generation = self._new_generation(surge)
                kind = ("new generation (its own Dynamo namespace: the router never mixes the two)"
                        if new_generation else "same generation")
                stages = self._stages(surge)
                order = "; ".join(", ".join(n + "-surge" for n in stage) for stage in stages)
                joins = ("register" if any(plan.service(n).listed_as for n in surge)
                         else "take traffic at the balancer")
                out.append(f"surge, {kind}: twins {order} start beside the running ones and {joins}"
                           + (" (prefill first)" if len(stages) > 1 else "")
                           + f"; then {'; '.join(', '.join(stage) for stage in reversed(stages))} drain (up to "
                           f"{max(_drain_s(plan.service(n)) for n in surge):g}s) "
                           f"and restart; then the twins drain and stop; expected loss 0")
            for rollout, steps in rolls:
                drain = max((_drain_s(plan.service(n)) for b in steps for n in b), default=0)
                if len(rollout.instances) == 1:
                    svc = plan.service(steps[0][0])
                    why = ("no spare capacity" if svc.twin is None else
                           "its command line changes, and there is room for its twin but not for a whole second "
                           "generation (Dynamo's router rejects a twin whose model card differs from the running one)")
                    out.append(f"{rollout.role}: single instance, {why}: up to {svc.ready.timeout_s:g}s "
                               f"without this role")
                    continue
                if rollout.registered is not None and self._card_changes(steps[0]):
                    svc = plan.service(steps[0][0])
                    out.append(f"{rollout.role}: {', '.join(steps[0])} restart together: their command line changes, "
                               "and Dynamo's router rejects workers whose model card differs from the running ones; "
                               f"no room for a second generation here: up to {svc.ready.timeout_s:g}s without "
                               f"{'this role' if len(steps[0]) == len(rollout.instances) else 'them'}")
                    continue
                together = len(steps) == 1 and len(steps[0]) >= len([n for i in rollout.instances for n in i])
                out.append(f"{rollout.role}: {len(steps)} batch(es) of at most {rollout.max_unavailable} instance(s): "
                           f"drain (up to {drain:g}s) -> restart -> ready"
                           + (" -> registered with the router" if rollout.registered else " -> back in the balancer"
                              + (" at its new address" if any(self._moves(n) for b in steps for n in b) else ""))
                           + ("; every instance at once: the role is out until they are ready" if together
                              else "; expected loss 0"))
        return out

    def rolling(self, wave: list[str]) -> tuple[list[str], list[str], list[tuple[RoleRollout, list[list[str]]]]]:
        """A wave's services split three ways: started at once (new, dead, or of no role to roll through); workers
        that change and have a surge twin each (a new generation starts beside the old one); and per role, the
        batches the other running instances that change restart in."""
        changing = set(self.running_changes()) & set(wave)
        # A worker's twin in the running generation's namespace must carry the same model card as the workers there:
        # only a plan with room for a whole generation (each worker in one) surges a new command line. A service no
        # router counts (a frontend behind the balancer) surges whatever changes.
        surge = [n for n in wave if n in changing and self.plan.service(n).twin is not None
                 and (self.plan.service(n).generation is not None or self.plan.service(n).listed_as is None
                      or not self._card_changes([n]))]
        rolls = []
        in_batches: set[str] = set(surge)
        for rollout in self.plan.rollouts:
            mine = {n for inst in rollout.instances for n in inst} & changing - set(surge)
            if mine and rollout.registered is not None and self._card_changes(mine):
                # Dynamo 1.6.1's router keeps the first configuration of a worker set and rejects workers whose
                # model card differs ("Rejected incompatible workers"): a new argv cannot roll in batches.
                rolls.append((rollout, [sorted(mine, key=wave.index)]))
                in_batches |= mine
            elif mine:
                rolls.append((rollout, batches(rollout, mine)))
                in_batches |= mine
        reloads = set(self.reloads(wave))
        return [n for n in wave if n not in in_batches and n not in reloads], surge, rolls

    def running_changes(self) -> list[str]:
        """The services that change and run now (a stopped one simply starts: nothing to roll or surge past)."""
        return [ch.service for ch in self.changes if ch.action == "change" and self.cluster.alive(ch.host, ch.service)]

    def check_moves(self) -> list[str]:
        """The reloading services whose readiness moves (a balancer whose health check follows a renamed model),
        not yet reloaded. They reload as soon as the new configuration's workers have registered, while the old
        name's still serve too: until then they would call every replica down, the ones that come back included."""
        return [n for n in self.reloads(list(self.to_start)) if n not in self.reloaded and self._ready_url(n)]

    def _ready_url(self, name: str) -> str | None:
        """The readiness URL a running service was recorded with, when the plan's differs (else None)."""
        have = str(((self.cluster.recorded(self.plan.service(name).host).get(name) or {}).get("ready") or {}).get("url") or "")
        return have if have and have != self.plan.service(name).ready.url else None

    def _moves(self, name: str) -> bool:
        """Whether a service behind a balancer comes back at another address than the balancer has for it."""
        svc = self.plan.service(name)
        old = _recorded_drain(self.cluster.recorded(svc.host).get(name) or {})
        return bool(svc.drain and old and svc.drain.address and old.get("address") != svc.drain.address)

    def _check_move_text(self, name: str) -> str:
        """What `diff` says of a reloading service whose readiness check moves: what its component says of that."""
        from primectl.components import base as components

        svc = self.plan.service(name)
        try:
            component: object | None = components.get(svc.component)
        except KeyError:
            component = None
        move = components.check_move(component, self.plan, svc, self._ready_url(name) or "")
        return f"{move.why}, so it reloads as soon as the new workers have registered, before any replica rolls; {move.then}"

    def reloads(self, wave: list[str]) -> list[str]:
        """The running services of a wave that take their change in place: only their files change, and they
        say how to re-read them (a balancer whose replica set changes)."""
        run = [f for f in RUN_FIELDS if f != "files"]
        return [ch.service for ch in self.changes
                if ch.action == "change" and ch.service in wave and self.plan.service(ch.service).reload is not None
                and not any(self._field_changed(ch.service, f) for f in run)]

    def start(self, wave: list[str]) -> None:
        """Start a wave: new and dead services at once; changing workers with room for a twin as a surge (twins
        first, then the old ones drained and replaced, then the twins drained); a role's other running instances
        that change in batches, each drained first and back in the router's count before the next batch starts."""
        at_once, surge, rolls = self.rolling(wave)
        if at_once:
            self._start_now(at_once)
        if reloads := [n for n in self.reloads(wave) if n not in self.reloaded]:
            self._reload_now(reloads)
        if surge:
            self._surge(surge)
        if any(rollout.registered is None for rollout, _ in rolls) and (early := self.check_moves()):
            self._reload_now(early)  # before a replica comes back, or the balancer would never call it up
        for rollout, steps in rolls:
            for i, batch in enumerate(steps, 1):
                if len(steps) > 1 or len(rollout.instances) > 1:
                    self.cluster.say(f"rolling {rollout.role} {i}/{len(steps)}: {', '.join(batch)} "
                                     f"(drain, restart, ready{', registered' if rollout.registered else ''})")
                self._start_now(batch)
                if rollout.registered is not None:
                    self._wait_registered(rollout)

    def _surge(self, names: list[str]) -> None:
        """Replace running workers with no moment short of capacity: their twins (the new configuration, on
        ports of their own) start and register, the old instances drain and restart as the new configuration,
        then the twins drain and stop. A new generation registers in a namespace of its own, so the router
        never mixes workers whose model cards differ."""
        plan, c = self.plan, self.cluster
        stages = self._stages(names)
        twins = [plan.service(n).twin for n in names]
        extra = {r.role: sum(1 for n in names if plan.service(n).role == r.role) for r in plan.rollouts}
        for i, stage in enumerate(stages):
            c.say(f"surge: starting {', '.join(n + '-surge' for n in stage)} beside {', '.join(stage)}"
                  + (" (prefill first: its router is active before the generation takes requests)"
                     if len(stages) > 1 and i == 0 else ""))
            started = [t for n in stage if (t := plan.service(n).twin) is not None and t.name not in self.twins]
            self.twins += [t.name for t in started]
            if started:
                self._start_services(started)
            self._wait_roles(stage, extra, fresh=True)
        if early := self.check_moves():
            self._reload_now(early)  # both generations serve now: the only moment both names answer
        for stage in reversed(stages):
            c.say(f"surge: draining and replacing {', '.join(stage)}")
            self._start_now(stage)
            self._wait_roles(stage, extra, fresh=False)
        c.say(f"surge: draining {', '.join(t.name for t in twins if t)}")
        self._stop_twins()
        self._wait_roles(names, {}, fresh=False)

    def _stages(self, names: list[str]) -> list[list[str]]:
        """The order a surge starts its twins in (and drains the old instances in, reversed). A new generation
        with prefill workers starts their twins first: Dynamo 1.6.1's frontend routes to a generation as soon
        as its decode workers register, and rejects what it sends there while that generation's prefill router
        is still activating. Its old prefill workers drain last, once no decode worker of theirs is routed to."""
        prefill = [n for n in names if self.plan.service(n).role == "prefill"]
        rest = [n for n in names if n not in prefill]
        if not self._new_generation(names) or not prefill or not rest:
            return [names]
        return [prefill, rest]

    def _wait_roles(self, names: list[str], twins: dict[str, int], *, fresh: bool) -> None:
        """Until the router counts each role of `names` as planned plus its twins still up (`fresh`: only the twins
        and the instances that do not change have registered in this generation so far)."""
        plan = self.plan
        for rollout in plan.rollouts:
            if rollout.registered is None or not any(n in inst for inst in rollout.instances for n in names):
                continue
            changing = sum(1 for inst in rollout.instances if any(n in names for n in inst))
            unchanged = len(rollout.instances) - changing
            # a new generation counts apart: at first only its twins and the instances that did not change
            count = (unchanged if fresh and self._new_generation(names) else len(rollout.instances)) + twins.get(rollout.role, 0)
            self._wait_registered(rollout, count)

    def _card_changes(self, names: Iterable[str]) -> bool:
        """Whether any of these workers changes its command line (what its model card is made from)."""
        return any(self._field_changed(n, "argv") for n in names)

    def _field_changed(self, name: str, field: str) -> bool:
        host = self.plan.service(name).host
        have = (self.cluster.recorded(host).get(name) or {}).get("fields", {})
        want = cast(dict[str, str], self.bundles[host].services[name].get("fields", {}))
        return have.get(field) != want.get(field)

    def _new_generation(self, names: list[str]) -> bool:
        """Whether the workers that change move to a generation (Dynamo namespace) other than the running one."""
        return any(self._field_changed(n, "generation") for n in names)

    def _start_services(self, services: list[Service]) -> None:
        """Start services that are not in the plan's list (surge twins) and wait until each is ready."""
        c = self.cluster
        by_host: dict[str, list[Service]] = {}
        for svc in services:
            by_host.setdefault(svc.host, []).append(svc)

        def one(h: str) -> Any:
            svcs = by_host[h]
            refs = [_service_ref(self.plan, s) for s in svcs]
            waits: list[WaitSpec] = [{"name": s.name, "unit": unit_name(self.plan.name, s.name),
                                      "probe": cast(ProbeSpec, s.ready.model_dump(mode="json"))} for s in svcs]
            return c.client(h).start_wait(refs, waits, timeout=max(s.ready.timeout_s for s in svcs) + 60)

        for h, r in parallel(one, by_host).items():
            if isinstance(r, BaseException):
                name = getattr(r, "service", None) or by_host[h][0].name
                raise StartFailed(f"surge twin {name} on {h}: {str(r).removeprefix(f'{h}: ')}", service=name,
                                  log_tail=self._tail(h, name))

    def _stop_twins(self) -> None:
        """Drain and stop every surge twin this `up` started (systemd: and forget their units)."""
        plan, c = self.plan, self.cluster
        twins = [svc.twin for svc in plan.services if svc.twin and svc.twin.name in self.twins]
        # decode twins before prefill twins: a prefill worker leaves only once nothing routes through it
        for prefill in (False, True):
            by_host: dict[str, list[ServiceRef]] = {}
            for t in twins:
                if (t.role == "prefill") == prefill:
                    by_host.setdefault(t.host, []).append(_service_ref(plan, t))
            for h, r in parallel(partial(self._stop_on, by_host), by_host).items():
                if isinstance(r, BaseException):
                    c.say(f"WARNING: could not stop the surge twins on {h}: {r}")
        self.twins = []

    def _stop_on(self, by_host: dict[str, list[ServiceRef]], h: str) -> Any:
        """Drain and stop the twins on host `h`, and forget their units."""
        return self.cluster.client(h).stop(by_host[h], remove_units=True)

    def _wait_registered(self, rollout: RoleRollout, count: int | None = None) -> None:
        """Until the router counts every instance of the role again (the batch just started has registered),
        or `count` of them."""
        plan = self.plan
        probe = rollout.registered if count is None else rollout.registered_count(count)
        assert probe is not None
        try:
            with WaitProgress([f"{rollout.role} registered"]) as progress:
                self.cluster.client(plan.head).wait([{"name": f"{rollout.role} registered",
                                                      "probe": cast(ProbeSpec, probe.model_dump(mode="json"))}],
                                                    timeout=probe.timeout_s + 30, progress=progress.update)
        except HostError as exc:
            raise StartFailed(f"{rollout.role} did not register with the router again: "
                              f"{str(exc).removeprefix(f'{plan.head}: ')}", service=rollout.instances[0][0]) from None

    def _start_now(self, wave: list[str]) -> None:
        """Start services (per host in parallel) and wait until every one is ready."""
        plan, c = self.plan, self.cluster
        self.started += wave
        by_host = _group(plan, wave)

        def one(h: str) -> Any:
            names = by_host[h]
            waits: list[WaitSpec] = [{"name": n, "unit": unit_name(plan.name, n),
                                      "probe": plan.service(n).ready.model_dump(mode="json")} for n in names]  # type: ignore[typeddict-item]
            timeout = max(plan.service(n).ready.timeout_s for n in names) + 60 + sum(_drain_s(plan.service(n)) for n in names)
            return c.client(h).start_wait(_refs(plan, names), waits, timeout=timeout, progress=progress.update)

        with WaitProgress(wave) as progress:  # each service's phase on stderr while the wave comes up
            results = parallel(one, by_host)
        for h, r in results.items():
            for name, d in (r.get("drained") or {}).items() if isinstance(r, dict) else ():
                c.say(f"{name}: {_drained_text(d)}")
            if isinstance(r, HostError) and r.service:
                tail = self._tail(h, r.service)
                raise StartFailed(f"{r.service} on {h}: {str(r).removeprefix(f'{h}: ')}", service=r.service,
                                  log_tail=tail)
            if isinstance(r, BaseException):
                raise StartFailed(f"{h}: {r}", service=None)

    def _reload_now(self, names: list[str], *, rollback: bool = False) -> None:
        """Have running services re-read their files in place (per host in parallel) and wait until each is
        ready; one that does not run is started. In a rollback nothing checks what the old files list."""
        plan, c = self.plan, self.cluster
        if not rollback:
            self.reloaded += names
        by_host = _group(plan, names)

        def one(h: str) -> Any:
            refs = _refs(plan, by_host[h])
            if rollback:
                for ref in refs:
                    ref["reload"] = {"signal": ref["reload"]["signal"], "timeout_s": ref["reload"].get("timeout_s", 30)}
            # in a rollback, ready as the previous revision recorded it (a renamed model's old name, say)
            waits: list[WaitSpec] = [{"name": n, "unit": unit_name(plan.name, n), "probe": cast(ProbeSpec, (
                rollback and (c.recorded(h).get(n) or {}).get("ready")) or plan.service(n).ready.model_dump(mode="json"))}
                for n in by_host[h]]
            return c.client(h).reload(refs, waits, timeout=max(plan.service(n).ready.timeout_s for n in by_host[h]) + 60)

        for h, r in parallel(one, by_host).items():
            if isinstance(r, BaseException):
                name = getattr(r, "service", None) or by_host[h][0]
                raise StartFailed(f"{name} on {h} did not reload: {str(r).removeprefix(f'{h}: ')}", service=name,
                                  log_tail=self._tail(h, name))
            c.say(f"reloaded {', '.join(r.get('reloaded', []))} on {h} in place"
                  if r.get("reloaded") else f"started {', '.join(by_host[h])} on {h} (it was not running)")

    def _tail(self, host: str, service: str) -> str:
        try:
            return self.cluster.client(host).tail([service], LOG_TAIL_LINES,
                                                  {service: unit_name(self.plan.name, service)}).get(service, "")
        except DeployError:
            return ""

    def gate(self) -> None:
        """The deployment-level readiness gate, probed from the head host (after the twins an interrupted `up`
        left, when no surge of this run replaced them, have drained and stopped)."""
        plan = self.plan
        if self.twins:
            self.cluster.say(f"surge: draining {', '.join(self.twins)} (left by an interrupted `up`)")
            self._stop_twins()
        try:
            with WaitProgress(["gate"]) as progress:
                self.cluster.client(plan.head).wait([{"name": "gate", "probe": plan.gate.model_dump(mode="json")}],  # type: ignore[typeddict-item]
                                                    timeout=plan.gate.timeout_s + 30, progress=progress.update)
        except HostError as exc:
            raise StartFailed(f"readiness gate {plan.gate.url}: {str(exc).removeprefix(f'{plan.head}: ')}",
                              service="frontend", log_tail=self._tail(plan.head, "frontend")) from None

    def rollback(self) -> None:
        """Put changed services back on the previous revision and wait until they are healthy."""
        plan, c = self.plan, self.cluster
        planned = {s.name for s in plan.services}
        stop = _group(plan, [n for n in self.started if n in planned])
        added = {ch.service for ch in self.changes if ch.action == "add"}

        def stop_one(h: str) -> None:
            kept = [n for n in stop[h] if n not in added]
            new = [n for n in stop[h] if n in added]  # never ran before: forget them (systemd: delete their units)
            if kept:
                c.client(h).stop(_refs(plan, kept))
            if new:
                c.client(h).stop(_refs(plan, new), remove_units=True)

        parallel(stop_one, stop)
        restore: dict[str, list[str]] = {}
        for h, view in c.views.items():
            prev = view.get("current")
            if prev and h in self.bundles and self.bundles[h].revision != prev:
                try:  # one host gone must not stop the others from being put back
                    c.client(h).switch(prev)
                except DeployError as exc:
                    c.say(f"WARNING: could not point {h} back at revision {prev}: {exc}")
            recorded = c.recorded(h)
            for ch in self.changes:
                if ch.host == h and ch.action in ("change", "remove") and ch.service in recorded:
                    if ch.action == "remove" or ch.service in self.started:
                        restore.setdefault(h, []).append(ch.service)
        if self.reloaded:  # `current` points at the previous release again: re-read its files
            try:
                self._reload_now(self.reloaded, rollback=True)
            except DeployError as exc:
                c.say(f"WARNING: {exc}")
        if not restore:
            if self.twins:  # only twins had started: the previous revision never stopped serving
                self._stop_twins()
                c.say("previous revision is healthy again (it kept serving while the surge twins started)")
            return
        c.say(f"restoring {', '.join(n for names in restore.values() for n in names)} on the previous revision")

        def one(h: str) -> Any:
            recorded = c.recorded(h)
            waits: list[WaitSpec] = [{"name": n, "unit": recorded[n]["unit"], "probe": recorded[n]["ready"]}
                                     for n in restore[h]]
            return c.client(h).start_wait(_recorded_refs(recorded, restore[h]), waits)

        bad = [f"{h}: {r}" for h, r in parallel(one, restore).items() if isinstance(r, BaseException)]
        self._stop_twins()  # the previous revision serves again: only now may the twins go
        if bad:
            c.say("WARNING: the previous revision did not come back healthy: " + "; ".join(bad))
        else:
            c.say("previous revision is healthy again")

    def record(self) -> None:
        """Record, per host, the revision and each service's hashes, probe and release."""
        plan, c = self.plan, self.cluster
        # every host of the deployment, so a later `up` finds the ones its recipe drops; written on a few keepers
        # only (every host's state names them), since a roster on every host is quadratic in the fleet's size
        roster = {n: plan.host(n).model_dump(mode="json") for n in self.hosts} | c.unreachable_dropped
        keepers = roster_keepers(plan.head, self.hosts)
        kept = {n: roster[n] for n in keepers}
        stamp = time.time()  # one for every host of this `up`: a roster from an older one never wins over it

        def one(h: str) -> None:
            old = c.state(h)
            prev = old.get("revision")
            rev = self.bundles[h].revision
            state: HostState = {
                "schema": STATE_SCHEMA, "deployment": plan.name, "revision": rev,
                "previous_revision": prev if prev != rev else old.get("previous_revision"),
                "supervisor": plan.supervisor, "secrets_hash": self.secrets_hash, "updated": time.time(),
                "services": {s.name: _record(s, self.bundles[h]) for s in plan.services_on(h)},
                "roster": roster if h in keepers else {}, "roster_keepers": kept, "roster_stamp": stamp,
            }
            c.client(h).write_state(state)

        fail_on_errors(parallel(one, self.hosts), "recording state", before_changes=False)

    def retire(self) -> None:
        """Record on each dropped host that it no longer runs anything of this deployment."""
        c = self.cluster

        def one(h: str) -> None:
            state: HostState = {"schema": STATE_SCHEMA, "deployment": self.plan.name, "revision": c.state(h).get("revision"),
                                "retired": True, "supervisor": self.plan.supervisor, "updated": time.time(),
                                "services": {}}
            c.client(h).write_state(state)

        for h, r in parallel(one, c.dropped).items():
            if isinstance(r, BaseException):
                c.say(f"WARNING: could not record on {h} that it left the deployment: {r}")
            else:
                c.say(f"{h} left the deployment (dropped from the recipe)")

    def summary(self) -> str:
        keep = sum(ch.action == "keep" for ch in self.changes)
        return f"{len(self.to_start)} started, {keep} unchanged"


def _drain_s(svc: Service) -> float:
    return svc.drain.timeout_s if svc.drain else 0.0


def _drained_text(d: Any) -> str:
    if not d:
        return "was not running"
    text = f"drained in {d.get('seconds', 0):.1f}s"
    return text + (f", {d['cut']} in-flight request(s) cut at the drain timeout" if d.get("cut") else ", nothing cut")


@contextmanager
def target_apply(plan: Plan, options: Any, say: Say) -> Iterator[SSHRollout]:
    """An SSH rollout on the plan's hosts (what `drain` and `restart` act through)."""
    with opened(plan, _policy(options), say, include_dropped=True) as cluster:
        yield SSHRollout(cluster)


def _stop_refs(cluster: Cluster, groups: dict[str, list[ServiceRef]], remove: bool, host: str) -> list[str]:
    return cluster.client(host).stop(groups[host], remove_units=remove)


class SSHTarget:
    """`target: ssh` (the default)."""

    name = "ssh"
    surges = True
    watches = True  # its run scripts start a service's `watch` beside it

    def plan_hosts(self, recipe: Recipe, hosts: list[HostPlan]) -> PlannedHosts:
        """The recipe names real hosts: planned as written."""
        return PlannedHosts(hosts)

    def bind(self, plan: Plan) -> Plan:
        """Hosts are named by the recipe: the plan is already bound."""
        return plan

    def render(self, plan: Plan) -> dict[str, bytes]:
        """Per-host bundles as <host>/<path>."""
        return {f"{h}/{p}": data for h, b in render_plan(plan).items() for p, data in b.files.items()}

    def write_render(self, plan: Plan, out: Path) -> list[str]:
        """`primectl render`: each host's release under out/<host>; one line per host, then the count of files."""
        from primectl.render.bundle import write_bundles

        bundles = render_plan(plan)
        written = write_bundles(bundles, out)
        lines = [f"{out / host}: revision {b.revision}, {len(b.services)} services" for host, b in sorted(bundles.items())]
        return [*lines, f"{len(written)} files written"]

    @contextmanager
    def apply(self, plan: Plan, options: Any, say: Say) -> Iterator[SSHRollout]:
        """Connect to every host (and the ones the recipe dropped) and inspect them."""
        with opened(plan, _policy(options), say, include_dropped=True) as cluster:
            yield SSHRollout(cluster)

    def status(self, plan: Plan, options: Any, say: Say) -> Any:
        """Liveness, readiness and revision of every service, the gate, and worker metrics."""
        from primectl.targets.ssh_observe import collect_status, status_probes

        with opened(plan, _policy(options), say, probes=lambda h: status_probes(plan, h)) as cluster:
            return collect_status(cluster)

    def logs(self, plan: Plan, service: str, options: Any, *, follow: bool, tail: int, journal: bool = False) -> int:
        """Stream a service's log file from its host (with `journal`: its unit's lines in the host's journal)."""
        from primectl.targets.ssh_observe import log_command

        host, command = log_command(plan, service, follow=follow, lines=tail, journal=journal)
        t = _policy(options).connect(plan.host(host), agent=False)
        try:
            code, _, _ = t.run(command, stream=True)
        finally:
            t.close()
        return code

    def preflight(self, plan: Plan, options: Any, say: Say, *, selftest: bool, fabric: bool) -> Any:
        """Check every host over SSH (unreachable ones are reported, not fatal): the preflight Report."""
        from primectl.checks.preflight import preflight

        return preflight(plan, _policy(options), say, selftest=selftest, fabric=fabric)

    def provision(self, plan: Plan, options: Any, say: Say, *, wheelhouse: Path | None) -> None:
        """Create or reuse each host's runtime venv (offline from `wheelhouse` when given)."""
        from primectl.deploy.provision import provision

        with opened(plan, _policy(options), say) as cluster:
            provision(cluster, wheelhouse=wheelhouse, say=say)

    def doctor(self, plan: Plan, options: Any, say: Say) -> tuple[list[str], int]:
        """Per host, the installed runtime's versions against the pins."""
        from primectl.deploy.provision import doctor

        with opened(plan, _policy(options), say) as cluster:
            return doctor(cluster)

    def drain(self, plan: Plan, service: str, options: Any, say: Say, *, restart: bool, break_lock: bool) -> None:
        """Take one service out of routing and let its in-flight work finish, then stop it (`restart`: start it
        again, wait until it is ready and back in the router's count, beside a surge twin where it has one)."""
        with target_apply(plan, options, say) as run:
            try:
                run.lock(break_lock=break_lock)
                run.diff(None)
                change = next((c for c in run.changes if c.service == service), None)
                if change is None or change.action in ("add", "remove"):
                    raise DeployError(f"{service} is not deployed; `primectl up` deploys it")
                if change.action == "change":
                    raise DeployError(f"{service} runs another definition than the recipe's ({change.reason}); "
                                      "`primectl up` rolls it to the recipe")
                svc = plan.service(service)
                if not restart:
                    r = run.cluster.client(svc.host).stop_drained(_refs(plan, [service]))
                    say(f"{service}: {_drained_text((r.get('drained') or {}).get(service))}; stopped "
                        "(`primectl restart` or `primectl up` starts it again)")
                    return
                rollout = plan.rollout_of(service)
                if svc.twin is not None:
                    run._surge([service])
                else:
                    run._start_now([service])
                    if rollout is not None and rollout.registered is not None:
                        run._wait_registered(rollout)
                say(f"{service}: restarted, ready" + (" and back in the router's count" if rollout else ""))
            finally:
                run.unlock()

    def unlock(self, plan: Plan, options: Any, say: Say) -> str:
        """Remove the lock on the head host, whoever holds it."""
        with opened(plan, _policy(options), say, hosts=[plan.head]) as cluster:
            cluster.client(plan.head).unlock(force=True)
        return plan.head

    def down(self, plan: Plan, options: Any, say: Say, *, purge: bool, break_lock: bool) -> list[str]:
        """Stop every service in reverse start order (on hosts the recipe dropped too); `purge` removes primectl's files."""
        cluster = open_cluster(plan, _policy(options), say, include_dropped=True)
        stopped: list[str] = []
        try:
            lock(cluster, break_lock=break_lock, command="down")
            recorded = {h: cluster.recorded(h) for h in cluster.views}
            for h in cluster.views:  # started by an `up` killed before it recorded them (SIGKILL): still ours
                if h in cluster.dropped:
                    continue
                for svc in plan.services_on(h):
                    for one in (svc, svc.twin):  # and surge twins an `up` killed mid-surge left behind
                        if one and one.name not in recorded[h] and cluster.alive(h, one.name):
                            recorded[h][one.name] = {"unit": unit_name(plan.name, one.name),
                                                     "stop_timeout": one.stop_timeout_s}
            planned = {n for wave in plan.start_waves() for n in wave}
            extra = sorted({n for svcs in recorded.values() for n in svcs} - planned)
            for names in [extra, *reversed(plan.start_waves())]:
                groups = {h: _recorded_refs(svcs, [n for n in names if n in svcs]) for h, svcs in recorded.items()}
                groups = {h: refs for h, refs in groups.items() if refs}
                for r in parallel(partial(_stop_refs, cluster, groups, purge), groups).values():
                    if isinstance(r, list):
                        stopped += r
            if purge:
                fail_on_errors(parallel(lambda h: cluster.client(h).purge(), [*plan.deployed_hosts(), *cluster.dropped]),
                               "purging", before_changes=False)
            known = sorted({n for svcs in recorded.values() for n in svcs})
            idle = [n for n in known if n not in stopped]
            say(f"stopped {len(stopped)} of {len(known)} service(s)"
                + (f" ({', '.join(idle)} {'was' if len(idle) == 1 else 'were'} not running)" if idle else "")
                + ("; files removed" if purge else ""))
            return stopped
        finally:
            if not purge:
                unlock(cluster)
            cluster.close()

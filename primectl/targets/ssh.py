"""The SSH target (the default): push per-host bundles over SSH (or run locally) and supervise them there.

Every host operation is one call of the stdlib host agent (host/agent.py)
over one connection per host; services run under the recipe's supervisor
(`process` or `systemd`). Hosts bind at plan time: the recipe names them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from primectl.checks.preflight_rules import ours_listening
from primectl.deploy.access import SSHOptions, access, record, ssh_options, with_access
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
from primectl.deploy.status import StatusReport
from primectl.errors import DeployError
from primectl.host.wire import (
    STATE_SCHEMA,
    DrainSpec,
    HostState,
    ProbeSpec,
    ReloadSpec,
    ServiceRecord,
    ServiceRef,
    WaitSpec,
)
from primectl.plan.layout import Layout, unit_name
from primectl.plan.model import HostPlan, Plan, RoleRollout, Service
from primectl.recipe.model import Recipe
from primectl.render.bundle import Bundle, render_plan
from primectl.rollout import strategy
from primectl.rollout.expected import drain_s, expected_loss
from primectl.rollout.strategy import Seen, Surge, WaveRollout, recorded_drain
from primectl.targets.base import PlannedHosts, StartFailed, StepPlan

if TYPE_CHECKING:
    from primectl.targets.base import BuildsOptions, ReachesHosts, Target

LOG_TAIL_LINES = 40
INLINE_BUNDLE_MAX = 192 << 10  # compressed: scripts + the demo model ~ 30 KiB; bigger bundles go over SFTP first
# A `connection: local` host's agent gets its request as one command-line argument, which holds at most 128 KiB
# (Linux's MAX_ARG_STRLEN; more is E2BIG, "Argument list too long"): base64 makes a bundle 4/3 its size.
INLINE_BUNDLE_MAX_LOCAL = 90 << 10


def _policy(options: ConnectionPolicy | None) -> ConnectionPolicy:
    """The given policy, or the defaults (None, or what another target built, reaches this one untyped)."""
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
    return [_ref(n, records[n]["unit"], records[n].get("stop_timeout", 30), recorded_drain(records[n])) for n in names]


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
        self.seen = Seen({}, {})  # what the hosts reported, as the rollout strategy reads it (set by `diff`)

    # -- lock and diff --------------------------------------------------------------------------------

    def lock(self, *, break_lock: bool) -> None:
        lock(self.cluster, break_lock=break_lock, command="up")

    def unlock(self) -> None:
        unlock(self.cluster)

    def diff(self, secrets: str | None, *, detail: bool = False) -> list[Change]:
        self.seen = self._observe()
        self.changes = self._relisted(compute_changes(self.bundles, self.cluster.views,
                                                      self._script_diff if detail else None,
                                                      partial(strategy.adoptable, self.plan)))
        self.changes += strategy.leftover_twins(self.plan, self.seen, exclude=self.twins)
        if secrets is not None:
            self.secrets_hash = secrets_hash(self.plan.name, secrets)
            self.stale_secrets = [h for h in self.hosts if self.cluster.state(h).get("secrets_hash") != self.secrets_hash]
            recorded = any(self.cluster.state(h).get("secrets_hash") for h in self.stale_secrets)
            if self.stale_secrets and not pending(self.changes) and recorded:
                self.cluster.say("secrets changed: running services keep the values they started with until they restart")
        return self.changes

    def _observe(self) -> Seen:
        """What the hosts reported of each planned service (and its twin) at the host the plan puts it on."""
        c, plan = self.cluster, self.plan
        recorded = {h: c.recorded(h) for h in self.hosts}
        live = {h: c.views.get(h, {}).get("services", {}) for h in self.hosts}
        ones = [(svc.host, one.name) for svc in plan.services for one in (svc, svc.twin) if one]
        running = {n for h, n in ones if live[h].get(n, {}).get("alive")}
        current = [n for h, n in ones if n in running and live[h][n].get("release") == self.bundles[h].revision]
        records = {s.name: recorded[s.host][s.name] for s in plan.services if s.name in recorded[s.host]}
        wanted = {n: cast(dict[str, str], m.get("fields", {})) for b in self.bundles.values()
                  for n, m in b.services.items()}
        return strategy.observe(plan, records, running, current, wanted)

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
        return strategy.starting(self.changes)

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

    def provision(self, wheelhouse: Path | None) -> None:
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
            limit = INLINE_BUNDLE_MAX_LOCAL if access(self.plan.host(h)).connection == "local" else INLINE_BUNDLE_MAX
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
        gone = strategy.removals(self.plan, self.changes, self.seen)
        if gone.stale_twins:
            c.say(f"stopping {', '.join(gone.stale_twins)}: surge twin(s) of another revision an interrupted `up` "
                  "left running")
            self.twins = gone.stale_twins
            self._stop_twins()
        if gone.adopted_twins:
            c.say(f"keeping {', '.join(gone.adopted_twins)}: surge twin(s) an interrupted `up` started from this "
                  "revision serve until this run's surge is done")
            self.twins = gone.adopted_twins
        for h, names in gone.services.items():
            c.client(h).stop(_recorded_refs(c.recorded(h), names), remove_units=True)

    def waves(self) -> list[list[str]]:
        return strategy.waves(self.plan, self.changes)

    def rollout_plan(self) -> list[str]:
        """Per wave, how the running services that change are replaced, and what clients lose (0, or why not)."""
        return expected_loss(self.plan, self.changes, self.seen)

    def rolling(self, wave: list[str]) -> WaveRollout:
        """How a wave's services are replaced (rollout/strategy.py decides)."""
        return strategy.wave_rollout(self.plan, self.changes, self.seen, wave)

    def running_changes(self) -> list[str]:
        """The services that change and run now (a stopped one simply starts: nothing to roll or surge past)."""
        return strategy.running_changes(self.changes, self.seen)

    def check_moves(self) -> list[str]:
        """The reloading services whose readiness moves, not yet reloaded: they reload as soon as the new
        configuration's workers have registered."""
        return [n for n in strategy.check_moves(self.plan, self.changes, self.seen) if n not in self.reloaded]

    def reloads(self, wave: list[str]) -> list[str]:
        """The services of a wave that take their change in place."""
        return strategy.reloads(self.plan, self.changes, self.seen, wave)

    def start(self, wave: list[str]) -> None:
        """Start a wave: new and dead services at once; changing workers with room for a twin as a surge (twins
        first, then the old ones drained and replaced, then the twins drained); a role's other running instances
        that change in batches, each drained first and back in the router's count before the next batch starts."""
        step = self.rolling(wave)
        if step.at_once:
            self._start_now(step.at_once)
        if reloads := [n for n in step.reloads if n not in self.reloaded]:
            self._reload_now(reloads)
        if step.surge:
            self._surge(step.surge)
        if any(roll.rollout.registered is None for roll in step.rolls) and (early := self.check_moves()):
            self._reload_now(early)  # before a replica comes back, or the balancer would never call it up
        for roll in step.rolls:
            rollout, steps = roll.rollout, roll.batches
            for i, batch in enumerate(steps, 1):
                if len(steps) > 1 or len(rollout.instances) > 1:
                    self.cluster.say(f"rolling {rollout.role} {i}/{len(steps)}: {', '.join(batch)} "
                                     f"(drain, restart, ready{', registered' if rollout.registered else ''})")
                self._start_now(batch)
                if rollout.registered is not None:
                    self._wait_registered(rollout)

    def _surge(self, surge: Surge) -> None:
        """Replace running workers with no moment short of capacity: their twins (the new configuration, on
        ports of their own) start and register, the old instances drain and restart as the new configuration,
        then the twins drain and stop. A new generation registers in a namespace of its own, so the router
        never mixes workers whose model cards differ."""
        plan, c = self.plan, self.cluster
        stages = surge.stages
        for i, stage in enumerate(stages):
            twins = [t for n in stage if (t := plan.service(n).twin) is not None]
            c.say(f"surge: starting {', '.join(t.name for t in twins)} beside {', '.join(stage)}"
                  + (" (prefill first: its router is active before the generation takes requests)"
                     if len(stages) > 1 and i == 0 else ""))
            started = [t for t in twins if t.name not in self.twins]
            self.twins += [t.name for t in started]
            if started:
                self._start_services(started)
            self._wait_roles(stage, surge.twins, fresh=True)
        if early := self.check_moves():
            self._reload_now(early)  # both generations serve now: the only moment both names answer
        for stage in reversed(stages):
            c.say(f"surge: draining and replacing {', '.join(stage)}")
            self._start_now(stage)
            self._wait_roles(stage, surge.twins, fresh=False)
        c.say(f"surge: draining {', '.join(t.name for n in surge.services if (t := plan.service(n).twin))}")
        self._stop_twins()
        self._wait_roles(surge.services, {}, fresh=False)

    def _wait_roles(self, names: list[str], twins: dict[str, int], *, fresh: bool) -> None:
        """Until the router counts each role of `names` as planned plus its twins still up (`fresh`: only the twins
        and the instances that do not change have registered in this generation so far)."""
        for rollout, count in strategy.registered_counts(self.plan, self.seen, names, twins, fresh=fresh):
            self._wait_registered(rollout, count)

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
        for twins in strategy.twin_drain_order(plan, self.twins):
            by_host: dict[str, list[ServiceRef]] = {}
            for t in twins:
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
            timeout = max(plan.service(n).ready.timeout_s for n in names) + 60 + sum(drain_s(plan.service(n)) for n in names)
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
        stop = strategy.rollback_stops(plan, self.changes, self.started)

        def stop_one(h: str) -> None:
            if stop[h].restarted:
                c.client(h).stop(_refs(plan, stop[h].restarted))
            if stop[h].added:
                c.client(h).stop(_refs(plan, stop[h].added), remove_units=True)

        parallel(stop_one, stop)
        for h, view in c.views.items():
            prev = view.get("current")
            if prev and h in self.bundles and self.bundles[h].revision != prev:
                try:  # one host gone must not stop the others from being put back
                    c.client(h).switch(prev)
                except DeployError as exc:
                    c.say(f"WARNING: could not point {h} back at revision {prev}: {exc}")
        restore = strategy.rollback_restores(self.changes, self.started, {h: c.recorded(h) for h in c.views})
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
        roster = {n: record(plan.host(n)) for n in self.hosts} | c.unreachable_dropped
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


def _drained_text(d: Any) -> str:
    if not d:
        return "was not running"
    text = f"drained in {d.get('seconds', 0):.1f}s"
    return text + (f", {d['cut']} in-flight request(s) cut at the drain timeout" if d.get("cut") else ", nothing cut")


@contextmanager
def target_apply(plan: Plan, options: ConnectionPolicy | None, say: Say) -> Iterator[SSHRollout]:
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
        """The recipe names real hosts: planned as written, each with how SSH reaches it (its `access`), and the
        known_hosts file their keys are checked against (the plan's target options)."""
        return PlannedHosts(with_access(hosts, recipe.host_list()),
                            options=SSHOptions(known_hosts=recipe.known_hosts).model_dump(mode="json"))

    def connection_options(self, plan: Plan, *, accept_new_host_keys: bool) -> ConnectionPolicy:
        """How commands reach the hosts over SSH; a bad PRIMECTL_KEEP_CONNECTIONS or PRIMECTL_SSH_CLIENT is refused
        here, before any host is reached."""
        from primectl.deploy.connect import ssh_client
        from primectl.deploy.keeper import persist_s

        persist_s()
        ssh_client()
        return ConnectionPolicy(known_hosts=ssh_options(plan).known_hosts, accept_new_host_keys=accept_new_host_keys)

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
    def apply(self, plan: Plan, options: ConnectionPolicy | None, say: Say) -> Iterator[SSHRollout]:
        """Connect to every host (and the ones the recipe dropped) and inspect them."""
        with opened(plan, _policy(options), say, include_dropped=True) as cluster:
            yield SSHRollout(cluster)

    def status(self, plan: Plan, options: ConnectionPolicy | None, say: Say) -> StatusReport:
        """Liveness, readiness and revision of every service, the gate, and worker metrics."""
        from primectl.targets.ssh_observe import collect_status, status_probes

        with opened(plan, _policy(options), say, probes=lambda h: status_probes(plan, h)) as cluster:
            return collect_status(cluster)

    def logs(self, plan: Plan, service: str, options: ConnectionPolicy | None, *, follow: bool, tail: int, journal: bool = False) -> int:
        """Stream a service's log file from its host (with `journal`: its unit's lines in the host's journal)."""
        from primectl.targets.ssh_observe import log_command

        host, command = log_command(plan, service, follow=follow, lines=tail, journal=journal)
        t = _policy(options).connect(plan.host(host), agent=False)
        try:
            code, _, _ = t.run(command, stream=True)
        finally:
            t.close()
        return code

    def preflight(self, plan: Plan, options: ConnectionPolicy | None, say: Say, *, selftest: bool, fabric: bool) -> Any:
        """Check every host over SSH (unreachable ones are reported, not fatal): the preflight Report."""
        from primectl.checks.preflight import preflight

        return preflight(plan, _policy(options), say, selftest=selftest, fabric=fabric)

    def provision(self, plan: Plan, options: ConnectionPolicy | None, say: Say, *, wheelhouse: Path | None) -> None:
        """Create or reuse each host's runtime venv (offline from `wheelhouse` when given)."""
        from primectl.deploy.provision import provision

        with opened(plan, _policy(options), say) as cluster:
            provision(cluster, wheelhouse=wheelhouse, say=say)

    def doctor(self, plan: Plan, options: ConnectionPolicy | None, say: Say) -> tuple[list[str], int]:
        """Per host, the installed runtime's versions against the pins."""
        from primectl.deploy.provision import doctor

        with opened(plan, _policy(options), say) as cluster:
            return doctor(cluster)

    def drain(self, plan: Plan, service: str, options: ConnectionPolicy | None, say: Say, *, restart: bool, break_lock: bool) -> None:
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
                    run._surge(strategy.surge(plan, run.seen, [service]))
                else:
                    run._start_now([service])
                    if rollout is not None and rollout.registered is not None:
                        run._wait_registered(rollout)
                say(f"{service}: restarted, ready" + (" and back in the router's count" if rollout else ""))
            finally:
                run.unlock()

    def unlock(self, plan: Plan, options: ConnectionPolicy | None, say: Say) -> str:
        """Remove the lock on the head host, whoever holds it."""
        with opened(plan, _policy(options), say, hosts=[plan.head]) as cluster:
            cluster.client(plan.head).unlock(force=True)
        return plan.head

    def down(self, plan: Plan, options: ConnectionPolicy | None, say: Say, *, purge: bool, break_lock: bool) -> list[str]:
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
                        # installed: a unit an earlier `down` stopped is never recorded either, yet `--purge`
                        # must remove it
                        if one and one.name not in recorded[h] and (cluster.alive(h, one.name)
                                                                    or cluster.installed(h, one.name)):
                            recorded[h][one.name] = {"unit": unit_name(plan.name, one.name),
                                                     "stop_timeout": one.stop_timeout_s}
            for names in strategy.stop_order(plan, {n for svcs in recorded.values() for n in svcs}):
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


if TYPE_CHECKING:  # mypy checks the target against the protocols, with its options (a ConnectionPolicy)
    _target: Target[ConnectionPolicy] = SSHTarget()
    _host_commands: ReachesHosts[ConnectionPolicy] = SSHTarget()
    _options: BuildsOptions[ConnectionPolicy] = SSHTarget()

"""The SSH target (the default): push per-host bundles over SSH (or run locally) and supervise them there.

Every host operation is one call of the stdlib host agent (deploy/agent.py)
over one connection per host; services run under the recipe's supervisor
(`process` or `systemd`). Hosts bind at plan time: the recipe names them.
"""

from __future__ import annotations

import difflib
import io
import tarfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from primectl.checks.preflight_rules import ours_listening
from primectl.deploy.changes import Change, compute_changes, pending, secrets_hash
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
from primectl.deploy.protocol import STATE_SCHEMA, HostState, Layout, ServiceRecord, ServiceRef, WaitSpec, unit_name
from primectl.errors import DeployError
from primectl.plan.model import HostPlan, Plan, Service
from primectl.recipe.model import Recipe
from primectl.render.bundle import Bundle, render_plan
from primectl.targets.base import ChangeLine, PlannedHosts, StartFailed, StepPlan

LOG_TAIL_LINES = 40


def _policy(options: Any) -> ConnectionPolicy:
    return options if isinstance(options, ConnectionPolicy) else ConnectionPolicy()


def _tar(bundle: Bundle) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(bundle.files):
            data = bundle.files[path]
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = bundle.modes.get(path, 0o644)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _refs(plan: Plan, names: Iterable[str]) -> list[ServiceRef]:
    return [{"name": n, "unit": unit_name(plan.name, n), "stop_timeout": plan.service(n).stop_timeout_s} for n in names]


def _recorded_refs(records: dict[str, ServiceRecord], names: Iterable[str]) -> list[ServiceRef]:
    return [{"name": n, "unit": records[n]["unit"], "stop_timeout": records[n].get("stop_timeout", 30)} for n in names]


def _record(svc: Service, bundle: Bundle) -> ServiceRecord:
    m: dict[str, Any] = bundle.services[svc.name]
    return {"hash": m["hash"], "files_hash": m["files_hash"], "expect_hash": m["expect_hash"], "fields": m["fields"],
            "unit": m["unit"], "role": svc.role, "release": bundle.revision, "listens": svc.listens,
            "ready": svc.ready.model_dump(mode="json"), "stop_timeout": svc.stop_timeout_s}  # type: ignore[typeddict-item]


def _group(plan: Plan, names: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(plan.service(n).host, []).append(n)
    return out


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

    # -- lock and diff --------------------------------------------------------------------------------

    def lock(self, *, break_lock: bool) -> None:
        lock(self.cluster, break_lock=break_lock, command="up")

    def unlock(self) -> None:
        unlock(self.cluster)

    def diff(self, secrets: str | None, *, detail: bool = False) -> list[ChangeLine]:
        self.changes = compute_changes(self.bundles, self.cluster.views)
        if secrets is not None:
            self.secrets_hash = secrets_hash(self.plan.name, secrets)
            self.stale_secrets = [h for h in self.hosts if self.cluster.state(h).get("secrets_hash") != self.secrets_hash]
            recorded = any(self.cluster.state(h).get("secrets_hash") for h in self.stale_secrets)
            if self.stale_secrets and not pending(self.changes) and recorded:
                self.cluster.say("secrets changed: running services keep the values they started with until they restart")
        return [ChangeLine(c.host, c.service, c.action, c.reason, self._script_diff(c) if detail else "")
                for c in self.changes]

    def _script_diff(self, c: Change) -> str:
        if c.action != "change":
            return ""
        release = self.cluster.recorded(c.host).get(c.service, {}).get("release")
        path = f"bin/{c.service}.sh"
        old = self.cluster.client(c.host).read(f"releases/{release}/{path}") if release else ""
        new = self.bundles[c.host].files[path].decode()
        return "".join(difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=f"{c.host}:{release}/{path}", tofile=f"{c.host}:{self.bundles[c.host].revision}/{path}"))

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
            StepPlan("waves", "; ".join(waves) or "nothing to start"),
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
            c.client(h).transport.put(_tar(b), Layout(c.workdir(h)).incoming(b.revision))
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
        removed: dict[str, list[str]] = {}
        for ch in self.changes:
            if ch.action == "remove":
                removed.setdefault(ch.host, []).append(ch.service)
        for h, names in removed.items():
            c.client(h).stop(_recorded_refs(c.recorded(h), names), remove_units=True)

    def waves(self) -> list[list[str]]:
        names = self.to_start
        return [[n for n in wave if n in names] for wave in self.plan.start_waves() if any(n in names for n in wave)]

    def start(self, wave: list[str]) -> None:
        """Start services (per host in parallel) and wait until every one is ready."""
        plan, c = self.plan, self.cluster
        self.started += wave
        by_host = _group(plan, wave)

        def one(h: str) -> Any:
            names = by_host[h]
            waits: list[WaitSpec] = [{"name": n, "unit": unit_name(plan.name, n),
                                      "probe": plan.service(n).ready.model_dump(mode="json")} for n in names]  # type: ignore[typeddict-item]
            timeout = max(plan.service(n).ready.timeout_s for n in names) + 60
            return c.client(h).start_wait(_refs(plan, names), waits, timeout=timeout, progress=progress.update)

        with WaitProgress(wave) as progress:  # each service's phase on stderr while the wave comes up
            results = parallel(one, by_host)
        for h, r in results.items():
            if isinstance(r, HostError) and r.service:
                tail = self._tail(h, r.service)
                raise StartFailed(f"{r.service} on {h}: {str(r).removeprefix(f'{h}: ')}", service=r.service,
                                  log_tail=tail)
            if isinstance(r, BaseException):
                raise StartFailed(f"{h}: {r}", service=None)

    def _tail(self, host: str, service: str) -> str:
        try:
            return self.cluster.client(host).tail([service], LOG_TAIL_LINES,
                                                  {service: unit_name(self.plan.name, service)}).get(service, "")
        except DeployError:
            return ""

    def gate(self) -> None:
        """The deployment-level readiness gate, probed from the head host."""
        plan = self.plan
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
        if not restore:
            return
        c.say(f"restoring {', '.join(n for names in restore.values() for n in names)} on the previous revision")

        def one(h: str) -> Any:
            recorded = c.recorded(h)
            waits: list[WaitSpec] = [{"name": n, "unit": recorded[n]["unit"], "probe": recorded[n]["ready"]}
                                     for n in restore[h]]
            return c.client(h).start_wait(_recorded_refs(recorded, restore[h]), waits)

        bad = [f"{h}: {r}" for h, r in parallel(one, restore).items() if isinstance(r, BaseException)]
        if bad:
            c.say("WARNING: the previous revision did not come back healthy: " + "; ".join(bad))
        else:
            c.say("previous revision is healthy again")

    def record(self) -> None:
        """Record, per host, the revision and each service's hashes, probe and release."""
        plan, c = self.plan, self.cluster
        # every host of the deployment, so a later `up` finds the ones its recipe drops
        roster = {n: plan.host(n).model_dump(mode="json") for n in self.hosts} | c.unreachable_dropped

        def one(h: str) -> None:
            old = c.state(h)
            prev = old.get("revision")
            rev = self.bundles[h].revision
            state: HostState = {
                "schema": STATE_SCHEMA, "deployment": plan.name, "revision": rev,
                "previous_revision": prev if prev != rev else old.get("previous_revision"),
                "supervisor": plan.supervisor, "secrets_hash": self.secrets_hash, "updated": time.time(),
                "services": {s.name: _record(s, self.bundles[h]) for s in plan.services_on(h)},
                "roster": roster,
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


def _stop_refs(cluster: Cluster, groups: dict[str, list[ServiceRef]], remove: bool, host: str) -> list[str]:
    return cluster.client(host).stop(groups[host], remove_units=remove)


class SSHTarget:
    """`target: ssh` (the default)."""

    name = "ssh"

    def plan_hosts(self, recipe: Recipe, hosts: list[HostPlan]) -> PlannedHosts:
        """The recipe names real hosts: planned as written."""
        return PlannedHosts(hosts)

    def bind(self, plan: Plan) -> Plan:
        """Hosts are named by the recipe: the plan is already bound."""
        return plan

    def render(self, plan: Plan) -> dict[str, bytes]:
        """Per-host bundles as <host>/<path>."""
        return {f"{h}/{p}": data for h, b in render_plan(plan).items() for p, data in b.files.items()}

    @contextmanager
    def apply(self, plan: Plan, options: Any, say: Say) -> Iterator[SSHRollout]:
        """Connect to every host (and the ones the recipe dropped) and inspect them."""
        with opened(plan, _policy(options), say, include_dropped=True) as cluster:
            yield SSHRollout(cluster)

    def status(self, plan: Plan, options: Any, say: Say) -> Any:
        """Liveness, readiness and revision of every service, the gate, and worker metrics."""
        from primectl.deploy.observe import collect_status

        with opened(plan, _policy(options), say) as cluster:
            return collect_status(cluster)

    def logs(self, plan: Plan, service: str, options: Any, *, follow: bool, tail: int, journal: bool = False) -> int:
        """Stream a service's log file from its host (with `journal`: its unit's lines in the host's journal)."""
        from primectl.deploy.observe import log_command

        host, command = log_command(plan, service, follow=follow, lines=tail, journal=journal)
        t = _policy(options).connect(plan.host(host))
        try:
            code, _, _ = t.run(command, stream=True)
        finally:
            t.close()
        return code

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
                    if svc.name not in recorded[h] and cluster.alive(h, svc.name):
                        recorded[h][svc.name] = {"unit": unit_name(plan.name, svc.name),
                                                 "stop_timeout": svc.stop_timeout_s}
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
            say(f"stopped {len(stopped)} service(s)" + ("; files removed" if purge else ""))
            return stopped
        finally:
            if not purge:
                unlock(cluster)
            cluster.close()

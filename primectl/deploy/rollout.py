"""`up`, `diff` and `down`: take a rendered plan to its hosts, safely.

Read top to bottom, `up` is: connect to every host (and to hosts the last
`up` deployed to that the recipe no longer names) -> inspect -> lock ->
compute changes -> check ports -> push -> switch -> start wave by wave and
wait -> gate -> record state -> unlock. Any failure before the switch changes
nothing; any failure after it rolls the changed services back to the previous
revision and waits until that revision is healthy again.
"""

from __future__ import annotations

import getpass
import hashlib
import io
import os
import shlex
import socket
import tarfile
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from primectl.deploy.transport import Transport, agent_call, connect
from primectl.errors import DeployError, Problem, RecipeError
from primectl.plan.model import HostPlan, Plan, Service
from primectl.render.bundle import Bundle, unit_name

T = TypeVar("T")
R = TypeVar("R")
Action = Literal["add", "change", "restart", "remove", "keep"]
LOCK_TTL_S = 3600
LOG_TAIL_LINES = 40


def parallel(fn: Callable[[T], R], items: Iterable[T]) -> dict[T, R | BaseException]:
    """Run fn over items on threads; each result or the exception it raised."""
    items = list(items)
    out: dict[T, R | BaseException] = {}
    if not items:
        return out
    pool = ThreadPoolExecutor(max_workers=min(32, len(items)))
    try:
        futures = {item: pool.submit(fn, item) for item in items}
        for item, fut in futures.items():
            try:
                out[item] = fut.result()
            except KeyboardInterrupt:
                raise  # the operator's Ctrl-C, not a host's failure
            except BaseException as exc:  # collected and reported per host
                out[item] = exc
    finally:
        # On Ctrl-C do not wait for calls still running on hosts: rollback starts at once.
        pool.shutdown(wait=False, cancel_futures=True)
    return out


@dataclass(frozen=True)
class Change:
    """What `up` does to one service."""

    host: str
    service: str
    action: Action
    reason: str


@dataclass
class Cluster:
    """Open connections plus what each host reported."""

    plan: Plan
    transports: dict[str, Transport]
    views: dict[str, dict[str, Any]]
    say: Callable[[str], None]
    lock_token: str | None = None
    lock_host: str | None = None
    # hosts the last `up` deployed to that the recipe no longer names: reachable ones are
    # inspected like the others (their services show up as removals), unreachable ones
    # stay in the roster so the next `up` tries again
    dropped: dict[str, HostPlan] = field(default_factory=dict)
    unreachable_dropped: dict[str, dict[str, Any]] = field(default_factory=dict)

    def workdir(self, host: str) -> str:
        if host in self.dropped:
            return self.dropped[host].workdir
        return self.plan.host(host).workdir

    def call(self, host: str, op: str, args: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        base = {"workdir": self.workdir(host), "supervisor": self.plan.supervisor}
        return agent_call(self.transports[host], op, base | args, timeout=timeout)

    def close(self) -> None:
        for t in self.transports.values():
            t.close()


def _fail_on_errors(results: dict[str, Any], what: str, *, before_changes: bool = True) -> None:
    """Raise one DeployError naming every host whose call failed; only early steps may say nothing changed."""
    errors = [f"{h}: {r}" for h, r in results.items() if isinstance(r, BaseException)]
    errors += [f"{h}: {r.get('error')}" for h, r in results.items() if isinstance(r, dict) and not r.get("ok")]
    if errors:
        unchanged = "; nothing was changed" if before_changes else ""
        raise DeployError(f"{what} failed on {len(errors)} host(s){unchanged}:\n  " + "\n  ".join(errors))


def open_cluster(plan: Plan, hosts: list[str], *, known_hosts: str | None, accept_new_host_keys: bool,
                 say: Callable[[str], None], include_dropped: bool = False) -> Cluster:
    """Connect to every host in parallel and inspect it; any failure changes nothing.

    Each host is inspected as soon as its own connection is up (no barrier between
    the two steps): inspecting only reads, so nothing changes before every host
    has answered. With ``include_dropped``, hosts that the last `up` recorded in
    its roster but the recipe no longer gives services are inspected too.
    """
    cluster = Cluster(plan, {}, {}, say)
    reach = partial(_connect_and_inspect, cluster, known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys)

    def one(h: str) -> dict[str, Any]:
        units = {s.name: unit_name(plan, s) for s in plan.services_on(h)}
        # Which planned ports are already taken is read now, so `up` needs no extra round trip for it.
        ports = sorted({p for s in plan.services_on(h) for p in s.listens})
        return reach(h, plan.host(h), {"services": units, "ports": ports, "address": plan.host(h).address})

    views = parallel(one, hosts)
    unreachable = {h: v for h, v in views.items() if h not in cluster.transports}
    try:
        _fail_on_errors(unreachable, "connecting")
        _fail_on_errors(views, "inspecting")
    except DeployError:
        cluster.close()
        raise
    cluster.views = {h: v for h, v in views.items() if isinstance(v, dict)}
    for h, v in cluster.views.items():
        owner = (v.get("state") or {}).get("deployment")
        if owner and owner != plan.name:
            cluster.close()
            raise DeployError(f"{h}: workdir {cluster.workdir(h)} holds deployment {owner!r}, not {plan.name!r}; "
                              "give each deployment its own workdir")
    if include_dropped:
        _join_dropped_hosts(cluster, reach)
    return cluster


def _connect_and_inspect(cluster: Cluster, name: str, host: HostPlan, args: dict[str, Any], *,
                         known_hosts: str | None, accept_new_host_keys: bool) -> dict[str, Any]:
    """Open a host's transport (kept in the cluster) and inspect its workdir."""
    cluster.transports[name] = connect(host, known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys)
    return cluster.call(name, "inspect", args, timeout=60)


def _roster(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The hosts the newest recorded state of this deployment lists (name -> HostPlan fields)."""
    states = [v.get("state") or {} for v in cluster.views.values()]
    states = [s for s in states if s.get("deployment") == cluster.plan.name and s.get("roster")]
    if not states:
        return {}
    roster: dict[str, dict[str, Any]] = max(states, key=lambda s: s.get("updated", 0))["roster"]
    return roster


def _join_dropped_hosts(cluster: Cluster, reach: Callable[[str, HostPlan, dict[str, Any]], dict[str, Any]]) -> None:
    """Connect to and inspect the hosts the recipe dropped; a dropped host that cannot be
    reached is reported and left alone (it is often why it was dropped)."""
    plan = cluster.plan
    planned = set(plan.deployed_hosts())
    dropped = {n: HostPlan.model_validate(r) for n, r in _roster(cluster).items() if n not in planned}
    cluster.dropped = dict(dropped)  # so cluster.call finds their workdirs; those that do not answer leave again

    for name, view in parallel(lambda n: reach(n, dropped[n], {}), dropped).items():
        hp = dropped[name]
        if isinstance(view, dict) and view.get("ok"):
            if (view.get("state") or {}).get("deployment") == plan.name:
                cluster.views[name] = view
            else:
                del cluster.dropped[name]
                cluster.transports.pop(name).close()
            continue
        del cluster.dropped[name]
        if name in cluster.transports:
            cluster.transports.pop(name).close()
        error = view.get("error") if isinstance(view, dict) else str(view)
        cluster.unreachable_dropped[name] = hp.model_dump(mode="json")
        cluster.say(f"WARNING: {name} ({hp.address}) was dropped from the recipe but cannot be inspected ({error}); "
                    "its services, if any, are still running there and the next `up` will try again")


def lock(cluster: Cluster, *, break_lock: bool, command: str) -> None:
    """Take the cluster lock on the frontend host (owner, pid, start, expiry)."""
    head = cluster.plan.service("frontend").host
    token = uuid.uuid4().hex
    owner = {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(), "command": command,
             "started": time.time(), "expires": time.time() + LOCK_TTL_S, "token": token}
    r = cluster.call(head, "lock", {"owner": owner, "force": break_lock})
    if not r.get("ok"):
        o = r.get("owner") or {}
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(o.get("started", 0)))
        stale = " (expired: break it with --break-lock)" if r.get("stale") else ""
        raise DeployError(f"deployment {cluster.plan.name} is locked by {o.get('user')}@{o.get('host')} "
                          f"pid {o.get('pid')} running `{o.get('command')}` since {started}{stale}; nothing was changed")
    cluster.lock_token, cluster.lock_host = token, head


def unlock(cluster: Cluster) -> None:
    """Release our lock (best effort: an expired lock can always be broken)."""
    if cluster.lock_token and cluster.lock_host:
        try:
            cluster.call(cluster.lock_host, "unlock", {"token": cluster.lock_token})
        except DeployError:
            pass


def compute_changes(plan: Plan, bundles: dict[str, Bundle], views: dict[str, dict[str, Any]]) -> list[Change]:
    """Per host and service: add, change, restart (dead), remove or keep."""
    out: list[Change] = []
    for host in sorted(views):
        state = views[host].get("state") or {}
        recorded: dict[str, Any] = state.get("services", {})
        live = views[host].get("services", {})
        desired: dict[str, Any] = bundles[host].manifest["services"] if host in bundles else {}  # type: ignore[assignment]
        for name, want in desired.items():
            have = recorded.get(name)
            alive = live.get(name, {}).get("alive", False)
            if have is None:
                out.append(Change(host, name, "add", "new service"))
            elif (have.get("hash"), have.get("files_hash")) != (want["hash"], want["files_hash"]):
                out.append(Change(host, name, "change", "definition changed"))
            elif not alive:
                out.append(Change(host, name, "restart", "not running"))
            else:
                out.append(Change(host, name, "keep", "unchanged and running"))
        gone = "host dropped from the recipe" if host not in bundles else "no longer in the plan"
        for name in sorted(set(recorded) - set(desired)):
            out.append(Change(host, name, "remove", gone))
    return out


def check_ports(cluster: Cluster, changes: list[Change]) -> None:
    """Every port a service about to start needs must be free, except ports our own services hold."""
    plan = cluster.plan
    need: dict[str, dict[int, str]] = {}
    for c in changes:
        if c.action in ("add", "change", "restart"):
            for port in plan.service(c.service).listens:
                need.setdefault(c.host, {})[port] = c.service
    problems = []
    for host, ports in need.items():
        recorded = (cluster.views[host].get("state") or {}).get("services", {})
        live = cluster.views[host].get("services", {})
        ours = {p for n, s in recorded.items() if live.get(n, {}).get("alive") for p in s.get("listens", [])}
        for port in sorted((set(ports) - ours) & set(cluster.views[host].get("taken", []))):
            problems.append(f"port {port} on {host} ({plan.host(host).address}) is already in use; "
                            f"{ports[port]} needs it")
    if problems:
        raise DeployError("ports are taken; nothing was changed:\n  " + "\n  ".join(problems))


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


def push(cluster: Cluster, bundles: dict[str, Bundle], hosts: list[str]) -> None:
    """Upload and unpack each host's release (atomic rename on the host)."""

    def one(h: str) -> dict[str, Any]:
        b = bundles[h]
        if b.revision in cluster.views[h].get("releases", []):
            return {"ok": True, "existed": True}
        cluster.transports[h].put(_tar(b), f"{cluster.workdir(h)}/incoming/{b.revision}.tar")
        return cluster.call(h, "stage", {"revision": b.revision})

    results = parallel(one, hosts)
    _fail_on_errors(results, "pushing the release")
    for h in hosts:
        cluster.say(f"pushed {h}: revision {bundles[h].revision}")


def resolve_secrets(plan: Plan, sources: dict[str, str], file: str) -> str:
    """Secret values as an env file; bad input (exit 2) when a source is missing."""
    lines, problems = [], []
    for name in plan.secret_names:
        source = sources[name]
        kind, _, ref = source.partition(":")
        value: str | None = None
        if kind == "env":
            value = os.environ.get(ref)
        elif kind == "file":
            try:
                with open(os.path.expanduser(ref)) as f:
                    value = f.read().strip()
            except OSError:
                value = None
        if value is None:
            problems.append(Problem(file, 0, 0, f"secrets.{name}",
                                    f"{source!r} has no value here (set the env var or create the file); "
                                    "allowed: env:NAME or file:PATH"))
            continue
        lines.append(f"{name}={shlex.quote(value)}")
    if problems:
        raise RecipeError(problems)
    return "".join(line + "\n" for line in lines)


def _svc_args(plan: Plan, names: Iterable[str]) -> list[dict[str, Any]]:
    return [{"name": n, "unit": unit_name(plan, plan.service(n)), "stop_timeout": plan.service(n).stop_timeout_s}
            for n in names]


def _record(plan: Plan, svc: Service, bundle: Bundle) -> dict[str, Any]:
    m = bundle.manifest["services"][svc.name]  # type: ignore[index]
    return {"hash": m["hash"], "files_hash": m["files_hash"], "unit": unit_name(plan, svc), "role": svc.role,
            "release": bundle.revision, "listens": svc.listens, "ready": svc.ready.model_dump(mode="json"),
            "stop_timeout": svc.stop_timeout_s}


class StartFailed(DeployError):
    """A service did not start or become ready; rollback follows."""


def start_and_wait(cluster: Cluster, by_host: dict[str, list[str]], probes: dict[str, dict[str, Any]]) -> None:
    """Start services (per host in parallel) and wait until every one is ready."""
    plan = cluster.plan

    def one(h: str) -> dict[str, Any]:
        names = by_host[h]
        waits: list[dict[str, Any]] = [{"name": n, "unit": unit_name(plan, plan.service(n)), "probe": probes[n]}
                                       for n in names]
        timeout = max(w["probe"].get("timeout_s", 60) for w in waits) + 60
        return cluster.call(h, "start_wait", {"services": _svc_args(plan, names), "waits": waits}, timeout=timeout)

    results = parallel(one, [h for h in by_host if by_host[h]])
    for h, r in results.items():
        if isinstance(r, BaseException):
            raise StartFailed(f"{h}: {r}", service=None)
        if not r.get("ok"):
            name = r.get("service") or by_host[h][0]
            tail = cluster.call(h, "tail", {"services": [name], "lines": LOG_TAIL_LINES}).get("logs", {}).get(name, "")
            raise StartFailed(f"{name} on {h}: {r.get('error')}", service=name, log_tail=tail)


def wait_gate(cluster: Cluster) -> None:
    """The deployment-level readiness gate, probed from the frontend host."""
    plan = cluster.plan
    head = plan.service("frontend").host
    r = cluster.call(head, "wait", {"waits": [{"name": "gate", "probe": plan.gate.model_dump(mode="json")}]},
                     timeout=plan.gate.timeout_s + 30)
    if not r.get("ok"):
        tail = cluster.call(head, "tail", {"services": ["frontend"], "lines": LOG_TAIL_LINES}).get("logs", {})
        raise StartFailed(f"readiness gate {plan.gate.url}: {r.get('error')}", service="frontend",
                          log_tail=tail.get("frontend", ""))


def _waves(plan: Plan, names: set[str]) -> list[list[str]]:
    return [[n for n in wave if n in names] for wave in plan.start_waves() if any(n in names for n in wave)]


def _group(plan: Plan, names: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(plan.service(n).host, []).append(n)
    return out


@dataclass
class UpResult:
    """What `up` did."""

    changes: list[Change]
    started: list[str]
    seconds: float
    rolled_back: bool = False


def up(plan: Plan, bundles: dict[str, Bundle], *, secrets: str, known_hosts: str | None = None,
       accept_new_host_keys: bool = False, break_lock: bool = False, say: Callable[[str], None] = print,
       after_ready: Callable[[], None] | None = None, prepare: Callable[[Cluster], None] | None = None) -> UpResult:
    """Bring the cluster to the plan; roll back changed services on failure (DeployError)."""
    t0 = time.monotonic()
    hosts = plan.deployed_hosts()
    cluster = open_cluster(plan, hosts, known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys, say=say,
                           include_dropped=True)
    try:
        lock(cluster, break_lock=break_lock, command="up")
        changes = compute_changes(plan, bundles, cluster.views)
        todo = [c for c in changes if c.action != "keep"]
        secrets_hash = hashlib.sha256((plan.name + secrets).encode()).hexdigest()[:16]
        stale_secrets = [h for h in hosts if (cluster.views[h].get("state") or {}).get("secrets_hash") != secrets_hash]
        if stale_secrets and not todo and (cluster.views[stale_secrets[0]].get("state") or {}).get("secrets_hash"):
            say("secrets changed: running services keep the values they started with until they restart")
        if not todo and not stale_secrets:
            say("no changes: every service is running its planned revision")
            return UpResult(changes, [], time.monotonic() - t0)
        if prepare:  # preflight and provisioning, only when something is about to change
            prepare(cluster)
        check_ports(cluster, changes)
        push_hosts = [h for h in hosts if cluster.views[h].get("current") != bundles[h].revision]
        push(cluster, bundles, push_hosts)
        write_secrets = bool(plan.secret_names or stale_secrets)

        def activate(h: str) -> dict[str, Any]:
            args: dict[str, Any] = {}
            if write_secrets:
                args["secrets"] = {"deployment": plan.name, "content": secrets}
            if h in push_hosts:
                args["revision"] = bundles[h].revision
            return cluster.call(h, "activate", args)

        started: list[str] = []
        try:
            _fail_on_errors(parallel(activate, hosts if write_secrets else push_hosts), "switching releases", before_changes=False)
            removed: dict[str, list[str]] = {}
            for c in changes:
                if c.action == "remove":
                    removed.setdefault(c.host, []).append(c.service)
            for h, names in removed.items():
                recorded = (cluster.views[h].get("state") or {}).get("services", {})
                cluster.call(h, "stop", {"services": [{"name": n, "unit": recorded[n]["unit"]} for n in names],
                                         "remove_units": True})
            to_start = {c.service for c in changes if c.action in ("add", "change", "restart")}
            probes = {s.name: s.ready.model_dump(mode="json") for s in plan.services}
            for wave in _waves(plan, to_start):
                say(f"starting {', '.join(wave)}")
                started += wave
                start_and_wait(cluster, _group(plan, wave), probes)
            wait_gate(cluster)
            if after_ready:
                after_ready()
        except DeployError as exc:
            say(f"FAILED: {exc}; rolling back")
            rollback(cluster, bundles, changes, started)
            raise DeployError(f"{exc} (rolled back to the previous revision)",
                              service=exc.service, log_tail=exc.log_tail) from None
        except KeyboardInterrupt:
            # Ctrl-C mid-rollout: put the previous revision back rather than leave a mix (a second Ctrl-C aborts).
            say("interrupted: rolling back to the previous revision")
            rollback(cluster, bundles, changes, started)
            raise DeployError("interrupted by the operator (rolled back to the previous revision)") from None
        write_state(cluster, bundles, hosts, secrets_hash)
        retire_dropped(cluster)
        say(f"ready: {plan.endpoint} ({len(to_start)} started, "
            f"{sum(c.action == 'keep' for c in changes)} unchanged)")
        return UpResult(changes, started, time.monotonic() - t0)
    finally:
        unlock(cluster)
        cluster.close()


def write_state(cluster: Cluster, bundles: dict[str, Bundle], hosts: list[str], secrets_hash: str) -> None:
    """Record, per host, the revision and each service's hash, probe and release."""
    plan = cluster.plan

    def one(h: str) -> dict[str, Any]:
        old = cluster.views[h].get("state") or {}
        prev = old.get("revision")
        state = {
            "deployment": plan.name, "revision": bundles[h].revision,
            "previous_revision": prev if prev != bundles[h].revision else old.get("previous_revision"),
            "supervisor": plan.supervisor, "secrets_hash": secrets_hash, "updated": time.time(),
            "services": {s.name: _record(plan, s, bundles[h]) for s in plan.services_on(h)},
            "roster": roster,
        }
        return cluster.call(h, "write_state", {"state": state})

    # every host of the deployment, so a later `up` finds the ones its recipe drops
    roster = {n: plan.host(n).model_dump(mode="json") for n in hosts} | cluster.unreachable_dropped
    _fail_on_errors(parallel(one, hosts), "recording state", before_changes=False)


def retire_dropped(cluster: Cluster) -> None:
    """Record on each dropped host that it no longer runs anything of this deployment."""

    def one(h: str) -> dict[str, Any]:
        old = cluster.views[h].get("state") or {}
        state: dict[str, Any] = {"deployment": cluster.plan.name, "revision": old.get("revision"), "retired": True,
                                 "supervisor": cluster.plan.supervisor, "updated": time.time(), "services": {}}
        return cluster.call(h, "write_state", {"state": state})

    for h, r in parallel(one, cluster.dropped).items():
        if isinstance(r, BaseException) or not r.get("ok"):
            cluster.say(f"WARNING: could not record on {h} that it left the deployment: {r}")
        else:
            cluster.say(f"{h} left the deployment (dropped from the recipe)")


def rollback(cluster: Cluster, bundles: dict[str, Bundle], changes: list[Change], started: list[str]) -> None:
    """Put changed services back on the previous revision and wait until they are healthy."""
    plan = cluster.plan
    by_host_stop = _group(plan, [n for n in started if n in {s.name for s in plan.services}])
    parallel(lambda h: cluster.call(h, "stop", {"services": _svc_args(plan, by_host_stop[h])}), by_host_stop)
    restore: dict[str, list[str]] = {}
    for h, view in cluster.views.items():
        prev = view.get("current")
        if prev and h in bundles and bundles[h].revision != prev:
            try:  # one host gone must not stop the others from being put back
                r = cluster.call(h, "switch", {"revision": prev})
            except DeployError as exc:
                r = {"ok": False, "error": str(exc)}
            if not r.get("ok"):
                cluster.say(f"WARNING: could not point {h} back at revision {prev}: {r.get('error')}")
        recorded = (view.get("state") or {}).get("services", {})
        for c in changes:
            if c.host == h and c.action in ("change", "remove") and c.service in recorded:
                if c.action == "remove" or c.service in started:
                    restore.setdefault(h, []).append(c.service)
    if not restore:
        return
    cluster.say(f"restoring {', '.join(n for names in restore.values() for n in names)} on the previous revision")

    def one(h: str) -> dict[str, Any]:
        recorded = (cluster.views[h].get("state") or {}).get("services", {})
        svcs = [{"name": n, "unit": recorded[n]["unit"], "stop_timeout": recorded[n].get("stop_timeout", 30)}
                for n in restore[h]]
        waits = [{"name": n, "unit": recorded[n]["unit"], "probe": recorded[n]["ready"]} for n in restore[h]]
        return cluster.call(h, "start_wait", {"services": svcs, "waits": waits})

    results = parallel(one, restore)
    bad = [f"{h}: {r}" for h, r in results.items() if isinstance(r, BaseException) or not r.get("ok")]
    if bad:
        cluster.say("WARNING: the previous revision did not come back healthy: " + "; ".join(map(str, bad)))
    else:
        cluster.say("previous revision is healthy again")


def _stop_on(cluster: Cluster, groups: dict[str, list[dict[str, Any]]], host: str) -> dict[str, Any]:
    return cluster.call(host, "stop", {"services": groups[host], "remove_units": True})


def down(plan: Plan, *, purge: bool, known_hosts: str | None = None, accept_new_host_keys: bool = False,
         break_lock: bool = False, say: Callable[[str], None] = print) -> list[str]:
    """Stop every service in reverse start order (on hosts the recipe dropped too); `purge` removes primectl's files."""
    hosts = plan.deployed_hosts()
    cluster = open_cluster(plan, hosts, known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys, say=say,
                           include_dropped=True)
    stopped: list[str] = []
    try:
        lock(cluster, break_lock=break_lock, command="down")
        recorded = {h: (v.get("state") or {}).get("services", {}) for h, v in cluster.views.items()}
        planned = {n for wave in plan.start_waves() for n in wave}
        extra = sorted({n for svcs in recorded.values() for n in svcs} - planned)
        for names in [extra, *reversed(plan.start_waves())]:
            groups: dict[str, list[dict[str, Any]]] = {}
            for h, svcs in recorded.items():
                for n in names:
                    if n in svcs:
                        groups.setdefault(h, []).append({"name": n, "unit": svcs[n]["unit"],
                                                         "stop_timeout": svcs[n].get("stop_timeout", 30)})
            results = parallel(partial(_stop_on, cluster, groups), groups)
            for r in results.values():
                if isinstance(r, dict):
                    stopped += r.get("stopped", [])
        if purge:
            _fail_on_errors(parallel(lambda h: cluster.call(h, "purge", {}), [*hosts, *cluster.dropped]), "purging",
                            before_changes=False)
        say(f"stopped {len(stopped)} service(s)" + ("; files removed" if purge else ""))
        return stopped
    finally:
        if not purge:
            unlock(cluster)
        cluster.close()

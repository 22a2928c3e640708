"""An open deployment: one connection per host, what each host reported, and the cluster lock.

`open_cluster` connects to every host in parallel and inspects it (state,
current release, liveness, lock, taken ports) in the same round trip; it also
finds the hosts the last `up` deployed to that the recipe no longer names (the
roster in state.json), so their services can be removed. Nothing here changes
a host except `lock`/`unlock`.
"""

from __future__ import annotations

import functools
import gc
import getpass
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from primectl.deploy.access import access, record
from primectl.deploy.client import HostClient, HostError
from primectl.deploy.connect import connect
from primectl.deploy.fanout import parallel
from primectl.deploy.known_hosts import known_hosts_path
from primectl.deploy.transport import HostUnreachable, Transport
from primectl.errors import DeployError
from primectl.host.processes import starttime
from primectl.host.wire import HostState, InspectResult, ServiceRecord
from primectl.plan.layout import unit_name
from primectl.plan.model import HostPlan, Plan

LOCK_TTL_S = 3600
Say = Callable[[str], None]
Connector = Callable[[HostPlan], Transport]


@dataclass(frozen=True)
class ConnectionPolicy:
    """How hosts are reached: which host keys are trusted, and (in tests) which transport to use."""

    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connector: Connector | None = None  # None: SSH or local per host; tests pass the fake transport

    def connect(self, host: HostPlan, *, agent: bool = True) -> Transport:
        """Open a transport to `host` (HostUnreachable when it cannot be reached). `agent=False`: for shell
        commands and uploads only (`logs`), never through the connection keeper, whose kept connections serve
        agent operations."""
        if self.connector is not None:
            return self.connector(host)
        from primectl.deploy import keeper  # here: most commands never start one

        if agent and access(host).connection == "ssh" and (idle := keeper.persist_s()):
            return keeper.KeptTransport(host, known_hosts=known_hosts_path(self.known_hosts),
                                        accept_new_host_keys=self.accept_new_host_keys, path=keeper.ensure(idle))
        return connect(host, known_hosts=self.known_hosts, accept_new_host_keys=self.accept_new_host_keys,
                       shell=not agent)


@dataclass
class Cluster:
    """Open connections plus what each host reported."""

    plan: Plan
    say: Say
    clients: dict[str, HostClient] = field(default_factory=dict)
    views: dict[str, InspectResult] = field(default_factory=dict)
    lock_token: str | None = None
    # Hosts the last `up` deployed to that the recipe no longer names: reachable ones are inspected
    # like the others (their services show up as removals); unreachable ones stay on the roster so
    # the next `up` tries again.
    dropped: dict[str, HostPlan] = field(default_factory=dict)
    unreachable_dropped: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # only with tolerate_unreachable

    def client(self, host: str) -> HostClient:
        """The client of an open host."""
        return self.clients[host]

    def state(self, host: str) -> HostState:
        """The host's recorded state ({} when it has none)."""
        return self.views.get(host, {}).get("state") or {}

    def recorded(self, host: str) -> dict[str, ServiceRecord]:
        """Services the host's state records."""
        return dict(self.state(host).get("services", {}))

    def alive(self, host: str, service: str) -> bool:
        """Whether the service's process ran when the host was inspected."""
        return bool(self.views.get(host, {}).get("services", {}).get(service, {}).get("alive"))

    def installed(self, host: str, service: str) -> bool:
        """Whether the service's unit was installed when the host was inspected (running or not)."""
        return bool(self.views.get(host, {}).get("services", {}).get(service, {}).get("installed"))

    def workdir(self, host: str) -> str:
        """The host's workdir (dropped hosts keep the one they were deployed with)."""
        if host in self.dropped:
            return self.dropped[host].workdir
        return self.plan.host(host).workdir

    def close(self) -> None:
        """Close every connection."""
        for c in self.clients.values():
            c.transport.close()


def fail_on_errors(results: dict[str, Any], what: str, *, before_changes: bool = True) -> None:
    """Raise one DeployError naming every host whose call failed; only early steps may say nothing changed."""
    errors = [str(r) if isinstance(r, HostError) else f"{h}: {r}" for h, r in results.items()
              if isinstance(r, BaseException)]
    if errors:
        unchanged = "; nothing was changed" if before_changes else ""
        raise DeployError(f"{what} failed on {len(errors)} host(s){unchanged}:\n  " + "\n  ".join(errors))


@functools.cache
def freeze_startup_heap() -> None:
    """Exempt what the process holds before its first fan-out (imported modules, the plan) from the cyclic
    garbage collector, once per process. A full collection during a 72-host `up` traversed all of it: about
    90 ms of the controller's CPU, one ms a host. What is created later is collected as before."""
    gc.freeze()


def open_cluster(plan: Plan, policy: ConnectionPolicy, say: Say, *, hosts: list[str] | None = None,
                 include_dropped: bool = False, tolerate_unreachable: bool = False,
                 probes: Callable[[str], list[dict[str, Any]]] | None = None) -> Cluster:
    """Connect to every host in parallel and inspect it; any failure changes nothing.

    Each host is inspected as soon as its own connection is up (no barrier between
    the two steps): inspecting only reads, so nothing changes before every host
    has answered. With `include_dropped`, hosts that the last `up` recorded in
    its roster but the recipe no longer gives services are inspected too. With
    `tolerate_unreachable`, hosts that cannot be reached are listed in
    `cluster.unreachable`, and hosts whose inspection failed keep an error
    view, instead of failing (preflight reports both). `probes` gives each host's
    probes to run in the same round trip (`status`); the view holds their results.
    """
    freeze_startup_heap()
    cluster = Cluster(plan, say)
    names = plan.deployed_hosts() if hosts is None else hosts

    def one(h: str) -> InspectResult:
        units, ports = _inspected(plan, h)
        return _connect_and_inspect(cluster, policy, h, plan.host(h), units, ports, probes(h) if probes else None)

    views = parallel(one, names)
    unreachable = {h: v for h, v in views.items() if h not in cluster.clients}
    if tolerate_unreachable:
        cluster.unreachable = {h: str(v) for h, v in unreachable.items()}
        views = {h: ({"ok": False, "error": str(v)} if isinstance(v, BaseException) else v)
                 for h, v in views.items() if h not in unreachable}
    try:
        fail_on_errors(unreachable if not tolerate_unreachable else {}, "connecting")
        fail_on_errors(views, "inspecting")
    except DeployError:
        cluster.close()
        raise
    cluster.views = {h: v for h, v in views.items() if isinstance(v, dict)}
    for h in cluster.views:
        owner = cluster.state(h).get("deployment")
        if owner and owner != plan.name:
            cluster.close()
            raise DeployError(f"{h}: workdir {cluster.workdir(h)} holds deployment {owner!r}, not {plan.name!r}; "
                              "give each deployment its own workdir")
    if include_dropped:
        _join_dropped_hosts(cluster, policy)
    return cluster


def _inspected(plan: Plan, h: str) -> tuple[dict[str, str], list[int]]:
    """What an inspection of host `h` asks after: its services' and surge twins' units, and its planned ports
    (which of them are taken is read then, so `up` needs no extra round trip for it)."""
    units = {s.name: unit_name(plan.name, s.name) for s in plan.services_on(h)}
    units |= {s.twin.name: unit_name(plan.name, s.twin.name) for s in plan.services_on(h) if s.twin}
    return units, sorted({p for s in plan.services_on(h) for p in s.listens})


def settle(cluster: Cluster) -> None:
    """After taking over a dead run's lock: wait until no host is still in a call the dead run made, then inspect
    every planned host again (what that call started or stopped shows)."""
    plan = cluster.plan
    hosts = [h for h in cluster.views if h not in cluster.dropped]
    fail_on_errors(parallel(lambda h: cluster.client(h).settle(), hosts), "waiting for the killed run's last calls")

    def one(h: str) -> InspectResult:
        units, ports = _inspected(plan, h)
        return cluster.client(h).inspect(units, ports, plan.host(h).address)

    views = parallel(one, hosts)
    fail_on_errors(views, "inspecting")
    cluster.views.update({h: v for h, v in views.items() if isinstance(v, dict)})


@contextmanager
def opened(plan: Plan, policy: ConnectionPolicy, say: Say, **kwargs: Any) -> Iterator[Cluster]:
    """`open_cluster` as a context manager that closes every connection afterwards."""
    cluster = open_cluster(plan, policy, say, **kwargs)
    try:
        yield cluster
    finally:
        cluster.close()


def _connect_and_inspect(cluster: Cluster, policy: ConnectionPolicy, name: str, host: HostPlan,
                         units: dict[str, str], ports: list[int],
                         probes: list[dict[str, Any]] | None = None) -> InspectResult:
    """Open a host's transport (kept in the cluster) and inspect its workdir. A host whose link fails before it
    answered (a host behind a head node is only reached with its first call) counts as not connected."""
    client = HostClient(name, policy.connect(host), host.workdir, cluster.plan.supervisor)
    try:
        view = client.inspect(units, ports, host.address, probes)
    except HostUnreachable:
        client.transport.close()
        raise
    except BaseException:  # the host answered, with an error: it is connected (and closed with the others)
        cluster.clients[name] = client
        raise
    cluster.clients[name] = client
    return view


Asked = dict[str, "InspectResult | BaseException"]


def _roster(cluster: Cluster, policy: ConnectionPolicy) -> tuple[dict[str, dict[str, Any]], Asked]:
    """The hosts the newest recorded roster of this deployment lists (name -> HostPlan fields), and what the
    keepers said when they had to be asked. Only the keepers hold the roster (host.wire.HostState): when none of
    them was inspected (the recipe dropped them all), they are connected and inspected (kept in the cluster, so
    they are not asked twice); keepers that cannot be asked stay on the roster as unreachable dropped hosts, and
    the operator is told."""
    plan = cluster.plan
    states = [s for s in (cluster.state(h) for h in cluster.views) if s.get("deployment") == plan.name]
    if not states:
        return {}, {}

    def newest_roster(found: list[HostState], stamp: float) -> dict[str, dict[str, Any]] | None:
        found = [s for s in found if s.get("roster") and s.get("roster_stamp", 0) >= stamp]
        return dict(max(found, key=lambda s: s.get("updated", 0))["roster"]) if found else None

    stamp = max(s.get("roster_stamp", 0) for s in states)
    roster = newest_roster(states, stamp)
    if roster is not None:
        return roster, {}
    latest = next(s for s in states if s.get("roster_stamp", 0) == stamp)
    keepers = {n: HostPlan.model_validate(r) for n, r in (latest.get("roster_keepers") or {}).items()
               if n not in cluster.views}
    views: Asked = parallel(lambda n: _connect_and_inspect(cluster, policy, n, keepers[n], {}, []), keepers)
    peeked: list[HostState] = [v.get("state") or {} for v in views.values() if isinstance(v, dict)]
    roster = newest_roster([s for s in peeked if s.get("deployment") == plan.name], stamp)
    if roster is not None:
        return roster, views
    lost = {n: record(keepers[n]) for n, v in views.items() if isinstance(v, BaseException)}
    if keepers:
        cluster.say(f"WARNING: the roster of {plan.name} is kept on {', '.join(keepers)}, which the recipe dropped, "
                    "and none of them gave the last `up`'s roster (unreachable, or its write failed there): hosts "
                    "dropped from the recipe since then may still run its services. Unreachable keepers stay on "
                    "the roster, and the next `up` tries them again.")
    older = newest_roster(states + [s for s in peeked if s.get("deployment") == plan.name], 0)  # better than none
    return (older or {}) | lost, views


def _join_dropped_hosts(cluster: Cluster, policy: ConnectionPolicy) -> None:
    """Connect to and inspect the hosts the recipe dropped; a dropped host that cannot be
    reached is reported and left alone (it is often why it was dropped)."""
    plan = cluster.plan
    planned = set(plan.deployed_hosts())
    roster, asked = _roster(cluster, policy)
    dropped = {n: HostPlan.model_validate(r) for n, r in roster.items() if n not in planned}
    cluster.dropped = dict(dropped)
    for n in set(asked) - set(dropped):  # a keeper its own roster does not list: nothing of ours to look at
        if n in cluster.clients:
            cluster.clients.pop(n).transport.close()

    def one(n: str) -> InspectResult:
        seen = asked.get(n)
        if isinstance(seen, BaseException):
            raise seen
        return seen if seen is not None else _connect_and_inspect(cluster, policy, n, dropped[n], {}, [])

    for name, view in parallel(one, dropped).items():
        hp = dropped[name]
        if isinstance(view, dict):
            if (view.get("state") or {}).get("deployment") == plan.name:
                cluster.views[name] = view
            else:
                del cluster.dropped[name]
                cluster.clients.pop(name).transport.close()
            continue
        del cluster.dropped[name]
        if name in cluster.clients:
            cluster.clients.pop(name).transport.close()
        cluster.unreachable_dropped[name] = record(hp)
        cluster.say(f"WARNING: {name} ({hp.address}) was dropped from the recipe but cannot be inspected ({view}); "
                    "its services, if any, are still running there and the next `up` will try again")


def boot_id() -> str:
    """This machine's boot id (a pid means the same process only within one boot)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def holder_gone(owner: dict[str, Any]) -> str | None:
    """Why the lock's holder is provably gone (None: it may still run). Provably: it ran on this machine, in this
    boot, and its pid runs no more or runs another process (its start time differs)."""
    pid, started = owner.get("pid"), owner.get("pid_start")
    if owner.get("host") != socket.gethostname() or not owner.get("boot_id") or owner.get("boot_id") != boot_id():
        return None
    if not isinstance(pid, int) or not started:
        return None
    now = starttime(pid)
    if now is None:
        return f"pid {pid} no longer runs"
    return f"pid {pid} is now another process" if now != started else None


def lock(cluster: Cluster, *, break_lock: bool, command: str) -> None:
    """Take the cluster lock on the head host (owner, pid, start, expiry). A lock whose holder is provably gone
    (killed on this machine, in this boot) is taken over, and said so."""
    head = cluster.plan.head
    token = uuid.uuid4().hex
    owner = {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(), "command": command,
             "started": time.time(), "expires": time.time() + LOCK_TTL_S, "token": token, "boot_id": boot_id(),
             "pid_start": starttime(os.getpid())}
    # Ours before the head host is even asked: a Ctrl-C while it takes the lock must still release it (releasing
    # with a token that holds nothing is a no-op).
    cluster.lock_token = token
    r = cluster.client(head).lock(owner, force=break_lock)
    for _ in range(20):  # a lock without its owner file is being taken or released this instant: ask again
        if r.get("ok") or (r.get("owner") or {}).get("token"):
            break
        time.sleep(0.1)
        r = cluster.client(head).lock(owner, force=break_lock)
    if not r.get("ok") and (gone := holder_gone(r.get("owner") or {})):
        o = r.get("owner") or {}
        cluster.say(f"took over the lock of `{o.get('command')}` ({o.get('user')}@{o.get('host')}), whose {gone}: "
                    "the deployment may be mid-change, and this run finishes or undoes it")
        r = cluster.client(head).lock(owner, force=True)
        if r.get("ok"):
            settle(cluster)
    if not r.get("ok"):
        cluster.lock_token = None
        o = r.get("owner") or {}
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(o.get("started", 0)))
        stale = " (expired)" if r.get("stale") else ""
        raise DeployError(f"deployment {cluster.plan.name} is locked by {o.get('user')}@{o.get('host')} "
                          f"pid {o.get('pid')} running `{o.get('command')}` since {started}{stale}; nothing was "
                          f"changed. If that run is gone (check on {o.get('host')}: `ps -p {o.get('pid')}`), "
                          "`primectl unlock RECIPE` or `--break-lock` takes the lock from it")


def unlock(cluster: Cluster) -> None:
    """Release our lock (best effort: an expired lock can always be broken)."""
    if cluster.lock_token and cluster.plan.head in cluster.clients:
        try:
            cluster.client(cluster.plan.head).unlock(token=cluster.lock_token)
        except (DeployError, HostUnreachable):
            pass
        cluster.lock_token = None

"""etcd (Debian's etcd-server): the discovery store for multi-host deployments."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from primectl.components.base import KubernetesForm, NotRendered
from primectl.engines.base import PlanContext
from primectl.plan.model import Probe, Service

ETCD_BINARY = "/usr/bin/etcd"

# Raft timing of a member with no peers. etcd's defaults (100 ms heartbeat, 1 s election timeout) suit members
# that hear each other over a network; alone, a member only waits out a randomized election timeout before it
# elects itself and /health turns true: 0.11-1.0 s after start with the defaults, 0.03-0.12 s with these
# (measured, etcd 3.4). A lone leader never steps down on a timeout, so they cost nothing in safety; the faster
# ticks cost about 6 ms of CPU a second while idle.
SOLO_HEARTBEAT_MS = 20
SOLO_ELECTION_TIMEOUT_MS = 100
# Raft timing of members that hear each other over a local network: etcd's own defaults, which its tuning guide
# (etcd.io/docs/v3.4/tuning) sizes for such a network (heartbeat about the members' round trip, election timeout
# ten heartbeats). A lost leader is replaced 1-2 election timeouts later.
CLUSTER_HEARTBEAT_MS = 100
CLUSTER_ELECTION_TIMEOUT_MS = 1000
KUBERNETES_DISCOVERY = "the operator's Kubernetes discovery replaces etcd and the file store"


def etcd_service(ctx: PlanContext, host: str) -> Service:
    """A single-member etcd bound to the host's own address."""
    ports = ctx.recipe.ports
    return solo_etcd(name="etcd", member=f"{ctx.recipe.name}-etcd", host=host, address=ctx.hosts[host].address,
                     workdir=ctx.hosts[host].workdir, client_port=ports.etcd_client, peer_port=ports.etcd_peer)


@dataclass(frozen=True)
class EtcdMember:
    """Where one member of an etcd cluster runs."""

    name: str  # the service's
    member: str  # etcd's own --name, unique in the cluster
    host: str
    address: str
    workdir: str


def solo_etcd(*, name: str, member: str, host: str, address: str, workdir: str, client_port: int, peer_port: int,
              progress_s: int | None = None) -> Service:
    """A single-member etcd called `name` on `address`, its data under the workdir (`progress_s`: see
    etcd_cluster)."""
    m = EtcdMember(name=name, member=member, host=host, address=address, workdir=workdir)
    return _member(m, [m], token=None, client_port=client_port, peer_port=peer_port,
                   heartbeat_ms=SOLO_HEARTBEAT_MS, election_ms=SOLO_ELECTION_TIMEOUT_MS, progress_s=progress_s)


def etcd_cluster(members: list[EtcdMember], *, token: str, client_port: int, peer_port: int,
                 progress_s: int | None = None) -> list[Service]:
    """An etcd cluster of `members` (each on its own address, its data under its workdir): every member lists all
    of them in --initial-cluster, and `token` keeps it from joining another cluster's members. `progress_s`: a
    watch that asks for progress notifications gets one this often (etcd's default: 10 min), so its client can
    tell a quiet member from one it can no longer hear."""
    return [_member(m, members, token=token, client_port=client_port, peer_port=peer_port,
                    heartbeat_ms=CLUSTER_HEARTBEAT_MS, election_ms=CLUSTER_ELECTION_TIMEOUT_MS,
                    progress_s=progress_s) for m in members]


def _member(m: EtcdMember, cluster: list[EtcdMember], *, token: str | None, client_port: int, peer_port: int,
            heartbeat_ms: int, election_ms: int, progress_s: int | None) -> Service:
    """Member `m` of the etcd `cluster` as a service (its /health answers true once it sees a leader: a member
    started without a quorum waits for one)."""
    def peer(x: EtcdMember) -> str:
        return f"http://{x.address}:{peer_port}"

    client = f"http://{m.address}:{client_port}"
    argv = [
        ETCD_BINARY,
        "--name", m.member,
        "--data-dir", posixpath.join(m.workdir, "data", m.name),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer(m),
        "--initial-advertise-peer-urls", peer(m),
        "--initial-cluster", ",".join(f"{x.member}={peer(x)}" for x in cluster),
        *(["--initial-cluster-token", token] if token else []),
        "--initial-cluster-state", "new",
        "--heartbeat-interval", str(heartbeat_ms),
        "--election-timeout", str(election_ms),
        *(["--experimental-watch-progress-notify-interval", f"{progress_s}s"] if progress_s else []),
    ]
    return Service(
        name=m.name, role="control", component="etcd", host=m.host, address=m.address,
        argv=argv,
        ports={"client": client_port, "peer": peer_port},
        listens=[client_port, peer_port],
        ready=Probe(kind="http", url=f"{client}/health", timeout_s=60),
        metrics_url=f"{client}/metrics",
    )


class Etcd:
    """The discovery store, on the control-plane host, when the recipe's discovery is etcd."""

    name = "etcd"
    stage = "control"

    def extend(self, ctx: PlanContext, planned: list[Service]) -> list[Service]:
        """etcd, when discovery is etcd."""
        if ctx.etcd_endpoint is None:
            return planned
        cp = ctx.recipe.control_plane
        return [*planned, etcd_service(ctx, cp.etcd_host or ctx.recipe.frontend.host)]

    def kubernetes(self, service: Service) -> KubernetesForm | NotRendered:
        """Not rendered: the Dynamo operator's discovery takes its place."""
        return NotRendered(KUBERNETES_DISCOVERY)

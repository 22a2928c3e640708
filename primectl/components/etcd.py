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


def solo_etcd(*, name: str, member: str, host: str, address: str, workdir: str, client_port: int, peer_port: int
              ) -> Service:
    """A single-member etcd called `name` on `address`, its data under the workdir."""
    client = f"http://{address}:{client_port}"
    peer = f"http://{address}:{peer_port}"
    argv = [
        ETCD_BINARY,
        "--name", member,
        "--data-dir", posixpath.join(workdir, "data", name),
        "--listen-client-urls", client,
        "--advertise-client-urls", client,
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"{member}={peer}",
        "--initial-cluster-state", "new",
        "--heartbeat-interval", str(SOLO_HEARTBEAT_MS),
        "--election-timeout", str(SOLO_ELECTION_TIMEOUT_MS),
    ]
    return Service(
        name=name, role="control", component="etcd", host=host, address=address,
        argv=argv,
        ports={"client": client_port, "peer": peer_port},
        listens=[client_port, peer_port],
        ready=Probe(kind="http", url=f"{client}/health", timeout_s=60),
        metrics_url=f"{client}/metrics",
    )


@dataclass(frozen=True)
class EtcdMember:
    """Where one member of an etcd cluster runs."""

    name: str  # the service's
    member: str  # etcd's own --name, unique in the cluster
    host: str
    address: str
    workdir: str


def etcd_cluster(members: list[EtcdMember], *, token: str, client_port: int, peer_port: int) -> list[Service]:
    """An etcd cluster of `members` (each on its own address, its data under its workdir): every member lists all
    of them in --initial-cluster, and `token` keeps it from joining another cluster's members."""
    def peer(m: EtcdMember) -> str:
        return f"http://{m.address}:{peer_port}"

    initial = ",".join(f"{m.member}={peer(m)}" for m in members)
    out = []
    for m in members:
        client = f"http://{m.address}:{client_port}"
        argv = [
            ETCD_BINARY,
            "--name", m.member,
            "--data-dir", posixpath.join(m.workdir, "data", m.name),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer(m),
            "--initial-advertise-peer-urls", peer(m),
            "--initial-cluster", initial,
            "--initial-cluster-token", token,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(CLUSTER_HEARTBEAT_MS),
            "--election-timeout", str(CLUSTER_ELECTION_TIMEOUT_MS),
        ]
        out.append(Service(
            name=m.name, role="control", component="etcd", host=m.host, address=m.address,
            argv=argv,
            ports={"client": client_port, "peer": peer_port},
            listens=[client_port, peer_port],
            # /health answers true once the member sees a leader: a member started alone waits for a quorum
            ready=Probe(kind="http", url=f"{client}/health", timeout_s=60),
            metrics_url=f"{client}/metrics",
        ))
    return out


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

"""etcd (Debian's etcd-server): the discovery store for multi-host deployments."""

from __future__ import annotations

import posixpath

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
KUBERNETES_DISCOVERY = "the operator's Kubernetes discovery replaces etcd and the file store"


def etcd_service(ctx: PlanContext, host: str) -> Service:
    """A single-member etcd bound to the host's own address."""
    addr = ctx.hosts[host].address
    ports = ctx.recipe.ports
    client = f"http://{addr}:{ports.etcd_client}"
    peer = f"http://{addr}:{ports.etcd_peer}"
    member = f"{ctx.recipe.name}-etcd"
    argv = [
        ETCD_BINARY,
        "--name", member,
        "--data-dir", posixpath.join(ctx.hosts[host].workdir, "data", "etcd"),
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
        name="etcd", role="control", component="etcd", host=host, address=addr,
        argv=argv,
        ports={"client": ports.etcd_client, "peer": ports.etcd_peer},
        listens=[ports.etcd_client, ports.etcd_peer],
        ready=Probe(kind="http", url=f"{client}/health", timeout_s=60),
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

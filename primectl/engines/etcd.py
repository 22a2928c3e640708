"""etcd (Debian's etcd-server): the discovery store for multi-host deployments."""

from __future__ import annotations

import posixpath

from primectl.engines.base import PlanContext
from primectl.plan.model import Probe, Service

ETCD_BINARY = "/usr/bin/etcd"


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
    ]
    return Service(
        name="etcd", role="control", component="etcd", host=host, address=addr,
        argv=argv,
        ports={"client": ports.etcd_client, "peer": ports.etcd_peer},
        listens=[ports.etcd_client, ports.etcd_peer],
        ready=Probe(kind="http", url=f"{client}/health", timeout_s=60),
    )

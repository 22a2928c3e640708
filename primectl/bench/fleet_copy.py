"""A copy of the demo fleet (recipes/demo-fleet.yaml over demo-site-a/b.yaml) in a directory of its own, on ports
of its own: what benchmarks/fleet_failover.py and tests/integration/test_fleet_demo.py bring up and take down."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
SITES = ("a", "b")


@dataclass
class FleetCopy:
    """Where the copy's files, workdirs and endpoints are."""

    recipe: Path
    sites: dict[str, Path]
    workdirs: dict[str, Path]  # site a, site b, gateway
    edge: str
    replicas: list[str]
    etcd: str  # the first member's client URL
    etcd_members: list[str]  # every member's


@dataclass(frozen=True)
class SiteHost:
    """Where a site's one host is reached over SSH (a site in a network namespace of its own), instead of running
    on this machine with `connection: local`."""

    address: str
    identity_file: Path
    known_hosts: Path


def site_ports(base: int) -> dict[str, int]:
    """Every port base of one site, from `base` up (a site takes at most base + 99)."""
    return {"etcd_client": base + 1, "etcd_peer": base + 2, "mooncake_rpc": base + 3, "mooncake_metadata": base + 4,
            "mooncake_metrics": base + 5, "worker_system": base + 10, "kv_events": base + 20,
            "nixl_side_channel": base + 30, "dp_rpc": base + 40, "bootstrap": base + 50, "response_stream": base + 60,
            "tcp_rpc": base + 70, "frontend_replica": base + 80}


def write_fleet(root: Path, *, port: int, name: str = "fleetcopy", capacity: int = 64, block: int = 4,
                lease_ttl_s: int = 3, failures: int = 2, cooldown_s: float = 2.0, replicas: int = 2,
                weights: tuple[int, ...] | None = None, only: tuple[str, ...] = SITES,
                tls: tuple[Path, Path] | None = None, admission: dict[str, Any] | None = None,
                teams: dict[str, dict[str, int]] | None = None, monitoring: dict[str, Any] | None = None,
                etcd_members: int = 1, site_hosts: dict[str, SiteHost] | None = None,
                stall_s: float | None = None) -> FleetCopy:
    """The fleet's recipe and its sites' (`only` those of SITES) under `root`: the edge on `port`, replicas from
    port + 10, the gateway's etcd on port + 20, the sites' frontends on port + 50/51 and their other ports from
    port + 100/200; `weights` in the order of `only` (default 1 each); `tls`: the edge's (certificate, key), so its
    endpoint is https. `admission` and `teams` add to the gateway's settings. `monitoring`: the fleet's
    `monitoring:` block, its ports from port + 30 (Prometheus, Alertmanager, node_exporter, the edge's exporter)
    unless it names them. With several `etcd_members`, each is a `connection: local` host of its own on
    127.0.0.2, .3, ... with its own workdir. `site_hosts`: the sites whose host is reached over SSH at an address
    of its own (the others run here, on loopback). `stall_s`: the gateway's (default: the recipe's). Runs on
    PRIMECTL_RUNTIME_PYTHON where it is set (no runtime to provision)."""
    python = os.environ.get("PRIMECTL_RUNTIME_PYTHON")
    sites, workdirs = {}, {}
    for i, site in enumerate(SITES):
        if site not in only:
            continue
        doc = yaml.safe_load((REPO / "recipes" / f"demo-site-{site}.yaml").read_text())
        doc["extends"] = str(REPO / "recipes" / "demo.yaml")
        doc["name"] = doc["namespace"] = f"{name}-site-{site}"
        workdirs[site] = root / f"site-{site}"
        doc["hosts"][0]["workdir"] = str(workdirs[site])
        host = doc["hosts"][0]
        reach = (site_hosts or {}).get(site)
        if reach:
            host.update(address=reach.address, connection="ssh", user="root", identity_file=str(reach.identity_file))
            doc["known_hosts"] = str(reach.known_hosts)
        else:
            host.update(address="127.0.0.1", connection="local")
            host.pop("identity_file", None)
            doc.pop("known_hosts", None)
        doc["frontend"] = {**doc.get("frontend", {}), "port": port + 50 + i}
        doc["ports"] = site_ports(port + 100 * (i + 1))
        if python:
            doc["software"] = {"python": python}
        sites[site] = root / f"site-{site}.yaml"
        sites[site].write_text(yaml.safe_dump(doc, sort_keys=False))
    workdirs["gateway"] = root / "gateway"
    if monitoring is not None:
        ports = {"prometheus": port + 30, "alertmanager": port + 31, "node_exporter": port + 32, "balancer": port + 33}
        monitoring = {**monitoring, "ports": {**ports, **monitoring.get("ports", {})}}
    hosts = [{"name": "local", "address": "127.0.0.1", "connection": "local", "workdir": str(workdirs["gateway"])}]
    gateway: dict[str, object] = {
        "host": "local", "port": port, "replicas": replicas,
        "ports": {"replica": port + 10, "etcd_client": port + 20, "etcd_peer": port + 21},
        "admission": {"block": block, "lease_ttl_s": lease_ttl_s, **(admission or {})},
        "breaker": {"failures": failures, "cooldown_s": cooldown_s}, "teams": teams or {}}
    if stall_s is not None:
        gateway["stall_s"] = stall_s
    if tls:
        gateway["tls"] = {"cert": str(tls[0]), "key": str(tls[1])}
    addresses = ["127.0.0.1"]
    if etcd_members > 1:
        addresses = [f"127.0.0.{2 + i}" for i in range(etcd_members)]
        for i, address in enumerate(addresses):
            workdirs[f"etcd-{i}"] = root / f"etcd-{i}"
            hosts.append({"name": f"etcd-{i}", "address": address, "connection": "local",
                          "workdir": str(workdirs[f"etcd-{i}"])})
        gateway["etcd_hosts"] = [f"etcd-{i}" for i in range(etcd_members)]
    recipe = root / "fleet.yaml"
    recipe.write_text(yaml.safe_dump({
        "kind": "fleet", "name": name, **({"monitoring": monitoring} if monitoring is not None else {}),
        "deployments": [{"recipe": f"site-{s}.yaml", "capacity": capacity, "weight": w}
                        for s, w in zip(sites, weights or (1,) * len(sites), strict=True)],
        "hosts": hosts, "supervisor": "process", "gateway": gateway,
    }, sort_keys=False))
    members = [f"http://{a}:{port + 20}" for a in addresses]
    return FleetCopy(recipe, sites, workdirs, f"{'https' if tls else 'http'}://127.0.0.1:{port}",
                     [f"http://127.0.0.1:{port + 10 + i}" for i in range(replicas)], members[0], members)

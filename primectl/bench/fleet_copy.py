"""A copy of the demo fleet (recipes/demo-fleet.yaml over demo-site-a/b.yaml) in a directory of its own, on ports
of its own: what benchmarks/fleet_failover.py and tests/integration/test_fleet_demo.py bring up and take down."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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


def site_ports(base: int) -> dict[str, int]:
    """Every port base of one site, from `base` up (a site takes at most base + 99)."""
    return {"etcd_client": base + 1, "etcd_peer": base + 2, "mooncake_rpc": base + 3, "mooncake_metadata": base + 4,
            "mooncake_metrics": base + 5, "worker_system": base + 10, "kv_events": base + 20,
            "nixl_side_channel": base + 30, "dp_rpc": base + 40, "bootstrap": base + 50, "response_stream": base + 60,
            "tcp_rpc": base + 70, "frontend_replica": base + 80}


def write_fleet(root: Path, *, port: int, name: str = "fleetcopy", capacity: int = 64, block: int = 4,
                lease_ttl_s: int = 3, failures: int = 2, cooldown_s: float = 2.0, replicas: int = 2,
                weights: tuple[int, int] = (1, 1), etcd_members: int = 1) -> FleetCopy:
    """The fleet's recipe and its two sites' under `root`: the edge on `port`, replicas from port + 10, the
    gateway's etcd on port + 20, the sites' frontends on port + 50/51 and their other ports from port + 100/200.
    With several `etcd_members`, each is a `connection: local` host of its own on 127.0.0.2, .3, ... with its
    own workdir. Runs on PRIMECTL_RUNTIME_PYTHON where it is set (no runtime to provision)."""
    python = os.environ.get("PRIMECTL_RUNTIME_PYTHON")
    sites, workdirs = {}, {}
    for i, site in enumerate(SITES):
        doc = yaml.safe_load((REPO / "recipes" / f"demo-site-{site}.yaml").read_text())
        doc["extends"] = str(REPO / "recipes" / "demo.yaml")
        doc["name"] = doc["namespace"] = f"{name}-site-{site}"
        workdirs[site] = root / f"site-{site}"
        doc["hosts"][0]["workdir"] = str(workdirs[site])
        doc["frontend"] = {"port": port + 50 + i}
        doc["ports"] = site_ports(port + 100 * (i + 1))
        if python:
            doc["software"] = {"python": python}
        sites[site] = root / f"site-{site}.yaml"
        sites[site].write_text(yaml.safe_dump(doc, sort_keys=False))
    workdirs["gateway"] = root / "gateway"
    hosts = [{"name": "local", "address": "127.0.0.1", "connection": "local", "workdir": str(workdirs["gateway"])}]
    gateway = {"host": "local", "port": port, "replicas": replicas,
               "ports": {"replica": port + 10, "etcd_client": port + 20, "etcd_peer": port + 21},
               "admission": {"block": block, "lease_ttl_s": lease_ttl_s},
               "breaker": {"failures": failures, "cooldown_s": cooldown_s}}
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
        "kind": "fleet", "name": name,
        "deployments": [{"recipe": f"site-{s}.yaml", "capacity": capacity, "weight": w}
                        for s, w in zip(SITES, weights, strict=True)],
        "hosts": hosts, "supervisor": "process", "gateway": gateway,
    }, sort_keys=False))
    members = [f"http://{a}:{port + 20}" for a in addresses]
    return FleetCopy(recipe, sites, workdirs, f"http://127.0.0.1:{port}",
                     [f"http://127.0.0.1:{port + 10 + i}" for i in range(replicas)], members[0], members)

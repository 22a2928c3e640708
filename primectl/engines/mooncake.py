"""Mooncake: the master of the host-DRAM KV tier, and the store config workers read."""

from __future__ import annotations

import json

from primectl.engines.base import Deployment
from primectl.plan.model import RELEASE, FileSpec, Probe, Service

GIB = 1024**3


def master_service(dep: Deployment, host: str) -> Service:
    """`mooncake_master` with its HTTP metadata server, bound to the host's address."""
    addr = dep.hosts[host].address
    p = dep.recipe.ports
    argv = [
        dep.runtime_bin(host, "mooncake_master"),
        f"--rpc_address={addr}",
        f"--rpc_port={p.mooncake_rpc}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={addr}",
        f"--http_metadata_server_port={p.mooncake_metadata}",
        f"--metrics_host={addr}",
        f"--metrics_port={p.mooncake_metrics}",
    ]
    probe = Probe(kind="http", url=f"http://{addr}:{p.mooncake_metrics}/health", timeout_s=60)
    files: list[FileSpec] = []
    if dep.recipe.engine == "mocker":
        # No vLLM worker exercises the store in a mocker deployment, so readiness
        # proves it with a put/get round trip through the master.
        probe = Probe(
            kind="command",
            command=[
                dep.python(host), f"{RELEASE}/probes/mooncake_roundtrip.py",
                "--master", f"{addr}:{p.mooncake_rpc}",
                "--metadata", f"http://{addr}:{p.mooncake_metadata}/metadata",
                "--local-hostname", addr,
            ],
            timeout_s=60,
        )
        files.append(FileSpec(path="probes/mooncake_roundtrip.py", content=_probe_script(), mode=0o755))
    return Service(
        name="mooncake-master", role="cache", component="mooncake-master", host=host, address=addr,
        argv=argv, env={}, files=files,
        ports={"rpc": p.mooncake_rpc, "metadata": p.mooncake_metadata, "metrics": p.mooncake_metrics},
        listens=[p.mooncake_rpc, p.mooncake_metadata, p.mooncake_metrics],
        ready=probe, metrics_url=f"http://{addr}:{p.mooncake_metrics}/metrics",
    )


def store_config(dep: Deployment, host: str, service: str, ranks: int) -> FileSpec:
    """The MooncakeStoreConnector JSON a worker process reads (MOONCAKE_CONFIG_PATH)."""
    tier = dep.recipe.host_tier
    assert tier is not None and dep.mooncake_master and dep.mooncake_metadata
    segment = int(tier.dram_gb_per_host * 1e9 / max(ranks, 1))
    cfg = {
        "local_hostname": dep.hosts[host].address,
        "metadata_server": dep.mooncake_metadata,
        "master_server_address": dep.mooncake_master,
        "protocol": tier.protocol,
        "device_name": tier.device_name,
        "mode": "",
        "global_segment_size": segment,
        "local_buffer_size": 4 * GIB,
    }
    return FileSpec(path=f"config/mooncake-{service}.json", content=json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _probe_script() -> str:
    from importlib.resources import files

    return files("primectl.engines").joinpath("mooncake_roundtrip.py").read_text()

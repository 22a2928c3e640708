"""Mooncake: the master of the host-DRAM KV tier, and the store config workers read."""

from __future__ import annotations

import json

from primectl.engines.base import PlanContext
from primectl.plan.model import RELEASE, FileSpec, Probe, Service

GIB = 1024**3


def master_argv(binary: str, address: str, rpc: int, metadata: int, metrics: int) -> list[str]:
    """The mooncake_master command line (also used by preflight for a temporary master)."""
    return [
        binary,
        f"--rpc_address={address}",
        f"--rpc_port={rpc}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={address}",
        f"--http_metadata_server_port={metadata}",
        f"--metrics_host={address}",
        f"--metrics_port={metrics}",
    ]


def master_service(ctx: PlanContext, host: str, *, workers_use_store: bool) -> Service:
    """`mooncake_master` with its HTTP metadata server, bound to the host's address."""
    addr = ctx.hosts[host].address
    p = ctx.recipe.ports
    argv = master_argv(ctx.runtime_bin(host, "mooncake_master"), addr, p.mooncake_rpc, p.mooncake_metadata,
                       p.mooncake_metrics)
    probe = Probe(kind="http", url=f"http://{addr}:{p.mooncake_metrics}/health", timeout_s=60)
    files: list[FileSpec] = []
    if not workers_use_store:
        # No worker exercises the store (e.g. the mocker engine), so readiness
        # proves it with a put/get round trip through the master.
        probe = Probe(
            kind="command",
            command=[
                ctx.python(host), f"{RELEASE}/probes/mooncake_roundtrip.py",
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


def store_config(ctx: PlanContext, host: str, service: str, ranks: int) -> FileSpec:
    """The MooncakeStoreConnector JSON a worker process reads (MOONCAKE_CONFIG_PATH)."""
    tier = ctx.tier
    assert tier is not None
    segment = int(tier.dram_gb_per_host * 1e9 / max(ranks, 1))
    # vLLM's MooncakeStoreConfig accepts mode "embedded" (each rank lends global_segment_size to the pool)
    # or "standalone-store"; anything else fails the worker at start ("unknown Mooncake mode").
    cfg = {
        "local_hostname": ctx.hosts[host].address,
        "metadata_server": tier.metadata,
        "master_server_address": tier.master,
        "protocol": tier.protocol,
        "device_name": tier.device_name,
        "mode": "embedded",
        "global_segment_size": segment,
        "local_buffer_size": min(4 * GIB, segment // 4),  # staging buffer for transfers, per rank
    }
    return FileSpec(path=f"config/mooncake-{service}.json", content=json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _probe_script() -> str:
    from importlib.resources import files

    return files("primectl.engines").joinpath("mooncake_roundtrip.py").read_text()

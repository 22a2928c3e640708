"""The MooncakeStoreConnector config a worker reads: where it finds the host-DRAM KV tier's master."""

from __future__ import annotations

import json

from primectl.engines.base import PlanContext
from primectl.plan.model import FileSpec

GIB = 1024**3


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

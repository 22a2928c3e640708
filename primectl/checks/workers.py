"""Figures workers report on their metrics port, for `status`: KV cache allocated, NIXL transfers.

Read from the controller over HTTP (the same /metrics the smoke tests read).
Only engines whose capabilities say they report them are asked.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from primectl.checks.metrics import counter_sum, samples
from primectl.plan.model import Plan

NIXL_XFER = "vllm:nixl_xfer_time_seconds_count"
NIXL_FAILED = "vllm:nixl_num_failed_transfers_total"
NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"
NIXL_FAILED_NOTIFY = "vllm:nixl_num_failed_notifications_total"
PROMPT_SOURCE = "vllm:prompt_tokens_by_source_total"
CACHE_INFO = "vllm:cache_config_info"


def scrape(url: str, timeout: float = 5.0) -> str | None:
    """A /metrics page's text, None when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return str(resp.read().decode("utf-8", "replace"))
    except OSError:
        return None


def worker_sections(plan: Plan) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Status sections ("kv cache", "nixl") and notes, from every worker's /metrics."""
    caps = plan.serving.capabilities
    if not (caps.reports_kv_cache or caps.nixl_metrics):
        return {}, []
    kv: list[dict[str, Any]] = []
    nixl: list[dict[str, Any]] = []
    notes: list[str] = []
    for s in plan.workers():
        predicted = plan.serving.kv_tokens_per_worker.get(s.role)
        if not s.metrics_url:
            continue
        text = scrape(s.metrics_url)
        if text is None:
            notes.append(f"{s.name}: metrics {s.metrics_url} unreachable")
            continue
        if caps.reports_kv_cache:
            info = next(iter(samples(text, CACHE_INFO)), None)
            blocks = int(float(info["num_gpu_blocks"])) if info and info.get("num_gpu_blocks") not in (None, "None") else None
            block = int(info["block_size"]) if info and info.get("block_size") else plan.serving.block_size
            tokens = blocks * block if blocks is not None else None
            row: dict[str, Any] = {"worker": s.name, "blocks": blocks, "block_size": block, "tokens": tokens,
                                   "predicted": predicted}
            if tokens is not None and predicted:
                row["delta_pct"] = round(100.0 * (tokens - predicted) / predicted, 2)
            kv.append(row)
        if caps.nixl_metrics and s.role == "decode":
            nixl.append({"worker": s.name, "transfers": counter_sum(text, NIXL_XFER, {}),
                         "failed": counter_sum(text, NIXL_FAILED, {}), "bytes": counter_sum(text, NIXL_BYTES, {})})
    sections: dict[str, list[dict[str, Any]]] = {}
    if kv:
        sections["kv cache"] = kv
    if nixl:
        sections["nixl"] = nixl
    return sections, notes

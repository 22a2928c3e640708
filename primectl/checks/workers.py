"""What workers report on their metrics port, read from the controller over HTTP.

For `status`: KV cache allocated and NIXL transfers (only engines whose
capabilities say they report them are asked). For the smoke tests: the request
counters that show which prefill and decode worker served a request, and the
decode side's NIXL and prompt-source counters that show the KV moved.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from primectl.checks.metrics import counter_sum, samples

if TYPE_CHECKING:
    from primectl.plan.model import Plan, Service

T = TypeVar("T")

# The metric names are the engine's: plan.serving.capabilities.metrics.


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
            info = next(iter(samples(text, caps.metrics.cache_info)), None)
            blocks = int(float(info["num_gpu_blocks"])) if info and info.get("num_gpu_blocks") not in (None, "None") else None
            block = int(info["block_size"]) if info and info.get("block_size") else plan.serving.block_size
            tokens = blocks * block if blocks is not None else None
            row: dict[str, Any] = {"worker": s.name, "blocks": blocks, "block_size": block, "tokens": tokens,
                                   "predicted": predicted}
            if tokens is not None and predicted:
                row["delta_pct"] = round(100.0 * (tokens - predicted) / predicted, 2)
            kv.append(row)
        if caps.nixl_metrics and s.role == "decode":
            m = caps.metrics
            nixl.append({"worker": s.name, "transfers": counter_sum(text, m.nixl_transfers, {}),
                         "failed": counter_sum(text, m.nixl_failed_transfers, {}), "bytes": counter_sum(text, m.nixl_bytes, {})})
    sections: dict[str, list[dict[str, Any]]] = {}
    if kv:
        sections["kv cache"] = kv
    if nixl:
        sections["nixl"] = nixl
    return sections, notes


# -- request counters: which worker served a request (the smoke tests' disaggregation and affinity checks) --

REQUESTS = "dynamo_component_requests_total"
PREFILL_LABELS = {"dynamo_component": "prefill", "dynamo_endpoint": "generate"}
DECODE_LABELS = {"dynamo_component": "backend", "dynamo_endpoint": "generate"}
COUNTER_LAG_S = 3.0
"""How long `counter_deltas` polls for both counters to move: metrics may lag the response."""


class MetricsUnreachable(Exception):
    """Some worker's /metrics page could not be read; the message names each one and why."""


def with_metrics(plan: Plan, role: str) -> list[Service]:
    """The plan's workers of `role` that publish a metrics URL."""
    return [s for s in plan.services if s.role == role and s.metrics_url]


def request_counters(plan: Plan) -> tuple[dict[str, float], dict[str, float]]:
    """Requests served so far, per prefill and per decode worker (MetricsUnreachable naming those not read)."""
    prefill: dict[str, float] = {}
    decode: dict[str, float] = {}
    bad: list[str] = []
    for role, labels, out in (("prefill", PREFILL_LABELS, prefill), ("decode", DECODE_LABELS, decode)):
        for s in with_metrics(plan, role):
            assert s.metrics_url is not None
            try:
                with urllib.request.urlopen(s.metrics_url, timeout=5) as resp:
                    text = resp.read().decode("utf-8", "replace")
            except OSError as exc:
                bad.append(f"{role} worker {s.name} metrics {s.metrics_url} unreachable "
                           f"({getattr(exc, 'reason', exc)})")
                continue
            out[s.name] = counter_sum(text, REQUESTS, labels)
    if bad:
        raise MetricsUnreachable("; ".join(bad))
    return prefill, decode


def counter_deltas(plan: Plan, send: Callable[[], T]) -> tuple[T, dict[str, float], dict[str, float]]:
    """Send one request; what it added to each prefill and decode worker's counter."""
    p0, d0 = request_counters(plan)
    result = send()
    deadline = time.monotonic() + COUNTER_LAG_S
    while True:
        p1, d1 = request_counters(plan)
        dp = {k: p1.get(k, 0.0) - v for k, v in p0.items()}
        dd = {k: d1.get(k, 0.0) - v for k, v in d0.items()}
        if (sum(dp.values()) > 0 and sum(dd.values()) > 0) or time.monotonic() > deadline:
            return result, dp, dd
        time.sleep(0.2)


def kv_moved(plan: Plan) -> dict[str, float]:
    """Decode workers' NIXL and prompt-source counters, summed (the engine's names on Dynamo's system port)."""
    total = {"transfers": 0.0, "bytes": 0.0, "failed": 0.0, "external": 0.0, "local": 0.0}
    m = plan.serving.capabilities.metrics
    for s in with_metrics(plan, "decode"):
        assert s.metrics_url is not None
        text = scrape(s.metrics_url) or ""
        total["transfers"] += counter_sum(text, m.nixl_transfers, {})
        total["bytes"] += counter_sum(text, m.nixl_bytes, {})
        total["failed"] += counter_sum(text, m.nixl_failed_transfers, {}) + counter_sum(text, m.nixl_failed_notifications, {})
        total["external"] += counter_sum(text, m.prompt_tokens_by_source, {"source": "external_kv_transfer"})
        total["local"] += counter_sum(text, m.prompt_tokens_by_source, {"source": "local_compute"})
    return total


def deltas(d: Mapping[str, float]) -> str:
    """`decode-0 +1, decode-1 +0` (evidence text)."""
    return ", ".join(f"{k} +{v:g}" for k, v in sorted(d.items())) or "none"


def metric_ref(name: str, labels: Mapping[str, str]) -> str:
    """`name{a="1",b="x"}`: the sample a check looked at (evidence text)."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

"""AIPerf exports + frontend /metrics -> summary.json, and the validity gate.

Sources (AIPerf 0.13.0, verified on its exports):
- `profile_export_aiperf.json`: one object per metric tag with `unit`, `avg` and, for per-request
  metrics, `p50`/`p90`/`p99`...: time_to_first_token, inter_token_latency (ms),
  output_token_throughput_per_user, e2e_output_token_throughput (tokens/s/user),
  output_token_throughput (tokens/s), request_throughput (req/s), completed_request_count
  (success + error), request_count (success), total_output_tokens, error_summary.
- the frontend's /metrics, scraped before and after the run (prefix-cache hit rate, see below).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from primectl.checks.metrics import labels_of, sample_lines

DEFAULT_MAX_ERROR_RATE = 0.01

# Figures an INVALID-free summary must have (the SLA metrics live among them).
REQUIRED_FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms",
                    "tok_s_per_user", "output_tok_s", "output_tok_s_per_gpu", "request_throughput_rps")



@dataclass(frozen=True)
class Sample:
    """One Prometheus text-format sample."""

    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (comments and unparsable lines skipped)."""
    out: list[Sample] = []
    for name, label_text, raw in sample_lines(text):
        try:
            value = float(raw)
        except ValueError:
            continue
        out.append(Sample(name, labels_of(label_text), value))
    return out


def metric_sum(samples: Iterable[Sample], name: str, **labels: str) -> float | None:
    """Sum of every series of `name` whose labels include `labels`; None if there is no such series."""
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(found) if found else None


# Which counters measure prefix-cache hits, best first. Each: (source, cached metric, prompt metric, labels).
# - The engine-reported figure: the frontend's per-request histogram of cached tokens (usage
#   prompt_tokens_details.cached_tokens) against its input-token histogram. vLLM reports it; the
#   Dynamo 1.6.1 mocker does not (the sum stays 0), so it is used only when it moved.
# - The KV router's figure: raw cached-prefix tokens on the prefill worker it selected, against
#   the input tokens it routed (phase="prefill"); present whenever router_mode is kv.
HIT_SOURCES: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("frontend dynamo_frontend_cached_tokens_sum / dynamo_frontend_input_sequence_tokens_sum",
     "dynamo_frontend_cached_tokens_sum", "dynamo_frontend_input_sequence_tokens_sum", {}),
    ('router dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase="prefill"} / '
     'dynamo_component_router_input_sequence_tokens_sum{phase="prefill"}',
     "dynamo_component_router_kv_selected_cached_prefix_tokens_total",
     "dynamo_component_router_input_sequence_tokens_sum", {"phase": "prefill"}),
)


def prefix_cache_hits(before: list[Sample], after: list[Sample]) -> dict[str, Any]:
    """Prefix-cache hit rate over the run (counter deltas); `source` names the counters used."""
    tried: list[str] = []
    for source, cached_name, prompt_name, labels in HIT_SOURCES:
        c1, p1 = metric_sum(after, cached_name, **labels), metric_sum(after, prompt_name, **labels)
        if c1 is None or p1 is None:
            tried.append(f"{cached_name}: absent")
            continue
        c0 = metric_sum(before, cached_name, **labels) or 0.0
        p0 = metric_sum(before, prompt_name, **labels) or 0.0
        cached, prompt = c1 - c0, p1 - p0
        if prompt <= 0 or cached <= 0:
            tried.append(f"{cached_name}: did not move (cached {cached:g}, prompt {prompt:g})")
            continue
        return {"hit_rate": round(cached / prompt, 4), "cached_tokens": cached, "prompt_tokens": prompt,
                "source": source, "not_used": tried}
    return {"hit_rate": None, "cached_tokens": None, "prompt_tokens": None, "source": None, "not_used": tried}


def _stat(doc: dict[str, Any], tag: str, stat: str) -> float | None:
    entry = doc.get(tag)
    if not isinstance(entry, dict):
        return None
    v = entry.get(stat)
    return float(v) if isinstance(v, int | float) and not math.isnan(float(v)) else None


def figures_from_aiperf(doc: dict[str, Any], gpu_slots: int) -> dict[str, float | None]:
    """The flat figures of a summary (SLA metrics included) from profile_export_aiperf.json."""
    completed = _stat(doc, "completed_request_count", "avg")
    ok = _stat(doc, "request_count", "avg")
    refused = errors(doc)
    failed = sum(e["count"] for e in refused if not e["overloaded"])
    shed = sum(e["count"] for e in refused if e["overloaded"])
    if completed is None and ok is not None:
        completed = ok + failed + shed
    out_tps = _stat(doc, "output_token_throughput", "avg")
    fig: dict[str, float | None] = {
        "ttft_p50_ms": _stat(doc, "time_to_first_token", "p50"),
        "ttft_p90_ms": _stat(doc, "time_to_first_token", "p90"),
        "ttft_p99_ms": _stat(doc, "time_to_first_token", "p99"),
        "itl_p50_ms": _stat(doc, "inter_token_latency", "p50"),
        "itl_p90_ms": _stat(doc, "inter_token_latency", "p90"),
        "itl_p99_ms": _stat(doc, "inter_token_latency", "p99"),
        "tok_s_per_user": _stat(doc, "output_token_throughput_per_user", "p50"),
        "tok_s_per_user_avg": _stat(doc, "output_token_throughput_per_user", "avg"),
        "e2e_tok_s_per_user": _stat(doc, "e2e_output_token_throughput", "p50"),
        "output_tok_s": out_tps,
        "output_tok_s_per_gpu": out_tps / gpu_slots if out_tps is not None and gpu_slots > 0 else None,
        "request_throughput_rps": _stat(doc, "request_throughput", "avg"),
        "requests_completed": completed,
        "requests_failed": float(failed),
        "error_rate": (failed / completed) if completed else None,
        "requests_overloaded": float(shed),
        "overload_rate": (shed / completed) if completed else None,
        "output_tokens_total": _stat(doc, "total_output_tokens", "avg"),
        "prompt_tokens_mean": _stat(doc, "input_sequence_length", "avg"),
        "benchmark_duration_s": _stat(doc, "benchmark_duration", "avg"),
    }
    return fig


# How a deployment at capacity answers, which is not an outage:
# - Dynamo's frontend over its busy thresholds (recipe frontend.busy: --active-decode-blocks-threshold,
#   --active-prefill-tokens-threshold[-frac]): 529 {"message":"Service temporarily overloaded","type":"Overloaded",
#   "code":529} (measured on the 1.6.1 demo, through HAProxy and straight; DYN_HTTP_OVERLOAD_STATUS_CODE changes
#   the code, not the type);
# - Dynamo releases that answer the same rejection 503 "All workers are busy, please retry later";
# - 429 Too Many Requests (the fleet gateway with every deployment full, any rate limiter).
# A 503 without those words (HAProxy's "No server is available", Dynamo's "Model X is not ready to serve
# requests yet") stays an error: nothing says the deployment is merely full.
OVERLOAD_CODES = frozenset({429, 529})
OVERLOAD_WORDS = re.compile(r'"type"\s*:\s*"Overloaded"|temporarily overloaded|all workers are busy', re.I)


def is_overload(code: object, kind: object = None, message: object = None) -> bool:
    """Whether a refused request's answer (HTTP code, error type, body) says the deployment is at capacity."""
    if code in OVERLOAD_CODES:
        return True
    return bool(OVERLOAD_WORDS.search(f"{kind or ''} {message or ''}")) or str(kind or "").lower() == "overloaded"


def errors(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """What the refused requests got, most frequent first: AIPerf's error_summary as count, code, type, message,
    and `overloaded` (the deployment said it was at capacity: see is_overload) or not (a failure)."""
    out = []
    for e in doc.get("error_summary") or []:
        if isinstance(e, dict):
            details = e.get("error_details")
            d: dict[str, Any] = details if isinstance(details, dict) else {}
            message = " ".join(str(d.get("message") or "").split())
            out.append({"count": int(e.get("count", 0)), "code": d.get("code"), "type": d.get("type"),
                        "message": message[:300], "overloaded": is_overload(d.get("code"), d.get("type"), message)})
    return sorted(out, key=lambda e: -e["count"])


def errors_text(summary: dict[str, Any], overloaded: bool = False) -> str:
    """The failed (or, with `overloaded`, the shed) requests' answers in one line ('' when AIPerf named none)."""
    kinds = [e for e in summary.get("errors") or [] if bool(e.get("overloaded")) == overloaded]
    return "; ".join(f"{e['count']}x " + " ".join(str(p) for p in (e.get("code"), e.get("type")) if p)
                     + (f": {e['message']}" if e.get("message") else "") for e in kinds[:3])


def streaming(records: list[dict[str, Any]]) -> dict[str, int]:
    """How AIPerf received the streamed responses of more than one token: how many, and how many it read whole
    (in one chunk: their inter-token latency reads 0 and they time no token rate)."""
    many = [r for r in records if not r.get("error") and (r.get("output_sequence_length") or 0) > 1]
    return {"responses": len(many), "read_whole": sum(1 for r in many if r.get("http_req_chunks_received") == 1)}


def gate(summary: dict[str, Any], max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> list[str]:
    """Why a summary is INVALID (empty list = valid): no output, too many errors, missing metrics."""
    reasons: list[str] = []
    if summary.get("aiperf", {}).get("exit_code", 0) != 0:
        reasons.append(f"aiperf exited with {summary['aiperf']['exit_code']}")
    fig = summary.get("figures") or {}
    if not fig:
        reasons.append("no AIPerf results (profile_export_aiperf.json missing or unreadable)")
        return reasons
    out = fig.get("output_tokens_total")
    if not out:
        shed = fig.get("requests_overloaded") or 0
        reasons.append("zero output tokens" + (f" ({shed:g} requests answered overloaded: "
                                                f"{errors_text(summary, overloaded=True)})" if shed else ""))
    completed = fig.get("requests_completed")
    if not completed:
        reasons.append("no completed requests")
    rate = fig.get("error_rate")
    if rate is None:
        reasons.append("error rate unknown")
    elif rate > max_error_rate:
        seen = errors_text(summary)
        reasons.append(f"error rate {rate:.2%} above the {max_error_rate:.2%} threshold "
                       f"({fig.get('requests_failed'):g} of {completed:g} requests failed"
                       + (f": {seen})" if seen else ")"))
    missing = [k for k in REQUIRED_FIGURES if fig.get(k) is None]
    whole = (summary.get("streaming") or {}).get("read_whole", 0)
    streamed = (summary.get("streaming") or {}).get("responses", 0)
    if "tok_s_per_user" in missing and streamed and whole == streamed:
        missing.remove("tok_s_per_user")
        reasons.append(f"tok_s_per_user unmeasured: AIPerf read each of the {streamed} streamed responses whole "
                       "(one chunk), so it could not time their tokens apart; the machine running AIPerf fell "
                       "behind the stream (it is busy) or the responses are too short")
    if missing:
        reasons.append("missing metrics: " + ", ".join(missing))
    if (summary.get("prefix_cache") or {}).get("hit_rate") is None:
        reasons.append("missing metrics: prefix-cache hit rate (no cache counter moved on the frontend's /metrics)")
    return reasons


def over_capacity(summary: dict[str, Any], max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> str | None:
    """Why a run's load was more than the deployment takes: more of its requests than `max_error_rate` were
    answered overloaded (None: it took the load). A measurement, not an invalid run: the load was too high."""
    fig = summary.get("figures") or {}
    rate, shed = fig.get("overload_rate"), fig.get("requests_overloaded") or 0
    if rate is None or rate <= max_error_rate:
        return None
    seen = errors_text(summary, overloaded=True)
    return (f"overloaded: {shed:g} of {fig.get('requests_completed'):g} requests ({rate:.2%}) answered that the "
            "deployment is at capacity" + (f" ({seen})" if seen else ""))


def finish(summary: dict[str, Any], max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> dict[str, Any]:
    """Apply the gate: set `valid`, `status` and `invalid_reasons`."""
    reasons = gate(summary, max_error_rate)
    summary["valid"] = not reasons
    summary["status"] = "VALID" if not reasons else "INVALID"
    summary["invalid_reasons"] = reasons
    summary["max_error_rate"] = max_error_rate
    summary["overloaded"] = over_capacity(summary, max_error_rate)
    return summary

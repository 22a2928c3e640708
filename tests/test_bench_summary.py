"""The validity gate on constructed summaries, the AIPerf figure mapping, cache counters and A/B statistics."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from primectl.bench import summary as sm
from primectl.bench.ab import compare, host_set
from primectl.bench.runner import load_plan

REPO = Path(__file__).resolve().parents[1]
AIPERF = {  # shape of AIPerf 0.13.0's profile_export_aiperf.json (values trimmed)
    "time_to_first_token": {"unit": "ms", "avg": 60.0, "p50": 56.5, "p90": 66.6, "p99": 86.6},
    "inter_token_latency": {"unit": "ms", "avg": 0.66, "p50": 0.61, "p90": 0.75, "p99": 1.79},
    "output_token_throughput_per_user": {"unit": "tokens/sec/user", "avg": 1641.6, "p50": 1631.5},
    "e2e_output_token_throughput": {"unit": "tokens/sec/user", "avg": 412.7, "p50": 421.4},
    "output_token_throughput": {"unit": "tokens/sec", "avg": 441.5},
    "request_throughput": {"unit": "requests/sec", "avg": 13.8},
    "request_count": {"unit": "requests", "avg": 138.0},
    "completed_request_count": {"unit": "requests", "avg": 138.0},
    "total_output_tokens": {"unit": "tokens", "avg": 4416.0},
    "input_sequence_length": {"unit": "tokens", "avg": 2563.3, "p50": 2395.0},
    "benchmark_duration": {"unit": "sec", "avg": 9.96},
    "error_summary": [],
}


def summary(doc=None, *, hit=0.8, code=0, gpus=3):
    doc = AIPERF if doc is None else doc
    s = {"aiperf": {"exit_code": code}, "figures": sm.figures_from_aiperf(doc, gpus) if doc else {},
         "prefix_cache": {"hit_rate": hit}, "errors": sm.errors(doc) if doc else []}
    return sm.finish(s)


def test_figures_from_aiperf() -> None:
    f = sm.figures_from_aiperf(AIPERF, 3)
    assert f["ttft_p90_ms"] == 66.6 and f["itl_p99_ms"] == 1.79
    assert f["tok_s_per_user"] == 1631.5 and f["e2e_tok_s_per_user"] == 421.4
    assert f["output_tok_s_per_gpu"] == pytest.approx(441.5 / 3)
    assert f["error_rate"] == 0 and f["requests_completed"] == 138


def test_valid_summary() -> None:
    s = summary()
    assert s["valid"] and s["status"] == "VALID" and s["invalid_reasons"] == []


def test_zero_output_tokens_is_invalid() -> None:
    doc = copy.deepcopy(AIPERF)
    doc["total_output_tokens"]["avg"] = 0
    s = summary(doc)
    assert not s["valid"] and s["status"] == "INVALID"
    assert "zero output tokens" in s["invalid_reasons"]


@pytest.mark.parametrize(("failed", "valid"), [(0, True), (1, True), (2, False), (50, False)])
def test_error_threshold(failed: int, valid: bool) -> None:
    doc = copy.deepcopy(AIPERF)
    doc["completed_request_count"]["avg"] = 138.0
    doc["request_count"]["avg"] = 138.0 - failed
    doc["error_summary"] = [{"error_details": {"code": 503}, "count": failed}] if failed else []
    s = summary(doc)  # 1 of 138 = 0.72% passes the 1% default; 2 of 138 = 1.45% does not
    assert s["valid"] is valid
    if not valid:
        assert any("above the 1.00% threshold" in r for r in s["invalid_reasons"])
    assert sm.finish(copy.deepcopy(s), max_error_rate=0.5)["valid"]


def test_an_invalid_error_rate_names_what_the_failed_requests_got() -> None:
    doc = copy.deepcopy(AIPERF)
    doc["completed_request_count"]["avg"] = 8.0
    doc["request_count"]["avg"] = 5.0
    doc["error_summary"] = [
        {"error_details": {"code": 503, "type": "Service Unavailable", "message": "no server\n available"}, "count": 1},
        {"error_details": {"code": 500, "type": "Internal Server Error", "message": "Failed to generate"}, "count": 2},
    ]
    (reason,) = [r for r in summary(doc)["invalid_reasons"] if r.startswith("error rate")]
    assert reason.endswith("(3 of 8 requests failed: 2x 500 Internal Server Error: Failed to generate; "
                           "1x 503 Service Unavailable: no server available)"), reason


def test_missing_metrics_are_invalid() -> None:
    doc = copy.deepcopy(AIPERF)
    del doc["inter_token_latency"]
    s = summary(doc)
    assert not s["valid"]
    assert any(r.startswith("missing metrics:") and "itl_p50_ms" in r for r in s["invalid_reasons"])
    assert not summary(hit=None)["valid"]


def test_responses_aiperf_read_whole_are_named_as_the_reason_tok_s_per_user_is_missing() -> None:
    # what a busy CI machine produced against demo-vllm: every streamed response in one chunk, ITL 0, no token rate
    records = [{"output_sequence_length": 16, "http_req_chunks_received": 1, "error": None} for _ in range(10)]
    records.append({"output_sequence_length": 1, "http_req_chunks_received": 1, "error": None})  # one token: no ITL
    assert sm.streaming(records) == {"responses": 10, "read_whole": 10}
    doc = copy.deepcopy(AIPERF)
    del doc["output_token_throughput_per_user"]
    s = {"aiperf": {"exit_code": 0}, "figures": sm.figures_from_aiperf(doc, 3), "prefix_cache": {"hit_rate": 0.5},
         "streaming": sm.streaming(records)}
    reasons = sm.finish(s)["invalid_reasons"]
    assert not s["valid"] and len(reasons) == 1, reasons
    assert reasons[0].startswith("tok_s_per_user unmeasured: AIPerf read each of the 10 streamed responses whole")
    # with some responses streamed in several chunks the metric is simply missing, as before
    s["streaming"] = sm.streaming(records[:9] + [{"output_sequence_length": 16, "http_req_chunks_received": 5}])
    assert sm.finish(s)["invalid_reasons"] == ["missing metrics: tok_s_per_user"]


def test_no_export_or_failed_aiperf_is_invalid() -> None:
    assert summary({})["invalid_reasons"][0].startswith("no AIPerf results")
    s = summary(code=1)
    assert not s["valid"] and "aiperf exited with 1" in s["invalid_reasons"]


METRICS_BEFORE = """# HELP dynamo_frontend_cached_tokens x
dynamo_frontend_cached_tokens_sum{model="demo"} 0
dynamo_frontend_input_sequence_tokens_sum{model="demo"} 100
dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase="decode",worker_id="a"} 0
dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase="prefill",worker_id="a"} 50
dynamo_component_router_input_sequence_tokens_sum{phase="prefill",worker_id="a"} 100
"""
METRICS_AFTER = """dynamo_frontend_cached_tokens_sum{model="demo"} 0
dynamo_frontend_input_sequence_tokens_sum{model="demo"} 1100
dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase="decode",worker_id="a"} 0
dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase="prefill",worker_id="a"} 650
dynamo_component_router_kv_selected_cached_prefix_tokens_total{phase="prefill",worker_id="b"} 200
dynamo_component_router_input_sequence_tokens_sum{phase="prefill",worker_id="a"} 1100
"""


def test_prefix_cache_hits_from_counter_deltas() -> None:
    before, after = sm.parse_prometheus(METRICS_BEFORE), sm.parse_prometheus(METRICS_AFTER)
    got = sm.prefix_cache_hits(before, after)
    assert got["hit_rate"] == pytest.approx(800 / 1000)  # (650 + 200 - 50) / (1100 - 100)
    assert got["source"].startswith("router")
    assert "did not move" in got["not_used"][0]
    # An engine that reports cached tokens in usage wins.
    after2 = sm.parse_prometheus(METRICS_AFTER.replace('cached_tokens_sum{model="demo"} 0', 'cached_tokens_sum{model="demo"} 900'))
    got2 = sm.prefix_cache_hits(before, after2)
    assert got2["hit_rate"] == pytest.approx(0.9) and got2["source"].startswith("frontend")
    assert sm.prefix_cache_hits([], [])["hit_rate"] is None


def test_ab_compare_spread_and_significance() -> None:
    a = [{"tok_s_per_user": v} for v in (100.0, 102.0, 98.0)]
    b = [{"tok_s_per_user": v} for v in (120.0, 121.0, 119.0)]
    row = next(r for r in compare(a, b) if r["metric"] == "tok_s_per_user")
    assert row["a_mean"] == pytest.approx(100) and row["b_mean"] == pytest.approx(120)
    assert row["spread"] == pytest.approx(2.0) and row["significant"] == "yes"
    close = [{"tok_s_per_user": v} for v in (101.0, 103.0, 99.0)]
    assert next(r for r in compare(a, close) if r["metric"] == "tok_s_per_user")["significant"] == "no"
    once = next(r for r in compare(a[:1], b[:1]) if r["metric"] == "tok_s_per_user")
    assert once["significant"].startswith("unknown")


def test_demo_variant_differs_only_in_the_prefill_budget_and_shares_hosts() -> None:
    from primectl.planner.load import load_recipe

    a = load_plan(REPO / "recipes" / "demo.yaml")
    b = load_plan(REPO / "recipes" / "demo-variant.yaml")
    da = load_recipe(REPO / "recipes" / "demo.yaml").recipe.model_dump()
    db = load_recipe(REPO / "recipes" / "demo-variant.yaml").recipe.model_dump()
    assert da["prefill"].pop("token_budget_per_gpu") != db["prefill"].pop("token_budget_per_gpu")
    da.pop("extends", None)
    db.pop("extends", None)
    assert da == db
    assert host_set(a) == host_set(b)


def test_bench_and_smoke_read_the_same_samples_from_a_metrics_page() -> None:
    from primectl.checks.metrics import counter_sum

    text = ('# HELP x_total requests\n# TYPE x_total counter\n'
            'x_total{worker="a",note="say \\"hi\\""} 2\nx_total{worker="b"} 3\nx_total 1\nx_total{worker="c"} NaNx\n')
    parsed = sm.parse_prometheus(text)
    assert [(s.labels, s.value) for s in parsed] == [
        ({"worker": "a", "note": 'say \\"hi\\"'}, 2.0), ({"worker": "b"}, 3.0), ({}, 1.0)]
    assert sm.metric_sum(parsed, "x_total") == counter_sum(text, "x_total", {}) == 6.0
    assert sm.metric_sum(parsed, "x_total", worker="b") == counter_sum(text, "x_total", {"worker": "b"}) == 3.0


@pytest.mark.parametrize("name", ["probe1-c2", "A1", "20260101T000000Z-demo"])
def test_started_utc_is_when_the_run_started_not_its_directory_name(name, tmp_path, monkeypatch) -> None:
    """Knee probes and A/B runs live in directories named `probe1-c2` or `A1`: the start time is the clock's."""
    from datetime import UTC, datetime, timedelta

    from primectl.bench import aiperf as ap
    from primectl.bench import runner

    monkeypatch.setattr(ap, "ensure_aiperf", lambda say: "/nonexistent/aiperf")
    monkeypatch.setattr(ap, "run_profile", lambda run, log: 1)
    monkeypatch.setattr(runner, "scrape", lambda url: ("", None))
    monkeypatch.setattr(runner, "_tokenizer", lambda plan, run_dir, override: ap.Tokenizer("t", None))
    before = datetime.now(UTC).replace(microsecond=0)
    res = runner.run_bench(load_plan(REPO / "recipes" / "demo.yaml"), runner.BenchOptions(duration_s=1),
                           run_dir=tmp_path / name, say=lambda _: None, plots=False)
    started = datetime.strptime(res.summary["started_utc"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert before <= started <= datetime.now(UTC) + timedelta(seconds=1)


def test_the_frontier_plot_starts_both_axes_at_zero() -> None:
    """Two variants 5% apart around 1,500 tok/s/user must look 5% apart: the axes are not zoomed onto the data."""
    import matplotlib.pyplot as plt

    from primectl.bench.plots import frontier_figure

    a = ("A", [(1, 1500.0, 90.0), (2, 1530.0, 95.0)], [(1500.0, 90.0)], [])
    b = ("B", [(1, 1570.0, 88.0), (2, 1560.0, 92.0)], [(1570.0, 88.0)], [(1560.0, 92.0)])
    fig = frontier_figure([a, b], title="sweep", x_sla=100.0)
    ax = fig.axes[0]
    try:
        assert ax.get_xlim()[0] == 0 and ax.get_xlim()[1] >= 1570
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 95
    finally:
        plt.close(fig)


# What AIPerf 0.13.0 recorded against the real 1.6.1 demo with frontend.busy.active_prefill_tokens_threshold: 1
# (`primectl bench --duration 15 --concurrency 8` inside `unshare --net`, 2026-12-07): 198 of 939 requests refused.
REAL_OVERLOAD = {"error_details": {"code": 529, "type": "<none>", "message":
                 '{"message":"Service temporarily overloaded","type":"Overloaded","code":529}'}, "count": 198}
# HAProxy in front of a deployment whose frontend is down (captured on the demo with the frontend killed).
REAL_NO_SERVER = {"error_details": {"code": 503, "type": "<none>", "message":
                  "<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n"
                  "</body></html>\n"}, "count": 1}


@pytest.mark.parametrize(("code", "kind", "message", "overloaded"), [
    (529, "<none>", '{"message":"Service temporarily overloaded","type":"Overloaded","code":529}', True),
    # DYN_HTTP_OVERLOAD_STATUS_CODE moves the code, not the type
    (503, "<none>", '{"message":"Service temporarily overloaded","type":"Overloaded","code":503}', True),
    (503, "Service Unavailable", "All workers are busy, please retry later", True),
    (429, "Too Many Requests", "every deployment is full", True),
    (503, "<none>", REAL_NO_SERVER["error_details"]["message"], False),
    (503, "<none>", '{"message":"Model demo is not ready to serve requests yet. The deployment may still be '
                    'starting up or is not fully provisioned.","type":"Service Unavailable","code":503}', False),
    (503, "Service Unavailable", "Service temporarily unavailable", False),
    (500, "<none>", '{"message":"Internal server error","type":"Internal Server Error","code":500}', False),
])
def test_overload_is_told_from_an_outage_by_the_answer(code: int, kind: str, message: str, overloaded: bool) -> None:
    assert sm.is_overload(code, kind, message) is overloaded


def _overloaded_run(ok: int, errors: list[dict]) -> dict:
    doc = copy.deepcopy(AIPERF)
    doc["request_count"]["avg"] = float(ok)
    doc["completed_request_count"]["avg"] = float(ok + sum(e["count"] for e in errors))
    doc["error_summary"] = errors
    return doc


def test_requests_refused_as_overload_are_counted_apart_and_do_not_make_the_run_invalid() -> None:
    s = summary(_overloaded_run(741, [REAL_OVERLOAD]))
    f = s["figures"]
    assert f["requests_overloaded"] == 198 and f["requests_failed"] == 0 and f["error_rate"] == 0
    assert f["overload_rate"] == pytest.approx(198 / 939)
    assert s["valid"], s["invalid_reasons"]
    assert s["overloaded"].startswith("overloaded: 198 of 939 requests (21.09%) answered that the deployment is at "
                                      "capacity (198x 529"), s["overloaded"]
    assert [e["overloaded"] for e in s["errors"]] == [True]


def test_an_outage_beside_overload_still_counts_as_failed() -> None:
    s = summary(_overloaded_run(741, [REAL_OVERLOAD, {**REAL_NO_SERVER, "count": 20}]))
    assert s["figures"]["requests_failed"] == 20 and s["figures"]["requests_overloaded"] == 198
    (reason,) = [r for r in s["invalid_reasons"] if r.startswith("error rate")]
    assert "20 of 959 requests failed: 20x 503" in reason and "529" not in reason, reason


def test_a_little_overload_is_within_the_error_budget() -> None:
    s = summary(_overloaded_run(937, [{**REAL_OVERLOAD, "count": 2}]))
    assert s["valid"] and s["overloaded"] is None and s["figures"]["requests_overloaded"] == 2


def test_bench_prints_the_overloaded_count(tmp_path: Path) -> None:
    import io

    from primectl.bench.report import print_bench
    from primectl.bench.runner import BenchResult

    s = summary(_overloaded_run(741, [REAL_OVERLOAD]))
    s["gpu"] = {"count": 3, "basis": "3 workers"}
    out = io.StringIO()
    assert print_bench(BenchResult(tmp_path, s), "table", out)
    assert ("overloaded             198 of 939 requests refused at capacity (21.09%, above --max-error-rate: more "
            'load than it takes): 198x 529 <none>: {"message":"Service temporarily overloaded"') in out.getvalue()

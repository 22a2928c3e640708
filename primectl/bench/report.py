"""What `bench`, `ab` and `sweep` print: the summary figures, the knee, the A/B deltas, the sweep's plan and result."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from primectl.bench.ab import ABRun
    from primectl.bench.runner import BenchResult, KneeRun
    from primectl.bench.sweep import Sweep

FIGURES = ("tok_s_per_user", "e2e_tok_s_per_user", "output_tok_s_per_gpu", "ttft_p50_ms", "ttft_p90_ms",
           "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "request_throughput_rps",
           "prefix_cache_hit_rate", "error_rate")


def print_bench(res: BenchResult, output: str, stream: TextIO | None = None) -> bool:
    """A run's status and figures (or its summary.json); whether it is valid."""
    stream = stream or sys.stdout
    s = res.summary
    if output == "json":
        stream.write(json.dumps(s, indent=2, default=str) + "\n")
        return bool(s["valid"])
    f = s["figures"]
    stream.write(f"{s['status']}: {res.run_dir}\n")
    for r in s["invalid_reasons"]:
        stream.write(f"  INVALID: {r}\n")
    if s["valid"]:
        for k in FIGURES:
            stream.write(f"  {k:22} {f.get(k) if f.get(k) is None else round(f[k], 4)}\n")
        stream.write(f"  gpu count              {s['gpu']['count']} ({s['gpu']['basis']})\n")
    if f.get("requests_overloaded"):
        from primectl.bench.summary import errors_text

        over = "above --max-error-rate: more load than it takes" if s.get("overloaded") else "within --max-error-rate"
        stream.write(f"  overloaded             {f['requests_overloaded']:g} of {f['requests_completed']:g} requests "
                     f"refused at capacity ({f['overload_rate']:.2%}, {over}): {errors_text(s, overloaded=True)}\n")
    for w in s.get("warnings", []):
        stream.write(f"  warning: {w}\n")
    return bool(s["valid"])


def print_knee(knee: KneeRun, output: str, stream: TextIO | None = None) -> bool:
    """The SLA search's result; whether a knee was found."""
    stream = stream or sys.stdout
    rep = knee.report
    if output == "json":
        stream.write(json.dumps(rep, indent=2, default=str) + "\n")
    else:
        stream.write(f"SLA {rep['sla']}: knee = {rep['knee'] if rep['knee'] is not None else 'none'} "
                     f"({rep['runs']} runs, {'resolved' if rep['resolved'] else 'not resolved to one step'}): "
                     f"{knee.run_dir}\n")
    return knee.result.knee is not None


def print_ab(res: ABRun, stream: TextIO | None = None) -> bool:
    """Where the report is, each metric's delta and significance; whether every run was valid."""
    stream = stream or sys.stdout
    stream.write(f"report: {res.run_dir / 'report.md'}\n")
    for r in res.rows:
        stream.write(f"  {r['metric']:22} delta {r['delta'] if r['delta'] is None else round(r['delta'], 4)}"
                     f"  significant: {r['significant']}\n")
    bad = [f"{lab}{i}" for lab, i, r in res.runs if not r.valid]
    if bad:
        stream.write(f"INVALID runs (left out of the statistics): {', '.join(bad)}\n")
    return res.valid


def print_sweep_plan(sw: Sweep, *, predict: bool, say: Callable[[str], None], stream: TextIO | None = None) -> None:
    """The variants, what the sweep derived for each, its GPUs, the order and what each step restarts.

    With `predict`, aiconfigurator's prediction for each variant at the top of the concurrency range.
    """
    stream = stream or sys.stdout
    st = sw.state
    stream.write(f"sweep of {st['deployment']}: {len(st['variants'])} variants, SLA {st['spec']['sla']}, "
                 f"repeat {st['spec']['repeat']}\n")
    width = max(len(v["label"]) for v in st["variants"])
    for v in st["variants"]:
        derived = ", ".join(f"{k}={x}" for k, x in v["derived"].items())
        stream.write(f"  {v['id']}  {v['label']:{width}}  {v['gpus']:>3} GPU{'s' if v['gpus'] != 1 else ''}"
                     f"{'  (' + derived + ')' if derived else ''}\n")
    stream.write("order (fewest restarts): " + " -> ".join(
        f"{vid} [{len(st['restarts'][vid])} restart{'s' if len(st['restarts'][vid]) != 1 else ''}]"
        for vid in st["order"]) + "\n")
    if not predict:
        return
    from primectl.bench.predict import predict as run_predict
    from primectl.bench.sweep_report import _f

    conc = st["spec"]["bench"]["concurrency"]
    stream.write(f"predictions (aiconfigurator, at {conc} sessions; estimates, not measurements):\n")
    for v in st["variants"]:
        p = run_predict(sw.plans[v["id"]], workload=st["spec"]["bench"].get("workload"), concurrency=conc, say=say)
        if p.status != "predicted":
            stream.write(f"  {v['id']}  {p.status}: {p.reason}\n")
            continue
        figs = ", ".join(f"{k}={_f(x)}" for k, x in p.figures.items())
        stream.write(f"  {v['id']}  {figs}\n")
        for w in p.warnings:
            stream.write(f"        warning: {w}\n")


def print_sweep(sw: Sweep, output: str, stream: TextIO | None = None) -> bool:
    """Where the results are, the winner and each variant's knee; whether every variant deployed and one had a knee."""
    stream = stream or sys.stdout
    st = sw.state
    if output == "json":
        stream.write(json.dumps(st, indent=2, default=str) + "\n")
    else:
        from primectl.bench.sweep_report import _f

        t = st["time"]
        stream.write(f"report: {sw.root / 'sweep.md'}\n")
        stream.write(f"time: {t['deploy_s']:.0f} s deploying, {t['measure_s']:.0f} s measuring\n")
        for r in st["summary"]:
            stream.write(f"  {r['id']}  {r['label']}: sessions {_f(r['sessions'], r['sessions_stdev'])}, "
                         f"output tok/s/GPU {_f(r['output_tok_s_per_gpu'], r['output_tok_s_per_gpu_stdev'])}, "
                         f"tok/s/user {_f(r['tok_s_per_user'], r['tok_s_per_user_stdev'])} ({r['status']})\n")
            if r.get("overloaded"):
                stream.write(f"      overloaded (refused at capacity): {', '.join(r['overloaded'])}\n")
            for x in r["invalid"]:
                stream.write(f"      INVALID (left out): {x}\n")
        w = st["winner"]
        stream.write(f"{w['verdict']}" + (f": {w['id']} ({w['label']}) -> {sw.root / 'winner.yaml'}" if w.get("id") else "")
                     + "\n")
    failed = [r["id"] for r in st["summary"] if r["status"].startswith("failed to deploy")]
    if failed and output != "json":
        stream.write(f"FAILED to deploy: {', '.join(failed)} (see sweep.md; each left the deployment on its last good "
                     "revision)\n")
    return not failed and any(r.get("sessions") is not None for r in st["summary"])

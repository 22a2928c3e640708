"""What `bench` and `ab` print: the summary figures, the knee, the A/B deltas."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from primectl.bench.runner import ABRun, BenchResult, KneeRun

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

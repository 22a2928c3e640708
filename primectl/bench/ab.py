"""`primectl ab`: a paired A/B trial, deployed through `up` and measured with `bench`'s runs.

A and B are deployed in turn on the same hosts (A, bench, B, bench, ... `--repeat` times,
interleaved so drift hits both), each run under `runs/<time>-ab/A1`, `B1`, ...; then
`report.md` (per-metric means, stdevs, delta B-A, and whether it beats twice the run-to-run
spread), `ab.json` and the plots.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primectl.bench.runner import BenchOptions, BenchResult, Say, draw_plots, load_plan, new_run_dir, run_bench

if TYPE_CHECKING:
    from primectl.pipeline import UpOptions
    from primectl.plan.model import Plan

AB_METRICS = ("tok_s_per_user", "e2e_tok_s_per_user", "output_tok_s_per_gpu", "ttft_p50_ms", "ttft_p90_ms",
              "itl_p50_ms", "itl_p90_ms", "request_throughput_rps", "prefix_cache_hit_rate", "error_rate")


def host_set(plan: Plan) -> set[str]:
    """Addresses of the hosts a plan runs services on."""
    return {plan.host(h).address for h in {s.host for s in plan.services}}


def deploy(plan: Plan, up_options: UpOptions, say: Say) -> None:
    """`primectl up` for one side of an A/B: the same pipeline, preflight and smoke included unless turned off."""
    from primectl.pipeline import up

    up(plan, up_options, say)


def undeploy(plan: Plan, up_options: UpOptions, say: Say) -> None:
    """`primectl down` of one side."""
    from primectl.targets.base import get as get_target

    get_target(plan.target.kind).down(plan, up_options.connection, say, purge=False, break_lock=False)


def spread_stats(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample stdev (stdev None with fewer than two values)."""
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per metric: mean and stdev of A and B, delta B-A, spread, and whether |delta| > 2x spread."""
    rows = []
    for m in AB_METRICS:
        va = [f[m] for f in a if f.get(m) is not None]
        vb = [f[m] for f in b if f.get(m) is not None]
        ma, sa = spread_stats(va)
        mb, sb = spread_stats(vb)
        delta = mb - ma if ma is not None and mb is not None else None
        spreads = [s for s in (sa, sb) if s is not None]
        spread = max(spreads) if spreads else None
        if delta is None:
            verdict = "n/a"
        elif spread is None:
            verdict = "unknown (needs --repeat >= 2)"
        else:
            verdict = "yes" if abs(delta) > 2 * spread else "no"
        rows.append({"metric": m, "a_mean": ma, "a_stdev": sa, "b_mean": mb, "b_stdev": sb, "delta": delta,
                     "delta_pct": (100 * delta / ma) if delta is not None and ma else None,
                     "spread": spread, "significant": verdict})
    return rows


def _fmt(v: float | None, pm: float | None = None) -> str:
    if v is None:
        return "n/a"
    s = f"{v:.4g}"
    return f"{s} ± {pm:.2g}" if pm is not None else s


def ab_report(a: Path, b: Path, runs: list[tuple[str, int, BenchResult]], rows: list[dict[str, Any]],
              opts: BenchOptions, repeat: int, pngs: list[str] | str) -> str:
    lines = [
        f"# A/B: {a.name} vs {b.name}", "",
        f"- A: `{a}`", f"- B: `{b}`",
        f"- order: {', '.join(f'{lab}{i}' for lab, i, _ in runs)} (interleaved, repeat {repeat})",
        f"- workload: {opts.workload or 'engine default'} seed {opts.seed}, concurrency {opts.concurrency}, "
        f"{opts.duration_s:g}s per run, same hosts",
        "- spread = the larger run-to-run stdev of A and B; a delta counts when |delta| > 2 x spread", "",
        "| metric | A mean ± stdev | B mean ± stdev | delta (B-A) | delta % | |delta| > 2x spread |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        pct = f"{r['delta_pct']:+.1f}%" if r["delta_pct"] is not None else "n/a"
        lines.append(f"| {r['metric']} | {_fmt(r['a_mean'], r['a_stdev'])} | {_fmt(r['b_mean'], r['b_stdev'])} | "
                     f"{_fmt(r['delta'])} | {pct} | {r['significant']} |")
    lines += ["", "## Runs", "", "| run | status | run dir |", "|---|---|---|"]
    for lab, i, res in runs:
        status = res.summary["status"] + ("" if res.valid else ": " + "; ".join(res.summary["invalid_reasons"]))
        lines.append(f"| {lab}{i} | {status} | `{res.run_dir}` |")
    lines += ["", "INVALID runs are left out of the statistics.", ""]
    if isinstance(pngs, list):
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in pngs]
    else:
        lines.append(pngs)
    return "\n".join(lines) + "\n"


@dataclass
class ABRun:
    run_dir: Path
    runs: list[tuple[str, int, BenchResult]]
    rows: list[dict[str, Any]]

    @property
    def valid(self) -> bool:
        return all(r.valid for _, _, r in self.runs)


def run_ab(a: Path, b: Path, opts: BenchOptions, up_options: UpOptions, *, repeat: int = 1,
           runs_root: Path = Path("runs"), say: Say = print) -> ABRun:
    """Deploy A, bench, deploy B, bench, ... `repeat` times (through `up`), then write report.md and the plots."""
    if repeat < 1:
        raise ValueError("--repeat must be at least 1")
    plan_a = load_plan(a)
    plan_b = load_plan(b)
    if host_set(plan_a) != host_set(plan_b):
        raise ValueError(f"A and B run on different hosts ({sorted(host_set(plan_a))} vs {sorted(host_set(plan_b))}); "
                         "an A/B needs the same hosts")
    # Same workload for both: the preset follows A's engine unless one was given.
    opts = BenchOptions(**{**opts.__dict__, "workload": opts.workload or (None if opts.trace else
                                                                           plan_a.serving.capabilities.workload)})
    root = new_run_dir(runs_root, "ab")
    runs: list[tuple[str, int, BenchResult]] = []
    current: Plan | None = None
    for i in range(1, repeat + 1):
        for label, recipe, plan in (("A", a, plan_a), ("B", b, plan_b)):
            if current is not None and current.name != plan.name:
                say(f"ab: stopping {current.name} (A and B have different deployment names)")
                undeploy(current, up_options, say)
            say(f"ab: deploying {label} ({recipe})")
            deploy(plan, up_options, say)
            current = plan
            res = run_bench(plan, opts, recipe=str(recipe), run_dir=root / f"{label}{i}", say=say, plots=False)
            say(f"ab: {label}{i} {res.summary['status']}")
            runs.append((label, i, res))
    figs_a = [r.summary["figures"] for lab, _, r in runs if lab == "A" and r.valid]
    figs_b = [r.summary["figures"] for lab, _, r in runs if lab == "B" and r.valid]
    rows = compare(figs_a, figs_b)
    pngs = draw_plots(lambda pl: pl.ab_plots(rows, [(lab, i, r.summary["figures"]) for lab, i, r in runs if r.valid],
                                         root))
    (root / "report.md").write_text(ab_report(a, b, runs, rows, opts, repeat, pngs))
    (root / "ab.json").write_text(json.dumps({"a": str(a), "b": str(b), "repeat": repeat, "rows": rows,
                                              "runs": [{"label": lab, "index": i, "run_dir": str(r.run_dir),
                                                        "status": r.summary["status"]} for lab, i, r in runs]},
                                             indent=2, default=str) + "\n")
    return ABRun(root, runs, rows)

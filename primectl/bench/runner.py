"""`bench`, the SLA knee search and `ab`: orchestration around AIPerf runs.

Every run writes `runs/<UTC time>-<recipe name>/`: the AIPerf input (`input.jsonl`), the workload
description (`workload.json`), AIPerf's raw exports (`aiperf/`), its console log (`aiperf.log`),
the frontend's /metrics before and after, `summary.json` and PNG plots.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primectl.bench import aiperf as ap
from primectl.bench import summary as sm
from primectl.bench.sla import SLA, KneeResult, knee_search
from primectl.bench.workload import generate, inspect_trace, preset

if TYPE_CHECKING:
    from primectl.deploy.pipeline import UpOptions
    from primectl.plan.model import Plan

Say = Callable[[str], None]
DEFAULT_SEED = 20260


@dataclass(frozen=True)
class BenchOptions:
    """What one bench run does."""

    workload: str | None = None
    duration_s: float = 60.0
    concurrency: int = 8
    trace: Path | None = None
    seed: int = DEFAULT_SEED
    sessions: int | None = None
    max_error_rate: float = sm.DEFAULT_MAX_ERROR_RATE
    tokenizer: str | None = None
    grace_s: float = 30.0


@dataclass
class BenchResult:
    """A finished run: its directory and summary."""

    run_dir: Path
    summary: dict[str, Any]

    @property
    def valid(self) -> bool:
        return bool(self.summary.get("valid"))


def utc_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def new_run_dir(root: Path, label: str) -> Path:
    """runs/<UTC time>-<label>, made unique with a suffix if two runs start in the same second."""
    base = root / f"{utc_stamp()}-{label}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}.{n}")
    path.mkdir(parents=True)
    return path


def load_plan(recipe: Path) -> Plan:
    """Validate and plan a recipe (RecipeError on bad input)."""
    from primectl.plan.build import plan_recipe

    return plan_recipe(recipe)[1]


def gpu_slots(plan: Plan) -> tuple[int, str]:
    """GPUs the plan uses; on a CPU plan (0 GPUs) each worker process counts as one slot."""
    if plan.capacity.gpus_used > 0:
        return plan.capacity.gpus_used, f"{plan.capacity.gpus_used} GPUs (plan capacity.gpus_used)"
    workers = [s.name for s in plan.services if s.role in ("prefill", "decode")]
    return max(len(workers), 1), (f"CPU deployment with 0 GPUs: each worker process counts as one GPU slot "
                                  f"({len(workers)}: {', '.join(workers)})")


def scrape(url: str | None, timeout: float = 10.0) -> tuple[str, str | None]:
    """The text of a /metrics page, or ("", error)."""
    if not url:
        return "", "no metrics URL in the plan"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace"), None
    except OSError as exc:
        return "", f"{url}: {exc}"


def _tokenizer(plan: Plan, run_dir: Path, override: str | None) -> ap.Tokenizer:
    """The tokenizer AIPerf synthesises prompts with: the served model's own."""
    model = plan.serving.model
    cache = run_dir / "hf-cache"
    if override:
        if Path(override).is_dir():
            return ap.Tokenizer(ap.cache_tokenizer(Path(override), cache), cache)
        return ap.Tokenizer(override, None)
    if model.generate:
        from primectl.render.bundle import model_files

        src = run_dir / "tokenizer"
        for rel, data in model_files(plan).items():
            (src / rel.removeprefix("model/")).parent.mkdir(parents=True, exist_ok=True)
            (src / rel.removeprefix("model/")).write_bytes(data)
        return ap.Tokenizer(ap.cache_tokenizer(src, cache, "primectl/demo"), cache)
    path = model.path
    if path and Path(path).is_dir():
        return ap.Tokenizer(ap.cache_tokenizer(Path(path), cache), cache)
    if path:
        return ap.Tokenizer(str(path), None)
    raise ValueError("the recipe names no model path to take the tokenizer from; pass --tokenizer")


def read_records(path: Path) -> list[dict[str, Any]]:
    """AIPerf's per-request export (profile_export.jsonl), flattened to {field: value}."""
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        meta = doc.get("metadata") or {}
        row: dict[str, Any] = {
            "conversation_id": meta.get("conversation_id"), "turn_index": meta.get("turn_index"),
            "start_ns": meta.get("request_start_ns"), "x_correlation_id": meta.get("x_correlation_id"),
            "error": doc.get("error"),
        }
        for name, m in (doc.get("metrics") or {}).items():
            if isinstance(m, dict) and "value" in m:
                row[name] = m["value"]
        out.append(row)
    return out


def session_checks(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-session facts from the per-request export: pinning ids, history growth, dataset wrap."""
    by_conv: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["conversation_id"] is not None:
            by_conv.setdefault(r["conversation_id"], []).append(r)
    seen: dict[tuple[str, int], int] = {}
    for r in records:
        key = (r["conversation_id"], r["turn_index"])
        seen[key] = seen.get(key, 0) + 1
    repeated = sum(n - 1 for n in seen.values() if n > 1)
    stable = all(len({r["x_correlation_id"] for r in rs}) == 1 for rs in by_conv.values())
    return {
        "conversations": len(by_conv),
        "session_header": "X-Dynamo-Session-ID = AIPerf's per-conversation X-Correlation-ID",
        "session_id_stable_across_turns": stable,
        "repeated_requests": repeated,
    }


def run_bench(plan: Plan, opts: BenchOptions, *, recipe: str = "", runs_root: Path = Path("runs"),
              run_dir: Path | None = None, say: Say = print, plots: bool = True) -> BenchResult:
    """One benchmark run against the deployment of `plan` (which must be up)."""
    # From the clock: a knee probe's or A/B run's directory (probe1-c2, A1) carries no time in its name.
    started_utc = utc_stamp()
    exe = ap.ensure_aiperf(say)
    spec = None
    if opts.trace is None:
        spec = preset(opts.workload or plan.serving.capabilities.workload)
    elif not opts.trace.is_file():
        raise ValueError(f"trace {opts.trace}: no such file")
    run_dir = run_dir or new_run_dir(runs_root, plan.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    input_file = run_dir / "input.jsonl"
    block = plan.serving.block_size
    if spec is not None:
        n_sessions = opts.sessions or max(4, spec.sessions_per_slot * opts.concurrency)
        wl = generate(spec, seed=opts.seed, block_size=block, sessions=n_sessions)
        wl.write(input_file)
        workload_doc: dict[str, Any] = {"source": "generated", "format": "aiperf mooncake_trace (per-turn deltas)",
                                        **wl.stats()}
    else:
        assert opts.trace is not None
        info = inspect_trace(opts.trace)
        shutil.copyfile(opts.trace, input_file)
        workload_doc = {"source": str(opts.trace), "format": "aiperf mooncake_trace (user file)", "rows": info.rows,
                        "sessions": info.sessions, "has_hash_ids": info.has_hash_ids, "seed": opts.seed}
    (run_dir / "workload.json").write_text(json.dumps(workload_doc, indent=2) + "\n")
    tok = _tokenizer(plan, run_dir, opts.tokenizer)
    slots, slot_basis = gpu_slots(plan)
    metrics_url = plan.service("frontend").metrics_url
    artifacts = run_dir / "aiperf"
    run = ap.profile_argv(exe, model=plan.served_model, url=plan.endpoint, tokenizer=tok,
                          concurrency=opts.concurrency, duration_s=opts.duration_s, input_file=input_file,
                          artifacts=artifacts, seed=opts.seed, block_size=block if spec else None,
                          user_trace=spec is None, grace_s=opts.grace_s)
    before, err_before = scrape(metrics_url)
    (run_dir / "metrics-before.txt").write_text(before)
    say(f"bench {plan.name}: {workload_doc.get('preset', 'trace')} workload, concurrency {opts.concurrency}, "
        f"{opts.duration_s:g}s -> {run_dir}")
    t0 = time.monotonic()
    code = ap.run_profile(run, run_dir / "aiperf.log")
    wall = time.monotonic() - t0
    after, err_after = scrape(metrics_url)
    (run_dir / "metrics-after.txt").write_text(after)

    export = artifacts / "profile_export_aiperf.json"
    doc: dict[str, Any] = {}
    if export.exists():
        try:
            doc = json.loads(export.read_text())
        except json.JSONDecodeError:
            doc = {}
    records = read_records(artifacts / "profile_export.jsonl")
    cache = sm.prefix_cache_hits(sm.parse_prometheus(before), sm.parse_prometheus(after))
    cache["scrape_errors"] = [e for e in (err_before, err_after) if e]
    figures = sm.figures_from_aiperf(doc, slots) if doc else {}
    if figures:
        figures["prefix_cache_hit_rate"] = cache["hit_rate"]
    summary: dict[str, Any] = {
        "recipe": recipe, "deployment": plan.name, "engine": plan.engine, "endpoint": plan.endpoint,
        "model": plan.served_model, "run_dir": str(run_dir), "started_utc": started_utc,
        "concurrency": opts.concurrency, "duration_s": opts.duration_s, "seed": opts.seed,
        "workload": workload_doc,
        "gpu": {"count": slots, "basis": slot_basis},
        "figures": figures,
        "prefix_cache": cache,
        "sessions": session_checks(records),
        "aiperf": {"version": ap.aiperf_version(exe) or doc.get("aiperf_version"), "executable": exe,
                   "argv": run.argv, "exit_code": code, "wall_s": round(wall, 1),
                   "env": {k: v for k, v in run.env.items() if k.startswith(("AIPERF_", "HF_HUB"))}},
        "units": {"ttft/itl": "ms", "tok_s_per_user": "output tokens/s per request, median",
                  "output_tok_s_per_gpu": "output tokens/s / gpu.count", "prefix_cache_hit_rate": "fraction"},
    }
    warnings = []
    if summary["sessions"]["repeated_requests"]:
        warnings.append(f"AIPerf replayed {summary['sessions']['repeated_requests']} request(s) a second time "
                        "(the workload ran out; use more --sessions): cache hits are inflated")
    summary["warnings"] = warnings
    sm.finish(summary, opts.max_error_rate)
    if plots:
        summary["plots"] = _plots(lambda pl: pl.bench_plots(records, run_dir / "plots", title=f"{plan.name}"))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return BenchResult(run_dir, summary)


def _plots(draw: Callable[[Any], list[Path]]) -> list[str] | str:
    """Draw with primectl.bench.plots; a note instead when matplotlib is missing."""
    try:
        from primectl.bench import plots
    except ImportError as exc:
        return f"plots skipped: {exc} (pip install 'matplotlib>=3.8')"
    return [str(p) for p in draw(plots)]


# -- SLA knee ------------------------------------------------------------------------------------------

@dataclass
class KneeRun:
    """A knee search: its directory, the search result and each probe's run."""

    run_dir: Path
    result: KneeResult
    runs: dict[int, BenchResult] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


def run_knee(plan: Plan, opts: BenchOptions, sla: SLA, *, recipe: str = "", low: int = 1, max_runs: int = 7,
             runs_root: Path = Path("runs"), root: Path | None = None, say: Say = print) -> KneeRun:
    """Bisect concurrency in [low, opts.concurrency] for the most sessions meeting `sla` (<= max_runs runs).

    Probes go under `root` when given (a sweep's repeat), else a new runs/<time>-<name>-knee.
    """
    if root is None:
        root = new_run_dir(runs_root, f"{plan.name}-knee")
    root.mkdir(parents=True, exist_ok=True)
    runs: dict[int, BenchResult] = {}

    def measure(c: int) -> tuple[float | None, str]:
        n = len(runs) + 1
        res = run_bench(plan, BenchOptions(**{**opts.__dict__, "concurrency": c}), recipe=recipe,
                        run_dir=root / f"probe{n}-c{c}", say=say, plots=False)
        runs[c] = res
        if not res.valid:
            return None, "INVALID: " + "; ".join(res.summary["invalid_reasons"])
        value = res.summary["figures"].get(sla.metric)
        return value, ""

    result = knee_search(measure, sla, low=low, high=opts.concurrency, max_runs=max_runs)
    for p in result.probes:
        say(f"  probe concurrency {p.concurrency:4d}: {sla.metric} = "
            f"{'n/a' if p.value is None else f'{p.value:.4g}'} -> {'PASS' if p.passed else 'FAIL'} {p.note}".rstrip())
    report = {
        "sla": str(sla), "range": [low, opts.concurrency], "max_runs": max_runs, "runs": len(result.probes),
        "knee": result.knee, "first_fail": result.first_fail, "resolved": result.resolved,
        "probes": [{"concurrency": p.concurrency, "value": p.value, "passed": p.passed, "note": p.note,
                    "run_dir": str(runs[p.concurrency].run_dir)} for p in result.probes],
        "knee_summary": runs[result.knee].summary["figures"] if result.knee is not None else None,
    }
    report["plots"] = _plots(lambda pl: pl.knee_plot(result, root / "knee.png"))
    (root / "knee.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return KneeRun(root, result, runs, report)


# -- A/B -------------------------------------------------------------------------------------------------

AB_METRICS = ("tok_s_per_user", "e2e_tok_s_per_user", "output_tok_s_per_gpu", "ttft_p50_ms", "ttft_p90_ms",
              "itl_p50_ms", "itl_p90_ms", "request_throughput_rps", "prefix_cache_hit_rate", "error_rate")


def host_set(plan: Plan) -> set[str]:
    """Addresses of the hosts a plan runs services on."""
    return {plan.host(h).address for h in {s.host for s in plan.services}}


def deploy(plan: Plan, up_options: UpOptions, say: Say) -> None:
    """`primectl up` for one side of an A/B: the same pipeline, preflight and smoke included unless turned off."""
    from primectl.deploy.pipeline import up

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
    pngs = _plots(lambda pl: pl.ab_plots(rows, [(lab, i, r.summary["figures"]) for lab, i, r in runs if r.valid],
                                         root))
    (root / "report.md").write_text(ab_report(a, b, runs, rows, opts, repeat, pngs))
    (root / "ab.json").write_text(json.dumps({"a": str(a), "b": str(b), "repeat": repeat, "rows": rows,
                                              "runs": [{"label": lab, "index": i, "run_dir": str(r.run_dir),
                                                        "status": r.summary["status"]} for lab, i, r in runs]},
                                             indent=2, default=str) + "\n")
    return ABRun(root, runs, rows)

"""`bench` and the SLA knee search: orchestration around AIPerf runs (`ab` is ab.py, on top of these).

Every run writes `runs/<UTC time>-<recipe name>/`: the AIPerf input (`input.jsonl`), the workload
description (`workload.json`), AIPerf's raw exports (`aiperf/`), its console log (`aiperf.log`),
the frontend's /metrics before and after, `summary.json` and PNG plots.
"""

from __future__ import annotations

import json
import shutil
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
    from primectl.planner.build import plan_recipe

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
                          user_trace=spec is None, grace_s=opts.grace_s, ignore_eos=bool(spec and spec.ignore_eos))
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
        "streaming": sm.streaming(records),
        "errors": sm.errors(doc) if doc else [],
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
    stream = summary["streaming"]
    if 0 < stream["read_whole"] < stream["responses"] and 2 * stream["read_whole"] >= stream["responses"]:
        warnings.append(f"AIPerf read {stream['read_whole']} of {stream['responses']} streamed responses whole (one "
                        "chunk): ITL and tok/s per user come from the others only")
    summary["warnings"] = warnings
    sm.finish(summary, opts.max_error_rate)
    if plots:
        summary["plots"] = draw_plots(lambda pl: pl.bench_plots(records, run_dir / "plots", title=f"{plan.name}"))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return BenchResult(run_dir, summary)


def draw_plots(draw: Callable[[Any], list[Path]]) -> list[str] | str:
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

    def measure(c: int) -> tuple[float | None, str] | tuple[float | None, str, bool]:
        n = len(runs) + 1
        res = run_bench(plan, BenchOptions(**{**opts.__dict__, "concurrency": c}), recipe=recipe,
                        run_dir=root / f"probe{n}-c{c}", say=say, plots=False)
        runs[c] = res
        if not res.valid:
            return None, "INVALID: " + "; ".join(res.summary["invalid_reasons"])
        value = res.summary["figures"].get(sla.metric)
        if res.summary.get("overloaded"):  # measured, and more sessions than the deployment takes: not the knee
            return value, res.summary["overloaded"], False
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
    report["plots"] = draw_plots(lambda pl: pl.knee_plot(result, root / "knee.png"))
    (root / "knee.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return KneeRun(root, result, runs, report)

"""What a sweep concludes: per-variant figures at the knee with their spread, the winner, and the files
(sweep.md, frontier.png, winner.yaml, the predictor-accuracy history)."""

from __future__ import annotations

import json
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from primectl.bench.variants import nest

if TYPE_CHECKING:
    from primectl.bench.sla import SLA
    from primectl.plan.model import Plan

#: Probe figures a sweep keeps (the frontier's axes among them).
FIGURES = ("tok_s_per_user", "output_tok_s_per_gpu", "ttft_p90_ms", "itl_p90_ms", "ttft_p50_ms", "itl_p50_ms",
           "request_throughput_rps", "error_rate", "requests_completed", "requests_overloaded", "overload_rate")
#: Figures reported at the knee, with their spread over repeats.
KNEE_FIGURES = ("tok_s_per_user", "output_tok_s_per_gpu", "ttft_p90_ms", "itl_p90_ms")
#: The figure the winner is chosen by: goodput per GPU (output tok/s per GPU while meeting the SLA).
WINNER_BY = "output_tok_s_per_gpu"
#: A prediction's figure -> the measured figure it is compared with (same name when absent).
PREDICTED_AS = {"ttft_ms": "ttft_p50_ms", "itl_ms": "itl_p50_ms", "tpot_ms": "itl_p50_ms"}
HISTORY = "predictor-accuracy.jsonl"


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def aggregate(state: dict[str, Any], plans: dict[str, Plan]) -> list[dict[str, Any]]:
    """One row per variant: status, knee sessions and figures (mean, stdev over repeats), invalid runs named."""
    rows = []
    for v in state["variants"]:
        res = state["results"].get(v["id"], {"repeats": []})
        repeats = res.get("repeats", [])
        knees = [r for r in repeats if r["knee"] is not None]
        row: dict[str, Any] = {"id": v["id"], "label": v["label"], "derived": v["derived"], "gpus": v["gpus"],
                               "gpu_basis": v["gpu_basis"], "repeats": len(repeats),
                               "knees": [r["knee"] for r in repeats]}
        if res.get("failed"):
            row["status"] = f"failed to deploy: {res['failed']['error']}"
        elif not repeats:
            row["status"] = "not run"
        elif not knees:
            row["status"] = "no knee: the lowest concurrency failed the SLA"
        else:
            row["status"] = "measured"
        row["sessions"], row["sessions_stdev"] = _stats([float(r["knee"]) for r in knees])
        for f in KNEE_FIGURES:
            vals = [float(r["knee_figures"][f]) for r in knees if (r.get("knee_figures") or {}).get(f) is not None]
            row[f], row[f + "_stdev"] = _stats(vals)
        row["invalid"] = [f"{v['id']} r{r['index']} c{p['concurrency']}: {'; '.join(p['invalid_reasons'])} "
                          f"({p['run_dir']})" for r in repeats for p in r["probes"] if not p["valid"]]
        row["overloaded"] = overloaded(repeats)
        pred = res.get("prediction")
        if pred:
            row["prediction"] = pred
            row["measured_over_predicted"] = ratios(row, pred, knees)
        rows.append(row)
    return rows


def overloaded(repeats: list[dict[str, Any]]) -> list[str]:
    """The probes whose load the deployment partly refused as overload (529, 503 busy, 429), as
    `c<concurrency>: <refused> of <requests>` (`r<repeat>` added with repeats), lowest concurrency first."""
    out = []
    for r in repeats:
        for p in sorted(r["probes"], key=lambda p: p["concurrency"]):
            shed = p.get("requests_overloaded")
            if shed:
                where = f"r{r['index']} " if len(repeats) > 1 else ""
                out.append(f"{where}c{p['concurrency']}: {shed:g} of {_f(p.get('requests_completed'))}")
    return out


def ratios(row: dict[str, Any], pred: dict[str, Any], knees: list[dict[str, Any]]) -> dict[str, float]:
    """measured / predicted per figure both have (at the knee, means over repeats)."""
    if pred.get("status") != "predicted" or not knees:
        return {}
    out = {}
    for name, predicted in (pred.get("figures") or {}).items():
        measured_name = PREDICTED_AS.get(name, name)
        vals = [float(r["knee_figures"][measured_name]) for r in knees
                if (r.get("knee_figures") or {}).get(measured_name) is not None]
        if vals and isinstance(predicted, int | float) and predicted > 0:
            out[measured_name] = round(statistics.fmean(vals) / predicted, 4)
    return out


def winner(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The variant with the most goodput per GPU at its knee, and whether its margin beats the spread.

    A margin counts when it is more than twice the larger run-to-run stdev of the two best variants
    (the same rule as `ab`); with one repeat the spread is unknown and the pick says so.
    """
    ranked = sorted((r for r in rows if r.get(WINNER_BY) is not None), key=lambda r: -r[WINNER_BY])
    if not ranked:
        return {"id": None, "verdict": "no winner: no variant met the SLA"}
    best = ranked[0]
    out: dict[str, Any] = {"id": best["id"], "label": best["label"], "by": WINNER_BY, "value": best[WINNER_BY]}
    if len(ranked) == 1:
        return {**out, "verdict": "winner: the only variant that met the SLA"}
    second = ranked[1]
    margin = best[WINNER_BY] - second[WINNER_BY]
    spreads = [s for s in (best[WINNER_BY + "_stdev"], second[WINNER_BY + "_stdev"]) if s is not None]
    spread = max(spreads) if len(spreads) == 2 else None
    out.update({"runner_up": second["id"], "margin": margin, "margin_pct": 100 * margin / second[WINNER_BY]
                if second[WINNER_BY] else None, "spread": spread})
    if spread is None:
        return {**out, "verdict": "winner, not checked against noise (the spread needs --repeat >= 2)"}
    if margin > 2 * spread:
        return {**out, "verdict": f"winner: the margin is more than 2x the spread ({margin:.3g} > 2 x {spread:.2g})"}
    return {**out, "id": None, "best": best["id"],
            "verdict": f"no winner: within noise ({best['id']} leads by {margin:.3g}, spread {spread:.2g})"}


def write_winner(path: Path, state: dict[str, Any], w: dict[str, Any]) -> Path:
    """winner.yaml: a recipe that extends the base with the winning overrides (and derived counts)."""
    v = next(x for x in state["variants"] if x["id"] == w["id"])
    body = {"extends": state["spec"]["base"], **nest({**v["overrides"], **v["derived"]})}
    head = [f"# primectl sweep winner: {v['id']} ({v['label']})", f"# {w['verdict']}",
            f"# by {w['by']} at the SLA knee: {w['value']:.4g}", f"# deploy it: primectl up {path}"]
    path.write_text("\n".join(head) + "\n" + yaml.safe_dump(body, sort_keys=False))
    return path


def record_accuracy(state: dict[str, Any], rows: list[dict[str, Any]], plans: dict[str, Plan],
                    runs_root: Path) -> dict[str, Any]:
    """Append measured/predicted to the runs directory's history; summarise earlier sweeps on this hardware."""
    history = runs_root / HISTORY
    earlier: list[dict[str, Any]] = []
    if history.exists():
        for line in history.read_text().splitlines():
            try:
                earlier.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    sweep_name = Path(state["variants"][0]["file"]).parent.parent.name if state["variants"] else ""
    new = []
    for r in rows:
        if not r.get("measured_over_predicted"):
            continue
        plan = plans[r["id"]]
        new.append({"utc": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"), "sweep": sweep_name,
                    "hardware": plan.hardware.profile, "engine": plan.engine, "variant": r["label"],
                    "measured_over_predicted": r["measured_over_predicted"]})
    if new:
        with history.open("a") as fh:
            for rec in new:
                fh.write(json.dumps(rec) + "\n")
    hardware = {plans[r["id"]].hardware.profile for r in rows}
    engines = {plans[r["id"]].engine for r in rows}
    prior = [e for e in earlier if e.get("hardware") in hardware and e.get("engine") in engines
             and e.get("sweep") != sweep_name]
    by_fig: dict[str, list[float]] = {}
    for e in prior:
        for k, x in e.get("measured_over_predicted", {}).items():
            by_fig.setdefault(k, []).append(float(x))
    return {"history": str(history), "recorded": len(new),
            "earlier": {k: {"median": statistics.median(v), "n": len(v)} for k, v in sorted(by_fig.items())}}


def frontier(state: dict[str, Any], rows: list[dict[str, Any]], sla: SLA, path: Path) -> list[str] | str:
    """frontier.png: output tok/s per GPU against tok/s per user, one curve per variant, knees marked."""
    curves = []
    for r in rows:
        res = state["results"].get(r["id"], {})
        by_c: dict[int, list[tuple[float, float]]] = {}
        knees = []
        for rep in res.get("repeats", []):
            for p in rep["probes"]:
                if p["valid"] and p.get("tok_s_per_user") is not None and p.get("output_tok_s_per_gpu") is not None:
                    by_c.setdefault(p["concurrency"], []).append((p["tok_s_per_user"], p["output_tok_s_per_gpu"]))
                    if p["concurrency"] == rep["knee"]:
                        knees.append((p["tok_s_per_user"], p["output_tok_s_per_gpu"]))
        if by_c:
            means = [(c, statistics.fmean(x for x, _ in v), statistics.fmean(y for _, y in v)) for c, v in sorted(by_c.items())]
            raw = [pt for v in by_c.values() for pt in v]
            curves.append((f"{r['id']} {r['label']}", means, raw, knees))
    try:
        from primectl.bench import plots
    except ImportError as exc:
        return f"plots skipped: {exc} (pip install 'matplotlib>=3.8')"
    x_sla = sla.value if sla.metric == "tok_s_per_user" else None
    return [str(p) for p in plots.frontier_plot(curves, path, title=f"{state.get('deployment', '')} sweep, SLA {sla}",
                                                x_sla=x_sla)]


def _f(v: float | None, sd: float | None = None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g} ± {sd:.2g}" if sd is not None else f"{v:.4g}"


def markdown(state: dict[str, Any], rows: list[dict[str, Any]], sla: SLA) -> str:
    """sweep.md: how the sweep ran, the per-variant table, the winner, predictions beside measurements."""
    spec, t = state["spec"], state["time"]
    total = t["deploy_s"] + t["measure_s"]
    bench = spec.get("bench") or {}
    lines = [f"# Sweep of {state.get('deployment', '')}: {len(rows)} variants", "",
             f"- base: `{spec['base']}`", f"- SLA: `{sla}`; knee search over concurrency "
             f"{spec['low']}..{bench.get('concurrency')} in at most {spec['max_runs']} runs, {bench.get('duration_s')} s "
             f"each, repeated {spec['repeat']} time(s)",
             f"- order (fewest restarts first): {' -> '.join(state['order'])}; restarts per step: "
             + ", ".join(f"{k}: {len(v)}" for k, v in state["restarts"].items()),
             f"- time: {t['deploy_s']:.0f} s deploying, {t['measure_s']:.0f} s measuring"
             + (f" ({100 * t['deploy_s'] / total:.0f}% deploying)" if total else ""),
             "- winner chosen by output tok/s per GPU at the knee; a margin counts when it is more than 2x the "
             "larger run-to-run stdev", ""]
    w = state["winner"]
    lines += [f"**{w['verdict']}**" + (f": {w['id']} ({w['label']})" if w.get("id") else ""), ""]
    if w.get("id"):
        lines += ["`winner.yaml` extends the base with the winning overrides: `primectl up winner.yaml`", ""]
    lines += ["| variant | overrides | derived | GPUs | sessions at knee | tok/s/user | output tok/s/GPU | "
              "TTFT p90 ms | ITL p90 ms | overloaded (requests refused at capacity) | status |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        derived = ", ".join(f"{k}={v}" for k, v in r["derived"].items()) or "-"
        lines.append(f"| {r['id']} | {r['label']} | {derived} | {r['gpus']} | {_f(r['sessions'], r['sessions_stdev'])} "
                     f"| {_f(r['tok_s_per_user'], r['tok_s_per_user_stdev'])} "
                     f"| {_f(r['output_tok_s_per_gpu'], r['output_tok_s_per_gpu_stdev'])} "
                     f"| {_f(r['ttft_p90_ms'], r['ttft_p90_ms_stdev'])} | {_f(r['itl_p90_ms'], r['itl_p90_ms_stdev'])} "
                     f"| {', '.join(r['overloaded']) or 'none'} | {r['status']} |")
    slots = "each worker process counts as one GPU slot" if any(r["gpu_basis"].startswith("CPU") for r in rows) \
        else "the plan's capacity.gpus_used"
    lines += ["", f"± is the run-to-run stdev over repeats (absent with one repeat). GPUs: {slots}. Overloaded: "
              "requests the deployment refused because it was at capacity (Dynamo's 529 over its frontend.busy "
              "thresholds, 503 \"All workers are busy\", 429), per probe concurrency; a probe that refused more "
              "than --max-error-rate of its requests that way is measured and fails the SLA, it is not invalid.", ""]
    invalid = [x for r in rows for x in r["invalid"]]
    lines += ["## Invalid runs (left out of every figure)", ""] + ([f"- {x}" for x in invalid] or ["none"]) + [""]
    if any(r.get("prediction") for r in rows):
        lines += prediction_section(state, rows)
    plots = state.get("plots")
    lines += ["## Frontier", ""]
    lines += [f"![frontier]({Path(p).name})" for p in plots] if isinstance(plots, list) else [str(plots)]
    return "\n".join(lines) + "\n"


def prediction_section(state: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Predictions (labelled as such, with the predictor's warnings) beside the measurements."""
    out = ["## Predicted (aiconfigurator) vs measured", "",
           "Predictions are estimates from aiconfigurator's perf database, not measurements.", "",
           "| variant | predicted at | prediction | measured / predicted | predictor warnings |", "|---|---|---|---|---|"]
    for r in rows:
        p = r.get("prediction")
        if not p:
            continue
        if p.get("status") != "predicted":
            shown = f"{p.get('status')}: {p.get('reason', '')}"
        else:
            shown = ", ".join(f"{k}={_f(v)}" for k, v in (p.get("figures") or {}).items())
        mp = ", ".join(f"{k} {v:.3g}" for k, v in r.get("measured_over_predicted", {}).items()) or "-"
        warns = "; ".join(p.get("warnings") or []) or "-"
        out.append(f"| {r['id']} | {p.get('concurrency')} sessions | {shown} | {mp} | {warns} |")
    acc = state.get("predictor") or {}
    if acc.get("earlier"):
        out += ["", "Earlier sweeps on this hardware (measured / predicted, median): "
                + ", ".join(f"{k} {v['median']:.3g} (n={v['n']})" for k, v in acc["earlier"].items())]
    return out + [""]

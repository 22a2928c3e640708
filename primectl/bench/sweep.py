"""`primectl sweep`: deploy each variant through `up`, find its SLA knee (`--repeat` times), pick the winner.

Everything a sweep knows is in `runs/<time>-<recipe>-sweep/sweep.json`, rewritten after every repeat, so an
interrupted sweep resumes where it stopped (`--resume DIR`). Variants run in the order that restarts the
fewest services; every change goes through the same `up` pipeline, so services a variant does not change
keep running (and engines stay loaded).
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primectl.bench import sweep_report as report
from primectl.bench.runner import BenchOptions, gpu_slots, run_knee, utc_stamp
from primectl.bench.sla import SLA, parse_sla
from primectl.bench.variants import Axis, materialise, plan_hash
from primectl.errors import DeployError, Interrupted, Problem, RecipeError

if TYPE_CHECKING:
    from primectl.pipeline import UpOptions
    from primectl.plan.model import Plan

Say = Callable[[str], None]
STATE = "sweep.json"
#: Brute-force the order up to this many variants (7! = 5040 orders); greedy nearest-neighbour above.
EXACT_ORDER_MAX = 7


@dataclass(frozen=True)
class SweepSpec:
    """What the sweep measures and how; stored in sweep.json so `--resume` runs the same sweep."""

    base: str
    sla: str
    repeat: int = 1
    low: int = 1
    max_runs: int = 4
    predict: bool = False
    preflight: bool = True
    smoke: bool = True
    bench: dict[str, Any] | None = None

    def bench_options(self) -> BenchOptions:
        fields = dict(self.bench or {})
        if fields.get("trace"):
            fields["trace"] = Path(fields["trace"])
        return BenchOptions(**fields)


def bench_fields(opts: BenchOptions) -> dict[str, Any]:
    """BenchOptions as JSON-able data."""
    out = asdict(opts)
    out["trace"] = str(opts.trace) if opts.trace else None
    return out


# -- order ------------------------------------------------------------------------------------------

def fingerprints(plan: Plan) -> dict[str, str]:
    """Each service's name -> what `up` compares to decide a restart: its rendered run and files hashes."""
    from primectl.render.bundle import render_plan

    return {name: f"{host}/{svc['hash']}/{svc['files_hash']}" for host, bundle in render_plan(plan).items()
            for name, svc in bundle.services.items()}


def restarts(a: Plan | dict[str, str], b: Plan | dict[str, str]) -> list[str]:
    """Services that going from deployment `a` to `b` starts or restarts (changed or new in b)."""
    have = a if isinstance(a, dict) else fingerprints(a)
    want = b if isinstance(b, dict) else fingerprints(b)
    return sorted(name for name, fp in want.items() if have.get(name) != fp)


def order(plans: dict[str, Plan], start: Plan) -> tuple[list[str], dict[str, list[str]]]:
    """The variant order with the fewest restarts from `start` (the base), and what each step restarts."""
    ids = list(plans)
    fps = {vid: fingerprints(p) for vid, p in plans.items()}
    fps[""] = fingerprints(start)
    cost: dict[tuple[str, str], int] = {}

    def c(a: str | None, b: str) -> int:
        key = (a or "", b)
        if key not in cost:
            cost[key] = len(restarts(fps[key[0]], fps[b]))
        return cost[key]

    if len(ids) <= EXACT_ORDER_MAX:
        best = min(itertools.permutations(ids),
                   key=lambda seq: (sum(c(p, n) for p, n in zip((None, *seq[:-1]), seq, strict=True)), seq))
        seq = list(best)
    else:  # greedy nearest neighbour, ties broken by variant id
        seq, left, prev = [], set(ids), None
        while left:
            nxt = min(sorted(left), key=lambda n, prev=prev: c(prev, n))  # type: ignore[misc]
            seq.append(nxt)
            left.discard(nxt)
            prev = nxt
    steps = {n: restarts(fps[p or ""], fps[n]) for p, n in zip((None, *seq[:-1]), seq, strict=True)}
    return seq, steps


# -- state ------------------------------------------------------------------------------------------

@dataclass
class Sweep:
    """A sweep on disk: its directory, its state document and its variants' plans."""

    root: Path
    state: dict[str, Any]
    plans: dict[str, Plan]

    @property
    def spec(self) -> SweepSpec:
        return SweepSpec(**self.state["spec"])

    def save(self) -> None:
        tmp = self.root / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=2, default=str) + "\n")
        tmp.replace(self.root / STATE)

    def variant(self, vid: str) -> dict[str, Any]:
        return next(v for v in self.state["variants"] if v["id"] == vid)

    def result(self, vid: str) -> dict[str, Any]:
        out: dict[str, Any] = self.state["results"].setdefault(vid, {"repeats": [], "deploys": []})
        return out


def prepare(base: Path, axes: list[Axis], spec: SweepSpec, root: Path) -> Sweep:
    """Validate and plan every variant (RecipeError naming each bad one) and choose the order; nothing deploys.

    The variants' recipe files go to `root`/variants; the caller removes `root` if they are refused.
    """
    from primectl.bench.variants import combine
    from primectl.planner.build import plan_recipe

    parse_sla(spec.sla)
    base_plan = plan_recipe(base)[1]  # a bad base is refused as itself, before any variant
    variants = combine(axes)
    plans = materialise(variants, base, root / "variants")
    seq, steps = order(plans, base_plan)
    state: dict[str, Any] = {
        "tool": "primectl sweep", "started_utc": utc_stamp(), "status": "planned", "deployment": base_plan.name,
        "spec": asdict(spec), "axes": [{"name": a.name, "source": a.source, "sets": [dict(s) for s in a.sets]}
                                       for a in axes],
        "variants": [{**v.to_json(), "gpus": gpu_slots(plans[v.id])[0], "gpu_basis": gpu_slots(plans[v.id])[1]}
                     for v in variants],
        "order": seq, "restarts": steps, "results": {}, "time": {"deploy_s": 0.0, "measure_s": 0.0},
    }
    return Sweep(root, state, plans)


def load(root: Path) -> Sweep:
    """A sweep directory for `--resume`: its state, and its variants planned again (refused if any changed)."""
    from primectl.planner.build import plan_recipe

    path = root / STATE
    if not path.is_file():
        raise RecipeError([Problem(str(path), 0, 0, "--resume", "no sweep.json here: not a sweep directory")])
    state = json.loads(path.read_text())
    plans: dict[str, Plan] = {}
    changed = []
    for v in state["variants"]:
        plans[v["id"]] = plan_recipe(Path(v["file"]))[1]
        if plan_hash(plans[v["id"]]) != v["plan_hash"]:
            changed.append(f"{v['id']} ({v['label']})")
    if changed:
        raise RecipeError([Problem(str(path), 0, 0, "--resume",
                                   f"the base recipe changed since this sweep started, so these variants would not be "
                                   f"the ones measured: {', '.join(changed)}; start a new sweep")])
    return Sweep(root, state, plans)


# -- running ---------------------------------------------------------------------------------------

def run(sweep: Sweep, up_options: UpOptions, say: Say) -> Sweep:
    """Deploy, measure and report every variant not yet done; KeyboardInterrupt leaves it resumable."""
    from primectl.pipeline import up

    spec = sweep.spec
    sla = parse_sla(spec.sla)
    opts = spec.bench_options()
    sweep.state["status"] = "running"
    sweep.save()
    try:
        for vid in sweep.state["order"]:
            res = sweep.result(vid)
            v = sweep.variant(vid)
            if res.get("failed"):
                continue
            if len(res["repeats"]) >= spec.repeat:
                if spec.predict and "prediction" not in res:  # interrupted after measuring, before predicting
                    res["prediction"] = _predict(sweep.plans[vid], opts, res, say)
                    sweep.save()
                continue
            plan = sweep.plans[vid]
            say(f"sweep: {vid} ({v['label']}): deploying")
            t0 = time.monotonic()
            try:
                out = up(plan, _up_options(up_options, v["file"], spec), say)
            except Interrupted:
                raise KeyboardInterrupt from None
            except DeployError as exc:
                sweep.state["time"]["deploy_s"] += time.monotonic() - t0
                res["failed"] = {"error": str(exc), "service": exc.service, "log_tail": exc.log_tail[-2000:]}
                say(f"sweep: {vid} failed to deploy ({exc}); the deployment is on its last good revision; next variant")
                sweep.save()
                continue
            spent = time.monotonic() - t0
            sweep.state["time"]["deploy_s"] += spent
            res["deploys"].append({"seconds": round(spent, 1), "started": out.started})
            while len(res["repeats"]) < spec.repeat:
                i = len(res["repeats"]) + 1
                rdir = sweep.root / vid / f"r{i}"
                shutil.rmtree(rdir, ignore_errors=True)  # an interrupted repeat starts over
                say(f"sweep: {vid} repeat {i}/{spec.repeat}: SLA {sla} knee search")
                t1 = time.monotonic()
                knee = run_knee(plan, opts, sla, recipe=v["file"], low=spec.low, max_runs=spec.max_runs, root=rdir,
                                say=say)
                sweep.state["time"]["measure_s"] += time.monotonic() - t1
                res["repeats"].append(repeat_record(i, knee))
                sweep.save()
            if spec.predict:
                res["prediction"] = _predict(plan, opts, res, say)
                sweep.save()
    except KeyboardInterrupt:
        sweep.state["status"] = "interrupted"
        sweep.save()
        raise
    finish(sweep, sla)
    return sweep


def _up_options(base: UpOptions, recipe_file: str, spec: SweepSpec) -> UpOptions:
    from dataclasses import replace

    return replace(base, recipe_file=recipe_file, preflight=spec.preflight, smoke=spec.smoke)


def repeat_record(index: int, knee: Any) -> dict[str, Any]:
    """One knee search as sweep.json keeps it: the knee, its figures, and every probe (valid or not)."""
    probes = []
    for p in knee.result.probes:
        r = knee.runs[p.concurrency]
        f = r.summary.get("figures") or {}
        probes.append({"concurrency": p.concurrency, "value": p.value, "passed": p.passed, "valid": r.valid,
                       "invalid_reasons": r.summary.get("invalid_reasons", []), "run_dir": str(r.run_dir),
                       "overloaded": r.summary.get("overloaded"),
                       **{k: f.get(k) for k in report.FIGURES}})
    return {"index": index, "knee": knee.result.knee, "first_fail": knee.result.first_fail,
            "resolved": knee.result.resolved, "run_dir": str(knee.run_dir),
            "knee_figures": knee.report.get("knee_summary"), "probes": probes}


def _predict(plan: Plan, opts: BenchOptions, res: dict[str, Any], say: Say) -> dict[str, Any]:
    """aiconfigurator's prediction at the measured knee (at the top of the range when there is none)."""
    from primectl.bench.predict import predict

    knees = [r["knee"] for r in res["repeats"] if r["knee"] is not None]
    at = round(sum(knees) / len(knees)) if knees else opts.concurrency
    p = predict(plan, workload=opts.workload, concurrency=at, say=say)
    return {"concurrency": at, **p.to_json()}


def finish(sweep: Sweep, sla: SLA) -> None:
    """Aggregate, pick the winner, write sweep.md, frontier.png and winner.yaml; record predictor accuracy."""
    rows = report.aggregate(sweep.state, sweep.plans)
    sweep.state["summary"] = rows
    sweep.state["winner"] = report.winner(rows)
    runs_root = sweep.root.parent
    if sweep.spec.predict:
        sweep.state["predictor"] = report.record_accuracy(sweep.state, rows, sweep.plans, runs_root)
    sweep.state["plots"] = report.frontier(sweep.state, rows, sla, sweep.root / "frontier.png")
    w = sweep.state["winner"]
    if w.get("id"):
        report.write_winner(sweep.root / "winner.yaml", sweep.state, w)
    sweep.state["status"] = "done"
    (sweep.root / "sweep.md").write_text(report.markdown(sweep.state, rows, sla))
    sweep.save()

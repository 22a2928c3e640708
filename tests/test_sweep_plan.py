"""`primectl sweep` before anything runs: variants, derived counts, validation, order, the winner rule.

No cluster: every variant is written out and planned exactly as `sweep` does (and `--dry-run` shows).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from primectl.bench.sweep import SweepSpec, load, order, prepare, restarts
from primectl.bench.sweep_report import winner
from primectl.bench.variants import combine, materialise, parse_variant, parse_vary, read_sweep_file, scalar
from primectl.errors import RecipeError
from primectl.planner.build import plan_recipe
from tests.conftest import REPO, CliResult

GLM = REPO / "recipes" / "glm53.yaml"
DEMO = REPO / "recipes" / "demo.yaml"
REFERENCE = REPO / "sweeps" / "glm53-reference.yaml"


def counts(path: Path) -> tuple[int, int, str | None]:
    r = plan_recipe(path)[0].recipe
    return r.prefill.groups, r.decode.workers, r.ratio


def test_values_are_typed_like_yaml_but_a_ratio_stays_a_ratio() -> None:
    assert scalar("2") == 2 and scalar("0.5") == 0.5 and scalar("TP4") == "TP4" and scalar("true") is True
    assert scalar("1:4") == "1:4"  # YAML 1.1 would read 64
    axis = parse_vary("decode.workers=1,2,3")
    assert [dict(s) for s in axis.sets] == [{"decode.workers": 1}, {"decode.workers": 2}, {"decode.workers": 3}]
    assert dict(parse_variant("decode.parallel=TP8,decode.dcp=4")) == {"decode.parallel": "TP8", "decode.dcp": 4}


@pytest.mark.parametrize("arg, says", [
    ("decode.workers", "expected PATH=VALUE"),
    ("hosts=a,b", "`hosts` cannot be varied"),
    ("name=x", "`name` cannot be varied"),
    ("decode..workers=1", "dotted field names"),
])
def test_bad_vary_is_refused_with_the_argument_named(arg: str, says: str) -> None:
    with pytest.raises(RecipeError) as exc:
        parse_vary(arg)
    assert says in str(exc.value) and f"--vary {arg}" in str(exc.value)


def test_ratio_derives_the_counts_the_rack_can_place(tmp_path: Path) -> None:
    vs = combine([parse_vary("ratio=1:2,1:3,1:4,1:5,1:6")])
    plans = materialise(vs, GLM, tmp_path)
    got = {v.overrides["ratio"]: (v.derived["prefill.groups"], v.derived["decode.workers"], plans[v.id].capacity.gpus_used)
           for v in vs}
    # DEP8 prefill = 8 GPUs, TP4 decode = 4 GPUs, 72 GPUs: the most groups that fit in steps of the ratio.
    assert got == {"1:2": (4, 8, 64), "1:3": (3, 9, 60), "1:4": (3, 12, 72), "1:5": (2, 10, 56), "1:6": (2, 12, 64)}
    assert counts(vs[2].file) == (3, 12, "1:4")  # the reference deployment's own counts
    assert "the most groups the planner could place" in vs[0].file.read_text()


def test_a_parallel_spec_change_rederives_the_counts_at_the_base_ratio(tmp_path: Path) -> None:
    vs = combine([parse_vary("prefill.parallel=DEP8,DEP16,TEP8")])
    materialise(vs, GLM, tmp_path)
    assert [counts(v.file) for v in vs] == [(3, 12, "1:4"), (2, 8, "1:4"), (3, 12, "1:4")]
    # TP8 + DCP4 decode at 1:2 lands on the hand-written reference recipe's counts.
    tp8 = combine([parse_vary("ratio=1:2"), parse_vary("decode.parallel=TP8"), parse_vary("decode.dcp=4")])
    materialise(tp8, GLM, tmp_path / "tp8")
    assert counts(tp8[0].file)[:2] == counts(REPO / "recipes" / "glm53-tp8-dcp4.yaml")[:2] == (3, 6)


def test_explicit_counts_rewrite_the_ratio_and_cpu_hosts_keep_the_base_groups(tmp_path: Path) -> None:
    vs = combine([parse_vary("decode.workers=1,3")])
    materialise(vs, DEMO, tmp_path / "a")
    assert [counts(v.file) for v in vs] == [(1, 1, "1:1"), (1, 3, "1:3")]
    rs = combine([parse_vary("ratio=1:1,1:3")])
    materialise(rs, DEMO, tmp_path / "b")
    assert [counts(v.file) for v in rs] == [(1, 1, "1:1"), (1, 3, "1:3")]
    assert "hosts without GPUs" in rs[0].notes[0]


def test_every_reference_axis_combination_plans_and_renders_for_every_target(tmp_path: Path) -> None:
    axes = read_sweep_file(REFERENCE)
    assert [a.name for a in axes] == ["prefill.parallel", "decode", "prefill.token_budget_per_gpu", "ratio"]
    vs = combine(axes)
    assert len(vs) == 3 * 3 * 2 * 5
    plans = materialise(vs, GLM, tmp_path)
    from primectl.render.bundle import render_plan
    from primectl.targets.base import get

    seen: set[tuple[str, str]] = set()
    for v in vs:
        plan = plans[v.id]
        assert render_plan(plan), v.label  # ssh bundles for every variant
        for key in (("prefill", plan.capacity.prefill.parallel), ("decode", plan.capacity.decode.parallel)):
            if key in seen:
                continue
            seen.add(key)
            for target in ("slurm", "kubernetes"):
                assert get(target).render(plan_recipe(v.file, target=target)[1]), (v.label, target)
    assert {p for role, p in seen if role == "prefill"} == {"DEP8", "DEP16", "TEP8"}
    assert {p for role, p in seen if role == "decode"} == {"TP4", "TP8", "DEP8"}
    dcp = [v for v in vs if v.overrides.get("decode.dcp") == 4]
    assert dcp and all("--decode-context-parallel-size" in " ".join(
        s.argv) for v in dcp[:1] for s in plans[v.id].services if s.role == "decode")
    assert {plans[v.id].serving.prefill_budget for v in vs} == {8192, 4096}


def test_an_invalid_variant_is_refused_with_its_file_line_and_field(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    r = cli("sweep", DEMO, "--vary", "decode.max_num_seqs=16,-1", "--sla", "ttft_p90_ms<=800", "--runs-dir", tmp_path)
    assert r.exit_code == 2
    (line,) = [p for p in r.problems() if "v02" in p]
    assert "variants/v02.yaml:" in line and "decode.max_num_seqs" in line and "greater than" in line
    assert not list(tmp_path.iterdir()), "a refused sweep leaves nothing behind"
    r = cli("sweep", DEMO, "--vary", "decode.wrokers=2", "--sla", "ttft_p90_ms<=800", "--runs-dir", tmp_path)
    assert r.exit_code == 2 and "did you mean `workers`" in r.stderr
    r = cli("sweep", GLM, "--vary", "prefill.parallel=DEP64", "--sla", "ttft_p90_ms<=800", "--dry-run")
    assert r.exit_code == 2 and "does not fit these hosts even once" in r.stderr
    r = cli("sweep", DEMO, "--vary", "decode.workers=2", "--sla", "ttft<=8")
    assert r.exit_code == 2 and "unknown SLA metric" in r.stdout + r.stderr


def test_dry_run_shows_variants_and_the_order_that_restarts_least(cli: Callable[..., CliResult]) -> None:
    r = cli("sweep", DEMO, "--vary", "decode.workers=1,2,3", "--vary", "prefill.token_budget_per_gpu=2048,4096",
            "--sla", "ttft_p90_ms<=800", "--dry-run")
    assert r.exit_code == 0, r.stderr
    assert "6 variants" in r.stdout and "v04  decode.workers=2, prefill.token_budget_per_gpu=4096" in r.stdout
    order_line = next(x for x in r.stdout.splitlines() if x.startswith("order"))
    assert order_line.split(": ", 1)[1].startswith("v04 [0 restarts]")  # the base itself: nothing restarts


def test_order_keeps_prefill_settings_together_and_steps_decode_counts(tmp_path: Path) -> None:
    vs = combine([parse_vary("prefill.token_budget_per_gpu=2048,4096"), parse_vary("decode.workers=1,2,3")])
    plans = materialise(vs, DEMO, tmp_path)
    base = plan_recipe(DEMO)[1]
    seq, steps = order(plans, base)
    total = sum(len(v) for v in steps.values())
    label = {v.id: v.label for v in vs}
    budgets = [label[i].split(", ")[0] for i in seq]
    assert budgets == sorted(budgets, key=budgets.index) and len({*budgets}) == 2
    assert budgets[:3] == [budgets[0]] * 3  # one prefill restart in the whole sweep
    written_order = list(plans)
    assert total < sum(len(restarts(plans[a] if a else base, plans[b]))
                       for a, b in zip([None, *written_order[:-1]], written_order, strict=True))


def _row(vid: str, value: float | None, sd: float | None) -> dict[str, object]:
    return {"id": vid, "label": vid, "output_tok_s_per_gpu": value, "output_tok_s_per_gpu_stdev": sd}


def test_winner_needs_a_margin_beyond_twice_the_spread() -> None:
    assert winner([_row("a", 100, 2), _row("b", 90, 3)])["id"] == "a"
    tie = winner([_row("a", 100, 6), _row("b", 90, 5)])
    assert tie["id"] is None and tie["verdict"].startswith("no winner: within noise") and tie["best"] == "a"
    one = winner([_row("a", 100, None), _row("b", 90, None)])
    assert one["id"] == "a" and "not checked against noise" in one["verdict"]
    assert winner([_row("a", None, None)])["verdict"] == "no winner: no variant met the SLA"
    assert winner([_row("a", 5, None), _row("b", None, None)])["verdict"] == "winner: the only variant that met the SLA"


def test_resume_refuses_a_sweep_whose_base_changed(tmp_path: Path) -> None:
    base = tmp_path / "demo.yaml"
    base.write_text(DEMO.read_text())
    root = tmp_path / "sw"
    sw = prepare(base, [parse_vary("decode.workers=1,2")], SweepSpec(base=str(base), sla="ttft_p90_ms<=800"), root)
    sw.save()
    assert load(root).state["order"] == sw.state["order"]
    doc = yaml.safe_load(base.read_text())
    doc["decode"]["max_num_seqs"] = 32
    base.write_text(yaml.safe_dump(doc))
    with pytest.raises(RecipeError) as exc:
        load(root)
    assert "changed since this sweep started" in str(exc.value)
    assert json.loads((root / "sweep.json").read_text())["status"] == "planned"
    assert os.path.isfile(root / "variants" / "v01.yaml")


def test_measured_over_predicted_is_recorded_and_read_back_by_a_later_sweep(tmp_path: Path) -> None:
    """The bookkeeping of `sweep --predict` (the numbers come from sweep runs; here they are given)."""
    from primectl.bench.sweep_report import aggregate, record_accuracy

    plan = plan_recipe(GLM)[1]

    def state(sweep: str, tok_s: float) -> dict[str, object]:
        knee = {"tok_s_per_user": tok_s, "output_tok_s_per_gpu": 50.0, "ttft_p90_ms": 900.0, "itl_p90_ms": 9.0,
                "ttft_p50_ms": 400.0}
        return {"variants": [{"id": "v01", "label": "ratio=1:4", "derived": {}, "gpus": 72, "gpu_basis": "GPUs",
                              "file": str(tmp_path / sweep / "variants" / "v01.yaml")}],
                "results": {"v01": {"repeats": [{"index": 1, "knee": 8, "knee_figures": knee, "probes": []}],
                                    "prediction": {"status": "predicted", "figures": {
                                        "tok_s_per_user": 40.0, "ttft_ms": 200.0, "output_tok_s_per_gpu": 25.0}}}}}

    first = state("20261201T000000Z-glm53-sweep", 80.0)
    rows = aggregate(first, {"v01": plan})
    assert rows[0]["measured_over_predicted"] == {"tok_s_per_user": 2.0, "ttft_p50_ms": 2.0, "output_tok_s_per_gpu": 2.0}
    got = record_accuracy(first, rows, {"v01": plan}, tmp_path)
    assert got["recorded"] == 1 and got["earlier"] == {}
    second = state("20261202T000000Z-glm53-sweep", 120.0)
    got = record_accuracy(second, aggregate(second, {"v01": plan}), {"v01": plan}, tmp_path)
    assert got["earlier"]["tok_s_per_user"] == {"median": 2.0, "n": 1}  # the first sweep, not this one
    lines = (tmp_path / "predictor-accuracy.jsonl").read_text().splitlines()
    assert [json.loads(x)["hardware"] for x in lines] == [plan.hardware.profile] * 2


def test_resume_predicts_a_variant_measured_before_the_interrupt_but_not_yet_predicted(tmp_path: Path) -> None:
    """Ctrl-C can land between a variant's last measurement and its prediction: `--resume` measures nothing
    again, predicts what is missing and reports every variant with its prediction."""
    from primectl.bench.sweep import run
    from primectl.deploy.cluster import ConnectionPolicy
    from primectl.pipeline import UpOptions

    base = tmp_path / "demo.yaml"
    base.write_text(DEMO.read_text())
    root = tmp_path / "sw"
    sw = prepare(base, [parse_vary("decode.workers=1,2")], SweepSpec(base=str(base), sla="ttft_p90_ms<=800",
                                                                     predict=True), root)
    knee = {"tok_s_per_user": 20.0, "output_tok_s_per_gpu": 40.0, "ttft_p90_ms": 300.0, "itl_p90_ms": 9.0,
            "ttft_p50_ms": 200.0}
    first, second = sw.state["order"]
    for vid in (first, second):
        sw.result(vid)["repeats"].append({"index": 1, "knee": 2, "knee_figures": knee, "probes": []})
    sw.result(first)["prediction"] = {"concurrency": 2, "status": "n/a", "reason": "given"}
    sw.state["status"] = "interrupted"
    sw.save()

    said: list[str] = []
    done = run(load(root), UpOptions(connection=ConnectionPolicy()), said.append)
    assert not any("deploying" in line for line in said), said  # nothing was deployed or measured again
    assert done.state["status"] == "done"
    assert done.state["results"][first]["prediction"]["reason"] == "given"  # kept, not predicted again
    assert done.state["results"][second]["prediction"]["status"] == "n/a"  # the CPU demo has no perf database
    assert all(row["prediction"]["status"] == "n/a" for row in done.state["summary"])


def test_the_sweep_table_counts_overloaded_requests_and_keeps_the_probe() -> None:
    """Issue #37: at capacity the demo answered 529 to part of the load; the sweep must say so per probe, and not
    list the probe as invalid (it is measured: it fails the SLA for being over capacity)."""
    from primectl.bench.sla import parse_sla
    from primectl.bench.sweep_report import aggregate, markdown

    plan = plan_recipe(DEMO)[1]
    knee = {"tok_s_per_user": 900.0, "output_tok_s_per_gpu": 500.0, "ttft_p90_ms": 40.0, "itl_p90_ms": 0.8}
    probes = [{"concurrency": 4, "value": 40.0, "passed": True, "valid": True, "invalid_reasons": [], "run_dir": "p1",
               "overloaded": None, "requests_completed": 700.0, "requests_overloaded": 0.0},
              {"concurrency": 8, "value": 42.0, "passed": False, "valid": True, "invalid_reasons": [], "run_dir": "p2",
               "overloaded": "overloaded: 198 of 939 requests (21.09%) answered that the deployment is at capacity",
               "requests_completed": 939.0, "requests_overloaded": 198.0}]
    state = {"variants": [{"id": "v01", "label": "decode.workers=1", "derived": {}, "gpus": 2, "gpu_basis": "CPU x",
                           "file": "v01.yaml"}],
             "results": {"v01": {"repeats": [{"index": 1, "knee": 4, "knee_figures": knee, "probes": probes}]}},
             "spec": {"base": "demo.yaml", "low": 1, "max_runs": 3, "repeat": 1, "bench": {"concurrency": 8}},
             "order": ["v01"], "restarts": {"v01": []}, "time": {"deploy_s": 10.0, "measure_s": 60.0},
             "winner": {"verdict": "winner: the only variant that met the SLA", "id": "v01", "label": "x"}}
    (row,) = aggregate(state, {"v01": plan})
    assert row["overloaded"] == ["c8: 198 of 939"] and row["invalid"] == [] and row["sessions"] == 4
    md = markdown(state, [row], parse_sla("ttft_p90_ms<=1000"))
    assert "| overloaded (requests refused at capacity) | status |" in md
    assert "| c8: 198 of 939 | measured |" in md
    assert "## Invalid runs (left out of every figure)\n\nnone\n" in md

"""`primectl predict`: a plan mapped to aiconfigurator field by field, and aiconfigurator run for real.

The mapping tests are pure. The real runs need aiconfigurator 0.12.0 in `.venv-predict` (`make
predict-tools`, which `make test` runs): outside CI its absence skips them, saying how to get it; under
CI=true it fails them. aiconfigurator runs on CPU in seconds.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from primectl.bench import predict as pr
from primectl.bench.runner import DEFAULT_SEED
from primectl.bench.workload import generate, preset
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from tests.conftest import REPO, CliResult

Cli = Callable[..., CliResult]


def _plan(name: str) -> Plan:
    return plan_recipe(REPO / "recipes" / name)[1]


def _flags(m: pr.Mapping) -> dict[str, str]:
    it = iter(m.flags)
    return dict(zip(it, it, strict=True))


def _bench_point(plan: Plan, sessions: int) -> tuple[int, int, int]:
    """isl, prefix, osl straight from the workload `bench` would generate for the plan."""
    spec = preset(plan.serving.capabilities.workload)
    wl = generate(spec, seed=DEFAULT_SEED, block_size=plan.serving.block_size,
                  sessions=max(4, spec.sessions_per_slot * sessions))
    prompts = [r.prompt_tokens for r in wl.requests]
    isl = round(sum(prompts) / len(prompts))
    prefix = round(isl * wl.stats()["theoretical_prefix_hit_rate"])
    osl = round(sum(r.output_tokens for r in wl.requests) / len(wl.requests))
    return isl, prefix, osl


def test_glm53_maps_field_by_field() -> None:
    plan = _plan("glm53.yaml")
    m = pr.map_plan(plan, concurrency=96)
    i, f = m.inputs, _flags(m)
    assert m.na == "" and m.model_candidates[0] == "GLM-5.3-NVFP4"      # model.path /models/GLM-5.3-NVFP4
    assert (i["system"], f["--system"]) == ("gb200", "gb200")           # hardware.profile gb200-nvl72 (GB200)
    assert (i["backend"], f["--backend"], i["engine_version"]) == ("vllm", "vllm", "0.31.0")
    assert f["--estimate-mode"] == "disagg"
    # prefill: DEP8 x 3 groups = attention DP 8, experts EP 8, one request per DP rank (30K new tokens > 4096 budget)
    assert i["p_parallel"] == "DEP8"
    assert [i[k] for k in ("p_tp", "p_pp", "p_dp", "p_etp", "p_ep", "p_bs", "p_workers")] == [1, 1, 8, 1, 8, 1, 3]
    assert [f[k] for k in ("--p-tp", "--p-pp", "--p-dp", "--p-etp", "--p-ep", "--p-bs", "--p-workers")] == \
        ["1", "1", "8", "1", "8", "1", "3"]
    # decode: TP4 x 12 workers = attention TP 4, experts tensor-parallel 4; 96 sessions = 8 per decoder
    assert i["d_parallel"] == "TP4" and i["d_dcp"] == 1
    assert [i[k] for k in ("d_tp", "d_pp", "d_dp", "d_etp", "d_ep", "d_bs", "d_workers")] == [4, 1, 1, 4, 1, 8, 12]
    assert [f[k] for k in ("--d-tp", "--d-pp", "--d-dp", "--d-etp", "--d-ep", "--d-workers")] == \
        ["4", "1", "1", "4", "1", "12"]
    assert "--d-bs" not in f and (m.d_bs, m.search) == (8, False)       # the driver appends --d-bs d_bs
    assert i["gpus_planned"] == 72 == plan.capacity.gpus_used
    # KV: nvfp4 is not among aiconfigurator's modes; fp8, said so
    assert (i["kv_dtype"], i["kvcache_quant_mode"], f["--kvcache-quant-mode"]) == ("nvfp4", "fp8", "fp8")
    assert any(c.startswith("NVFP4 KV not modelled") and "fp8" in c for c in m.caveats)
    assert f["--prefill-free-gpu-memory-fraction"] == f["--decode-free-gpu-memory-fraction"] == "0.92"
    # workload: the bench's agentic preset (116K first prompt, +6K per turn, 400 out, cold 140K prompts)
    isl, prefix, osl = _bench_point(plan, 96)
    assert (i["workload"], i["isl"], i["prefix"], i["osl"]) == ("agentic", isl, prefix, osl)
    assert (f["--isl"], f["--prefix"], f["--osl"]) == (str(isl), str(prefix), str(osl))
    assert 116_000 < isl < 160_000 and 0 < prefix < isl and 360 <= osl <= 440
    assert "theoretical hit rate" in i["workload_basis"] and "seed 20260" in i["workload_basis"]


def test_glm53_default_concurrency_fills_the_decoders_as_planned() -> None:
    plan = _plan("glm53.yaml")
    m = pr.map_plan(plan)
    assert plan.capacity.decode is not None
    assert (m.d_bs, m.search) == (plan.capacity.decode.sessions_in_hbm, True) == (10, True)
    assert m.inputs["concurrency"] is None and "sessions_in_hbm" in m.inputs["concurrency_basis"]


def test_concurrency_spreads_over_decode_ranks_rounding_up() -> None:
    m = pr.map_plan(_plan("glm53.yaml"), concurrency=100)
    assert m.d_bs == math.ceil(100 / 12) == 9
    assert any("concurrency 100 is modelled as 108 in flight" in c for c in m.caveats)
    with pytest.raises(ValueError, match="at least 1"):
        pr.map_plan(_plan("glm53.yaml"), concurrency=0)
    with pytest.raises(ValueError, match="unknown workload"):
        pr.map_plan(_plan("glm53.yaml"), workload="nope")


def test_tep8_prefill_maps_to_attention_tp8_experts_ep8() -> None:
    i = pr.map_plan(_plan("glm53-tep8.yaml"), concurrency=48).inputs
    assert [i[k] for k in ("p_parallel", "p_tp", "p_dp", "p_etp", "p_ep", "p_workers")] == ["TEP8", 8, 1, 1, 8, 3]
    assert [i[k] for k in ("d_parallel", "d_tp", "d_etp", "d_ep", "d_workers")] == ["TP4", 4, 4, 1, 12]


def test_tp8_dcp4_decode_maps_to_tp8_and_says_dcp_is_not_modelled() -> None:
    m = pr.map_plan(_plan("glm53-tp8-dcp4.yaml"), concurrency=48)
    i = m.inputs
    assert [i[k] for k in ("d_parallel", "d_tp", "d_dp", "d_etp", "d_ep", "d_dcp", "d_workers", "d_bs")] == \
        ["TP8", 8, 1, 8, 1, 4, 6, 8]
    assert not any("dcp" in flag or "context" in flag for flag in m.flags)   # aiconfigurator has no DCP flag
    assert any(c.startswith("decode context parallelism (dcp 4) not modelled") for c in m.caveats)


def test_parallel_specs_map_to_aiconfigurator_widths() -> None:
    assert pr.role_parallelism("DEP8") == {"tp": 1, "pp": 1, "dp": 8, "etp": 1, "ep": 8}
    assert pr.role_parallelism("TEP8") == {"tp": 8, "pp": 1, "dp": 1, "etp": 1, "ep": 8}
    assert pr.role_parallelism("TP4") == {"tp": 4, "pp": 1, "dp": 1, "etp": 4, "ep": 1}
    assert pr.role_parallelism("DP4") == {"tp": 1, "pp": 1, "dp": 4, "etp": 4, "ep": 1}


def test_tool_warnings_are_shown_with_short_paths_and_without_the_aisimulate_notice() -> None:
    msg = ("Loading low-fidelity fallback rows for x.parquet from /a/b/lib/python3.11/site-packages/"
           "aiconfigurator_core/systems/data/gb200/mla/trtllm/x.parquet. Queries ...")
    assert pr._tool_warning(msg) == ("aiconfigurator: Loading low-fidelity fallback rows for x.parquet from "
                                     "aiconfigurator_core/systems/data/gb200/mla/trtllm/x.parquet. Queries ...")
    assert pr._tool_warning("`aiconfigurator cli estimate` is deprecated ... Install `aisimulate==0.12.0`") is None


def test_demo_is_na_without_installing_anything(cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_install(say: Callable[[str], None]) -> str:
        raise AssertionError("predict tried to find or install aiconfigurator for a CPU recipe")

    monkeypatch.setattr(pr, "ensure_aiconfigurator", no_install)
    monkeypatch.setenv("PRIMECTL_PREDICT_VENV", str(tmp_path / "venv"))
    r = cli("predict", "recipes/demo.yaml")
    assert r.exit_code == 0, r.stderr
    assert "prediction (aiconfigurator 0.12.0)" in r.stdout
    assert "n/a: hardware profile cpu has no GPU" in r.stdout
    doc = json.loads(cli("predict", "recipes/demo.yaml", "-o", "json").stdout)
    assert (doc["status"], doc["figures"], doc["argv"]) == ("n/a", {}, [])
    assert not (tmp_path / "venv").exists()


def test_a_missing_tool_is_a_failed_prediction_exit_1(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMECTL_AICONFIGURATOR", "/nonexistent/aiconfigurator")
    r = cli("predict", "recipes/glm53.yaml", "--concurrency", "8", "-o", "json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["status"] == "failed" and "PRIMECTL_AICONFIGURATOR=/nonexistent/aiconfigurator" in doc["reason"]


def test_bad_input_exits_2(cli: Cli) -> None:
    r = cli("predict", "recipes/glm53.yaml", "--workload", "nope")
    assert r.exit_code == 2 and "unknown workload 'nope'" in r.stderr


@pytest.fixture
def aiconfigurator(monkeypatch: pytest.MonkeyPatch) -> str:
    """The installed aiconfigurator: absent, the test skips (outside CI) or fails (CI=true); never installed here."""
    try:
        exe = pr.find_aiconfigurator()
    except pr.AIConfiguratorMissing as exc:
        missing = f"aiconfigurator {pr.AICONFIGURATOR_VERSION} is not installed ({exc}); run `make predict-tools`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {missing}", pytrace=False)
        pytest.skip(missing)
    monkeypatch.setenv("PRIMECTL_AICONFIGURATOR", exe)
    return exe


def test_glm53_predicted_for_real_with_aiconfigurators_warnings(cli: Cli, aiconfigurator: str) -> None:
    r = cli("predict", "recipes/glm53.yaml")
    assert r.exit_code == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.startswith("prediction (aiconfigurator 0.12.0, gb200, vllm): glm53")
    assert "not measurements" in out
    figures = dict(re.findall(r"^  (ttft_ms|itl_ms|tok_s_per_user|output_tok_s_per_gpu) +([\d,.]+)$", out, re.M))
    assert sorted(figures) == ["itl_ms", "output_tok_s_per_gpu", "tok_s_per_user", "ttft_ms"], out
    assert all(float(v.replace(",", "")) > 0 for v in figures.values()), figures
    # aiconfigurator's own warnings, next to the numbers
    assert "aiconfigurator: Loading low-fidelity fallback rows for mla_context_module_perf.parquet" in out
    assert "aiconfigurator: Loading low-fidelity fallback rows for dsa_generation_module_perf.parquet" in out
    assert "primectl: NVFP4 KV not modelled" in out
    assert "aisimulate" not in out
    # the default: the decoders as full as aiconfigurator's fp8-KV memory model lets them be (the plan says 10)
    at = re.search(r"at (\d+) sessions in flight \((\d+) per decode rank\)", out)
    assert at and 1 <= int(at.group(2)) < 10 and int(at.group(1)) == 12 * int(at.group(2)), out
    assert "command: " + aiconfigurator + " cli estimate --model nvidia/GLM-5.3-NVFP4 --system gb200" in out


def test_glm53_prediction_as_json_reproduces_its_command(cli: Cli, aiconfigurator: str) -> None:
    r = cli("predict", "recipes/glm53.yaml", "--concurrency", "48", "-o", "json")
    assert r.exit_code == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "predicted" and doc["label"] == "prediction (aiconfigurator 0.12.0, gb200, vllm)"
    assert doc["tool"]["version"] == doc["tool"]["core_version"] == "0.12.0"
    assert doc["tool"]["perf_db"].startswith("vllm ")
    figs = doc["figures"]
    assert set(figs) == set(pr.FIGURES) and all(isinstance(v, float) and v > 0 for v in figs.values()), figs
    i = doc["inputs"]
    assert (i["model"], i["d_bs"], i["concurrency_modelled"], i["gpus_modelled"]) == ("nvidia/GLM-5.3-NVFP4", 4, 48, 72)
    assert i["resolved"]["(d)kvcache"].endswith("fp8")
    argv = doc["argv"]
    assert argv[:5] == [aiconfigurator, "cli", "estimate", "--model", "nvidia/GLM-5.3-NVFP4"]
    flags = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert [flags[k] for k in ("--p-dp", "--p-ep", "--p-workers", "--d-tp", "--d-etp", "--d-bs", "--d-workers")] == \
        ["8", "8", "3", "4", "4", "4", "12"]
    assert any(w.startswith("aiconfigurator: Loading low-fidelity fallback rows") for w in doc["warnings"])
    assert doc["raw"]["row"]["(p)dp"] == 8 and doc["raw"]["op_sources"]["decode"]

"""engine: vllm on hardware: cpu — the same adapter that renders GLM-5.3's GPU workers, with CPU data derived.

The numbers checked against come from a real vLLM prefill + decode pair served on this kind of machine
(docs/vllm-cpu-notes.md): VLLM_CPU_KVCACHE_SPACE=1 with block 128 gave num_gpu_blocks 8192 (1,048,576
tokens), =2 with block 64 gave 32768 (2,097,152 tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primectl.engines.vllm import cpu_kv_tokens
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.recipe.catalog import MODELS
from primectl.render.bundle import render_plan

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plan() -> Plan:
    return plan_recipe(REPO / "recipes" / "demo-vllm.yaml")[1]


def test_the_same_adapter_renders_cpu_and_gpu_workers(plan: Plan) -> None:
    gpu = plan_recipe(REPO / "recipes" / "glm53.yaml")[1]
    assert {s.component for s in plan.workers()} == {s.component for s in gpu.workers()} == {"dynamo-vllm"}


def test_cpu_workers_run_dynamo_vllm_through_the_named_bridge_on_their_own_core(plan: Plan) -> None:
    prefill, decode = plan.service("prefill-0"), plan.service("decode-0")
    for s in (prefill, decode):
        assert s.argv[1] == "@release@/bridges/dynamo_vllm_cpu_bridge.py"
        assert "-m" not in s.argv[:3]
        assert {"--enforce-eager", "--dtype"} <= set(s.argv) and "--gpu-memory-utilization" not in s.argv
        assert "CUDA_VISIBLE_DEVICES" not in s.env and "VLLM_KV_CACHE_LAYOUT" not in s.env
        assert s.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and s.env["UCX_NET_DEVICES"] == "lo"
        assert s.env["PYTHONPATH"] == "@release@/bridges"
        transfer = json.loads(s.argv[s.argv.index("--kv-transfer-config") + 1])
        nixl = transfer if transfer["kv_connector"] == "NixlConnector" else transfer["kv_connector_extra_config"]["connectors"][0]
        assert nixl["kv_buffer_device"] == "cpu"
        events = json.loads(s.argv[s.argv.index("--kv-events-config") + 1])
        assert events["endpoint"].startswith("tcp://*:")
    # one core each, never the same one
    assert {prefill.env["VLLM_CPU_OMP_THREADS_BIND"], decode.env["VLLM_CPU_OMP_THREADS_BIND"]} == {"0", "1"}


def test_caches_and_temp_files_stay_under_the_workdir(plan: Plan) -> None:
    workdir = plan.host("local").workdir
    for s in (*plan.workers(), plan.service("frontend")):
        for key in ("HOME", "XDG_CACHE_HOME", "TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
            if key in s.env:
                assert s.env[key].startswith(workdir + "/"), (s.name, key)
                assert s.env[key] in s.dirs, "the run script creates it"
    assert "TMPDIR" in plan.service("decode-0").env and "HOME" in plan.service("frontend").env


def test_every_worker_and_its_twin_share_one_compile_cache(plan: Plan) -> None:
    """The C++ that torch compiles on a worker's first request is reused by the other workers of the host, a
    restarted one and a surge twin (each has a TMPDIR of its own, where inductor would keep it otherwise)."""
    caches = {s.env["TORCHINDUCTOR_CACHE_DIR"] for w in plan.workers() for s in (w, w.twin) if s is not None}
    assert len(caches) == 1 and len({s.env["TMPDIR"] for s in plan.workers()}) == len(plan.workers())
    assert plan.service("decode-0").twin is not None


def test_the_bundle_ships_both_bridges_and_the_generated_model(plan: Plan) -> None:
    files = render_plan(plan)["local"].files
    assert {"bridges/dynamo_vllm_cpu_bridge.py", "bridges/sitecustomize.py", "model/model.safetensors",
            "model/tokenizer.json", "model/chat_template.jinja"} <= set(files)
    script = files["bin/prefill-0.sh"].decode()
    assert '"${release_dir}"/bridges/dynamo_vllm_cpu_bridge.py' in script and "mkdir -p" in script


def test_the_runtime_is_the_vllm_cpu_lock_and_pins_have_no_flashinfer(plan: Plan) -> None:
    rt = plan.serving.runtime["local"]
    assert (rt.flavour, rt.lock) == ("vllm-cpu", "runtime-requirements-vllm-cpu.txt")
    assert plan.pins["vllm"] == "0.31.0" and "flashinfer-python" not in plan.pins
    assert (REPO / "scripts" / rt.lock).exists()


@pytest.mark.parametrize(("gib", "block", "tokens"), [(1, 128, 1_048_576), (2, 64, 2_097_152), (1, 64, 1_048_576)])
def test_predicted_kv_tokens_match_what_vllm_allocated(gib: int, block: int, tokens: int) -> None:
    assert cpu_kv_tokens(MODELS["tiny-qwen2"], gib, block) == tokens


def test_the_plan_predicts_each_roles_kv_tokens(plan: Plan) -> None:
    assert plan.serving.kv_tokens_per_worker == {"prefill": 1_048_576, "decode": 1_048_576}
    caps = plan.serving.capabilities
    assert caps.tool_calls and caps.nixl_metrics and caps.reports_kv_cache and caps.workload == "agentic-tiny"
    assert caps.first_request_timeout_s >= 120


def test_the_mooncake_store_config_is_one_vllm_accepts(plan: Plan) -> None:
    files = render_plan(plan)["local"].files
    cfg = json.loads(files["config/mooncake-prefill-0.json"])
    # vLLM 0.31.0's MooncakeStoreConfig: mode "embedded" or "standalone-store"; anything else kills the worker
    assert cfg["mode"] == "embedded" and cfg["global_segment_size"] > 0 < cfg["local_buffer_size"]
    assert cfg["local_buffer_size"] <= cfg["global_segment_size"]

"""primectl/bridges/vllm_cpu_seed_bridge.py: a seeded, chunk-prefilled request must not kill a CPU engine core.

The first tests run anywhere (torch from primectl's venv, a stand-in runner whose bookkeeping is upstream's
loop). The runtime tests drive vLLM 0.31.0's own `_sample` (its CPU sampler) and `_bookkeeping_sync` in the
vllm-cpu runtime (PRIMECTL_VLLM_CPU_RUNTIME_PYTHON, or REPO/.runtime-vllm-cpu) and are skipped without it;
`test_gap_still_present_upstream` fails once vLLM no longer needs the bridge.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from primectl.bridges import vllm_cpu_seed_bridge as bridge
from primectl.bridges import worker_sitecustomize
from primectl.engines import vllm as vllm_engine
from primectl.planner.build import plan_recipe
from primectl.render.bundle import render_plan

torch = pytest.importorskip("torch")

# Importing the bridge installed its import hook into this process: take it out again.
sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, bridge._PatchAfterImport)]

REPO = Path(__file__).resolve().parents[1]
BRIDGE_DIR = REPO / "primectl" / "bridges"
LOCK = REPO / "scripts" / "runtime-requirements-vllm-cpu.txt"


def _runtime() -> Path | None:
    env = os.environ.get("PRIMECTL_VLLM_CPU_RUNTIME_PYTHON")
    candidate = Path(env) if env else REPO / ".runtime-vllm-cpu" / "bin" / "python"
    return candidate if candidate.exists() else None


RUNTIME = _runtime()
needs_runtime = pytest.mark.skipif(RUNTIME is None, reason="no vllm-cpu runtime (make runtime-vllm-cpu)")


# --- a stand-in for GPUModelRunner: the CPU sampler's draw and upstream's rewind loop, verbatim -------------

class Runner:
    VOCAB = 1088

    def __init__(self, gen: Any) -> None:
        self.input_batch = SimpleNamespace(num_reqs=1, generators={0: gen})
        self.discard_request_mask = SimpleNamespace(np=np.zeros(1, dtype=bool))
        self.sampling_generators = self.input_batch.generators  # SamplingMetadata holds the batch's dict

    def _sample(self, logits: Any, spec_decode_metadata: Any) -> int:
        # TopKTopPSampler.forward_cpu: exponential noise per row, the row's own generator when it has one
        q = torch.empty_like(logits).exponential_()
        for i, gen in self.sampling_generators.items():
            q[i].exponential_(generator=gen)
        return int(logits.softmax(-1).div(q).argmax(-1)[0])

    def _bookkeeping_sync(self, *args: Any) -> None:
        # vllm 0.31.0 gpu_model_runner.py:3694-3701
        num_reqs = self.input_batch.num_reqs
        discard_sampled_tokens_req_indices = np.nonzero(self.discard_request_mask.np[:num_reqs])[0]
        for i in discard_sampled_tokens_req_indices:
            gen = self.input_batch.generators.get(int(i))
            if gen is not None:
                gen.set_offset(gen.get_offset() - 4)


def _module() -> ModuleType:
    mod = ModuleType(bridge.GAP_MODULE)
    mod.GPUModelRunner = type("GPUModelRunner", (Runner,), {})  # type: ignore[attr-defined]
    return mod


def _generate(cls: type[Runner], chunks_before: int, seed: int = 42) -> list[int]:
    """A seeded request: `chunks_before` prompt chunks whose token is discarded, then 4 kept tokens."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    r = cls(gen)
    logits = torch.linspace(-1, 1, Runner.VOCAB).unsqueeze(0)
    out = []
    for discard in [True] * chunks_before + [False] * 4:
        r.discard_request_mask.np[0] = discard
        token = r._sample(logits, None)
        r._bookkeeping_sync()
        if not discard:
            out.append(token)
    assert r.input_batch.generators == {0: gen}  # the batch's own dict is back
    return out


def test_without_the_bridge_a_chunked_seeded_request_raises_the_engine_killing_error() -> None:
    cls = _module().GPUModelRunner
    assert _generate(cls, 0)  # a prompt that fits the token budget: no discarded row, no rewind
    with pytest.raises(RuntimeError, match="CPU Generator does not use offset"):
        _generate(cls, 1)


def test_with_the_bridge_it_is_served_and_the_output_does_not_depend_on_the_chunking() -> None:
    mod = _module()
    assert bridge.patch(mod)
    cls = mod.GPUModelRunner
    unchunked = _generate(cls, 0)
    assert _generate(cls, 1) == _generate(cls, 3) == unchunked
    assert _generate(cls, 2, seed=7) == _generate(cls, 0, seed=7) != unchunked


def test_patch_is_idempotent_and_leaves_offset_generators_to_upstream() -> None:
    mod = _module()
    assert bridge.patch(mod) and bridge.patch(mod)
    cls = mod.GPUModelRunner
    assert getattr(getattr(cls._sample, bridge.MARK), bridge.MARK, None) is None  # wrapped once

    class Philox:  # what a CUDA generator offers: (seed, offset), no CPU device
        device = SimpleNamespace(type="cuda")

        def __init__(self) -> None:
            self.offset = 8

        def get_offset(self) -> int:
            return self.offset

        def set_offset(self, offset: int) -> None:
            self.offset = offset

    gen = Philox()
    r = cls(gen)
    r.discard_request_mask.np[0] = True
    r._bookkeeping_sync()
    assert gen.offset == 4  # upstream's rewind still runs for it
    assert not bridge.patch(ModuleType("other"))


def test_finder_claims_only_the_runner_module() -> None:
    finder = bridge._PatchAfterImport()
    for other in ("json", "vllm", "vllm.v1.worker.cpu_model_runner", "nixl_cu12._api"):
        assert finder.find_spec(other, None) is None


def test_bridges_are_standard_library_only() -> None:
    """They run in the runtime venv, which has no primectl, and in processes that never import torch."""
    for name in ("vllm_cpu_seed_bridge.py", "worker_sitecustomize.py"):
        tree = ast.parse((BRIDGE_DIR / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert imported - {"__future__"} <= set(sys.stdlib_module_names), name


def test_lock_still_pins_the_versions_the_gap_was_found_in() -> None:
    pins = dict(line.split("==", 1) for line in LOCK.read_text().splitlines() if "==" in line and not line.startswith("#"))
    assert {k: pins.get(k) for k in bridge.CHECKED_AGAINST} == bridge.CHECKED_AGAINST, (
        "the vllm-cpu lock moved: run the runtime tests in this file and drop the bridge if "
        "test_gap_still_present_upstream fails")


def test_cpu_workers_ship_the_bridge_and_load_it_in_every_process(tmp_path: Path) -> None:
    """bridges/sitecustomize.py is worker_sitecustomize.py and every bridge it names ships beside it."""
    files = render_plan(plan_recipe(REPO / "recipes" / "demo-vllm.yaml")[1])["local"].files
    assert files[vllm_engine.NIXL_BRIDGE].decode() == (BRIDGE_DIR / "worker_sitecustomize.py").read_text()
    names = [n.removesuffix(".py") for n in vllm_engine.WORKER_BRIDGES]
    assert names == list(worker_sitecustomize.WORKER_BRIDGES) and "vllm_cpu_seed_bridge" in names
    for n in names:
        assert files[f"bridges/{n}.py"].decode() == (BRIDGE_DIR / f"{n}.py").read_text()
        (tmp_path / f"{n}.py").write_bytes(files[f"bridges/{n}.py"])
    (tmp_path / "sitecustomize.py").write_bytes(files[vllm_engine.NIXL_BRIDGE])
    # a fresh interpreter with the worker's PYTHONPATH, as vLLM's spawned EngineCore is
    probe = "import json, sys; print(json.dumps(sorted(m for m in sys.modules if m.endswith('_bridge'))))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert json.loads(r.stdout) == sorted(names)


# --- vLLM 0.31.0's own code in the vllm-cpu runtime ----------------------------------------------------------

PROBE = textwrap.dedent("""
    import inspect, json, sys
    from types import SimpleNamespace
    if sys.argv[2] == "bridged":
        sys.path.insert(0, sys.argv[1])
        import vllm_cpu_seed_bridge  # what bridges/sitecustomize.py does at interpreter start
    import numpy as np
    import torch
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.logits_processor import LogitsProcessors

    class PastTheRewind(Exception):
        pass

    class ReqIds(list):
        def copy(self):  # the first thing _bookkeeping_sync touches after its rewind loop
            raise PastTheRewind

    def runner(gen):
        r = object.__new__(CPUModelRunner)  # only what _sample and the rewind read
        r.sampler = Sampler()
        r.use_async_scheduling = False
        gens = {0: gen}
        b = SimpleNamespace(num_reqs=1, generators=gens, req_ids=ReqIds(["r"]),
                            update_async_output_token_ids=lambda: None)
        b.sampling_metadata = SamplingMetadata(
            temperature=torch.tensor([1.0]), all_greedy=False, all_random=True, top_p=None, top_k=None,
            generators=gens, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
            frequency_penalties=torch.zeros(1), presence_penalties=torch.zeros(1),
            repetition_penalties=torch.ones(1), output_token_ids=[[]], allowed_token_ids_mask=None,
            bad_words_token_ids={}, logitsprocs=LogitsProcessors())
        r.input_batch = b
        r.discard_request_mask = SimpleNamespace(np=np.zeros(1, dtype=bool))
        return r

    torch.manual_seed(0)
    logits = torch.randn(1, 1088)

    def generate(chunks_before, seed=42):
        gen = torch.Generator(device="cpu")
        gen.manual_seed(seed)
        r = runner(gen)
        out = []
        for discard in [True] * chunks_before + [False] * 4:
            r.discard_request_mask.np[0] = discard
            s = r._sample(logits.clone(), None)
            try:
                r._bookkeeping_sync(None, s, logits, None, 1)
            except PastTheRewind:
                pass
            if not discard:
                out.append(int(s.sampled_token_ids[0, 0]))
        return out

    res = {"overrides": [n for n in ("_sample", "_bookkeeping_sync") if n in vars(CPUModelRunner)],
           "rewind_in_source": "gen.set_offset(gen.get_offset() - 4)" in inspect.getsource(
               GPUModelRunner._bookkeeping_sync)}
    for key, chunks, seed in (("chunks0", 0, 42), ("chunks1", 1, 42), ("chunks3", 3, 42),
                              ("seed7_chunks2", 2, 7), ("seed7", 0, 7)):
        try:
            res[key] = generate(chunks, seed)
        except Exception as e:
            res[key] = f"{type(e).__name__}: {e}"
    print("PROBE " + json.dumps(res))
""")


def _probe(mode: str) -> dict[str, Any]:
    assert RUNTIME is not None
    r = subprocess.run([str(RUNTIME), "-c", PROBE, str(BRIDGE_DIR), mode], capture_output=True, text=True,
                       timeout=300, cwd="/", env={**os.environ, "VLLM_NO_USAGE_STATS": "1"})
    line = next((x for x in r.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, f"probe failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(line[len("PROBE "):])
    return result


@needs_runtime
def test_gap_still_present_upstream() -> None:
    """Fails once vLLM's CPU runner survives a chunked seeded request by itself: then delete the bridge."""
    plain = _probe("plain")
    assert plain["overrides"] == [] and plain["rewind_in_source"]
    assert isinstance(plain["chunks0"], list)
    assert plain["chunks1"] == plain["chunks3"] == "RuntimeError: CPU Generator does not use offset", (
        "vLLM's bookkeeping no longer fails on a CPU generator: check whether vllm_cpu_seed_bridge is still "
        "needed and remove it if not")


@needs_runtime
def test_bridged_vllm_serves_it_with_the_same_tokens_however_the_prompt_was_chunked() -> None:
    bridged = _probe("bridged")
    assert isinstance(bridged["chunks0"], list) and len(bridged["chunks0"]) == 4
    assert bridged["chunks1"] == bridged["chunks3"] == bridged["chunks0"]
    assert bridged["seed7_chunks2"] == bridged["seed7"] != bridged["chunks0"]

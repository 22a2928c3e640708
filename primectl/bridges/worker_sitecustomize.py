"""Shipped as a CPU worker's ``bridges/sitecustomize.py``: loads the bridges that must act in every Python process.

The worker's PYTHONPATH is ``@release@/bridges``, so Python's ``site`` imports this at the start of the worker
and of every process vLLM spawns from it (EngineCore and its workers), before any of their code runs. Each
bridge named here is a sibling module in that directory that installs itself on import and says which
upstream gap it covers. A bridge that fails to import must not stop the worker: the failure is reported on
stderr and the others still load.
"""

from __future__ import annotations

import importlib
import sys

#: NIXL progress-thread delay; seeded requests with chunked prefill on vLLM's CPU model runner.
WORKER_BRIDGES = ("nixl_progress_bridge", "vllm_cpu_seed_bridge")


def load() -> list[str]:
    """Import every bridge in WORKER_BRIDGES; the names that loaded."""
    loaded = []
    for name in WORKER_BRIDGES:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a broken bridge must not take the worker down
            print(f"primectl bridges: {name} not loaded: {type(exc).__name__}: {exc}", file=sys.stderr)
        else:
            loaded.append(name)
    return loaded


load()

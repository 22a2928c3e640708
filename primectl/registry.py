"""Which engines and targets primectl knows, by the name a recipe uses.

This module is a leaf: it names implementations by import path and loads them
on first use, so the recipe schema can list the choices without importing the
implementations (which themselves import the recipe model).

Adding an engine: write `primectl/engines/<name>.py` with a class satisfying
`primectl.engines.base.Engine`, and add one line to ENGINES. Adding a target:
write `primectl/targets/<name>.py` satisfying `primectl.targets.base.Target`
and add one line to TARGETS.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

ENGINES: dict[str, str] = {
    "vllm": "primectl.engines.vllm:VllmEngine",
    "mocker": "primectl.engines.mocker:MockerEngine",
}

TARGETS: dict[str, str] = {
    "ssh": "primectl.targets.ssh:SSHTarget",
    "kubernetes": "primectl.targets.kubernetes:KubernetesTarget",
    "slurm": "primectl.targets.slurm:SlurmTarget",
}


@cache
def _load(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)()


def engine(name: str) -> Any:
    """The engine registered as `name` (KeyError if none); typed as `Engine` by `primectl.engines.base.get`."""
    return _load(ENGINES[name])


def target(name: str) -> Any:
    """The target registered as `name` (KeyError if none); typed by `primectl.targets.base.get`."""
    return _load(TARGETS[name])

"""Check `extra_args` against the flag catalogs of the pinned engine versions.

The catalogs under `data/` are generated from each component's own argument
parser by `scripts/gen_flag_catalog.py`; an unknown flag is an error with a
suggestion, and a flag primectl already derives from the recipe is refused
with the recipe field to set instead.
"""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

from primectl.recipe.load import Finding, did_you_mean
from primectl.recipe.model import Recipe

CATALOGS = {
    "vllm": ("vllm-0.33.0.json", "dynamo-vllm-1.6.1.json"),
    "mocker": ("dynamo-mocker-1.6.1.json",),
}

# Flags the adapters set from recipe fields: name -> the field to use instead.
MANAGED = {
    "--model": "model.path", "--model-path": "model.path", "--served-model-name": "model.served_name",
    "--model-name": "model.served_name", "--disaggregation-mode": "(role)",
    "--tensor-parallel-size": "parallel", "--data-parallel-size": "parallel",
    "--data-parallel-size-local": "parallel", "--data-parallel-start-rank": "parallel",
    "--data-parallel-address": "parallel", "--enable-expert-parallel": "parallel",
    "--kv-cache-dtype": "kv.dtype", "--block-size": "kv.block_size",
    "--max-num-batched-tokens": "token_budget_per_gpu", "--max-num-seqs": "max_num_seqs",
    "--gpu-memory-utilization": "gpu_memory_utilization", "--max-model-len": "model.max_context",
    "--kv-transfer-config": "transfer / host_tier", "--kv-events-config": "frontend.kv_events",
    "--dyn-tool-call-parser": "tool_calling.tool_call_parser", "--dyn-reasoning-parser": "tool_calling.reasoning_parser",
    "--reasoning-parser": "tool_calling.reasoning_parser",
    "--structured-outputs-config": "tool_calling.structured_backend",
}


@cache
def catalog(engine: str) -> dict[str, dict[str, Any]]:
    """Every flag the engine's pinned command line accepts, with whether it takes a value."""
    flags: dict[str, dict[str, Any]] = {}
    for name in CATALOGS[engine]:
        data = json.loads(files("primectl.recipe").joinpath(f"data/{name}").read_text())
        flags.update(data["flags"])
    return flags


def check_extra_args(r: Recipe) -> list[Finding]:
    """Findings for unknown, managed or malformed flags in prefill/decode extra_args."""
    out: list[Finding] = []
    if not (r.prefill.extra_args or r.decode.extra_args):
        return out
    known = catalog(r.engine)
    for role in ("prefill", "decode"):
        args = getattr(r, role).extra_args
        i = 0
        while i < len(args):
            token = args[i]
            path = (role, "extra_args", i)
            if not token.startswith("-"):
                out.append(Finding(path, f"{token!r} is not a flag and follows no flag that takes a value"))
                i += 1
                continue
            name, has_inline, value = token.partition("=")
            if name in MANAGED:
                out.append(Finding(path, f"{name} is set by primectl from `{MANAGED[name]}`; set it there"))
            elif name not in known:
                out.append(Finding(path, f"unknown {r.engine} flag {name}{did_you_mean(name, list(known))} "
                                   f"(checked against the pinned {r.engine} flag catalog)"))
                i += 1
                continue
            spec = known.get(name, {})
            if spec.get("takes_value") and not has_inline:
                if i + 1 >= len(args):
                    out.append(Finding(path, f"{name} needs a value"))
                    break
                value = args[i + 1]
                i += 1
            choices = spec.get("choices")
            if choices and spec.get("takes_value") and value not in [str(c) for c in choices]:
                out.append(Finding(path, f"{value!r} is not allowed for {name}; allowed: {', '.join(map(str, choices))}"))
            i += 1
    return out

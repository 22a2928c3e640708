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
    "vllm": ("vllm-0.31.0.json", "dynamo-vllm-1.6.1.json"),
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


def _canonical(name: str) -> str:
    """vLLM accepts `--max_num_seqs` and `--compilation-config.mode`; look both up as the base flag."""
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def _value_count(spec: dict[str, Any], following: list[str]) -> tuple[int, str | None]:
    """How many of `following` the flag consumes (argparse nargs), and an error if too few."""
    if not spec.get("takes_value"):
        return 0, None
    values = 0
    for token in following:
        if token.startswith("-") and not _is_number(token):
            break
        values += 1
    nargs = spec.get("nargs")
    if nargs in (None, 1):
        return (1, None) if values >= 1 else (0, "needs a value")
    if nargs == "?":
        return min(values, 1), None
    if nargs == "*":
        return values, None
    if nargs == "+":
        return (values, None) if values else (0, "needs at least one value")
    if isinstance(nargs, int):
        return (nargs, None) if values >= nargs else (values, f"needs {nargs} values")
    return min(values, 1), None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


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
            raw, has_inline, inline = token.partition("=")
            name = _canonical(raw)
            spec = known.get(name) or known.get(raw)
            if name in MANAGED:
                out.append(Finding(path, f"{name} is set by primectl from `{MANAGED[name]}`; set it there"))
            elif spec is None:
                out.append(Finding(path, f"unknown {r.engine} flag {raw}{did_you_mean(raw, list(known))} "
                                   f"(checked against the pinned {r.engine} flag catalog)"))
                # skip the values an unknown flag probably had, so they are not reported again
                i += 1
                while i < len(args) and not args[i].startswith("-"):
                    i += 1
                continue
            spec = spec or {}
            if has_inline:
                values = [inline]
                used = 0
            else:
                used, error = _value_count(spec, args[i + 1 :])
                if error:
                    out.append(Finding(path, f"{raw} {error}"))
                values = args[i + 1 : i + 1 + used]
            choices = spec.get("choices")
            for value in values:
                if choices and value not in [str(c) for c in choices]:
                    out.append(Finding(path, f"{value!r} is not allowed for {raw}; allowed: {', '.join(map(str, choices))}"))
            i += 1 + used
    return out

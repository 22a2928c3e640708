"""`engine: sglang` for primectl: Dynamo's mocker running its SGLang scheduler model.

Dynamo 1.6.1's mocker (`python -m dynamo.mocker`) simulates one of three
schedulers, chosen with `--engine-type`: vllm (its default, what primectl's
built-in `engine: mocker` runs), sglang or trtllm. The SGLang one is a
different model of a worker: SGLang's schedule policies (fifo, or lpm: longest
prefix match first), its prefill budget split into `max_prefill_tokens` per
batch and `chunked_prefill_size` per chunk, and its admission by
`clip_max_new_tokens` and `schedule_conservativeness`.

This engine is the built-in mocker engine with that scheduler: the same
argv, env, ports, readiness, capabilities and container image, with

- `--engine-type sglang`, always (a flag primectl manages: refused in extra_args);
- the recipe's prefill budget (`prefill.token_budget_per_gpu`) as SGLang's own
  `--sglang-max-prefill-tokens` and `--sglang-chunked-prefill-size` (managed too);
- no host KV tier: Dynamo 1.6.1's mocker offloads to host memory only with
  its vllm scheduler, so a recipe that enables `host_tier` is refused;
- the other SGLang knobs (`--sglang-schedule-policy lpm`, ...) through the
  roles' `extra_args`, checked against the mocker's flag catalog like any
  other flag, and the schedule policy against the values SGLang knows.

It is installed as a distribution of its own and found through its entry
point (group `primectl.engines`); nothing in primectl names it.
"""

from __future__ import annotations

from collections.abc import Mapping

from primectl.engines.base import PlanContext
from primectl.engines.mocker import MockerEngine
from primectl.errors import Finding
from primectl.plan.model import Service, Slot
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.model import Decode, Prefill, Recipe

ENGINE_TYPE = "sglang"
# Flags this engine sets from the recipe: flag -> what to set instead.
MANAGED = {
    "--engine-type": "engine (sglang runs the mocker's SGLang scheduler)",
    "--sglang-max-prefill-tokens": "token_budget_per_gpu",
    "--sglang-chunked-prefill-size": "token_budget_per_gpu",
    "--sglang-page-size": "kv.block_size",
}
# What Dynamo 1.6.1's mocker accepts for --sglang-schedule-policy (fcfs: a deprecated alias of fifo).
SCHEDULE_POLICIES = ("fifo", "lpm", "fcfs")


class SglangMockerEngine(MockerEngine):
    """`engine: sglang`: the mocker with `--engine-type sglang`."""

    name = "sglang"
    component = "dynamo-mocker-sglang"

    def managed_flags(self) -> Mapping[str, str]:
        """The mocker's managed flags and the SGLang scheduler's."""
        return {**super().managed_flags(), **MANAGED}

    def validate(self, recipe: Recipe, arch: Architecture | None, hw: Hardware) -> list[Finding]:
        """extra_args against the mocker's catalog (with this engine's managed flags), and the schedule policy."""
        findings = super().validate(recipe, arch, hw)
        if recipe.host_tier is not None and recipe.host_tier.enabled:
            findings.append(Finding(("host_tier",), (
                "engine sglang has no host KV tier: Dynamo 1.6.1's mocker supports native host offload only with "
                "its vllm scheduler (\"native_host_offload is supported only for backend=vllm\"); "
                "set host_tier.enabled: false, or use engine: mocker")))
        for role in ("prefill", "decode"):
            args = getattr(recipe, role).extra_args
            for i, arg in enumerate(args):
                flag, _, value = arg.partition("=")
                if flag != "--sglang-schedule-policy":
                    continue
                value = value or (args[i + 1] if i + 1 < len(args) else "")
                if value not in SCHEDULE_POLICIES:
                    findings.append(Finding((role, "extra_args", i), (
                        f"--sglang-schedule-policy {value!r} is not an SGLang schedule policy; "
                        f"allowed: {', '.join(SCHEDULE_POLICIES)}")))
        return findings

    def worker(self, ctx: PlanContext, slot: Slot, spec: Prefill | Decode, depends_on: list[str]) -> Service:
        """The mocker's worker, with the SGLang scheduler's flags ahead of the role's own extra_args."""
        ours = ["--engine-type", ENGINE_TYPE]
        if spec.token_budget_per_gpu is not None:
            budget = str(spec.token_budget_per_gpu)
            ours += ["--sglang-max-prefill-tokens", budget, "--sglang-chunked-prefill-size", budget]
        return super().worker(ctx, slot, spec.model_copy(update={"extra_args": [*ours, *spec.extra_args]}), depends_on)

"""vLLM through Dynamo (`python -m dynamo.vllm`): the production engine, one process per host.

Dynamo parses its own flags first and hands the rest to the pinned vLLM's
engine-arg parser, so everything here is a flag one of the two defines (both
catalogs are generated from those parsers: scripts/gen_flag_catalog.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from primectl.engines.base import (
    DYNAMO_WORKER_MANAGED,
    EngineServing,
    FlagCatalog,
    PlanContext,
    RuntimeFlavour,
    dynamo_pins,
)
from primectl.engines.mooncake import store_config
from primectl.errors import Finding
from primectl.plan.capacity import parse_parallel
from primectl.plan.model import RELEASE, Capabilities, FileSpec, Probe, Service, Slot
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.flags import check_extra_args, load_catalog
from primectl.recipe.model import Decode, Prefill, Recipe
from primectl.recipe.suggest import did_you_mean

CATALOGS = ("vllm-0.31.0.json", "dynamo-vllm-1.6.1.json")
# vLLM's name for each recipe KV dtype, per attention kind.
VLLM_KV_DTYPE = {
    ("mla", "nvfp4"): "nvfp4_ds_mla",
    ("mla", "fp8"): "fp8",
    ("mla", "bf16"): "bfloat16",
    ("mla", "auto"): "auto",
    ("mha", "nvfp4"): "nvfp4",
    ("mha", "fp8"): "fp8",
    ("mha", "bf16"): "bfloat16",
    ("mha", "auto"): "auto",
}
GPU_STARTUP_TIMEOUT_S = 40 * 60


def kv_transfer_config(role: str, host_tier: bool) -> str:
    """The --kv-transfer-config JSON: NIXL handoff, plus the Mooncake store on prefill when tiered."""
    nixl_role = "kv_producer" if role == "prefill" else "kv_consumer"
    if host_tier and role == "prefill":
        cfg: dict[str, object] = {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "connectors": [
                    {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
                    {
                        "kv_connector": "MooncakeStoreConnector",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"load_async": True},
                    },
                ]
            },
        }
    else:
        cfg = {"kv_connector": "NixlConnector", "kv_role": nixl_role}
    return json.dumps(cfg, separators=(",", ":"), sort_keys=True)


def _used_ports(slot: Slot) -> dict[str, int]:
    wanted = {"system", "tcp_rpc", "nixl", "kv_events"} | ({"dp_rpc"} if slot.data_parallel else set())
    return {k: v for k, v in slot.ports.items() if k in wanted}


class VllmEngine:
    """`engine: vllm`."""

    name = "vllm"
    component = "dynamo-vllm"

    def flag_catalog(self) -> FlagCatalog:
        """vLLM's engine args plus dynamo.vllm's own flags, at the pinned versions."""
        return load_catalog(*CATALOGS)

    def managed_flags(self) -> Mapping[str, str]:
        """Flags the adapter derives from the recipe."""
        return DYNAMO_WORKER_MANAGED

    def validate(self, recipe: Recipe, arch: Architecture | None, hw: Hardware) -> list[Finding]:
        """GPUs present, Dynamo parser names, extra_args against the catalog."""
        out: list[Finding] = []
        if not hw.sm:
            out.append(Finding(("engine",), f"engine vllm needs GPUs; hardware profile {recipe.hardware.profile!r} has "
                               "none (use `engine: mocker` for a GPU-less deployment)"))
        flags = self.flag_catalog()
        for field, flag in (("tool_call_parser", "--dyn-tool-call-parser"), ("reasoning_parser", "--dyn-reasoning-parser")):
            value = getattr(recipe.tool_calling, field)
            choices = [str(c) for c in (flags.get(flag, {}).get("choices") or [])]
            if value is not None and choices and value not in choices:
                out.append(Finding(("tool_calling", field), f"{value!r} is not a Dynamo parser"
                                   f"{did_you_mean(value, choices)}; allowed: {', '.join(choices)}"))
        return out + check_extra_args(recipe, flags, self.managed_flags())

    def pins(self, recipe: Recipe) -> dict[str, str]:
        """Dynamo's pins plus vLLM and FlashInfer."""
        s = recipe.software
        return dynamo_pins(recipe) | {"vllm": s.vllm, "flashinfer-python": s.flashinfer}

    def runtime_flavour(self, hw: Hardware) -> RuntimeFlavour:
        """CUDA hosts install the GPU set."""
        return RuntimeFlavour("cuda", "runtime-requirements-cuda.txt")

    def serving(self, recipe: Recipe, arch: Architecture, hw: Hardware) -> EngineServing:
        """vLLM enforces the context limit itself (4xx), reports NIXL and its KV cache, calls tools when a parser is set."""
        caps = Capabilities(
            tool_calls=recipe.tool_calling.tool_call_parser is not None, nixl_metrics=True, over_context="4xx",
            exercises_host_tier=True, reports_kv_cache=True, workload="agentic",
        )
        return EngineServing(context_limit=recipe.model.max_context or arch.max_context,
                             prefill_budget=recipe.prefill.token_budget_per_gpu, capabilities=caps)

    def worker(self, ctx: PlanContext, slot: Slot, spec: Prefill | Decode, depends_on: list[str]) -> Service:
        """One `dynamo.vllm` process: a whole TP instance, or one host's share of a DEP group."""
        r = ctx.recipe
        host = ctx.hosts[slot.host]
        addr = host.address
        par = parse_parallel(slot.parallel)
        dp = slot.data_parallel
        tool = r.tool_calling
        argv = [
            ctx.python(slot.host), "-m", "dynamo.vllm",
            "--model", ctx.model.path,
            "--served-model-name", r.model.served_name,
            "--disaggregation-mode", slot.role,
            "--tensor-parallel-size", str(par.tp),
        ]
        if dp is not None:
            argv += [
                "--data-parallel-size", str(dp.size),
                "--data-parallel-size-local", str(dp.local),
                "--data-parallel-start-rank", str(dp.start_rank),
                "--data-parallel-address", dp.address,
                "--data-parallel-rpc-port", str(slot.ports["dp_rpc"]),
            ]
            if dp.local < dp.size:
                argv.append("--data-parallel-hybrid-lb")
        if par.expert_parallel:
            argv.append("--enable-expert-parallel")
        budget = spec.token_budget_per_gpu
        if budget is not None:
            argv += ["--max-num-batched-tokens", str(budget)]
        if spec.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(spec.max_num_seqs)]
        if r.model.max_context:
            argv += ["--max-model-len", str(r.model.max_context)]
        argv += [
            "--block-size", str(r.kv.block_size),
            "--kv-cache-dtype", VLLM_KV_DTYPE[(ctx.arch.attention, r.kv.dtype)],
            "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
            "--enable-prefix-caching",
            "--structured-outputs-config", json.dumps({"backend": tool.structured_backend}),
        ]
        if tool.reasoning_parser:
            argv += ["--reasoning-parser", tool.reasoning_parser, "--dyn-reasoning-parser", tool.reasoning_parser]
        if tool.tool_call_parser:
            argv += ["--dyn-tool-call-parser", tool.tool_call_parser]
            argv += ["--dyn-structural-tag", "true" if tool.structural_tag else "false"]
        if r.frontend.router_mode == "kv" and r.frontend.kv_events:
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{slot.ports['kv_events']}"}
            argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"), sort_keys=True)]
        tiered = ctx.tier is not None
        argv += ["--kv-transfer-config", kv_transfer_config(slot.role, tiered)]
        argv += spec.extra_args

        env = ctx.dynamo_env(slot.host)
        env.update({
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in slot.gpus),
            "DYN_SYSTEM_HOST": addr,
            "DYN_SYSTEM_PORT": str(slot.ports["system"]),
            "DYN_TCP_RPC_PORT": str(slot.ports["tcp_rpc"]),
            "VLLM_HOST_IP": addr,
            "VLLM_NIXL_SIDE_CHANNEL_HOST": addr,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(slot.ports["nixl"]),
            "VLLM_KV_CACHE_LAYOUT": r.kv.layout,
        })
        files: list[FileSpec] = []
        if tiered and slot.role == "prefill":
            cfg = store_config(ctx, slot.host, slot.name, ranks=len(slot.gpus) or 1)
            files.append(cfg)
            env["MOONCAKE_CONFIG_PATH"] = f"{RELEASE}/" + cfg.path
            env["MOONCAKE_REQUESTER_LOCAL_HOSTNAME"] = addr
            env["MC_TCP_BIND_ADDRESS"] = addr
        env.update(spec.env)
        ranks = dp.local if dp else 1
        base_events = slot.ports.get("kv_events", 0)
        start = dp.start_rank if dp else 0
        listens = [slot.ports["system"], slot.ports["tcp_rpc"]]
        listens += [slot.ports["nixl"] + start + i for i in range(ranks)]
        if "kv_events" in slot.ports:
            listens += [base_events + start + i for i in range(ranks)]
        if dp is not None and dp.start_rank == 0:
            listens.append(slot.ports["dp_rpc"])
        system = f"http://{addr}:{slot.ports['system']}"
        return Service(
            name=slot.name, role=slot.role, component=self.component, host=slot.host, address=addr,
            gpus=list(slot.gpus), group=slot.group, slot=slot.name, data_parallel=dp,
            argv=argv, env=env, files=files, ports=_used_ports(slot), listens=sorted(listens),
            depends_on=depends_on,
            ready=Probe(kind="http", url=f"{system}/health", timeout_s=spec.startup_timeout_s or GPU_STARTUP_TIMEOUT_S,
                        interval_s=2),
            metrics_url=f"{system}/metrics",
            stop_timeout_s=60,
        )

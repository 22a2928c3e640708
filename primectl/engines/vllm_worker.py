"""Dynamo's vLLM worker (`python -m dynamo.vllm`), one process per host.

Dynamo parses its own flags first and hands the rest to vLLM 0.33.0's
engine-arg parser, so everything here is a flag one of the two defines.
"""

from __future__ import annotations

import json

from primectl.engines.base import Deployment, WorkerSlot
from primectl.engines.mooncake import store_config
from primectl.plan.model import FileSpec, Probe, Service
from primectl.recipe.model import Decode, Prefill

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


def _used_ports(slot: WorkerSlot) -> dict[str, int]:
    wanted = {"system", "tcp_rpc", "nixl", "kv_events"} | ({"dp_rpc"} if slot.data_parallel else set())
    return {k: v for k, v in slot.ports.items() if k in wanted}


def vllm_worker_service(dep: Deployment, slot: WorkerSlot, spec: Prefill | Decode, depends_on: list[str]) -> Service:
    """One `dynamo.vllm` process: a whole TP instance, or one host's share of a DEP group."""
    r = dep.recipe
    host = dep.hosts[slot.host]
    addr = host.address
    par = slot.parallel
    dp = slot.data_parallel
    tool = r.tool_calling
    argv = [
        dep.python(slot.host), "-m", "dynamo.vllm",
        "--model", dep.model_path,
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
        "--kv-cache-dtype", VLLM_KV_DTYPE[(dep.arch.attention, r.kv.dtype)],
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
    tiered = r.host_tier is not None and r.host_tier.enabled
    argv += ["--kv-transfer-config", kv_transfer_config(slot.role, tiered)]
    argv += spec.extra_args

    env = dep.dynamo_env(slot.host)
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
        cfg = store_config(dep, slot.host, slot.name, ranks=len(slot.gpus) or 1)
        files.append(cfg)
        env["MOONCAKE_CONFIG_PATH"] = "@release@/" + cfg.path
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
        name=slot.name, role=slot.role, component="dynamo-vllm", host=slot.host, address=addr,
        gpus=list(slot.gpus), group=slot.group, data_parallel=dp,
        argv=argv, env=env, files=files, ports=_used_ports(slot), listens=sorted(listens),
        depends_on=depends_on,
        ready=Probe(kind="http", url=f"{system}/health", timeout_s=spec.startup_timeout_s or GPU_STARTUP_TIMEOUT_S, interval_s=2),
        metrics_url=f"{system}/metrics",
        stop_timeout_s=60,
    )

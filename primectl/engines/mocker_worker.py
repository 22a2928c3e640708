"""Dynamo's mocker engine (`python -m dynamo.mocker`): a CPU stand-in for vLLM workers.

It simulates KV blocks, prefill/decode timing, KV transfer and a host tier, and
registers with the frontend exactly as a vLLM worker would.
"""

from __future__ import annotations

from primectl.engines.base import Deployment, WorkerSlot
from primectl.plan.capacity import kv_bytes_per_token
from primectl.plan.model import Probe, Service
from primectl.recipe.model import Decode, Prefill

# AISimulate (the mocker's source of default timings) is not installable, so
# bandwidths are always passed explicitly.
HOST_OFFLOAD_GBPS = 50.0


def mocker_worker_service(dep: Deployment, slot: WorkerSlot, spec: Prefill | Decode, depends_on: list[str]) -> Service:
    """One mocker process standing in for a vLLM prefill or decode instance."""
    r = dep.recipe
    addr = dep.hosts[slot.host].address
    dp_size = slot.data_parallel.size if slot.data_parallel else 1
    per_token = kv_bytes_per_token(dep.arch, r.kv.dtype, slot.parallel.tp)
    argv = [
        dep.python(slot.host), "-m", "dynamo.mocker",
        "--model-path", dep.model_path,
        "--model-name", r.model.served_name,
        "--disaggregation-mode", slot.role,
        "--data-parallel-size", str(dp_size),
        "--block-size", str(r.kv.block_size),
        "--num-gpu-blocks-override", str(r.mocker.num_gpu_blocks),
        "--kv-bytes-per-token", str(per_token),
        "--kv-transfer-bandwidth", str(r.transfer.bandwidth_gb_s),
        "--speedup-ratio", str(r.mocker.speedup_ratio),
    ]
    if slot.role == "prefill":
        # Prefill listens for the decode side's rendezvous; decode workers connect to it.
        argv += ["--bootstrap-ports", str(slot.ports["bootstrap"])]
    if spec.token_budget_per_gpu is not None:
        argv += ["--max-num-batched-tokens", str(spec.token_budget_per_gpu)]
    if spec.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(spec.max_num_seqs)]
    if r.model.max_context:
        argv += ["--max-model-len", str(r.model.max_context)]
    if r.mocker.startup_time_s:
        argv += ["--startup-time", str(r.mocker.startup_time_s)]
    tier = r.host_tier
    if tier is not None and tier.enabled:
        host_blocks = int(tier.dram_gb_per_host * 1e9 / (per_token * r.kv.block_size) / dp_size)
        argv += [
            "--num-host-blocks", str(max(host_blocks, 1)),
            "--host-offload-d2h-bandwidth-gbps", str(HOST_OFFLOAD_GBPS),
            "--host-offload-h2d-bandwidth-gbps", str(HOST_OFFLOAD_GBPS),
        ]
    argv += spec.extra_args
    env = dep.dynamo_env(slot.host)
    env.update({
        "DYN_SYSTEM_HOST": addr,
        "DYN_SYSTEM_PORT": str(slot.ports["system"]),
        "DYN_TCP_RPC_PORT": str(slot.ports["tcp_rpc"]),
        # Without this the mocker's /health stays 503 forever.
        "DYN_SYSTEM_STARTING_HEALTH_STATUS": "ready",
    })
    env.update(spec.env)
    # The mocker publishes KV events on the event plane itself (no --zmq-kv-events-ports).
    ports = {k: slot.ports[k] for k in ("system", "tcp_rpc")}
    if slot.role == "prefill":
        ports["bootstrap"] = slot.ports["bootstrap"]
    system = f"http://{addr}:{slot.ports['system']}"
    return Service(
        name=slot.name, role=slot.role, component="dynamo-mocker", host=slot.host, address=addr,
        gpus=list(slot.gpus), group=slot.group, data_parallel=slot.data_parallel,
        argv=argv, env=env, ports=ports, listens=sorted(ports.values()),
        depends_on=depends_on,
        ready=Probe(kind="http", url=f"{system}/health", timeout_s=spec.startup_timeout_s or 120),
        metrics_url=f"{system}/metrics",
    )

"""What the Dynamo worker adapters share: the flags every `python -m dynamo.<engine>` worker gets from recipe fields.

The built-in vLLM and mocker adapters (and plugins built on them) run Dynamo workers; this module holds what
they have in common, so the generic Engine protocol (primectl.engines.base) carries no engine's flags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from primectl.plan.model import PID, RELEASE, FileSpec, Service

if TYPE_CHECKING:
    from primectl.engines.base import PlanContext

WORKER_WATCH = "probes/worker_watch.py"

# Flags the Dynamo worker adapters set from recipe fields: flag -> the field to use instead.
DYNAMO_WORKER_MANAGED: dict[str, str] = {
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


def listed_as(addr: str, tcp_rpc_port: int) -> str:
    """What the Dynamo frontend's /health `instances` show for a worker on the TCP request plane: each of its
    endpoints' transport, `"<addr>:<DYN_TCP_RPC_PORT>/<instance>/<namespace>/<component>/<endpoint>"`."""
    return f'"{addr}:{tcp_rpc_port}/'


def with_worker_watch(ctx: PlanContext, svc: Service) -> Service:
    """A worker with probes/worker_watch.py beside it, which ends it (so that its supervisor starts it again) when
    its engine panics inside the live process, and, on Dynamo's file store, once the frontend has not listed it
    for `control_plane.lost_worker_grace_s` (on etcd a worker whose lease lapses ends itself)."""
    from importlib.resources import files

    r = ctx.recipe
    if not ctx.watches:
        return svc
    script = FileSpec(path=WORKER_WATCH, content=files("primectl.engines").joinpath("worker_watch.py").read_text(),
                      mode=0o755)
    watch = [ctx.python(svc.host), "-I", f"{RELEASE}/{WORKER_WATCH}", "--pid", PID]
    grace = r.control_plane.lost_worker_grace_s
    if r.control_plane.discovery == "file" and grace and svc.listed_as:
        url = ctx.worker_listing_url
        watch += ["--url", url, "--expect", svc.listed_as, "--grace", f"{grace:g}"]
    return svc.model_copy(update={"watch": watch, "files": [*svc.files, script]})

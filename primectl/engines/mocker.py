"""Dynamo's mocker engine (`python -m dynamo.mocker`): a CPU stand-in for vLLM workers.

It simulates KV blocks, prefill/decode timing, KV transfer and a host tier, and
registers with the frontend exactly as a vLLM worker would.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from primectl.engines.base import (
    EngineServing,
    FlagCatalog,
    PlanContext,
    RuntimeFlavour,
    dynamo_pins,
    options,
)
from primectl.engines.dynamo_worker import DYNAMO_WORKER_MANAGED, listed_as, with_worker_watch
from primectl.errors import Finding
from primectl.plan.model import RELEASE, Capabilities, ContainerImage, FileSpec, Probe, Service, Slot
from primectl.recipe.capacity import kv_bytes_per_token, parse_parallel
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.flags import check_extra_args, load_catalog
from primectl.recipe.model import Decode, EngineBlock, Prefill, Recipe, Strict

CATALOGS = ("dynamo-mocker-1.6.1.json",)
# AISimulate (the mocker's source of default timings) is not installable, so
# bandwidths are always passed explicitly.
HOST_OFFLOAD_GBPS = 50.0
# 1.6.1 publishes no mocker image: its mocker DGD template runs the planner image, which carries the wheel.
IMAGE = ContainerImage(repository="nvcr.io/nvidia/ai-dynamo/dynamo-planner", working_dir="/workspace")
BLOCK = "mocker"
# `python -m dynamo.mocker` through the named bridge over its one upstream gap: it does not advertise its context
# limit to the frontend, which then answers an over-long prompt with the mocker's 500 instead of its own 400.
BRIDGE = "bridges/dynamo_mocker_token_budget_bridge.py"


def _bridge_file() -> str:
    from importlib.resources import files

    return files("primectl.bridges").joinpath("dynamo_mocker_token_budget_bridge.py").read_text()


class Mocker(Strict):
    """Mocker engine knobs (engine: mocker)."""

    speedup_ratio: float = Field(1.0, ge=0)
    num_gpu_blocks: int = Field(16384, gt=0)
    startup_time_s: float = Field(0, ge=0)
    host_offload: bool = Field(False, description=(
        "Simulate the host (G2) KV tier inside the mocker (--num-host-blocks from host_tier). Off by default: "
        "Dynamo 1.6.1's mocker (aisimulate-core 0.13.0) panics in it under sustained long prompts "
        "(host_offload/tier.rs:1222, 'host completions must be ticked before a later mutation'), and the "
        "panic kills the engine while the process and its /health live on."))


class MockerEngine:
    """`engine: mocker`."""

    name = "mocker"
    component = "dynamo-mocker"

    def flag_catalog(self) -> FlagCatalog:
        """dynamo.mocker's flags at the pinned Dynamo."""
        return load_catalog(*CATALOGS)

    def managed_flags(self) -> Mapping[str, str]:
        """Flags the adapter derives from the recipe."""
        return DYNAMO_WORKER_MANAGED

    def recipe_block(self) -> EngineBlock:
        """The recipe's `mocker:` block: simulated speed, KV blocks, start-up time."""
        return BLOCK, Mocker

    def software_pins(self) -> None:
        """No pins of its own: Dynamo's."""
        return None

    def validate(self, recipe: Recipe, arch: Architecture | None, hw: Hardware) -> list[Finding]:
        """extra_args against the mocker's catalog."""
        return check_extra_args(recipe, self.flag_catalog(), self.managed_flags())

    def pins(self, recipe: Recipe) -> dict[str, str]:
        """The Dynamo runtime only."""
        return dynamo_pins(recipe)

    def runtime_flavour(self, hw: Hardware) -> RuntimeFlavour:
        """The CPU Dynamo + Mooncake set, whatever the hardware."""
        return RuntimeFlavour("cpu", "runtime-requirements-cpu.txt")

    def serving(self, recipe: Recipe, arch: Architecture, hw: Hardware) -> EngineServing:
        """No tools, no NIXL metrics; the frontend refuses an over-long prompt with 400 (BRIDGE publishes the limit)."""
        caps = Capabilities(tool_calls=False, nixl_metrics=False, over_context="4xx", exercises_host_tier=False,
                            reports_kv_cache=False, workload="agentic-demo")
        return EngineServing(context_limit=recipe.model.max_context, prefill_budget=recipe.prefill.token_budget_per_gpu,
                             capabilities=caps, image=IMAGE)

    def worker(self, ctx: PlanContext, slot: Slot, spec: Prefill | Decode, depends_on: list[str]) -> Service:
        """One mocker process standing in for a vLLM prefill or decode instance."""
        r = ctx.recipe
        mock = options(r, BLOCK, Mocker)
        addr = ctx.hosts[slot.host].address
        dp_size = slot.data_parallel.size if slot.data_parallel else 1
        per_token = kv_bytes_per_token(ctx.arch, r.kv.dtype, parse_parallel(slot.parallel).tp)
        argv = [
            ctx.python(slot.host), f"{RELEASE}/{BRIDGE}",
            "--model-path", ctx.model_path(slot.host),
            "--model-name", r.model.served_name,
            "--disaggregation-mode", slot.role,
            "--data-parallel-size", str(dp_size),
            "--block-size", str(r.kv.block_size),
            "--num-gpu-blocks-override", str(mock.num_gpu_blocks),
            "--kv-bytes-per-token", str(per_token),
            "--kv-transfer-bandwidth", str(r.transfer.bandwidth_gb_s),
            "--speedup-ratio", str(mock.speedup_ratio),
        ]
        # No --bootstrap-ports: like a vLLM prefill worker, the mocker's prefill then finishes before the frontend
        # sends the request on to decode (Dynamo's synchronous hand-off). With a bootstrap rendezvous the frontend
        # sends decode while prefill still runs, and Dynamo 1.6.1 cannot migrate a request whose decode worker
        # dies then: its retry books the request's prefill again under the same id ("failed to book scheduler
        # state: Request ... already exists"), and the client gets an error (docs/live-changes.md, "What a change can still lose").
        if spec.token_budget_per_gpu is not None:
            argv += ["--max-num-batched-tokens", str(spec.token_budget_per_gpu)]
        if spec.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(spec.max_num_seqs)]
        if r.model.max_context:
            argv += ["--max-model-len", str(r.model.max_context)]
        if mock.startup_time_s:
            argv += ["--startup-time", str(mock.startup_time_s)]
        tier = ctx.tier
        if tier is not None and mock.host_offload:
            host_blocks = int(tier.dram_gb_per_host * 1e9 / (per_token * r.kv.block_size) / dp_size)
            argv += [
                "--num-host-blocks", str(max(host_blocks, 1)),
                "--host-offload-d2h-bandwidth-gbps", str(HOST_OFFLOAD_GBPS),
                "--host-offload-h2d-bandwidth-gbps", str(HOST_OFFLOAD_GBPS),
            ]
        argv += spec.extra_args
        env = ctx.dynamo_env(slot.host)
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
        system = f"http://{addr}:{slot.ports['system']}"
        return with_worker_watch(ctx, Service(
            name=slot.name, role=slot.role, component=self.component, host=slot.host, address=addr,
            gpus=list(slot.gpus), group=slot.group, slot=slot.name, data_parallel=slot.data_parallel,
            argv=argv, env=env, ports=ports, listens=sorted(ports.values()),
            files=[FileSpec(path=BRIDGE, content=_bridge_file())], depends_on=depends_on,
            ready=Probe(kind="http", url=f"{system}/health", timeout_s=spec.startup_timeout_s or 120),
            metrics_url=f"{system}/metrics",
            listed_as=listed_as(addr, slot.ports["tcp_rpc"]),
        ))

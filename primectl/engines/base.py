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
from typing import Any, Protocol, TypeVar, cast

from pydantic import BaseModel

from primectl import registry
from primectl.errors import Finding
from primectl.plan.model import Capabilities, ContainerImage, Drain, HostPlan, ModelSource, Runtime, Service, Slot, Tier
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.model import Decode, EngineBlock, Prefill, Recipe, Role, with_engine_parts

FlagCatalog = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class RuntimeFlavour:
    """Which pinned package set a host runtime is installed from."""

    name: str  # cpu | vllm-cpu | cuda
    lock: str  # file name under scripts/ (the lock the venv is installed from)
    install_flags: tuple[str, ...] = ()  # what scripts/install-runtime.sh is given for it


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


class EngineRecipeParts(Protocol):
    """What an engine may add to the recipe; an engine without these members adds nothing (see `recipe_block`,
    `software_pins`), so a plugin need not have them."""

    def recipe_block(self) -> EngineBlock | None:
        """The top-level recipe key of this engine's own options and their model (defaults when left out), e.g.
        `("mocker", Mocker)`; validated, with file:line, like the rest of the recipe."""
        ...

    def software_pins(self) -> type[BaseModel] | None:
        """A model of this engine's pins under `software:` (beside Dynamo's own), every field with a default."""
        ...


M = TypeVar("M", bound=BaseModel)


def recipe_block(engine: object) -> EngineBlock | None:
    """The engine's own recipe block, None if it declares none."""
    declared = getattr(engine, "recipe_block", None)
    return cast(EngineRecipeParts, engine).recipe_block() if callable(declared) else None


def software_pins(engine: object) -> type[BaseModel] | None:
    """The model of the engine's pins under `software:`, None if it declares none."""
    declared = getattr(engine, "software_pins", None)
    return cast(EngineRecipeParts, engine).software_pins() if callable(declared) else None


def recipe_model(engine: str | None = None, *, every: bool = False, blocks: tuple[EngineBlock, ...] = ()
                 ) -> type[Recipe]:
    """The recipe model a recipe of `engine` is validated against: the blocks and pins of every built-in engine
    (a recipe may carry another engine's block, e.g. one it extends) and of `engine`; `every`: of every registered
    engine (the JSON Schema). An unknown or broken engine adds nothing (the recipe's `engine:` check says why).
    `blocks`: other top-level blocks (the components'), after the engines'."""
    names = registry.names("engine") if every else [*registry.BUILTIN_ENGINES, *([engine] if engine else [])]
    engines = []
    for name in dict.fromkeys(names):
        try:
            engines.append(get(name))
        except (KeyError, registry.PluginError):
            continue
    own = tuple(b for e in engines if (b := recipe_block(e)) is not None)
    pins = tuple(p for e in engines if (p := software_pins(e)) is not None)
    return with_engine_parts((*own, *blocks), pins)


def options(recipe: Recipe, key: str, model: type[M]) -> M:
    """The recipe's block `key` as `model` (its defaults where the recipe was built without engine blocks)."""
    value = getattr(recipe, key, None)
    return value if isinstance(value, model) else model()


def pins_of(recipe: Recipe, model: type[M]) -> M:
    """The recipe's `software:` fields that `model` declares, as `model` (defaults where absent)."""
    sw = recipe.software
    return model.model_validate({k: getattr(sw, k) for k in model.model_fields if hasattr(sw, k)})


def get(name: str) -> Engine:
    """The registered engine called `name` (KeyError if none; registry.PluginError if a plugin's is broken or incomplete)."""
    obj = registry.engine(name)
    missing = registry.missing_members(obj, Engine)
    if missing:
        raise registry.PluginError("engine", name, f"engine {name!r} lacks {', '.join(missing)} of the Engine protocol "
                                                   f"(primectl.engines.base.Engine; {registry.entry('engine', name).describe()})")
    return cast(Engine, obj)


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
    # Whether the target starts a service's `watch` beside it (SSH's run scripts do; a scheduler or an operator
    # restarts what fails its own way).
    watches: bool = False
    # The first frontend's own HTTP address (not the balancer's: one in front answers nothing of its own while the
    # model is not ready, such as the frontend's listing of the workers it discovered).
    frontend_url: str = ""
    # What the engine's workers do (EngineServing.capabilities), for the components planned around them.
    capabilities: Capabilities | None = None
    # Whether the target starts a surge twin beside each service a change restarts.
    surges: bool = False
    # Whether the frontends sit behind a balancer (the endpoint is the balancer's; each frontend has a port of its own).
    balanced: bool = False

    @property
    def worker_listing_url(self) -> str:
        """Where the first frontend lists the worker instances its discovery holds: /health's `instances`, each with
        the transport a worker's `listed_as` names."""
        return f"{self.frontend_url}/health"

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

"""The recipe: what the operator asks for, as pydantic models.

Unknown keys are errors everywhere. Field descriptions are the documentation:
they become the JSON Schema (`primectl schema`) and the `plan` output.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator

from primectl import registry
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.suggest import did_you_mean

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
PARALLEL_RE = re.compile(r"^(DEP|TEP|TP|DP)([1-9][0-9]*)$")
KV_LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "NHD", "HND", "BLHNC", "BLNHC", "BHLNC")
Name = Annotated[str, Field(pattern=NAME_RE, description="Lower-case letters, digits and dashes.")]
Port = Annotated[int, Field(ge=1, le=65535)]
SystemPort = Annotated[int, Field(ge=1, le=32767, description="Dynamo reads it as a signed 16-bit value.")]
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What a served model name may hold: it travels in URL paths (/v1/models/{name}/ready), JSON and run scripts.
SERVED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")
SERVED_NAME_ALLOWED = "letters, digits and . _ : / @ + - (starting with a letter or digit)"


def _env_name(v: str) -> str:
    # Names are written unquoted into run scripts (`export NAME=...`): only shell identifiers.
    if not ENV_NAME_RE.match(v):
        raise ValueError(f"{v!r} is not an environment variable name (letters, digits and _, no leading digit)")
    return v


EnvName = Annotated[str, AfterValidator(_env_name)]
ENV_NAMES_SCHEMA: dict[str, Any] = {"propertyNames": {"pattern": ENV_NAME_RE.pattern}}


def _absolute_path(v: str) -> str:
    if not re.fullmatch(r"/[A-Za-z0-9._/-]*", v) or "/../" in v + "/":
        raise ValueError(f"{v!r} must be an absolute path of letters, digits and . _ - /")
    return v.rstrip("/") or "/"


# An absolute path of plain characters, without `..`; a trailing `/` is dropped.
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]


def _registered(kind: registry.Kind, what: str) -> Callable[[dict[str, Any]], None]:
    """The schema of a field naming a registered engine or target: what is installed (plugins included) when asked."""

    def extra(schema: dict[str, Any]) -> None:
        choices = registry.names(kind)
        schema["description"] = f"{what}: {', '.join(choices)}."
        schema["enum"] = choices

    return extra


def _check_registered(kind: registry.Kind, v: str) -> str:
    if not registry.known(kind, v):
        choices = registry.names(kind)
        raise ValueError(f"{v!r} is not {'an' if kind == 'engine' else 'a'} {kind}{did_you_mean(v, choices)}; "
                         f"allowed: {', '.join(choices)} (plugins add more: `primectl plugins` lists them)")
    return v


class Strict(BaseModel):
    """Base: unknown keys are errors, values are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(Strict):
    """The model to serve."""

    served_name: str = Field(..., min_length=1, description=f"Name clients put in `model` (OpenAI API): {SERVED_NAME_ALLOWED}.")
    path: str = Field(
        "",
        description="Weights directory on every worker host. Empty with `generate: demo-tiny`, "
        "where primectl writes a tiny tokenizer-only model into the bundle.",
    )
    arch: str | None = Field(None, description="Architecture from the built-in catalog: glm-5.3, deepseek-v3.2, demo-tiny.")
    architecture: Architecture | None = Field(None, description="Explicit architecture (instead of `arch`).")
    generate: Literal["demo-tiny", "tiny-qwen2"] | None = Field(
        None, description="Generate a tiny model into the bundle (no download): demo-tiny (tokenizer only, for the "
        "mocker) or tiny-qwen2 (random-weight Qwen2 with tool-call tokens, that real vLLM serves on CPU).")
    weights: dict[Literal["experts", "dense"], Literal["bf16", "fp8", "nvfp4"]] = Field(
        default_factory=lambda: {"experts": "fp8", "dense": "fp8"},  # type: ignore[arg-type]
        description="Storage dtype per part: routed experts and everything else.",
    )
    weights_gb: float | None = Field(None, gt=0, description="Size of the weights directory, for preflight.")
    max_context: int | None = Field(None, gt=0, description="Serving context limit (--max-model-len); default: the architecture's.")

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, v: str) -> str:
        if not SERVED_NAME_RE.match(v):
            bad = sorted({c for c in v if not re.match(r"[A-Za-z0-9._:/@+-]", c)})
            shown = ", ".join(repr(c) for c in bad) or repr(v[:1])
            raise ValueError(f"{v!r} cannot be carried in the OpenAI API paths primectl probes ({shown} not allowed); "
                             f"allowed: {SERVED_NAME_ALLOWED}")
        return v


class HardwareSpec(Strict):
    """Hardware profile from the catalog, with optional overrides."""

    profile: Literal["gb200-nvl72", "h200-hgx", "cpu"] = Field(..., description="gb200-nvl72, h200-hgx or cpu.")
    hbm_gb: float | None = Field(None, gt=0, description="Override memory per GPU (GB).")
    gpus_per_host: int | None = Field(None, ge=0, description="Override GPUs per host.")
    host_dram_gb: float | None = Field(None, ge=0, description="Override host memory per host (GB).")


class Host(Strict):
    """One machine primectl deploys to."""

    name: Name
    address: str = Field(..., min_length=1, description="Address the other hosts and primectl reach it at.")
    port: Port = Field(22, description="SSH port.")
    user: str = Field("root", min_length=1)
    identity_file: str | None = Field(None, description="SSH private key; default: the SSH agent / ~/.ssh.")
    gpus: int | None = Field(None, ge=0, description="GPUs on this host; default: the hardware profile's.")
    labels: dict[str, str] = Field(default_factory=dict, description="rack, tray, nvlink_domain, ...")
    workdir: AbsolutePath = Field("/var/lib/primectl", min_length=1, description="Where releases, state and logs live.")
    connection: Literal["ssh", "local"] = Field("ssh", description="`local` runs on this machine without SSH.")
    via: Name | None = Field(
        None, description="Reach this host through another host of the recipe (a rack's head node): primectl keeps "
        "one SSH connection to that host and starts this host's agent with that host's own `ssh` client, so the "
        "controller makes no SSH handshake of its own for it. That host's user logs in here with its own keys; "
        "this host's key is still checked against primectl's known_hosts, where it must already be.")
    via_identity_file: AbsolutePath | None = Field(
        None, description="With `via`: the private key, on that host, its `ssh` client logs in here with; default: "
        "its user's own (~/.ssh).")


class Inventory(Strict):
    """Hosts kept in a separate file."""

    inventory: str = Field(..., description="Path to a YAML file with a `hosts:` list, relative to the recipe.")


class SessionAffinity(Strict):
    """Keep a session's turns on one decode worker (header X-Dynamo-Session-ID)."""

    ttl_secs: int = Field(1800, ge=1)
    mode: Literal["hard", "soft"] = "hard"


class Admission(Strict):
    """Busy thresholds: the frontend rejects work above them (admission control)."""

    active_decode_blocks_threshold: float | None = Field(None, gt=0, le=1)
    active_prefill_tokens_threshold: int | None = Field(None, gt=0)
    active_prefill_tokens_threshold_frac: float | None = Field(None, gt=0)


class Frontend(Strict):
    """Dynamo frontend: OpenAI API and KV-aware router."""

    host: str = Field(..., description="Host name (from hosts) that runs the frontend.")
    port: Port = 8000
    router_mode: Literal["round-robin", "random", "power-of-two", "kv", "direct", "least-loaded"] = "kv"
    kv_events: bool = Field(True, description="Workers publish KV events so the router tracks cached prefixes.")
    session_affinity: SessionAffinity | None = Field(default_factory=SessionAffinity)
    busy: Admission = Field(default_factory=Admission)
    migration_limit: int = Field(3, ge=0, description="Times a request may move to another worker on failure.")
    host_cache_hit_weight: float | None = Field(None, ge=0)
    replicas: int = Field(
        1, ge=1, description="Frontend processes behind a load balancer (HAProxy) on `port`, so a frontend change "
        "rolls through them with no lost request; on target ssh one frontend sits behind HAProxy too, with a twin "
        "that takes its traffic while it restarts.")
    drain_timeout_s: int = Field(60, ge=0, description="How long a frontend replica may take to finish its streams.")


class Rollout(Strict):
    """How a change to a running role reaches its instances: in batches, each drained before it stops."""

    max_unavailable: int = Field(1, ge=1, description="Instances of the role out of service at once during a change.")
    drain_timeout_s: int = Field(
        60, ge=0, description="How long a draining instance may take to finish its in-flight requests before they are cut.")


class Role(Strict):
    """Fields shared by prefill and decode."""

    parallel: str = Field(..., description="DEPn, TEPn, TPn or DPn (n GPUs per instance).")
    max_num_seqs: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1)
    reserve_gb: float = Field(4.0, ge=0, description="Per-GPU memory kept for activations and CUDA graphs.")
    extra_args: list[str] = Field(default_factory=list, description="More engine flags, checked against vLLM's flag catalog.")
    env: dict[EnvName, str] = Field(
        default_factory=dict, description="Extra environment variables.", json_schema_extra=ENV_NAMES_SCHEMA,
    )
    hosts: list[str] | None = Field(None, description="Restrict placement to these hosts (in order).")
    startup_timeout_s: int | None = Field(None, gt=0, description="Readiness budget per instance.")
    cpu_kv_cache_gib: int = Field(
        1, ge=1, description="CPU hosts: GiB of host memory each worker of this role gives its KV cache "
        "(vLLM's VLLM_CPU_KVCACHE_SPACE, whole GiB); GPU hosts size KV from gpu_memory_utilization.")
    rollout: Rollout = Field(default_factory=lambda: Rollout(), description="How a change rolls through this role's instances.")

    @field_validator("parallel")
    @classmethod
    def _parallel(cls, v: str) -> str:
        m = PARALLEL_RE.match(v)
        if not m or int(m.group(2)) & (int(m.group(2)) - 1):
            raise ValueError(f"{v!r} is not a parallel spec; allowed: DEPn, TEPn, TPn, DPn with n a power of two")
        return v


class Prefill(Role):
    """Prefill worker groups."""

    groups: int = Field(..., ge=1, description="Independent prefill groups.")
    token_budget_per_gpu: int = Field(4096, gt=0, description="Prefill tokens per GPU per step (--max-num-batched-tokens).")


class Decode(Role):
    """Decode workers."""

    workers: int = Field(..., ge=1)
    token_budget_per_gpu: int | None = Field(None, gt=0)
    dcp: int = Field(
        1, ge=1, description="Decode context parallelism (vLLM --decode-context-parallel-size): the KV cache is sharded "
        "over this many of the TP ranks instead of copied on each, so an instance holds ~dcp x the tokens. "
        "A power of two that divides the TP size (TPn/TEPn); 1 = off.")

    @field_validator("dcp")
    @classmethod
    def _dcp(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError(f"{v} is not a power of two; allowed: 1, 2, 4, 8, ... dividing the TP size")
        return v


class KVCache(Strict):
    """KV cache format."""

    dtype: Literal["fp8", "nvfp4", "bf16", "auto"] = "auto"
    layout: str = Field("BLHNC", description="VLLM_KV_CACHE_LAYOUT: " + ", ".join(KV_LAYOUTS))
    block_size: int = Field(64, gt=0, description="Tokens per KV block.")

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str) -> str:
        if v not in KV_LAYOUTS:
            raise ValueError(f"{v!r} is not a known KV layout; allowed: {', '.join(KV_LAYOUTS)}")
        return v


class Transfer(Strict):
    """Prefill -> decode KV transfer."""

    backend: Literal["nixl"] = "nixl"
    bandwidth_gb_s: float = Field(50.0, gt=0, description="Only used by the mocker to simulate transfer time.")


class HostTier(Strict):
    """Mooncake host-DRAM KV tier."""

    enabled: bool = True
    master_host: str = Field(..., description="Host that runs mooncake_master.")
    dram_gb_per_host: float = Field(..., gt=0, description="Host memory each worker host lends to the tier.")
    protocol: Literal["rdma", "tcp"] = "rdma"
    device_name: str = Field("", description="RDMA device(s), e.g. mlx5_0; empty = auto.")


class ToolCalling(Strict):
    """Tool calling and reasoning output."""

    tool_call_parser: str | None = Field(None, description="Dynamo tool call parser (glm47, glm45, ...).")
    reasoning_parser: str | None = None
    structured_backend: Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"] = "xgrammar"
    structural_tag: bool = Field(True, description="Constrain tool calls with a structural tag.")


class ControlPlane(Strict):
    """Discovery, request and event planes."""

    discovery: Literal["etcd", "file"] = "etcd"
    etcd_host: str | None = Field(None, description="Host that runs etcd; default: the frontend host.")
    etcd_lease_ttl_s: int | None = Field(None, gt=0, description="ETCD_LEASE_TTL for worker registrations.")
    lost_worker_grace_s: int = Field(30, ge=0, description=(
        "discovery: file: how long a running worker the frontend no longer lists (its entry expired while the "
        "process was stalled, and Dynamo's file store never writes it back) may run on before it ends itself, so "
        "that its supervisor or `up` starts it again; 0: never (status still names it)."))
    request_plane: Literal["tcp"] = "tcp"
    event_plane: Literal["zmq"] = "zmq"


class Ports(Strict):
    """Port bases; instances on one host get consecutive ports from these."""

    etcd_client: Port = 2379
    etcd_peer: Port = 2380
    mooncake_rpc: Port = 50051
    mooncake_metadata: Port = 8080
    mooncake_metrics: Port = 9003
    worker_system: SystemPort = 8081
    kv_events: Port = 20080
    nixl_side_channel: Port = 5600
    dp_rpc: Port = 29550
    tp_master: Port = Field(29501, description="torch.distributed master port of a tensor-parallel instance that spans "
                            "hosts (vLLM --master-port, bound on its first host).")
    bootstrap: Port = 8998
    response_stream: Port = 23000
    frontend_replica: Port = Field(8100, description="HTTP port of frontend replica 0 when `frontend.replicas` > 1 "
                                   "(the balancer takes `frontend.port`).")
    tcp_rpc: Port = 23100


class Software(Strict):
    """Pinned component versions: the set Dynamo declares (checked against primectl/recipe/data/dynamo-*-requires.json)."""

    dynamo: str = "1.6.1"
    nixl: str = Field("1.4.1", description="The NIXL Dynamo's METADATA names (extra `vllm`: nixl[cu13]).")
    mooncake: str = "0.3.13.post1"
    python: str | None = Field(None, description="Use this Python on every host instead of a provisioned runtime.")


RECIPE_KINDS = ("deployment",)


class Recipe(Strict):
    """A deployment: model, topology, cache, router and hosts."""

    kind: Literal["deployment"] = Field(
        "deployment", exclude=True,
        description="What the recipe describes: `deployment` (one model's workers, frontend and caches on its "
                    "hosts; the default).")
    extends: str | None = Field(None, description="Base recipe this one overrides (path relative to this file).")
    name: Name = Field(..., description="Deployment name; used in unit names and the lock.")
    namespace: Name | None = Field(None, description="Dynamo namespace; default: the name.")
    model: ModelSpec
    hardware: HardwareSpec
    hosts: list[Host] | Inventory
    frontend: Frontend
    prefill: Prefill
    decode: Decode
    ratio: str | None = Field(None, pattern=r"^[1-9][0-9]*:[1-9][0-9]*$", description="Prefill:decode, e.g. 1:4.")
    kv: KVCache = Field(default_factory=KVCache)
    transfer: Transfer = Field(default_factory=Transfer)
    host_tier: HostTier | None = None
    tool_calling: ToolCalling = Field(default_factory=ToolCalling)
    control_plane: ControlPlane = Field(default_factory=ControlPlane)
    engine: str = Field(registry.DEFAULT_ENGINE, description="Worker engine (one registered in primectl.registry).",
                        json_schema_extra=_registered("engine", "Worker engine"))
    target: str = Field("ssh", description="How processes reach machines (one registered in primectl.registry).",
                        json_schema_extra=_registered("target", "How processes reach machines"))
    software: Software = Field(default_factory=Software)
    supervisor: Literal["systemd", "process"] = "systemd"
    restart_delay_s: int = Field(5, ge=1, le=300, description=(
        "supervisor: systemd: seconds before a service that died is started again (its unit's RestartSec)."))
    ports: Ports = Field(default_factory=Ports)
    secrets: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Env var name -> `env:NAME` or `file:PATH` on the control machine; written 0600, never shown.",
        json_schema_extra=ENV_NAMES_SCHEMA,
    )
    known_hosts: str | None = Field(None, description="known_hosts file for SSH host keys; default: ~/.ssh/known_hosts.")

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        return _check_registered("engine", v)

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        return _check_registered("target", v)

    def host_list(self) -> list[Host]:
        """The hosts, once an inventory has been resolved by the loader."""
        assert isinstance(self.hosts, list), "inventory not resolved"
        return self.hosts

    @property
    def dynamo_namespace(self) -> str:
        """The Dynamo namespace (the name unless set)."""
        return self.namespace or self.name


def hardware_profile(recipe: Recipe) -> Hardware:
    """The catalog profile with the recipe's overrides applied."""
    from primectl.recipe.catalog import HARDWARE

    base = HARDWARE[recipe.hardware.profile]
    changes = {k: v for k, v in recipe.hardware.model_dump(exclude={"profile"}).items() if v is not None}
    return base.model_copy(update=changes)


EngineBlock = tuple[str, type[BaseModel]]


def _reorder(model: type[BaseModel], order: list[str]) -> None:
    """Put `model`'s fields in `order`: it is the order a dump writes them in, and the recipe hash is a dump's."""
    fields = model.__pydantic_fields__
    model.__pydantic_fields__ = {k: fields[k] for k in order}
    model.model_rebuild(force=True)


@cache
def with_engine_parts(blocks: tuple[EngineBlock, ...], pins: tuple[type[BaseModel], ...]) -> type[Recipe]:
    """`Recipe` with what engines declare: each block a top-level key (`key: model`, defaults when left out), each
    pins model's fields under `software:` beside Dynamo's own. The first engine to declare a key or pin keeps it;
    a key the recipe itself has is not an engine's to take.

    Blocks follow `target` in dumps; a pin follows the field its model's `dump_after` names (else it goes last),
    so a recipe dumps, and hashes, as it did when these were fields of the recipe itself."""
    if not blocks and not pins:
        return Recipe
    sw_fields: dict[str, Any] = {}
    sw_order = list(Software.model_fields)
    for model in pins:
        after: dict[str, str] = getattr(model, "dump_after", {})
        for name, info in model.model_fields.items():
            if name in Software.model_fields or name in sw_fields:
                continue
            sw_fields[name] = (info.annotation, info)
            prev = after.get(name)
            sw_order.insert(sw_order.index(prev) + 1 if prev in sw_order else len(sw_order), name)
    software = create_model("Software", __base__=Software, __doc__=Software.__doc__, __module__=__name__, **sw_fields)
    _reorder(software, sw_order)
    fields: dict[str, Any] = {"software": (software, Field(default_factory=software))}
    for key, model in blocks:
        if key in Recipe.model_fields:
            continue
        if getattr(model, "optional_block", False):  # absent: None (and so it dumps, and hashes, as null)
            fields.setdefault(key, (model | None, Field(None, description=getattr(model, "block_description", None))))
        else:
            fields.setdefault(key, (model, Field(default_factory=model)))
    recipe = cast(type[Recipe], create_model("Recipe", __base__=Recipe, __doc__=Recipe.__doc__, __module__=__name__,
                                             **fields))
    order = list(Recipe.model_fields)
    at = order.index("target") + 1
    _reorder(recipe, [*order[:at], *(k for k in fields if k != "software"), *order[at:]])
    return recipe


def recipe_json_schema(model: type[Recipe] = Recipe) -> str:
    """The JSON Schema of `model` (the recipe with the installed engines' blocks) as text (for editors:
    yaml-language-server)."""
    import json

    doc = model.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "primectl recipe"
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"

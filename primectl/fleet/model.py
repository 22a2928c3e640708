"""`kind: fleet`: one public endpoint over several deployments, each a recipe file of its own."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from primectl.monitoring.model import MonitoringBlock
from primectl.recipe.model import Host, Name, Port, Strict


class FleetMember(Strict):
    """One deployment behind the gateway."""

    recipe: str = Field(..., min_length=1, description="The deployment's recipe file (relative to this file).")
    weight: int = Field(1, ge=0, le=1000, description="Share of new requests among the deployments of its role "
                                                       "(0: drained: it takes none).")
    role: Literal["primary", "spill"] = Field(
        "primary", description="primary: takes traffic by weight; spill: only what no primary can take.")
    capacity: int | None = Field(None, ge=1, description=(
        "Concurrent requests the gateway admits to it; default: decode.workers x decode.max_num_seqs of its recipe."))


class Admission(Strict):
    """Lease-based admission: each deployment's capacity, handed to replicas in blocks held on their etcd leases."""

    block: int = Field(4, ge=1, le=1024, description="Slots a replica claims at a time.")
    lease_ttl_s: int = Field(3, ge=1, le=60, description="A dead replica's blocks return this long after it died.")
    retry_after_s: int = Field(1, ge=1, le=3600, description="Retry-After of a 429 when every deployment is full.")
    queue: int = Field(0, ge=0, le=100_000, description=(
        "Requests a replica holds waiting for a free slot when every deployment is full (0: answer 429 at once)."))
    queue_timeout_s: float = Field(30.0, gt=0, le=3600, description="How long a queued request waits before its 429.")
    batch_reserve: float = Field(0.25, ge=0, le=1, description=(
        "Share of each deployment's capacity batch callers never claim: it stays free for interactive traffic."))


class Limits(Strict):
    """Limits that hold across every replica of the gateway (the same blocks on etcd leases as admission)."""

    max_concurrency: int | None = Field(None, ge=1, le=1_000_000, description="Requests in flight at once.")
    tokens_per_minute: int | None = Field(None, ge=1, description="Prompt plus completion tokens per minute.")


class Breaker(Strict):
    """The circuit breaker every replica shares, per deployment."""

    failures: int = Field(3, ge=1, le=1000, description="Consecutive failures (refused, 5xx) that open it.")
    cooldown_s: float = Field(5.0, gt=0, le=3600, description="Open this long before one replica probes it.")


class GatewayPorts(Strict):
    """Ports of the gateway tier (the edge's is `gateway.port`)."""

    replica: Port = Field(18300, description="The first replica's; replica i listens on replica + i.")
    etcd_client: Port = 18379
    etcd_peer: Port = 18380


class Tls(Strict):
    """The edge's certificate and private key (PEM files, relative to the fleet recipe): the endpoint is https."""

    cert: str = Field(..., min_length=1, description="The certificate (chain), PEM; the leaf first.")
    key: str = Field(..., min_length=1, description="Its private key, PEM, unencrypted: shipped to the gateway host "
                                                    "mode 0600, and never written into a plan, a diff or a log.")


class Gateway(Strict):
    """The gateway tier: its own etcd, the replicas, and HAProxy in front of them (the public endpoint)."""

    host: Name = Field(..., description="The host (one of `hosts:`) that runs the replicas and the edge.")
    etcd_hosts: list[Name] | None = Field(None, min_length=1, max_length=7, description=(
        "The hosts (of `hosts:`) of the tier's etcd, one member each: an odd number, 3 to outlive one member's "
        "loss; default: [host]."))
    port: Port = Field(8000, description="The public endpoint's port (the edge).")
    tls: Tls | None = Field(None, description="The edge terminates TLS on `port` with this certificate (None: plain "
                                              "HTTP).")
    replicas: int = Field(2, ge=1, le=16)
    ports: GatewayPorts = Field(default_factory=GatewayPorts)
    admission: Admission = Field(default_factory=Admission)
    breaker: Breaker = Field(default_factory=Breaker)
    deadline_s: int = Field(600, ge=1, le=86400, description="One request's whole budget, failovers included.")
    stall_s: float = Field(60.0, gt=0, le=3600, description=(
        "A deployment that sends a stream nothing for this long (no response headers, no next chunk) has failed: "
        "the stream goes on from another deployment. What tells a site cut off (packets dropped, nothing refused) "
        "from a slow one, so keep it above the longest time to first token you expect."))
    drain_timeout_s: float = Field(30.0, ge=0, le=3600, description="A replica's streams get this long to finish.")
    teams: dict[Name, Limits] = Field(default_factory=dict, description=(
        "Each team's limits (a team not listed has none); `keys create --max-concurrency/--tokens-per-minute` sets "
        "a key's own."))


class FleetRecipe(Strict):
    """A fleet: deployments (recipe files) behind one gateway."""

    kind: Literal["fleet"]
    name: Name = Field(..., description="The fleet's name: its gateway's state, lock and etcd prefix.")
    deployments: list[FleetMember] = Field(..., min_length=1)
    gateway: Gateway
    hosts: list[Host] = Field(..., min_length=1, description="The gateway tier's hosts.")
    supervisor: Literal["systemd", "process"] = "systemd"
    known_hosts: str | None = Field(None, description="known_hosts file for SSH host keys; default: ~/.ssh/known_hosts.")
    monitoring: MonitoringBlock | None = Field(None, description=(
        "Prometheus, Alertmanager and node_exporter for the gateway tier (as a deployment's `monitoring:`; "
        "Prometheus's host defaults to the gateway's): its replicas, edge and etcd are scraped."))


def fleet_schema_text() -> str:
    """The fleet recipe's JSON Schema as text (`primectl schema --kind fleet`, for editors)."""
    import json

    doc = FleetRecipe.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "primectl fleet recipe"
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"

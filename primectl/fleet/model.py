"""`kind: fleet`: one public endpoint over several deployments, each a recipe file of its own."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

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


class Breaker(Strict):
    """The circuit breaker every replica shares, per deployment."""

    failures: int = Field(3, ge=1, le=1000, description="Consecutive failures (refused, 5xx) that open it.")
    cooldown_s: float = Field(5.0, gt=0, le=3600, description="Open this long before one replica probes it.")


class GatewayPorts(Strict):
    """Ports of the gateway tier (the edge's is `gateway.port`)."""

    replica: Port = Field(18300, description="The first replica's; replica i listens on replica + i.")
    etcd_client: Port = 18379
    etcd_peer: Port = 18380


class Gateway(Strict):
    """The gateway tier: its own etcd, the replicas, and HAProxy in front of them (the public endpoint)."""

    host: Name = Field(..., description="The host (one of `hosts:`) that runs the replicas and the edge.")
    etcd_hosts: list[Name] | None = Field(None, min_length=1, max_length=7, description=(
        "The hosts (of `hosts:`) of the tier's etcd, one member each: an odd number, 3 to outlive one member's "
        "loss; default: [host]."))
    port: Port = Field(8000, description="The public endpoint's port (the edge).")
    replicas: int = Field(2, ge=1, le=16)
    ports: GatewayPorts = Field(default_factory=GatewayPorts)
    admission: Admission = Field(default_factory=Admission)
    breaker: Breaker = Field(default_factory=Breaker)
    deadline_s: int = Field(600, ge=1, le=86400, description="One request's whole budget, failovers included.")
    drain_timeout_s: float = Field(30.0, ge=0, le=3600, description="A replica's streams get this long to finish.")


class FleetRecipe(Strict):
    """A fleet: deployments (recipe files) behind one gateway."""

    kind: Literal["fleet"]
    name: Name = Field(..., description="The fleet's name: its gateway's state, lock and etcd prefix.")
    deployments: list[FleetMember] = Field(..., min_length=1)
    gateway: Gateway
    hosts: list[Host] = Field(..., min_length=1, description="The gateway tier's hosts.")
    supervisor: Literal["systemd", "process"] = "systemd"
    known_hosts: str | None = Field(None, description="known_hosts file for SSH host keys; default: ~/.ssh/known_hosts.")


def fleet_schema_text() -> str:
    """The fleet recipe's JSON Schema as text (`primectl schema --kind fleet`, for editors)."""
    import json

    doc = FleetRecipe.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "primectl fleet recipe"
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"

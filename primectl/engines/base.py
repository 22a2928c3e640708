"""What every adapter needs to know about the deployment it belongs to."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from primectl.plan.capacity import Parallel
from primectl.plan.model import DataParallel, HostPlan
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.model import Recipe


@dataclass(frozen=True)
class Deployment:
    """Deployment-wide facts the adapters share (resolved once by the planner)."""

    recipe: Recipe
    arch: Architecture
    hw: Hardware
    runtime_key: str
    hosts: dict[str, HostPlan]
    etcd_endpoint: str | None
    mooncake_master: str | None
    mooncake_metadata: str | None
    discovery_dir: str | None
    model_path: str

    def python(self, host: str) -> str:
        """The Python interpreter of the host runtime."""
        if self.recipe.software.python:
            return self.recipe.software.python
        return posixpath.join(self.hosts[host].workdir, "runtime", self.runtime_key, "bin", "python")

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
        }
        if self.etcd_endpoint:
            env["ETCD_ENDPOINTS"] = self.etcd_endpoint
            if self.recipe.control_plane.etcd_lease_ttl_s:
                env["ETCD_LEASE_TTL"] = str(self.recipe.control_plane.etcd_lease_ttl_s)
        if self.discovery_dir:
            env["DYN_FILE_KV"] = self.discovery_dir
        return env


@dataclass(frozen=True)
class WorkerSlot:
    """Where one worker process runs and which ports it owns."""

    name: str
    role: str
    host: str
    gpus: tuple[int, ...]
    parallel: Parallel
    data_parallel: DataParallel | None
    group: str | None
    ports: dict[str, int] = field(default_factory=dict)

"""Where things live on a host: every path under a host's workdir (`Layout`), and a service's unit name.

The controller plans and renders with these, and hosts use the same definitions: this module is shipped with
the host agent (deploy/shipping.py), so it imports nothing but the standard library.
"""

from __future__ import annotations

import os


def unit_name(deployment: str, service: str) -> str:
    """The systemd unit (and process-supervisor) name of a service."""
    return f"primectl-{deployment}-{service}"


class Layout:
    """Every path primectl keeps under a host's workdir."""

    # What `down --purge` removes (the runtime venv and wheelhouse stay: they are shared and costly).
    PURGED = ("releases", "current", "state.json", "logs", "run", "secrets", "incoming", "lock", "data", "discovery",
              "models")

    def __init__(self, workdir: str):
        self.workdir = workdir

    def path(self, *parts: str) -> str:
        """A path under the workdir."""
        return os.path.join(self.workdir, *parts)

    @property
    def releases(self) -> str:
        return self.path("releases")

    def release(self, revision: str) -> str:
        """releases/<revision>: one immutable bundle."""
        return self.path("releases", revision)

    @property
    def current(self) -> str:
        """The link to the release that runs."""
        return self.path("current")

    @property
    def state(self) -> str:
        return self.path("state.json")

    def log(self, service: str) -> str:
        return self.path("logs", f"{service}.log")

    def pidfile(self, service: str) -> str:
        """run/<service>.pid: "pid starttime", so a reused pid is never taken for the service."""
        return self.path("run", f"{service}.pid")

    def started_from(self, service: str) -> str:
        """run/<service>.release: the revision `current` named when primectl last started the service."""
        return self.path("run", f"{service}.release")

    @property
    def lock(self) -> str:
        return self.path("lock")

    @property
    def lock_owner(self) -> str:
        return self.path("lock", "owner.json")

    def secrets(self, deployment: str) -> str:
        """The 0600 env file run scripts source."""
        return self.path("secrets", f"{deployment}.env")

    def incoming(self, revision: str) -> str:
        """Where an uploaded release archive (`unpack_files`) waits to be staged."""
        return self.path("incoming", f"{revision}.release")

    def script(self, service: str) -> str:
        """The run script of a service, through the `current` link."""
        return self.path("current", "bin", f"{service}.sh")

    def unit_file(self, unit: str) -> str:
        """The unit file a release ships for a service."""
        return self.path("current", "systemd", f"{unit}.service")

    def runtime(self, key: str) -> str:
        """runtime/<key>: the host runtime venv for one pinned set (shared by deployments, kept by purge)."""
        return self.path("runtime", key)

    def scratch(self, run_id: str) -> str:
        """preflight/<run>: probes and their logs, removed afterwards."""
        return self.path("preflight", run_id)

"""The typed client of the host agent: one method per operation, one error type.

Every method sends one request over the host's transport and returns the
typed result; a failed operation raises `HostError` (host, operation, code,
service), which is a DeployError. The only expected non-success outcome that
is not an error is a lock held by someone else (`lock` returns it).
"""

from __future__ import annotations

import base64
from typing import Any, cast

from primectl.deploy.transport import OnProgress, Transport
from primectl.errors import DeployError
from primectl.host.wire import (
    CODE_FAILED,
    HostState,
    InspectResult,
    InstallProgress,
    LockResult,
    ReloadResult,
    ServiceRef,
    StartResult,
    StopResult,
    WaitSpec,
)


class HostError(DeployError):
    """An agent operation failed on a host."""

    def __init__(self, host: str, op: str, message: str, *, code: int = CODE_FAILED, service: str | None = None):
        self.host = host
        self.op = op
        self.code = code
        super().__init__(f"{host}: {message}", service=service)


class HostClient:
    """Agent operations on one host, with its workdir and supervisor filled in."""

    def __init__(self, name: str, transport: Transport, workdir: str, supervisor: str):
        self.name = name
        self.transport = transport
        self.base = {"workdir": workdir, "supervisor": supervisor}

    def call(self, op: str, args: dict[str, Any] | None = None, *, timeout: float | None = None,
             check: bool = True, progress: OnProgress | None = None, every: float = 1.0) -> dict[str, Any]:
        """Run one operation; HostError when it failed (unless `check` is off). `progress` gets its progress
        lines (the agent sends one at least every `every` seconds while it waits)."""
        args = self.base | (args or {})
        if progress is None:
            result = self.transport.agent(op, args, timeout)
        else:
            result = self.transport.agent(op, args | {"progress_s": every}, timeout, progress)
        if check and not result.get("ok"):
            raise HostError(self.name, op, str(result.get("error") or f"{op} failed"),
                            code=int(result.get("code", CODE_FAILED)), service=result.get("service"))
        return result

    def inspect(self, units: dict[str, str], ports: list[int], address: str,
                probes: list[dict[str, Any]] | None = None) -> InspectResult:
        """State, current release, lock, liveness of every service, and which of `ports` are taken; with `probes`,
        each run once too (`probes` in the result, as `probe` gives them)."""
        args: dict[str, Any] = {"services": units, "ports": ports, "address": address}
        if probes:
            args["probes"] = probes
        # the probes get the minute `probe` gives them, on top of the inspection's own
        return cast(InspectResult, self.call("inspect", args, timeout=120 if probes else 60))

    def lock(self, owner: dict[str, Any], *, force: bool) -> LockResult:
        """Take the cluster lock; a held lock comes back with ok False and its owner (not an error)."""
        return cast(LockResult, self.call("lock", {"owner": owner, "force": force}, check=False))

    def settle(self, timeout: float = 600) -> None:
        """Wait until no other agent is changing this host (the last call of an `up` that was killed)."""
        self.call("settle", {"timeout": timeout}, timeout=timeout + 30)

    def unlock(self, *, token: str | None = None, force: bool = False) -> bool:
        """Release the lock held by `token` (or any lock with `force`); whether it was released."""
        return bool(self.call("unlock", {"token": token, "force": force}, check=False).get("ok"))

    def stage(self, revision: str, archive: bytes | None = None) -> None:
        """Unpack a release (`host.files.unpack_files`): the one uploaded to incoming/, or `archive` sent with the
        request."""
        args: dict[str, Any] = {"revision": revision}
        if archive is not None:
            args["archive_b64"] = base64.b64encode(archive).decode()
        self.call("stage", args)

    def activate(self, *, revision: str | None = None, secrets: dict[str, str] | None = None) -> None:
        """Write the secrets file and/or switch `current` to a release."""
        args: dict[str, Any] = {}
        if revision is not None:
            args["revision"] = revision
        if secrets is not None:
            args["secrets"] = secrets
        self.call("activate", args)

    def switch(self, revision: str) -> None:
        """Point `current` at a release already on the host."""
        self.call("switch", {"revision": revision})

    def start_wait(self, services: list[ServiceRef], waits: list[WaitSpec], timeout: float | None = None,
                   progress: OnProgress | None = None) -> StartResult:
        """Start services and wait for their probes; HostError naming the service that failed.
        `progress` gets each service's phase while it waits (deploy/progress.py shows them)."""
        return cast(StartResult, self.call("start_wait", {"services": services, "waits": waits}, timeout=timeout,
                                           progress=progress))

    def reload(self, services: list[ServiceRef], waits: list[WaitSpec], timeout: float | None = None,
               progress: OnProgress | None = None) -> ReloadResult:
        """Reload running services in place (their `reload`; one not running is started) and wait for their probes."""
        return cast(ReloadResult, self.call("reload", {"services": services, "waits": waits}, timeout=timeout,
                                            progress=progress))

    def wait(self, waits: list[WaitSpec], timeout: float | None = None,
             progress: OnProgress | None = None) -> StartResult:
        """Wait for probes."""
        return cast(StartResult, self.call("wait", {"waits": waits}, timeout=timeout, progress=progress))

    def install_progress(self, venv: str, log: str) -> InstallProgress:
        """How far a runtime install into `venv` is (pip writing to `log`)."""
        return cast(InstallProgress, self.call("install_progress", {"venv": venv, "log": log}, timeout=60))

    def stop(self, services: list[ServiceRef], *, remove_units: bool = False) -> list[str]:
        """Stop services; the names that were running."""
        return self.stop_drained(services, remove_units=remove_units).get("stopped", [])

    def stop_drained(self, services: list[ServiceRef], *, remove_units: bool = False) -> StopResult:
        """Stop services, each drained first where its ref says how; what was stopped and what draining took."""
        timeout = sum(float(s.get("drain", {}).get("timeout_s", 0)) + float(s.get("stop_timeout", 30))
                      for s in services) + 60
        return cast(StopResult, self.call("stop", {"services": services, "remove_units": remove_units}, timeout=timeout))

    def probe(self, probes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Run each probe once: name -> {ok, detail}."""
        return dict(self.call("probe", {"probes": probes}, timeout=60).get("results", {}))

    def write_state(self, state: HostState) -> None:
        """Record state.json."""
        self.call("write_state", {"state": state})

    def tail(self, services: list[str], lines: int, units: dict[str, str] | None = None) -> dict[str, str]:
        """The last lines of each service's log (plus the supervisor's own words about its unit)."""
        return dict(self.call("tail", {"services": services, "lines": lines, "units": units or {}}).get("logs", {}))

    def purge(self) -> None:
        """Remove primectl's files under the workdir."""
        self.call("purge")

    def read(self, path: str) -> str:
        """A small text file under the workdir ('' when absent)."""
        return str(self.call("read", {"path": path}).get("text", ""))

    def spawn(self, argv: list[str], *, cwd: str, log: str) -> int:
        """Start a helper process in its own session; its pid."""
        return int(self.call("spawn", {"argv": argv, "cwd": cwd, "log": log})["pid"])

    def kill(self, pid: int, marker: str) -> None:
        """Stop a spawned helper by pid, if its command line still holds `marker`."""
        self.call("kill", {"pid": pid, "marker": marker}, check=False)

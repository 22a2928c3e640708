"""A FAKE transport for unit tests: the real host agent, run in-process on temp-dir workdirs.

Everything the agent does to files (stage, switch, state, lock, secrets,
purge) is real; what cannot run in a unit test is simulated by a `FakeWorld`:
which services are running (a FakeSupervisor instead of processes or
systemd), whether a readiness probe passes, which hosts cannot be reached,
and faults to inject (a service that exits at start, one that never becomes
ready, a Ctrl-C while a service starts, a host that drops mid-rollout).
Like pyinfra's `connectors/fake.py`: rollout, diff, rollback and dropped
hosts get tests that run in milliseconds, beside the real-sshd tests.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from primectl.deploy.access import access
from primectl.deploy.transport import HostUnreachable, OnProgress, progress_line
from primectl.host import agent
from primectl.host.probes import TEXT_MISSING
from primectl.host.supervisor import Supervisor, mark_start
from primectl.host.wire import Liveness, ProbeSpec, Progress, ServiceRef
from primectl.plan.layout import Layout
from primectl.plan.model import HostPlan

Fault = Literal["exit-at-start", "never-ready", "interrupt-at-start", "unhealthy-after-start"]


@dataclass
class FakeWorld:
    """The simulated part of the fake hosts, shared by every transport a test opens."""

    faults: dict[str, Fault] = field(default_factory=dict)  # service -> fault
    unreachable: set[str] = field(default_factory=set)  # hosts that refuse connections
    drop_after: dict[str, int] = field(default_factory=dict)  # host -> agent calls it answers, then drops
    gate_ready: bool = True
    # service -> probes it fails ("connection refused") before it passes, logging "Loading weights... k/n" at each
    ready_after: dict[str, int] = field(default_factory=dict)
    probes: dict[str, int] = field(default_factory=dict)  # service -> probes so far
    taken: dict[str, set[int]] = field(default_factory=dict)  # host -> ports something else listens on
    running: dict[tuple[str, str], int] = field(default_factory=dict)  # (host, service) -> fake pid
    starts: list[tuple[str, str]] = field(default_factory=list)  # every (host, service) start, in order
    stops: list[tuple[str, str]] = field(default_factory=list)
    drains: list[tuple[str, str]] = field(default_factory=list)  # every (host, service) drained before it stopped
    reloads: list[tuple[str, str]] = field(default_factory=list)  # every (host, service) reloaded in place
    namespaces: dict[tuple[str, str], str] = field(default_factory=dict)  # (host, service) -> its DYN_NAMESPACE
    unlisted: set[str] = field(default_factory=set)  # running workers the frontend lost (until they start again)
    interrupt_after: set[str] = field(default_factory=set)  # agent ops answered, then Ctrl-C before the answer arrives
    calls: list[tuple[str, str]] = field(default_factory=list)  # every (host, op)
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def connector(self) -> Any:
        """A `ConnectionPolicy.connector`: opens a FakeTransport (HostUnreachable for unreachable hosts)."""

        def connect(host: HostPlan) -> FakeTransport:
            if host.name in self.unreachable:
                raise HostUnreachable(f"{host.name} ({host.address}:{access(host).port}): cannot connect: "
                                      "fake host is down")
            return FakeTransport(host, self)

        return connect

    def started(self, service: str) -> int:
        """How many times a service was started."""
        return sum(1 for _, s in self.starts if s == service)

    def is_running(self, host: str, service: str) -> bool:
        """Whether the fake process of a service runs."""
        return (host, service) in self.running


class FakeSupervisor(Supervisor):
    """Processes that exist only in the FakeWorld."""

    name = "fake"

    def __init__(self, layout: Layout, world: FakeWorld, host: str):
        super().__init__(layout)
        self.world = world
        self.host = host

    def liveness(self, name: str, unit: str) -> Liveness:
        pid = self.world.running.get((self.host, name))
        return {"alive": pid is not None, "pid": pid, "state": "running" if pid else "stopped"}

    def start(self, svc: ServiceRef) -> tuple[int | None, str | None]:
        name = svc["name"]
        fault = self.world.faults.get(name)
        with self.world._lock:
            self.world.starts.append((self.host, name))
            self.world.unlisted.discard(name)  # started again, it registers again
        if fault == "interrupt-at-start":
            del self.world.faults[name]  # the operator presses Ctrl-C once; the rollback then proceeds
            raise KeyboardInterrupt
        if fault == "exit-at-start":
            self.world.running.pop((self.host, name), None)
            return None, None  # "started", then gone before it became ready
        if svc.get("drain") and (self.host, name) in self.world.running:
            self.world.drains.append((self.host, name))
        pid = next(self.world._pids)
        self.world.running[(self.host, name)] = pid
        self.world.namespaces[(self.host, name)] = self._namespace(name)
        mark_start(self.layout, name)
        return pid, None

    def _namespace(self, name: str) -> str:
        """The Dynamo namespace its run script exports (where a real worker would register)."""
        try:
            with open(self.layout.script(name)) as f:
                for line in f:
                    if line.startswith("export DYN_NAMESPACE="):
                        return line.split("=", 1)[1].strip().strip("'")
        except OSError:
            pass
        return ""

    def reload(self, svc: ServiceRef) -> tuple[bool, str | None]:
        if (self.host, svc["name"]) not in self.world.running:
            return False, None
        with self.world._lock:
            self.world.reloads.append((self.host, svc["name"]))
        return True, None

    def stop(self, svc: ServiceRef, *, remove: bool) -> bool:
        with self.world._lock:
            self.world.stops.append((self.host, svc["name"]))
            if svc.get("drain") and (self.host, svc["name"]) in self.world.running:
                self.world.drains.append((self.host, svc["name"]))
        return self.world.running.pop((self.host, svc["name"]), None) is not None


class FakeTransport:
    """`Transport` over the FakeWorld: agent calls run in-process, files go to the host's real (temp) workdir."""

    def __init__(self, host: HostPlan, world: FakeWorld):
        self.host = host
        self.world = world
        self.closed = False

    def _probe(self, name: str, probe: ProbeSpec, workdir: str) -> tuple[bool, str]:
        if name == "gate":
            return self.world.gate_ready, "fake gate " + ("ready" if self.world.gate_ready else "not ready")
        if probe.get("expect_text"):  # "<worker> listed": the frontend lists a running worker it has not lost
            worker = name.removesuffix(" listed")
            if any(key[1] == worker for key in self.world.running) and worker not in self.world.unlisted:
                return True, f"fake listing holds {probe['expect_text']}"
            return False, f"fake HTTP 200, {TEXT_MISSING}{probe['expect_text']}"
        if probe.get("json_path"):  # "<role> registered": the router counts the role's running instances
            role = name.split(" ")[0]
            namespace = str(probe["json_path"]).split(".")[1]  # namespaces.<ns>.worker_types.<role>.workers
            count = sum(1 for key in self.world.running
                        if key[1].startswith(role + "-") and self.world.namespaces.get(key) == namespace)
            return count == probe.get("json_expect"), f"fake router counts {count} {role} worker(s) in {namespace}"
        fault = self.world.faults.get(name)
        if fault == "never-ready" or not self.world.is_running(self.host.name, name):
            return False, "fake HTTP 503"
        n = self.world.probes[name] = self.world.probes.get(name, 0) + 1
        if n <= self.world.ready_after.get(name, 0):
            with open(Layout(workdir).log(name), "a") as log:
                log.write(f"Loading weights... {n}/{self.world.ready_after[name]}\n")
            return False, "fake connection refused"
        if fault == "unhealthy-after-start":
            return False, "fake HTTP 500"
        return True, "fake HTTP 200"

    def agent(self, op: str, args: dict[str, Any], timeout: float | None,
              on_progress: OnProgress | None = None) -> dict[str, Any]:
        """Run one agent operation in-process (HostUnreachable once the host has dropped)."""
        with self.world._lock:
            self.world.calls.append((self.host.name, op))
            left = self.world.drop_after.get(self.host.name)
            if left is not None:
                if left <= 0:
                    raise HostUnreachable(f"{self.host.name}: connection lost: fake host dropped")
                self.world.drop_after[self.host.name] = left - 1
        supervisor = FakeSupervisor(Layout(args["workdir"]), self.world, self.host.name)
        if op == "inspect":  # taken ports come from the world, not from connecting to them
            ports = set(args.get("ports", []))
            result = agent.dispatch(op, args | {"ports": []}, supervisor=supervisor, prober=self._probe)
            result["taken"] = sorted(ports & self.world.taken.get(self.host.name, set()))
            return result
        def emit(progress: Progress) -> None:  # as the transports hand progress lines on (JSON-decoded)
            progress_line(json.loads(json.dumps(progress)), on_progress)

        result = agent.dispatch(op, args, supervisor=supervisor, prober=self._probe,
                                emit=emit if on_progress is not None else None)
        if op in self.world.interrupt_after:
            self.world.interrupt_after.discard(op)
            raise KeyboardInterrupt  # the host did it; the operator's Ctrl-C came before its answer
        return result

    def run(self, command: str, *, timeout: float | None = None, stream: bool = False) -> tuple[int, str, str]:
        """Run a shell command on this machine (the fake host's files are local)."""
        r = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return r.returncode, r.stdout, r.stderr

    def put(self, data: bytes, path: str, mode: int = 0o644) -> None:
        """Write a file under the fake host's workdir."""
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)

    def close(self) -> None:
        self.closed = True

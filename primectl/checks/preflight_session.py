"""What the phases of one preflight run share: the open hosts, their scratch directories, the verdicts so far.

`Session` holds the cluster's host clients and gives each host a scratch
directory for probes (removed by `cleanup`); `Known` is what the host phase
learnt (the agent's view, the fact script's report, which runtimes work), read
by the GPU and fabric phases; `Verdicts` collects one Result per (host, check),
a later one for the same pair replacing the earlier.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import uuid
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from primectl.checks.preflight_rules import HostNeeds, Result
from primectl.deploy.client import HostClient
from primectl.deploy.transport import Transport
from primectl.errors import DeployError
from primectl.plan.layout import Layout
from primectl.plan.model import Plan


def json_line(out: str) -> dict[str, Any] | None:
    """The last line of `out` that is a JSON object (what a probe prints last), else None."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


class Session:
    """The open cluster's hosts plus a scratch directory per host for probes; cleans up afterwards."""

    def __init__(self, plan: Plan, needs: dict[str, HostNeeds], clients: dict[str, HostClient]):
        self.plan = plan
        self.needs = needs
        self.clients = clients
        self.t: dict[str, Transport] = {h: c.transport for h, c in clients.items()}
        self.run_id = uuid.uuid4().hex[:10]
        self._scratch: dict[str, str] = {}

    def spawn(self, host: str, argv: list[str], log: str) -> int | None:
        """Start a probe process in the host's scratch directory through the agent; its pid."""
        try:
            return self.clients[host].spawn(argv, cwd=self.scratch(host), log=log)
        except DeployError:
            return None

    def kill(self, host: str, pid: int, marker: str) -> None:
        """Stop a probe started by `spawn`, by pid (only if it is still ours)."""
        self.clients[host].kill(pid, marker)

    def scratch(self, host: str) -> str:
        if host not in self._scratch:
            d = Layout(self.needs[host].workdir).scratch(self.run_id)
            code, _, err = self.t[host].run(f"mkdir -p {shlex.quote(d)}")
            if code != 0:
                raise DeployError(f"{host}: cannot create {d}: {err.strip()}")
            self._scratch[host] = d
        return self._scratch[host]

    def put_resource(self, host: str, package: str, name: str) -> str:
        path = posixpath.join(self.scratch(host), name)
        self.t[host].put(files(package).joinpath(name).read_bytes(), path, 0o755)
        return path

    def cleanup(self) -> None:
        for host, d in self._scratch.items():
            try:
                self.t[host].run(f"rm -rf {shlex.quote(d)}; rmdir {shlex.quote(posixpath.dirname(d))} 2>/dev/null; true")
            except DeployError:
                pass


@dataclass
class Known:
    """What the host phase learnt, per host it could inspect."""

    views: dict[str, dict[str, Any]] = field(default_factory=dict)  # hosts whose agent inspect succeeded
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)  # hosts whose fact script succeeded
    runtime_ok: set[str] = field(default_factory=set)  # hosts whose runtime matches the pins


class Verdicts(dict[tuple[str, str], Result]):
    """One Result per (host, check); `put` replaces an earlier one for the same pair."""

    def put(self, r: Result) -> None:
        self[(r.host, r.check)] = r

    def status(self, host: str, check: str) -> str | None:
        """The status recorded for (host, check), None when there is none yet."""
        r = self.get((host, check))
        return r.status if r is not None else None

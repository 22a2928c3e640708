"""What `up` would do to each service: pure, from the rendered bundles and what the hosts recorded.

Only what changes how a process runs (argv, env, files it reads, its host and
address) restarts it: `change`. A change in what primectl expects of a service
(start order, readiness probe, metrics URL, stop timeout) is recorded without
a restart: `update`. Dynamo discovers workers dynamically, so scaling a role
changes the frontend's dependency list (start order) but never restarts it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from primectl.deploy.protocol import InspectResult, ServiceRecord
from primectl.render.bundle import Bundle

Action = Literal["add", "change", "update", "restart", "remove", "keep"]
MARKS: dict[str, str] = {"add": "+", "change": "~", "update": "=", "restart": "!", "remove": "-", "keep": " "}
STARTS: tuple[Action, ...] = ("add", "change", "restart")


@dataclass(frozen=True)
class Change:
    """What `up` does to one service, and why."""

    host: str
    service: str
    action: Action
    reason: str

    @property
    def starts(self) -> bool:
        """Whether `up` (re)starts the service."""
        return self.action in STARTS


def changed_fields(have: ServiceRecord, want: Mapping[str, Any], fields: tuple[str, ...] | None = None) -> list[str]:
    """The fields (all, or the given ones in their order) whose hashes differ between two manifest entries."""
    old, new = have.get("fields") or {}, want.get("fields") or {}
    names = fields if fields is not None else tuple(sorted(set(old) | set(new)))
    return [f for f in names if old.get(f) != new.get(f)]


def secrets_hash(deployment: str, secrets: str) -> str:
    """What a host or job records of the secrets it was given (never the values)."""
    return hashlib.sha256((deployment + secrets).encode()).hexdigest()[:16]


def compute_changes(bundles: Mapping[str, Bundle], views: Mapping[str, InspectResult]) -> list[Change]:
    """Per inspected host and service: add, change, update, restart (dead), remove or keep."""
    out: list[Change] = []
    for host in sorted(views):
        state = views[host].get("state") or {}
        recorded: dict[str, ServiceRecord] = dict(state.get("services", {}))
        live = views[host].get("services", {})
        desired: dict[str, Any] = bundles[host].services if host in bundles else {}
        for name, want in desired.items():
            have = recorded.get(name)
            alive = live.get(name, {}).get("alive", False)
            if have is None:
                out.append(Change(host, name, "add", "new service"))
            elif (have.get("hash"), have.get("files_hash")) != (want["hash"], want["files_hash"]):
                fields = [f for f in changed_fields(have, want) if f in want.get("run_fields", ())]
                if not fields and have.get("files_hash") != want["files_hash"]:
                    fields = ["files"]  # what it reads changed (a generated model, a config, a template)
                what = ", ".join(fields) if have.get("fields") and fields else "definition"
                out.append(Change(host, name, "change", f"{what} changed"))
            elif not alive:
                out.append(Change(host, name, "restart", "not running"))
            elif have.get("expect_hash") != want["expect_hash"]:
                fields = changed_fields(have, want, tuple(want.get("expect_fields", ())))
                out.append(Change(host, name, "update", f"{', '.join(fields) or 'expectations'} changed (no restart)"))
            else:
                out.append(Change(host, name, "keep", "unchanged and running"))
        gone = "host dropped from the recipe" if host not in bundles else "no longer in the plan"
        for name in sorted(set(recorded) - set(desired)):
            out.append(Change(host, name, "remove", gone))
    return out


def pending(changes: list[Change]) -> list[Change]:
    """The changes that are not `keep`."""
    return [c for c in changes if c.action != "keep"]

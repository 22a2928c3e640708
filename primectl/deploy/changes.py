"""What `up` would do to each service: pure, from the rendered manifests and what the machines recorded.

One diff for every target: `diff_services` compares a target's rendered
manifest entries with what its machines recorded (SSH: each host's state.json,
Slurm: the deployment's state.json) and says, per service, one `Change`.

Only what changes how a process runs (argv, env, files it reads, its host and
address) restarts it: `change`. A change in what primectl expects of a service
(start order, readiness probe, metrics URL, stop timeout) is recorded without
a restart: `update`. Dynamo discovers workers dynamically, so scaling a role
changes the frontend's dependency list (start order) but never restarts it.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # types only: targets.base imports this module, and must stay light to import
    from primectl.host.wire import InspectResult, ServiceRecord
    from primectl.render.bundle import Bundle

Action = Literal["add", "change", "update", "restart", "remove", "keep"]
MARKS: dict[str, str] = {"add": "+", "change": "~", "update": "=", "restart": "!", "remove": "-", "keep": " "}
STARTS: tuple[Action, ...] = ("add", "change", "restart")


@dataclass(frozen=True)
class Change:
    """What `up` does to one service, and why (one line of `diff`)."""

    host: str
    service: str
    action: Action
    reason: str
    detail: str = ""  # what `diff` shows under the line: a unified diff of its run script

    @property
    def starts(self) -> bool:
        """Whether `up` (re)starts the service."""
        return self.action in STARTS


def changed_fields(have: Mapping[str, Any], want: Mapping[str, Any], fields: tuple[str, ...] | None = None) -> list[str]:
    """The fields (all, or the given ones in their order) whose hashes differ between two manifest entries."""
    old, new = have.get("fields") or {}, want.get("fields") or {}
    names = fields if fields is not None else tuple(sorted(set(old) | set(new)))
    return [f for f in names if old.get(f) != new.get(f)]


def secrets_hash(deployment: str, secrets: str) -> str:
    """What a host or job records of the secrets it was given (never the values)."""
    return hashlib.sha256((deployment + secrets).encode()).hexdigest()[:16]


def script_path(service: str) -> str:
    """A service's run script in a release (what `diff` shows the changes of)."""
    return f"bin/{service}.sh"


def file_diff(path: str, old: str, new: str, old_release: str, new_release: str) -> str:
    """A unified diff of one file between two releases (labelled `<release>/<path>`; empty when equal)."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"{old_release}/{path}", tofile=f"{new_release}/{path}"))


def _run_reason(have: Mapping[str, Any], want: Mapping[str, Any]) -> str:
    """Which of what changes how a service runs changed, in the manifest's order of run fields."""
    fields = changed_fields(have, want, tuple(want.get("run_fields", ())))
    if not fields and have.get("files_hash") != want["files_hash"]:
        fields = ["files"]  # what it reads changed (a generated model, a config, a template)
    what = ", ".join(fields) if have.get("fields") and fields else "definition"
    return f"{what} changed"


def diff_services(want: Mapping[str, Mapping[str, Any]], have: Mapping[str, Mapping[str, Any]], *,
                  host: str | None = None, alive: Mapping[str, bool] | None = None,
                  gone: str = "no longer in the plan", detail: Callable[[str], str] | None = None,
                  started: Mapping[str, str] | None = None, revision: str | None = None) -> list[Change]:
    """Per service: add, change, update, restart (not running), remove or keep.

    `want`: rendered manifest entries by service; `have`: what was recorded of each. `host`: the host every
    line names (None: each entry's own `host`). `alive`: which recorded services run (None: the caller judges
    liveness itself, as Slurm does for the whole job). `gone`: why a recorded service not in `want` goes.
    `detail(service)`: what `diff` shows under a `change` line (a run-script diff). `started`: the revision
    each running service was started from, where known; one that runs `revision` (the one being applied) already,
    started by an `up` that was stopped before it recorded its work, is an `update`: recorded, not restarted.
    """
    out: list[Change] = []
    for name, w in want.items():
        h = have.get(name)
        where = host if host is not None else str(w.get("host", "?"))
        dead = alive is not None and not alive.get(name, False)
        if h is None:
            out.append(Change(where, name, "add", "new service"))
        elif (h.get("hash"), h.get("files_hash")) != (w["hash"], w["files_hash"]):
            if revision and not dead and (started or {}).get(name) == revision:
                out.append(Change(where, name, "update", f"already runs revision {revision} (started by an `up` "
                                                         "that ended before it recorded it): recorded, no restart"))
            else:
                out.append(Change(where, name, "change", _run_reason(h, w) + ("; not running: it starts" if dead else ""),
                                  detail(name) if detail else ""))
        elif dead:
            out.append(Change(where, name, "restart", "not running"))
        elif h.get("expect_hash") != w.get("expect_hash"):
            fields = changed_fields(h, w, tuple(w.get("expect_fields", ())))
            out.append(Change(where, name, "update", f"{', '.join(fields) or 'expectations'} changed (no restart)"))
        else:
            out.append(Change(where, name, "keep", "unchanged and running"))
    for name in sorted(set(have) - set(want)):
        where = host if host is not None else str(have[name].get("host", "?"))
        out.append(Change(where, name, "remove", gone))
    return out


def compute_changes(bundles: Mapping[str, Bundle], views: Mapping[str, InspectResult],
                    detail: Callable[[str, str], str] | None = None,
                    adoptable: Callable[[str], bool] | None = None) -> list[Change]:
    """Per inspected host and service (SSH): `diff_services` of its bundle against its recorded state.

    `detail(host, service)`: what `diff` shows under a `change` line. `adoptable(service)`: whether a service an
    interrupted `up` started from the revision being applied is kept as it runs (else it restarts).
    """
    out: list[Change] = []
    for host in sorted(views):
        state = views[host].get("state") or {}
        recorded: dict[str, ServiceRecord] = dict(state.get("services", {}))
        live = views[host].get("services", {})
        desired: dict[str, Any] = bundles[host].services if host in bundles else {}
        alive = {name: bool(live.get(name, {}).get("alive", False)) for name in desired}
        started = {name: str(live[name]["release"]) for name in desired
                   if live.get(name, {}).get("release") and adoptable is not None and adoptable(name)}
        gone = "host dropped from the recipe" if host not in bundles else "no longer in the plan"
        out += diff_services(desired, recorded, host=host, alive=alive, gone=gone,
                             detail=functools.partial(detail, host) if detail else None, started=started,
                             revision=bundles[host].revision if host in bundles else None)
    return out


def pending(changes: list[Change]) -> list[Change]:
    """The changes that are not `keep`."""
    return [c for c in changes if c.action != "keep"]

"""What `up`, `diff`, `down`, `status`, `keys` and `usage` do with a fleet.

`up` brings each deployment to its recipe through the one `up` pipeline (a deployment that is unchanged is
left alone: "no changes"), then the gateway tier the same way. `down` takes the gateway down first, so no
client request is routed to a deployment while it stops.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primectl.errors import DeployError
from primectl.fleet.etcd_client import Etcd
from primectl.fleet.plan import FleetPlan
from primectl.output import print_table

if TYPE_CHECKING:
    from primectl.pipeline import UpOptions
    from primectl.plan.model import Plan

Say = Callable[[str], None]
Connect = Callable[["Plan"], object]  # a plan's target's connection options, from its own recipe
KEY_PREFIX = "pk-"


def up(fleet: FleetPlan, options: UpOptions, connect: Connect, say: Say) -> float:
    """Every deployment, then the gateway, through the `up` pipeline, each connected to as its own recipe says
    (`connect`: its target's connection options; `options.connection` is not used); the seconds it took."""
    from primectl.pipeline import up as do_up

    t0 = time.monotonic()
    for plan in fleet.plans:
        say(f"deployment {plan.name}:")
        do_up(plan, replace(options, connection=connect(plan)), say)
    say(f"gateway {fleet.gateway.name}:")
    do_up(fleet.gateway, replace(options, connection=connect(fleet.gateway), smoke=False), say)
    say(f"fleet {fleet.name} ready: {fleet.endpoint} (model {fleet.served_model}; clients need a key: "
        f"primectl keys create RECIPE --team NAME)")
    return time.monotonic() - t0


def diff(fleet: FleetPlan, connect: Connect, say: Say) -> bool:
    """Each deployment's diff and the gateway's, printed; whether anything would change."""
    from primectl.pipeline import diff as do_diff
    from primectl.pipeline import print_diff

    changed = False
    for plan in [*fleet.plans, fleet.gateway]:
        sys.stdout.write(f"== {plan.name}\n")
        lines, steps = do_diff(plan, connect(plan), say, smoke=plan is not fleet.gateway)
        changed |= print_diff(lines, steps)
    return changed


def down(fleet: FleetPlan, connect: Connect, say: Say, *, purge: bool, break_lock: bool) -> None:
    """The gateway first (clients stop reaching any deployment), then each deployment."""
    from primectl.targets.base import get

    for plan in [fleet.gateway, *fleet.plans]:
        say(f"{plan.name}:")
        get(plan.target.kind).down(plan, connect(plan), say, purge=purge, break_lock=break_lock)


def render(fleet: FleetPlan, out: Path, target: str | None) -> list[str]:
    """Each deployment's render in out/<deployment>/ (for `target`, else its own), and the gateway tier's in
    out/<fleet>-gateway/ where the target runs it (SSH); elsewhere NOTES.txt says it is left out."""
    from primectl.planner.build import plan_recipe
    from primectl.targets.base import render_for_target

    lines: list[str] = []
    for m in fleet.members:
        lines += render_for_target(plan_recipe(m.recipe, target=target)[1], out / m.name)
    kind = target or fleet.gateway.target.kind
    if kind == fleet.gateway.target.kind:
        lines += render_for_target(fleet.gateway, out / fleet.gateway.name)
    else:
        out.mkdir(parents=True, exist_ok=True)
        note = out / "NOTES.txt"
        note.write_text(f"fleet {fleet.name}: the gateway tier (its etcd, {len(replicas(fleet))} replicas and HAProxy) "
                        f"is rendered for target {fleet.gateway.target.kind} only; for target {kind} the deployments "
                        "are rendered here and the gateway tier is left out.\n")
        lines.append(str(note))
    return lines


def _etcd(fleet: FleetPlan) -> Etcd:
    return Etcd(fleet.etcd)


def key_id(key: str) -> str:
    """What names a key in etcd, `keys list` and usage: its SHA-256 (the key itself is kept nowhere)."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyLimits:
    """A key's class and its own fleet-wide limits (None: none)."""

    klass: str = "interactive"
    max_concurrency: int | None = None
    tokens_per_minute: int | None = None


def create_key(fleet: FleetPlan, team: str, name: str | None, limits: KeyLimits = KeyLimits()) -> str:
    """A new key for `team`, stored hashed; the key itself is returned once and kept nowhere."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    kid = key_id(key)
    record: dict[str, Any] = {"team": team, "name": name or "", "created": time.time(), "class": limits.klass}
    record |= {k: v for k, v in (("max_concurrency", limits.max_concurrency),
                                 ("tokens_per_minute", limits.tokens_per_minute)) if v}
    _etcd(fleet).put(f"{fleet.prefix}/keys/{kid}", json.dumps(record))
    return key


def list_keys(fleet: FleetPlan) -> list[dict[str, Any]]:
    """Every key's id (the start of its hash), team, name, class, limits and creation time."""
    out = []
    for k, v in sorted(_etcd(fleet).prefix(f"{fleet.prefix}/keys/").items()):
        doc = json.loads(v)
        limits = ", ".join(f"{f}={doc[f]}" for f in ("max_concurrency", "tokens_per_minute") if doc.get(f))
        out.append({"id": k.rsplit("/", 1)[-1][:12], "team": doc.get("team", ""), "name": doc.get("name", ""),
                    "class": doc.get("class", "interactive"), "limits": limits,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(doc.get("created", 0)))})
    return out


def revoke_key(fleet: FleetPlan, key_id: str) -> int:
    """Delete the keys whose id starts with `key_id` (at least 8 characters): how many went."""
    etcd = _etcd(fleet)
    gone = 0
    for k in etcd.prefix(f"{fleet.prefix}/keys/"):
        if k.rsplit("/", 1)[-1].startswith(key_id):
            gone += etcd.delete(k)
    return gone


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


def replicas(fleet: FleetPlan) -> list[tuple[str, str]]:
    """(name, base URL) of every gateway replica."""
    return [(s.name, f"http://{s.address}:{s.ports['http']}") for s in fleet.gateway.services if s.role == "gateway"]


def usage(fleet: FleetPlan, since: float, by: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Usage since `since` from every replica, summed by `by` (team, key or deployment); replicas that did not
    answer."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    missing = []
    for name, url in replicas(fleet):
        try:
            got = _get_json(f"{url}/-/usage?since={since}")["rows"]
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            missing.append(f"{name} ({getattr(exc, 'reason', exc)})")
            continue
        for r in got:
            key = {"team": (r["team"],), "key": (r["team"], r["key_id"]), "deployment": (r["deployment"] or "-",)}[by]
            acc = rows.setdefault(key, {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors": 0})
            for f in acc:
                acc[f] += r[f]
    columns = {"team": ["team"], "key": ["team", "key_id"], "deployment": ["deployment"]}[by]
    return [dict(zip(columns, k, strict=True)) | v for k, v in sorted(rows.items())], missing


def status(fleet: FleetPlan) -> dict[str, Any]:
    """Per deployment: breaker, admitted/capacity, weight; per replica: pid, lease, grants (from etcd and the
    replicas themselves)."""
    shared = _etcd(fleet).prefix(f"{fleet.prefix}/")
    breakers = {k.rsplit("/", 1)[-1] for k in shared if k.startswith(f"{fleet.prefix}/breaker/")}
    listed = {k.rsplit("/", 1)[-1]: json.loads(v) for k, v in shared.items() if k.startswith(f"{fleet.prefix}/replicas/")}
    live: dict[str, dict[str, Any]] = {}
    for name, url in replicas(fleet):
        try:
            live[name] = _get_json(f"{url}/health")
        except (urllib.error.URLError, OSError, ValueError):
            live[name] = {}
    deployments = []
    for m in fleet.members:
        blocks = sum(1 for k in shared if k.startswith(f"{fleet.prefix}/admit/{m.name}/"))
        admitted = sum(h.get("deployments", {}).get(m.name, {}).get("inflight", 0) for h in live.values())
        deployments.append({"name": m.name, "endpoint": m.endpoint, "role": m.role, "weight": m.weight,
                            "breaker": "open" if m.name in breakers else "closed", "admitted": admitted,
                            "capacity": m.capacity, "granted_blocks": blocks})
    reps = [{"name": name, "url": url, "ready": bool(live[name].get("ready")), "pid": live[name].get("pid"),
             "lease": live[name].get("lease") or listed.get(name, {}).get("lease"),
             "grants": listed.get(name, {}).get("grants", {}), "inflight": listed.get(name, {}).get("inflight", {}),
             "queued": sum(live[name].get("queued", {}).values()), "limits": live[name].get("limits", {})}
            for name, url in replicas(fleet)]
    return {"fleet": fleet.name, "endpoint": fleet.endpoint, "model": fleet.served_model,
            "deployments": deployments, "replicas": reps, **alerts(fleet),
            "healthy": all(r["ready"] for r in reps) and any(d["breaker"] == "closed" for d in deployments)}


def alerts(fleet: FleetPlan) -> dict[str, Any]:
    """Where the gateway tier's monitoring answers and what fires there (nothing where it is not monitored; a note,
    not a failure, when Alertmanager does not answer: `status` stays about the fleet)."""
    from primectl.alerting.alerts_view import firing_or_note, problems, urls
    from primectl.monitoring.rules import MEMBER

    mon = fleet.gateway.monitoring
    if mon is None:
        return {}
    firing, note = firing_or_note(mon, fleet.gateway.name)
    return {"monitoring": urls(mon), **({"notes": [note]} if note else {}),
            "alerts": [{"alert": a.name, "severity": a.severity, "about": a.labels.get(MEMBER) or a.service or "-",
                        "summary": a.summary} for a in problems(firing) if not a.silenced]}


def print_status(doc: dict[str, Any], output: str) -> None:
    """The fleet's status as two tables (or JSON)."""
    if output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    print_table(f"fleet {doc['fleet']}: {doc['endpoint']} (model {doc['model']})",
                ["deployment", "role", "weight", "breaker", "admitted/capacity", "endpoint"],
                [[d["name"], d["role"], str(d["weight"]), d["breaker"], f"{d['admitted']}/{d['capacity']}", d["endpoint"]]
                 for d in doc["deployments"]])
    print_table("gateway replicas", ["replica", "ready", "pid", "lease", "grants", "queued"],
                [[r["name"], "yes" if r["ready"] else "NO", str(r["pid"] or "-"), str(r["lease"] or "-"),
                  ", ".join(f"{k}={v}" for k, v in r["grants"].items()) or "-", str(r["queued"])]
                 for r in doc["replicas"]])
    if doc.get("alerts"):
        print_table("alerts firing", ["alert", "severity", "about", "summary"],
                    [[a["alert"], a["severity"], a["about"], a["summary"]] for a in doc["alerts"]])
    for line in [*doc.get("notes", []), *(f"{k} {v}" for k, v in doc.get("monitoring", {}).items())]:
        sys.stdout.write(line + "\n")


def require_gateway(fleet: FleetPlan) -> None:
    """DeployError when no replica answers (the fleet is down)."""
    for _, url in replicas(fleet):
        try:
            _get_json(f"{url}/health")
            return
        except (urllib.error.URLError, OSError, ValueError):
            continue
    raise DeployError(f"no gateway replica of fleet {fleet.name} answers; run `primectl up` on the fleet",
                      service="gateway-0")

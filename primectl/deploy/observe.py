"""`status`, `logs` and `diff`: read what runs on the hosts, change nothing."""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass
from typing import Any

from primectl.deploy.rollout import Change, Cluster, compute_changes, parallel
from primectl.plan.model import Plan
from primectl.render.bundle import Bundle


@dataclass(frozen=True)
class ServiceStatus:
    """One service as `status` reports it."""

    service: str
    host: str
    role: str
    deployed: bool
    running: bool
    ready: bool
    pid: int | None
    revision: str | None
    detail: str

    @property
    def healthy(self) -> bool:
        """Deployed, running and passing its readiness probe."""
        return self.deployed and self.running and self.ready


def collect_status(cluster: Cluster) -> tuple[list[ServiceStatus], dict[str, Any]]:
    """Liveness from the agent plus one readiness probe per service, and the gate."""
    plan = cluster.plan

    def probe(h: str) -> dict[str, Any]:
        probes = [{"name": s.name, "probe": s.ready.model_dump(mode="json")} for s in plan.services_on(h)]
        if plan.service("frontend").host == h:
            probes.append({"name": "gate", "probe": plan.gate.model_dump(mode="json")})
        return cluster.call(h, "probe", {"probes": probes}, timeout=60)

    results = parallel(probe, list(cluster.views))
    rows: list[ServiceStatus] = []
    gate: dict[str, Any] = {"ok": False, "detail": "frontend host not inspected"}
    for svc in plan.services:
        view = cluster.views.get(svc.host, {})
        state = (view.get("state") or {}).get("services", {}).get(svc.name)
        live = view.get("services", {}).get(svc.name, {})
        res = results.get(svc.host)
        pr = res.get("results", {}).get(svc.name, {}) if isinstance(res, dict) else {}
        rows.append(ServiceStatus(
            svc.name, svc.host, svc.role, state is not None, bool(live.get("alive")), bool(pr.get("ok")),
            live.get("pid"), state.get("release") if state else None,
            pr.get("detail", "") if state else "not deployed",
        ))
        if svc.name == "frontend" and isinstance(res, dict):
            gate = res.get("results", {}).get("gate", gate)
    return rows, gate


def render_diff(cluster: Cluster, bundles: dict[str, Bundle]) -> tuple[list[Change], dict[str, str]]:
    """What `up` would do, with a unified diff of each changed service's run script."""
    changes = compute_changes(cluster.plan, bundles, cluster.views)
    details: dict[str, str] = {}
    for c in changes:
        if c.action != "change":
            continue
        view = cluster.views[c.host]
        release = (view.get("state") or {}).get("services", {}).get(c.service, {}).get("release")
        path = f"bin/{c.service}.sh"
        old = ""
        if release:
            wd = cluster.workdir(c.host)
            _, old, _ = cluster.transports[c.host].run(f"cat {shlex.quote(f'{wd}/releases/{release}/{path}')}")
        new = bundles[c.host].files[path].decode()
        details[c.service] = "".join(difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=f"{c.host}:{release}/{path}", tofile=f"{c.host}:{bundles[c.host].revision}/{path}"))
    return changes, details


def log_command(plan: Plan, service: str, *, follow: bool, lines: int) -> tuple[str, str]:
    """(host, shell command) that prints a service's log."""
    svc = plan.service(service)
    path = f"{plan.host(svc.host).workdir}/logs/{service}.log"
    return svc.host, f"tail -n {int(lines)} {'-F ' if follow else ''}{shlex.quote(path)}"

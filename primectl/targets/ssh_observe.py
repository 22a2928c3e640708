"""`status` and `logs` over SSH: read what runs on the hosts, change nothing."""

from __future__ import annotations

import shlex
from typing import Any

from primectl.checks.registration import listing_probes, mark_unlisted
from primectl.deploy.cluster import Cluster
from primectl.deploy.status import ServiceStatus, StatusReport
from primectl.plan.model import Plan


def status_probes(plan: Plan, h: str) -> list[dict[str, Any]]:
    """What `status` probes on host `h`: each service's readiness, and on the head host the gate and the listing
    of every worker in the frontend's discovery."""
    probes = [{"name": s.name, "probe": s.ready.model_dump(mode="json")} for s in plan.services_on(h)]
    if plan.head == h:
        probes.append({"name": "gate", "probe": plan.gate.model_dump(mode="json")})
        probes += listing_probes(plan, [w.name for w in plan.workers()])
    return probes


def collect_status(cluster: Cluster) -> StatusReport:
    """Liveness from the agent plus one readiness probe per service, the gate, and worker figures, from a cluster
    opened with `status_probes` (their results ride with each host's inspection)."""
    plan = cluster.plan
    results = {h: dict(view.get("probes") or {}) for h, view in cluster.views.items()}
    rows: list[ServiceStatus] = []
    gate: dict[str, Any] = {"ok": False, "detail": "frontend host not inspected"}
    for svc in plan.services:
        state = cluster.recorded(svc.host).get(svc.name) if svc.host in cluster.views else None
        live = cluster.views.get(svc.host, {}).get("services", {}).get(svc.name, {})
        res = results.get(svc.host, {})
        pr = res.get(svc.name, {})
        rows.append(ServiceStatus(
            svc.name, svc.host, svc.role, state is not None, bool(live.get("alive")), bool(pr.get("ok")),
            live.get("pid"), state.get("release") if state else None,
            pr.get("detail", "") if state else "not deployed",
            state=str(live.get("state", "")), restarts=int(live.get("restarts", 0) or 0),
        ))
        if svc.host == plan.head and svc.host in results:
            gate = res.get("gate", gate)
    rows = mark_unlisted(rows, results.get(plan.head, {}))
    report = StatusReport(plan.name, rows, gate, plan.gate.url or "")
    from primectl.checks.workers import worker_sections

    report.sections, report.notes = worker_sections(plan)
    return report


def log_command(plan: Plan, service: str, *, follow: bool, lines: int, journal: bool = False) -> tuple[str, str]:
    """(host, shell command) that prints a service's log file, or with `journal` what systemd logged about its unit.

    Units write the service's output to the same log file as the process supervisor
    (StandardOutput=append:), so the journal holds only systemd's own lines: starts, stops,
    exits with their status, and automatic restarts with their counter.
    """
    from primectl.plan.layout import Layout, unit_name

    svc = plan.service(service)
    if journal:
        unit = shlex.quote(f"{unit_name(plan.name, service)}.service")
        return svc.host, f"journalctl -u {unit} -n {int(lines)} --no-pager -o short-iso{' -f' if follow else ''}"
    path = Layout(plan.host(svc.host).workdir).log(service)
    # Strip terminal escape codes on the host (GNU sed, unbuffered so --follow stays live).
    strip = r"sed -u -e 's/\x1b\[[0-9;?]*[ -\/]*[@-~]//g' -e 's/\x1b\][^\x07]*\x07//g' -e 's/\r$//'"
    return svc.host, f"tail -n {int(lines)} {'-F ' if follow else ''}{shlex.quote(path)} | {strip}"

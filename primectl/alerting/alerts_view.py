"""`primectl alerts`, and the alert marks `status` adds: what fires now, since when, where, and what to do."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from primectl.alerting import alertmanager_api as api
from primectl.alerting.alertmanager_api import Firing
from primectl.deploy.status import StatusReport
from primectl.output import print_table
from primectl.plan.model import MonitoringPlan

HEARTBEAT = "Watchdog"  # always fires, by design: not a problem, never listed as one


def problems(alerts: list[Firing]) -> list[Firing]:
    """The alerts that say something is wrong (all but the Watchdog)."""
    return [a for a in alerts if a.name != HEARTBEAT]


def ago(since: datetime, now: datetime | None = None) -> str:
    """How long ago, as `3m12s`."""
    s = max(0, int(((now or datetime.now(UTC)) - since).total_seconds()))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"


def by_service(alerts: list[Firing]) -> dict[str, list[str]]:
    """Service -> names of the alerts firing about it."""
    out: dict[str, list[str]] = {}
    for a in problems(alerts):
        if a.service:
            out.setdefault(a.service, []).append(a.name)
    return out


def print_alerts(deployment: str, mon: MonitoringPlan, alerts: list[Firing], output: str,
                 stream: TextIO | None = None) -> None:
    """A table (or JSON) of the firing alerts, then where Prometheus and Alertmanager answer."""
    stream = stream or sys.stdout
    shown = problems(alerts)
    if output == "json":
        doc: dict[str, Any] = {
            "deployment": deployment, "prometheus": mon.prometheus_url, "alertmanager": mon.alertmanager_url,
            "firing": [{"alert": a.name, "severity": a.severity, "service": a.service, "host": a.host,
                        "since": a.since.isoformat(), "summary": a.summary, "runbook": a.runbook,
                        "silenced": a.silenced, "inhibited": a.inhibited, "labels": a.labels} for a in shown]}
        stream.write(json.dumps(doc, indent=2) + "\n")
        return
    rows = [[a.name + (" (silenced)" if a.silenced else " (inhibited)" if a.inhibited else ""), a.severity, a.service or "-", a.host or "-",
             ago(a.since), a.summary, a.runbook] for a in shown]
    title = f"{deployment}: {len(shown)} alert(s) firing" if shown else f"{deployment}: no alerts firing"
    if shown:
        print_table(title, ["alert", "severity", "service", "host", "since", "summary", "runbook"], rows,
                    fold="runbook", stream=stream)
    else:
        stream.write(title + "\n")
    stream.write(f"prometheus {mon.prometheus_url}\nalertmanager {mon.alertmanager_url}\n")


def urls(mon: MonitoringPlan) -> dict[str, str]:
    """Where Prometheus and Alertmanager answer, as `status` prints them."""
    return {"prometheus": mon.prometheus_url, "alertmanager": mon.alertmanager_url}


def firing_or_note(mon: MonitoringPlan, deployment: str) -> tuple[list[Firing], str | None]:
    """What fires about `deployment` now, or nothing and the note that Alertmanager did not answer (for `status`,
    which stays about the services when monitoring does not answer)."""
    try:
        return api.firing(mon.alertmanager_url, deployment), None
    except api.AlertmanagerError as exc:
        return [], f"alerts unknown: Alertmanager did not answer ({exc})"


def attach_alerts(report: StatusReport, mon: MonitoringPlan, deployment: str) -> None:
    """Mark `status`'s rows with the alerts firing about them, and add where monitoring answers."""
    report.monitoring = urls(mon)
    firing, note = firing_or_note(mon, deployment)
    if note:
        report.notes.append(note)
        return
    report.alerts = by_service(firing)
    wide = [a for a in problems(firing) if not a.service]
    report.notes += [f"alert {a.name} firing: {a.summary}" for a in wide]

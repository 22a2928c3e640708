"""What `status` reports, whatever the target: one row per service, the gate, and worker figures."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from primectl.output import print_table


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
    state: str = ""  # the supervisor's own view, e.g. systemd's "active (running)"
    restarts: int = 0  # restarts the supervisor did by itself since the unit started

    @property
    def healthy(self) -> bool:
        """Deployed, running and passing its readiness probe."""
        return self.deployed and self.running and self.ready


@dataclass
class StatusReport:
    """The whole deployment's status."""

    deployment: str
    rows: list[ServiceStatus]
    gate: dict[str, Any]
    gate_url: str
    sections: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # e.g. "kv cache", "nixl"
    notes: list[str] = field(default_factory=list)
    monitoring: dict[str, str] = field(default_factory=dict)  # prometheus/alertmanager -> URL, where monitored
    alerts: dict[str, list[str]] = field(default_factory=dict)  # service -> the alerts firing about it

    @property
    def healthy(self) -> bool:
        """Every service healthy and the gate passing."""
        return all(r.healthy for r in self.rows) and bool(self.gate.get("ok"))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`status -o json`)."""
        return {"deployment": self.deployment, "healthy": self.healthy, "gate": self.gate,
                "services": [asdict(r) | {"healthy": r.healthy} for r in self.rows],
                **{k.replace(" ", "_"): v for k, v in self.sections.items()}, "notes": self.notes,
                **({"monitoring": self.monitoring, "alerts": self.alerts} if self.monitoring else {})}


def print_status(report: StatusReport, output: str, stream: TextIO | None = None) -> None:
    """Table (rich on a terminal, plain whole columns in a pipe), wide (adds state, restarts) or json."""
    stream = stream or sys.stdout
    if output == "json":
        stream.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return
    wide = output == "wide"
    headers = ["service", "host", "role", "running", "ready", "pid", "revision"]
    if wide:
        headers += ["state", "restarts"]
    if report.monitoring:
        headers.append("alerts")
    headers.append("detail")
    rows = []
    for r in report.rows:
        row = [r.service, r.host, r.role, "yes" if r.running else "NO", "yes" if r.ready else "NO", str(r.pid or "-"),
               r.revision or "-"]
        if wide:
            row += [r.state or "-", str(r.restarts)]
        if report.monitoring:
            row.append(", ".join(report.alerts.get(r.service, [])) or "-")
        detail = r.detail + (f" (restarted {r.restarts}x by the supervisor)" if r.restarts and not wide else "")
        rows.append([*row, detail])
    print_table(f"{report.deployment}: {'healthy' if report.healthy else 'NOT HEALTHY'}", headers, rows, fold="detail",
                stream=stream)
    for title, items in report.sections.items():
        if items:
            keys = list(items[0])
            print_table(title, keys, [[_cell(i.get(k)) for k in keys] for i in items], stream=stream)
    stream.write(f"gate {report.gate_url}: {'ready' if report.gate.get('ok') else 'NOT READY'} "
                 f"({report.gate.get('detail')})\n")
    for note in report.notes:
        stream.write(f"note: {note}\n")
    for name, url in report.monitoring.items():
        stream.write(f"{name} {url}\n")


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else f"{v:.4g}"
    return str(v)

"""Alertmanager's HTTP API (v2), as primectl uses it: what fires, and the silences a change sets and lifts."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

TIMEOUT_S = 5


class AlertmanagerError(Exception):
    """Alertmanager did not answer, or refused the call."""


@dataclass(frozen=True)
class Firing:
    """One active alert."""

    name: str
    severity: str
    labels: dict[str, str]
    since: datetime
    summary: str
    runbook: str
    silenced: bool
    inhibited: bool = False

    @property
    def service(self) -> str:
        """The service it is about ('' for a deployment-wide alert)."""
        return self.labels.get("service", "")

    @property
    def host(self) -> str:
        """The host it is about ('' where none)."""
        return self.labels.get("host", "") or self.labels.get("check_host", "")


def _call(url: str, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raise AlertmanagerError(f"{method} {url}: HTTP {exc.code} {exc.read()[:200].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AlertmanagerError(f"{method} {url}: {reason}") from None
    return json.loads(raw) if raw else None


def firing(base: str, deployment: str, *, include_silenced: bool = False) -> list[Firing]:
    """The deployment's active alerts, oldest first: inhibited ones too (an alert another one explains, such as a
    worker's TargetDown under its role's WorkersBelowPlan, is still true: only its notification is held back);
    silenced ones only with `include_silenced`."""
    query = "active=true" + ("" if include_silenced else "&silenced=false")
    out = []
    for a in _call(f"{base}/api/v2/alerts?{query}") or []:
        labels = dict(a.get("labels") or {})
        if labels.get("deployment", deployment) != deployment:
            continue
        ann = a.get("annotations") or {}
        out.append(Firing(
            name=labels.get("alertname", "?"), severity=labels.get("severity", ""), labels=labels,
            since=datetime.fromisoformat(str(a.get("startsAt", "1970-01-01T00:00:00Z")).replace("Z", "+00:00")),
            summary=ann.get("summary", ""), runbook=ann.get("runbook", ""),
            silenced=bool((a.get("status") or {}).get("silencedBy")),
            inhibited=bool((a.get("status") or {}).get("inhibitedBy"))))
    return sorted(out, key=lambda f: (f.since, f.name, f.service))


def silence(base: str, matchers: dict[str, str], *, minutes: float, created_by: str, comment: str,
            silence_id: str | None = None) -> str:
    """Create a silence of alerts whose labels match (a value with `|` is a regex alternation), or with
    `silence_id` change that one's end; its id."""
    now = datetime.now(UTC)
    body: dict[str, Any] = {
        "matchers": [{"name": k, "value": v, "isRegex": "|" in v, "isEqual": True} for k, v in matchers.items()],
        "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=minutes)).isoformat(),
        "createdBy": created_by, "comment": comment,
    }
    if silence_id:
        body["id"] = silence_id
    return str(_call(f"{base}/api/v2/silences", "POST", body)["silenceID"])


@dataclass(frozen=True)
class Silence:
    """One active silence."""

    id: str
    matchers: dict[str, str]
    ends: datetime


def active_silences(base: str, created_by: str) -> list[Silence]:
    """The active silences `created_by` set."""
    return [Silence(s["id"], {m["name"]: m["value"] for m in s.get("matchers") or []},
                    datetime.fromisoformat(str(s.get("endsAt", "1970-01-01T00:00:00Z")).replace("Z", "+00:00")))
            for s in _call(f"{base}/api/v2/silences") or []
            if s.get("createdBy") == created_by and (s.get("status") or {}).get("state") == "active"]


def expire(base: str, silence_id: str) -> None:
    """Lift a silence now."""
    _call(f"{base}/api/v2/silence/{silence_id}", "DELETE")

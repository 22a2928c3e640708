"""The recipe's `monitoring:` block: where Prometheus and Alertmanager run, where alerts go, the SLOs rules use."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

KEY = "monitoring"
DURATION_RE = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def duration_s(text: str) -> float:
    """A Prometheus duration (`15s`, `1h30m`) in seconds."""
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(int(n) * scale[unit] for n, unit in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", text))


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _duration(value: str) -> str:
    if not DURATION_RE.match(value):
        raise ValueError(f"{value!r} is not a duration; write it as Prometheus does: 5s, 1m, 1h30m, 15d")
    return value


class Email(_Block):
    """Alerts by email, through Alertmanager's own SMTP client."""

    to: str = Field(..., description="Address the alerts go to.")
    sender: str = Field(..., alias="from", description="Address they come from.")
    smarthost: str = Field(..., description="SMTP server as host:port.")
    require_tls: bool = Field(True, description="Refuse to send without STARTTLS.")


class Alerts(_Block):
    """Where Alertmanager sends notifications, and how it groups them (neither `webhook` nor `email`: alerts are
    only seen with `primectl alerts` and in Alertmanager's own UI)."""

    webhook: str | None = Field(None, description="URL Alertmanager POSTs each notification to (its webhook format).")
    email: Email | None = Field(None, description="Send notifications by email instead of, or beside, the webhook.")
    heartbeat: str | None = Field(None, description="URL the always-firing Watchdog alert is sent to (a dead man's "
                                  "switch); None: Watchdog is not sent anywhere.")
    group_wait: str = Field("10s", description="How long Alertmanager waits to group a new alert with others.")
    group_interval: str = Field("1m", description="How long before a changed group (a new or resolved alert) "
                                "is notified again.")
    repeat_interval: str = Field("4h", description="How long before a still-firing alert is notified again.")

    _durations = field_validator("group_wait", "group_interval", "repeat_interval")(classmethod(
        lambda cls, v: _duration(v)))


class Slo(_Block):
    """The service levels the quality rules hold the deployment to."""

    ttft_p95_s: float = Field(2.0, gt=0, description="Time to first token at p95, in seconds.")
    itl_p95_s: float = Field(0.1, gt=0, description="Inter-token latency at p95, in seconds.")
    error_ratio: float = Field(0.01, gt=0, lt=1, description="Share of requests that may fail (5 minutes).")
    throttled_ratio: float = Field(0.05, gt=0, lt=1, description="A fleet's: share of its requests its gateway may "
                                   "answer 429, every deployment full (5 minutes).")


class MonitoringPorts(_Block):
    """Ports of the monitoring services (node_exporter's on every host)."""

    prometheus: int = Field(9090, ge=1, le=65535)
    alertmanager: int = Field(9093, ge=1, le=65535)
    node_exporter: int = Field(9100, ge=1, le=65535)
    balancer: int = Field(8404, ge=1, le=65535, description="HAProxy's own /metrics, where there is a balancer.")
    dcgm_exporter: int = Field(9400, ge=1, le=65535, description="dcgm-exporter's, on GPU hosts.")


class MonitoringBlock(_Block):
    """`monitoring:`: Prometheus, Alertmanager, node_exporter on every host and dcgm-exporter on every GPU host,
    with rules for serving and hardware, and continuous health checks."""

    optional_block: ClassVar[bool] = True
    block_description: ClassVar[str] = ("Continuous monitoring and alerting: Prometheus and Alertmanager on one host, "
                                        "exporters on every host (absent: none).")

    enabled: bool = Field(True, description="false: plan none of it (the block may stay in the recipe).")
    host: str | None = Field(None, description="Host of Prometheus and Alertmanager; default: the frontend's.")
    retention: str = Field("15d", description="How long Prometheus keeps samples.")
    scrape_interval: str = Field("5s", description="How often every target is scraped.")
    evaluation_interval: str = Field("5s", description="How often the rules are evaluated.")
    health_interval: str = Field("15s", description="How often each host runs its health checks (textfile metrics).")
    alerts: Alerts = Field(default_factory=Alerts, description="Where alerts go.")
    slo: Slo = Field(default_factory=Slo, description="SLOs for the quality rules.")
    sysfs: str = Field("/sys", description="The sysfs node_exporter reads (InfiniBand ports among others).")
    infiniband: bool | None = Field(None, description="The hosts have InfiniBand ports to watch (state, physical "
                                    "state, link downs); default: where the hardware profile has GPUs.")
    dcgm_interval_ms: int = Field(5000, ge=100, description="dcgm-exporter's collection interval (its default is "
                                  "30000: too slow to see a link flap).")
    ports: MonitoringPorts = Field(default_factory=MonitoringPorts)

    _durations = field_validator("retention", "scrape_interval", "evaluation_interval", "health_interval")(
        classmethod(lambda cls, v: _duration(v)))

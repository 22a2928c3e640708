"""The alert rules primectl ships, each with a runbook line saying what to do.

The groups are plain data; `rules_yaml` is the rule file bare-metal Prometheus loads, and the Kubernetes target's
PrometheusRule carries the same groups. Expressions read only the labels scrape.py gives every target
(`deployment`, `service`, `host`, `role`) and the metric names the real components export (the contract test
checks each name against captured exposition in tests/data/metrics/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from primectl.monitoring.model import Slo


@dataclass(frozen=True)
class RuleFacts:
    """What the rules need to know of the plan."""

    deployment: str
    slo: Slo
    scrape_interval: str = "5s"
    workers: dict[str, int] = field(default_factory=dict)  # role -> planned worker processes
    roles: tuple[str, ...] = ()  # every role with a scraped service
    components: tuple[str, ...] = ()  # every component with a scraped service (the scrape jobs)


@dataclass(frozen=True)
class Rule:
    """One alerting rule."""

    alert: str
    expr: str
    severity: str  # critical pages; warning tickets; none (the Watchdog)
    summary: str
    runbook: str
    for_: str = "0s"
    labels: dict[str, str] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        """The rule as Prometheus reads it."""
        out: dict[str, Any] = {"alert": self.alert, "expr": self.expr}
        if self.for_ != "0s":
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.labels}
        out["annotations"] = {"summary": self.summary, "runbook": self.runbook}
        return out


def _times(duration: str, n: int) -> str:
    """`n` times a duration, in seconds."""
    from primectl.monitoring.model import duration_s

    return f"{round(duration_s(duration) * n)}s"


def availability(facts: RuleFacts) -> list[Rule]:
    """Processes the deployment needs, down or missing."""
    dep = facts.deployment
    out = [Rule(
        "TargetDown", f'up{{deployment="{dep}"}} == 0', "critical",
        "{{ $labels.service }} on {{ $labels.host }} ({{ $labels.role }}) is not answering its metrics scrape",
        "primectl status <recipe>; primectl logs <recipe> {{ $labels.service }}; primectl up <recipe> restarts it",
        for_=_times(facts.scrape_interval, 3))]
    for role, count in sorted(facts.workers.items()):
        out.append(Rule(
            "WorkersBelowPlan", f'count(up{{deployment="{dep}",role="{role}"}} == 1) < {count} '
            f'or absent(up{{deployment="{dep}",role="{role}"}} == 1)', "critical",
            f"fewer live {role} workers than the plan's {count}",
            "primectl status <recipe> names the missing workers; primectl up <recipe> starts them",
            for_="30s", labels={"role": role}))
    return out


def self_monitoring(facts: RuleFacts) -> list[Rule]:
    """Alerts about the monitoring itself."""
    return [Rule(
        "Watchdog", "vector(1)", "none",
        "always firing: proves the path from Prometheus to Alertmanager to the receiver works",
        "if the heartbeat receiver stops hearing this, monitoring is down: check Prometheus and Alertmanager")]


def rule_groups(facts: RuleFacts) -> list[dict[str, Any]]:
    """Every group, in a stable order."""
    groups = [("availability", availability(facts)), ("self-monitoring", self_monitoring(facts))]
    return [{"name": f"primectl-{name}", "rules": [r.doc() for r in rules]} for name, rules in groups if rules]


def rules_yaml(facts: RuleFacts) -> str:
    """The rule file: its groups, as bare-metal Prometheus loads them."""
    return yaml.safe_dump({"groups": rule_groups(facts)}, sort_keys=False, default_flow_style=False, width=120)

"""Where a plan's monitoring answers, from its planned Prometheus and Alertmanager."""

from __future__ import annotations

from typing import Any

from primectl.monitoring.model import duration_s
from primectl.plan.model import MonitoringPlan, Service

SETTLE_MARGIN_S = 5


def monitoring_plan(services: list[Service], block: Any) -> MonitoringPlan | None:
    """The Prometheus and Alertmanager URLs, when the plan has both (None: the recipe does not monitor)."""
    by_component = {s.component: s for s in services}
    prom, am = by_component.get("prometheus"), by_component.get("alertmanager")
    if prom is None or am is None:
        return None
    return MonitoringPlan(host=prom.host, prometheus_url=f"http://{prom.address}:{prom.ports['http']}",
                          alertmanager_url=f"http://{am.address}:{am.ports['http']}", alertmanager_service=am.name,
                          # a restarted target is scraped up, then the rules evaluated, twice over
                          settle_s=2 * (duration_s(block.scrape_interval) + duration_s(block.evaluation_interval))
                          + SETTLE_MARGIN_S)

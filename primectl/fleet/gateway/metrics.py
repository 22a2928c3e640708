"""A gateway replica's metrics: counters, gauges and histograms, served as Prometheus text exposition 0.0.4."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from .admission import Deployment

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
Labels = tuple[tuple[str, str], ...]


METRIC_PREFIX = "primectl_gateway_"
COUNTERS = {
    "requests_total": "Requests answered, by HTTP status and the deployment that answered (none: the gateway).",
    "failovers_total": "Requests a deployment refused or failed before their first byte (sent on to the next).",
    "continuations_total": "Streams a deployment broke after their first byte, continued on another deployment.",
    "stream_errors_total": "Streams that a deployment broke and that ended with an SSE error event.",
    "throttled_total": "429s answered: every deployment was at capacity.",
    "unauthorized_total": "401s answered: no key, or not a key of the fleet.",
    "breaker_trips_total": "Times this replica opened a deployment's shared circuit breaker.",
    "lease_keepalive_failures_total": "Lease keepalives that failed (etcd unreachable) or found the lease gone.",
}
PER_DEPLOYMENT = ("failovers_total", "continuations_total", "stream_errors_total", "breaker_trips_total")
GAUGES = {
    "breaker_open": "1 while the deployment's shared circuit breaker is open, as this replica knows it.",
    "inflight_requests": "Requests this replica has admitted to the deployment now.",
    "granted_slots": "Slots of the deployment this replica holds (its blocks x block).",
    "capacity_slots": "The deployment's capacity: concurrent requests the fleet admits to it.",
}
HISTOGRAMS = {
    "time_to_first_event_seconds": (TTFT_BUCKETS, "From a request's arrival to the first event of its stream "
                                                  "written to the client."),
    "request_duration_seconds": (DURATION_BUCKETS, "From a request's arrival to its response's last byte."),
}


def _gauges(d: Deployment) -> dict[str, int]:
    return {"breaker_open": int(d.open_since is not None), "inflight_requests": d.inflight,
            "granted_slots": d.granted, "capacity_slots": d.capacity}


def _labels(pairs: Labels) -> str:
    """A label set as exposition writes it (backslash, quote and newline escaped)."""
    esc = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n"}
    return "{" + ",".join(f'{k}="{v.translate(esc)}"' for k, v in pairs) + "}" if pairs else ""


class Metrics:
    """This replica's counters and histograms, served at /metrics as Prometheus text exposition 0.0.4. A request's
    status, duration and time to its first event are taken in one place, the middleware, from its response."""

    def __init__(self, deployments: list[Deployment]):
        self.deployments = deployments
        # every counter starts at 0 (per deployment where it has one), so a rule on it has data from the first scrape
        self.counts: dict[tuple[str, Labels], int] = {
            (n, ()): 0 for n in COUNTERS if n not in PER_DEPLOYMENT and n != "requests_total"}  # that one has a code
        self.counts |= {(n, (("deployment", d.name),)): 0 for n in PER_DEPLOYMENT for d in deployments}
        self.hists: dict[tuple[str, Labels], list[float]] = {}  # a count per bucket, then the sum, then the count

    def inc(self, name: str, deployment: str | None = None, **labels: str) -> None:
        key = (name, tuple(sorted({**labels, **({"deployment": deployment} if deployment else {})}.items())))
        self.counts[key] = self.counts.get(key, 0) + 1

    def observe(self, name: str, seconds: float, deployment: str | None) -> None:
        buckets = HISTOGRAMS[name][0]
        h = self.hists.setdefault((name, (("deployment", deployment),) if deployment else ()), [0.0] * (len(buckets) + 2))
        for i, le in enumerate(buckets):
            h[i] += seconds <= le
        h[-2] += seconds
        h[-1] += 1

    @web.middleware  # type: ignore[untyped-decorator]
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        t0, status = time.monotonic(), 500
        try:
            resp: web.StreamResponse = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:  # the client went away first (nginx's 499), not a server error
            status = 499
            raise
        finally:
            if request.path.startswith("/v1/"):
                dep = request.get("deployment")
                self.inc("requests_total", dep, code=str(status))
                if status in (429, 401):
                    self.inc("throttled_total" if status == 429 else "unauthorized_total")
                self.observe("request_duration_seconds", time.monotonic() - t0, dep)
                if request.get("first_event"):
                    self.observe("time_to_first_event_seconds", request["first_event"] - t0, dep)

    def text(self) -> str:
        """The exposition page."""
        out: list[str] = []
        pre = METRIC_PREFIX

        def family(name: str, kind: str, text: str, samples: list[str]) -> None:
            out.extend([f"# HELP {pre}{name} {text}", f"# TYPE {pre}{name} {kind}", *samples])

        for name, text in COUNTERS.items():
            family(name, "counter", text, [f"{pre}{name}{_labels(k)} {v}" for (n, k), v in
                                           sorted(self.counts.items()) if n == name])
        for name, text in GAUGES.items():
            family(name, "gauge", text, [f'{pre}{name}{_labels((("deployment", d.name),))} {_gauges(d)[name]}'
                                         for d in self.deployments])
        for name, (buckets, text) in HISTOGRAMS.items():
            samples = []
            for (n, k), h in sorted(self.hists.items()):
                if n == name:
                    samples += [f"{pre}{name}_bucket{_labels((*k, ('le', f'{le:g}')))} {int(c)}"
                                for le, c in zip(buckets, h, strict=False)]
                    samples += [f"{pre}{name}_bucket{_labels((*k, ('le', '+Inf')))} {int(h[-1])}",
                                f"{pre}{name}_sum{_labels(k)} {h[-2]!r}", f"{pre}{name}_count{_labels(k)} {int(h[-1])}"]
            family(name, "histogram", text, samples)
        return "\n".join(out) + "\n"

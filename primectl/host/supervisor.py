"""The supervisor strategy: how a service's process is started, stopped and watched on a host (`Supervisor`;
process_supervisor and systemd_supervisor are the two), and how a service is emptied before it stops.
"""

from __future__ import annotations

import os
import time

from primectl.host.probes import http_fetch
from primectl.host.processes import SIGTERM, end_watches, session_of, starttime

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from primectl.host.wire import Drained, DrainSpec, Liveness, ServiceRef
    from primectl.plan.layout import Layout


def inflight(drain: DrainSpec) -> int | None:
    """In-flight requests a service reports on its metrics: the named gauges summed (None: unreadable)."""
    url, names = drain.get("inflight_url"), set(drain.get("inflight_metrics") or [])
    if not url or not names:
        return None
    try:
        status, body = http_fetch(str(url), timeout=2)
    except (OSError, ValueError):
        return None
    if status != 200:
        return None
    text = body.decode(errors="replace")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.split("{", 1)[0].split(" ", 1)[0] in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                pass
    return int(total)


# A draining worker has left discovery the moment it got SIGTERM, but a request the router had already
# picked it for may still be on its way: it counts as empty only after this long with nothing in flight.
DRAIN_QUIET_S = 1.0
DRAINED_STOP_S = 2.0  # how long a drained service gets to exit by itself before SIGKILL


def drain_by_signal(pid: int, drain: DrainSpec, alive: Any = None) -> Drained:
    """SIGTERM the service's main process only (Dynamo workers then leave discovery and stop taking work) and
    wait until its metrics show nothing in flight for DRAIN_QUIET_S, it exits, or `timeout_s` passes."""
    alive = alive or (lambda: starttime(pid) is not None)
    t0 = time.time()
    try:
        os.kill(pid, SIGTERM)
    except ProcessLookupError:
        return {"seconds": 0.0, "cut": 0, "how": "signal"}
    deadline = t0 + float(drain.get("timeout_s", 60))
    quiet_since: float | None = None
    last: int | None = None
    while time.time() < deadline and alive():
        last = inflight(drain)
        now = time.time()
        if last == 0:
            quiet_since = quiet_since or now
            if now - quiet_since >= DRAIN_QUIET_S:
                break
        else:
            quiet_since = None
        time.sleep(0.1)
    cut = (last or 0) if time.time() >= deadline and alive() else 0
    return {"seconds": round(time.time() - t0, 3), "cut": cut, "how": "signal"}


class Supervisor:
    """How a service's process is started, stopped and watched on a host."""

    name = "base"

    def __init__(self, layout: Layout):
        self.layout = layout
        self.drained: dict[str, Drained] = {}

    def liveness(self, name: str, unit: str) -> Liveness:
        """Whether the service runs (and the supervisor's own view of it)."""
        raise NotImplementedError

    def drain(self, svc: ServiceRef) -> bool:
        """Empty a running service that says how (its `drain`) before it is stopped; whether it drained."""
        spec = svc.get("drain")
        if not spec:
            return False
        live = self.liveness(svc["name"], svc.get("unit", svc["name"]))
        pid = live.get("pid")
        if not live.get("alive") or pid is None:
            return False
        end_watches(svc.get("unit", svc["name"]), session_of(pid))  # a draining service must not be ended by its watch
        if spec.get("how") == "balancer":
            from primectl.host.haproxy import drain_from_balancer

            self.drained[svc["name"]] = drain_from_balancer(spec)
        else:
            self.drained[svc["name"]] = drain_by_signal(pid, spec)
        return True

    def prepare(self, services: list[ServiceRef]) -> str | None:
        """Before starting services of the current release (systemd: install their units); an error or None."""
        return None

    def reload(self, svc: ServiceRef) -> tuple[bool, str | None]:
        """Have a running service re-read its files in place (its `reload`): (whether it ran, error or None).
        One that does not run is not reloaded: the caller starts it."""
        live = self.liveness(svc["name"], svc.get("unit", svc["name"]))
        pid = live.get("pid")
        if not live.get("alive") or pid is None:
            return False, None
        from primectl.host.haproxy import reload_in_place

        return True, reload_in_place(pid, svc["reload"])

    def start(self, svc: ServiceRef) -> tuple[int | None, str | None]:
        """(Re)start one service from `current`: (pid, error)."""
        raise NotImplementedError

    def stop(self, svc: ServiceRef, *, remove: bool) -> bool:
        """Stop one service (and with `remove`, forget it: systemd disables and deletes its unit); was it running?"""
        raise NotImplementedError

    def stop_many(self, services: list[ServiceRef], *, remove: bool) -> list[str]:
        """Stop a batch of services (of one start wave: no order among them); the names that were running."""
        return [svc["name"] for svc in services if self.stop(svc, remove=remove)]

    def journal(self, unit: str, lines: int) -> str:
        """What the supervisor itself logged about the service (systemd: the journal), '' if nothing."""
        return ""


def mark_start(layout: Layout, name: str) -> None:
    """Append the `--- primectl: starting NAME at TIME ---` line to a service's log (every supervisor does)."""
    os.makedirs(layout.path("logs"), exist_ok=True)
    with open(layout.log(name), "ab") as log:
        log.write(f"--- primectl: starting {name} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')} ---\n".encode())

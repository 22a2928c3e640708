"""An Alertmanager webhook receiver for benchmarks and tests: records every notification with when it arrived."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Notification:
    """One alert of one webhook notification."""

    at: float  # time.monotonic() when it arrived
    status: str  # firing or resolved
    alert: str
    labels: dict[str, str]


@dataclass
class Receiver:
    """A webhook server on `address:port` (start it with `start`, stop it with `stop`)."""

    address: str = "127.0.0.1"
    port: int = 0
    received: list[Notification] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        """Where Alertmanager posts."""
        return f"http://{self.address}:{self.port}/alerts"

    def start(self) -> Receiver:
        """Listen, in a thread of this process."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner._record(json.loads(body or b"{}"))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((self.address, self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _record(self, doc: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            for a in doc.get("alerts") or []:
                labels = dict(a.get("labels") or {})
                self.received.append(Notification(now, str(a.get("status")), labels.get("alertname", ""), labels))

    def since(self, t0: float, *, watchdog: bool = False) -> list[Notification]:
        """What arrived after `t0` (the Watchdog heartbeat left out unless asked for)."""
        with self._lock:
            return [n for n in self.received if n.at >= t0 and (watchdog or n.alert != "Watchdog")]

    def wait_for(self, t0: float, timeout: float, *, status: str, alert: str | None = None,
                 service: str | None = None, labels: dict[str, str] | None = None) -> Notification | None:
        """The first notification after `t0` with this status (and alert name, service label, other labels), or
        None."""
        want = {**(labels or {}), **({"service": service} if service is not None else {})}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in self.since(t0):
                if n.status == status and (alert is None or n.alert == alert) and all(
                        n.labels.get(k) == v for k, v in want.items()):
                    return n
            time.sleep(0.1)
        return None

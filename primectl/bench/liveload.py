"""Steady streaming load that counts lost requests: the yardstick for changes made to a live deployment.

N client threads each send streaming chat requests in a loop through the
official `openai` client, with its retries off (a retry would hide a loss).
A request counts as served when its stream ends with a `finish_reason`; any
exception, HTTP error or stream that ends without one is lost, recorded with
what the client saw. The loop is bounded by a request count and a deadline
and stops by itself.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Outcome:
    """One request as a client saw it."""

    client: int
    started: float  # monotonic
    ended: float
    ok: bool
    detail: str = ""


@dataclass
class LoadReport:
    """Everything the clients saw while the load ran."""

    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def served(self) -> int:
        """Requests that finished with a finish_reason."""
        return sum(o.ok for o in self.outcomes)

    @property
    def lost(self) -> list[Outcome]:
        """Requests that did not."""
        return [o for o in self.outcomes if not o.ok]

    def seen(self) -> str:
        """The distinct errors clients got, most frequent first ('-' when none)."""
        counts = Counter(o.detail for o in self.lost)
        return "; ".join(f"{n}x {d}" for d, n in counts.most_common(3)) or "-"


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    text = str(exc).replace("\n", " ")
    if status is not None:
        return f"HTTP {status}: {text[:120]}"
    return f"{type(exc).__name__}: {text[:120]}"


class LiveLoad:
    """`clients` threads streaming chat completions from `endpoint` until `stop()` (or a bound) ends them."""

    def __init__(self, endpoint: str, model: str, *, clients: int = 6, max_tokens: int = 48,
                 max_requests: int = 20000, deadline_s: float = 600, timeout_s: float = 60):
        self.endpoint = endpoint.rstrip("/")
        self.model = model
        self.clients = clients
        self.max_tokens = max_tokens
        self.max_requests = max_requests
        self.deadline = time.monotonic() + deadline_s
        self.timeout_s = timeout_s
        self.report = LoadReport()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> LiveLoad:
        """Start the client threads; returns self."""
        for i in range(self.clients):
            t = threading.Thread(target=self._loop, args=(i,), name=f"live-load-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> LoadReport:
        """Let every in-flight request finish, then stop; what the clients saw."""
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout_s + 5)
        return self.report

    def __enter__(self) -> LiveLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _more(self) -> bool:
        with self._lock:
            return (not self._stop.is_set() and time.monotonic() < self.deadline
                    and len(self.report.outcomes) < self.max_requests)

    def _loop(self, client_id: int) -> None:
        from openai import OpenAI

        client = OpenAI(base_url=f"{self.endpoint}/v1", api_key="none", timeout=self.timeout_s, max_retries=0)
        n = 0
        while self._more():
            n += 1
            t0 = time.monotonic()
            ok, detail = self._one(client, f"client {client_id} turn {n}: tell me about the weather")
            with self._lock:
                self.report.outcomes.append(Outcome(client_id, t0, time.monotonic(), ok, detail))
            if not ok:
                time.sleep(0.05)  # an error comes back at once: do not spin

    def _one(self, client: object, prompt: str) -> tuple[bool, str]:
        try:
            stream = client.chat.completions.create(  # type: ignore[attr-defined]
                model=self.model, messages=[{"role": "user", "content": prompt}],
                max_tokens=self.max_tokens, stream=True)
            finish = None
            for chunk in stream:
                for choice in chunk.choices:
                    finish = choice.finish_reason or finish
            return (True, "") if finish else (False, "stream ended without a finish_reason")
        except Exception as exc:  # every failure a client can see counts, whatever its type
            return False, _describe(exc)

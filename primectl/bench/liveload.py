"""Steady streaming load that counts lost requests: the yardstick for changes made to a live deployment.

N client threads each send streaming chat requests in a loop through the
official `openai` client, with its retries off (a retry would hide a loss).
A request counts as served when its stream ends with a `finish_reason`; any
exception, HTTP error or stream that ends without one is lost, recorded with
what the client saw. The loop is bounded by a request count and a deadline
and stops by itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from primectl.components.haproxy import BACKEND, admin_socket
from primectl.host.haproxy import balancer_command, balancer_server


@dataclass
class Outcome:
    """One request as a client saw it."""

    client: int
    started: float  # monotonic
    ended: float
    ok: bool
    detail: str = ""
    tokens: int = 0  # content chunks the client had received when the request ended (0: failed before any token)


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


def agent_prompt(client: int, turn: int, size: int) -> str:
    """A client's prompt for one turn: a short question, or, with `size`, one of about `size` bytes that grows
    each turn from the same history (an agent session: most of it cached, the tail new)."""
    head = f"client {client} turn {turn}: tell me about the weather"
    if size <= len(head):
        return head
    history = " ".join(f"step{client}x{i}" for i in range(size // 8 + 1))
    return (history[:size - len(head) - 1] + " " + head)[:size]


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    text = str(exc).replace("\n", " ")
    if status is not None:
        return f"HTTP {status}: {text[:120]}"
    return f"{type(exc).__name__}: {text[:120]}"


class LiveLoad:
    """`clients` threads streaming chat completions from `endpoint` until `stop()` (or a bound) ends them; each
    client sends at least one request."""

    def __init__(self, endpoint: str, model: str, *, clients: int = 6, max_tokens: int = 48,
                 max_requests: int = 20000, deadline_s: float = 600, timeout_s: float = 60, prompt_bytes: int = 0):
        self.endpoint = endpoint.rstrip("/")
        self.model = model
        self.clients = clients
        self.max_tokens = max_tokens
        self.max_requests = max_requests
        self.deadline = time.monotonic() + deadline_s
        self.timeout_s = timeout_s
        self.prompt_bytes = prompt_bytes
        self.report = LoadReport()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> LiveLoad:
        """Start the client threads, each with its client made; returns self."""
        # Made here, not in the threads: importing openai takes seconds on a busy host, and a stop() that came
        # before a thread's first request would end the load with nothing sent.
        from openai import OpenAI

        for i in range(self.clients):
            client = OpenAI(base_url=f"{self.endpoint}/v1", api_key="none", timeout=self.timeout_s, max_retries=0)
            t = threading.Thread(target=self._loop, args=(i, client), name=f"live-load-{i}", daemon=True)
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

    def _loop(self, client_id: int, client: object) -> None:
        n = 0
        while n == 0 or self._more():  # a started client sends at least one request, whenever stop() comes
            n += 1
            t0 = time.monotonic()
            ok, detail, tokens = self._one(client, agent_prompt(client_id, n, self.prompt_bytes))
            with self._lock:
                self.report.outcomes.append(Outcome(client_id, t0, time.monotonic(), ok, detail, tokens))
            if not ok:
                time.sleep(0.05)  # an error comes back at once: do not spin

    def _one(self, client: object, prompt: str) -> tuple[bool, str, int]:
        tokens = 0
        try:
            stream = client.chat.completions.create(  # type: ignore[attr-defined]
                model=self.model, messages=[{"role": "user", "content": prompt}],
                max_tokens=self.max_tokens, stream=True)
            finish = None
            for chunk in stream:
                for choice in chunk.choices:
                    tokens += bool(choice.delta and choice.delta.content)
                    finish = choice.finish_reason or finish
            return (True, "", tokens) if finish else (False, "stream ended without a finish_reason", tokens)
        except Exception as exc:  # every failure a client can see counts, whatever its type
            return False, _describe(exc), tokens


def up_killed_at(primectl: str, recipe: Path, line: str, *, cwd: Path, timeout_s: float = 600,
                 args: tuple[str, ...] = ()) -> tuple[bool, str]:
    """`primectl up RECIPE --no-smoke [ARGS...]`, killed with SIGKILL as soon as it prints a line starting with
    `line` (a controller that dies: no cleanup, no rollback). Whether it was killed there (not: it ended first, or
    `timeout_s` passed and it was killed then), and what it had printed."""
    env = os.environ | {"COLUMNS": "250", "NO_COLOR": "1", "PRIMECTL_PROGRESS": "plain"}
    proc = subprocess.Popen([primectl, "up", str(recipe), "--no-smoke", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env)
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    at_line = False
    try:
        assert proc.stdout is not None
        for out in proc.stdout:
            seen.append(out)
            at_line = out.startswith(line)
            if at_line or time.monotonic() > deadline:
                break
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    return at_line, "".join(seen)


_MIGRATION_SAMPLE = re.compile(r"^dynamo_frontend_model_migration_(total|duration_seconds_count)\{([^}]*)\} (\S+)$")


def frontend_metrics_urls(workdir: Path) -> list[str]:
    """Each frontend replica's /metrics, from the balancer's server list (none without a balancer)."""
    sock = Path(admin_socket(str(workdir)))
    if not sock.exists():
        return []
    urls = []
    for line in balancer_command(str(sock), f"show servers state {BACKEND}").splitlines():
        f = line.split()  # be_id be_name srv_id srv_name srv_addr ... srv_port (the 19th field)
        if len(f) > 18 and f[0].isdigit():
            urls.append(f"http://{f[4]}:{f[18]}/metrics")
    return urls


def deployment_counters(workdir: Path) -> dict[str, float]:
    """What the deployment counted, summed over the frontend replicas: `migration/<type>` (migrations Dynamo
    started: new_request before a stream, ongoing_request after), `migration_outcome/<outcome>` (how they ended;
    `failure`: Dynamo could not migrate the request) and `balancer_retries` (requests HAProxy sent again)."""
    out: dict[str, float] = {}
    for url in frontend_metrics_urls(workdir):
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            m = _MIGRATION_SAMPLE.match(line)
            if not m:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            key = (f"migration/{labels.get('migration_type')}" if m.group(1) == "total"
                   else f"migration_outcome/{labels.get('outcome')}")
            out[key] = out.get(key, 0.0) + float(m.group(3))
    sock = Path(admin_socket(str(workdir)))
    if sock.exists():
        out["balancer_retries"] = float(balancer_server(str(sock), f"{BACKEND}/BACKEND").get("wretr") or 0)
    return out


def counter_delta(before: dict[str, float], after: dict[str, float], prefix: str) -> dict[str, int]:
    """The counters under `prefix/` that moved, by their name after the prefix."""
    keys = {k for k in (*before, *after) if k.startswith(prefix + "/")}
    moved = {k.split("/", 1)[1]: int(after.get(k, 0) - before.get(k, 0)) for k in sorted(keys)}
    return {k: v for k, v in moved.items() if v}

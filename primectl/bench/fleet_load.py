"""Streaming load through a fleet's edge, counted by how each request ended; what the fleet benchmarks
(benchmarks/fleet_replica_loss.py, benchmarks/fleet_blue_green.py) share.

A request ends as one of:
- `ok`: its stream ended with a finish_reason;
- `lost before first byte`: no response began (the client's `create` raised): what the edge is to resend;
- `cut mid-stream`: the response began, then the stream broke (an error while it was read);
- `no finish_reason`: the stream ended cleanly without one;
- `hung`: still open when the load was stopped and given time to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from primectl.bench.fleet_copy import FleetCopy

REPO = Path(__file__).resolve().parents[2]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
OK, LOST, CUT, NO_FINISH, HUNG = "ok", "lost before first byte", "cut mid-stream", "no finish_reason", "hung"


@dataclass
class Outcome:
    """One request: when it started and ended, and how."""

    started: float
    ended: float = 0.0
    how: str = HUNG
    detail: str = ""


@dataclass
class Load:
    """The clients' outcomes, and a switch to stop them."""

    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, endpoint: str, key: str, clients: int, prompt_bytes: int, max_tokens: int) -> None:
        """`clients` threads, each streaming chats in a loop until `stop`."""
        for n in range(clients):
            t = threading.Thread(target=self._loop, args=(endpoint, key, n, prompt_bytes, max_tokens), daemon=True)
            self.threads.append(t)
            t.start()

    def finish(self, hang_s: float) -> None:
        """Stop the clients and give each `hang_s` to end what it holds (one still open stays `hung`)."""
        self.stop.set()
        deadline = time.monotonic() + hang_s
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _loop(self, endpoint: str, key: str, n: int, prompt_bytes: int, max_tokens: int) -> None:
        from openai import OpenAI

        from primectl.checks.smoke import words

        client = OpenAI(base_url=f"{endpoint}/v1", api_key=key, max_retries=0, timeout=300)
        prompt = words(max(1, prompt_bytes // 6), f"client {n}") if prompt_bytes else f"go on, client {n}"
        while not self.stop.is_set():
            o = Outcome(time.monotonic())
            self.outcomes.append(o)
            o.how, o.detail = stream_once(client, prompt, max_tokens)
            o.ended = time.monotonic()


def stream_once(client: Any, prompt: str, max_tokens: int) -> tuple[str, str]:
    """One streamed chat: how it ended (OK, LOST, CUT, NO_FINISH) and the error, if any."""
    try:
        stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                                max_tokens=max_tokens, stream=True)
    except Exception as exc:  # any failure before the response: a lost request
        return LOST, f"{type(exc).__name__}: {exc}"
    finish = None
    try:
        for ch in stream:
            if ch.choices and ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
    except Exception as exc:  # any failure once it began: a cut stream
        return CUT, f"{type(exc).__name__}: {exc}"
    return (OK, "") if finish else (NO_FINISH, "")


def tally(outcomes: list[Outcome]) -> dict[str, int]:
    """How many requests ended each way."""
    out: dict[str, int] = {}
    for o in outcomes:
        out[o.how] = out.get(o.how, 0) + 1
    return out


def cli(*args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`primectl ARGS` from the repository root."""
    return subprocess.run([PRIMECTL, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=os.environ | {"NO_COLOR": "1", "COLUMNS": "250"})


def health(url: str) -> dict[str, Any]:
    """A replica's /health ({} when it does not answer)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
            return doc
    except (OSError, ValueError):
        return {}


def processes_under(path: Path) -> list[int]:
    """Pids of live processes whose cwd is under `path` (every service runs in its workdir)."""
    root = str(path.resolve())
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
                if cwd == root or cwd.startswith(root + "/"):
                    out.append(int(entry))
            except OSError:
                continue
    return out


def kill_under(paths: list[Path]) -> None:
    """SIGKILL what still runs under `paths` (what a benchmark started there), by pid."""
    import signal

    for path in paths:
        for pid in processes_under(path):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def with_fleet(body: Callable[[FleetCopy], int], prefix: str, **copy: Any) -> int:
    """A throwaway fleet copy (`write_fleet(**copy)` in a temporary directory) brought up, `body(fleet)`'s exit
    code, then `down` and whatever still runs under its workdirs SIGKILLed by pid; 1 when `up` failed."""
    import sys
    import tempfile

    from primectl.bench.fleet_copy import write_fleet

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        fleet = write_fleet(Path(tmp), **copy)
        try:
            up = cli("up", fleet.recipe)
            if up.returncode != 0:
                sys.stderr.write(up.stdout + up.stderr)
                return 1
            return body(fleet)
        finally:
            cli("down", fleet.recipe)
            kill_under(list(fleet.workdirs.values()))

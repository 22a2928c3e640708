"""What a long wait is doing, on stderr: services coming up, runtimes installing.

On a terminal (stderr is a tty) each service or host has a live line, redrawn
in place, as `kubectl rollout status` and pip draw theirs:

    decode-0   waiting  41s/600s  probe: HTTP 503  last log: "Loading weights..."
    prefill-0  ready    12s

In a pipe or a file it is one plain line every few seconds, no escape codes:

    waiting: decode-0 41s/600s (probe: HTTP 503; last log: "Loading weights..."), prefill-0 ready 12s

stdout is never written to. PRIMECTL_PROGRESS=live|plain|off overrides the
choice; PRIMECTL_PROGRESS_EVERY_S sets the plain lines' interval (5 s; live
lines are redrawn at most every 0.2 s, or that interval if shorter).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Self, TextIO

from primectl.host.wire import InstallProgress, Progress, ServiceProgress
from primectl.output import is_terminal

PLAIN_EVERY_S = 5.0
LIVE_EVERY_S = 0.2  # the fastest a live line is redrawn
TICK_S = 1.0  # the clock on live lines moves even when no progress line came
PLAIN_LOG_CHARS = 100  # a plain line keeps this much of a service's last log line (a live line: the width)
URLOPEN = re.compile(r"<urlopen error (.*)>")


def _mode(stream: TextIO) -> str:
    mode = os.environ.get("PRIMECTL_PROGRESS", "")
    if mode in ("live", "plain", "off"):
        return mode
    return "live" if is_terminal(stream) and os.environ.get("TERM") != "dumb" else "plain"


def _every() -> float:
    try:
        return max(0.0, float(os.environ.get("PRIMECTL_PROGRESS_EVERY_S", PLAIN_EVERY_S)))
    except ValueError:
        return PLAIN_EVERY_S


def seconds(s: float) -> str:
    """41s, 2m05s."""
    s = max(0, int(s))
    return f"{s}s" if s < 120 else f"{s // 60}m{s % 60:02d}s"


class Display:
    """Status lines: redrawn in place on a terminal, one plain line every `every` seconds elsewhere.

    Thread-safe: hosts report from their own threads. A ticker thread redraws with the clock moving
    while nothing new comes (a probe can block for seconds), so a slow start never looks frozen.
    """

    def __init__(self, stream: TextIO | None = None, mode: str | None = None, every: float | None = None):
        self.stream = stream or sys.stderr
        self.mode = mode or _mode(self.stream)
        self.every = _every() if every is None else every
        self._lock = threading.Lock()
        self._drawn = 0  # live lines on screen now
        self._last = time.monotonic()  # the first plain line comes `every` seconds in
        self._printed = 0  # plain lines written
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def lines(self) -> list[str]:
        """The live lines (overridden)."""
        return []

    def plain(self) -> str:
        """The plain line (overridden)."""
        return ""

    def final(self, ok: bool) -> str:
        """The plain line when done, written only if plain lines were (overridden)."""
        return ""

    def refresh(self, *, force: bool = False) -> None:
        """Draw now if a redraw is due."""
        with self._lock:
            now = time.monotonic()
            every = min(self.every, LIVE_EVERY_S) if self.mode == "live" else self.every
            if self.mode == "off" or (not force and now - self._last < every):
                return
            self._last = now
            try:
                if self.mode == "live":
                    self._draw_live(self.lines())
                elif text := self.plain():
                    self.stream.write(text + "\n")
                    self._printed += 1
                self.stream.flush()
            except (OSError, ValueError):  # stderr went away: the deployment goes on without it
                self.mode = "off"

    def above(self, say: Callable[[str], None], msg: str) -> None:
        """`say(msg)` without breaking the live lines: they are cleared, the message printed, then redrawn."""
        with self._lock:
            if self.mode == "live" and self._drawn:
                self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
                self.stream.flush()
                self._drawn = 0
            say(msg)
        self.refresh(force=self.mode == "live")

    def _draw_live(self, lines: list[str]) -> None:
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)  # a wrapped line would break the redraw
        out = [f"\x1b[{self._drawn}F"] if self._drawn else []  # to the start of the first line drawn before
        for line in lines:
            out.append("\x1b[2K" + (line if len(line) <= width else line[: width - 3] + "...") + "\n")
        for _ in range(self._drawn - len(lines)):
            out.append("\x1b[2K\n")
        self.stream.write("".join(out))
        self._drawn = max(self._drawn, len(lines))

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S if self.mode == "live" else max(0.2, min(self.every, TICK_S))):
            self.refresh()

    def __enter__(self) -> Self:
        if self.mode != "off":
            if self.mode == "live":
                self.refresh(force=True)
            self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.mode == "live":
            self.refresh(force=True)  # the last state stays on screen
        elif self.mode == "plain" and self._printed:
            text = self.final(kind is None)
            if text:
                with self._lock:
                    self.stream.write(text + "\n")
                    self.stream.flush()


class WaitProgress(Display):
    """Services waiting for their readiness probes, fed by the agent's progress lines of every host."""

    def __init__(self, names: list[str], **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.rows: dict[str, ServiceProgress] = {n: {"name": n, "phase": "starting"} for n in names}
        self.at: dict[str, float] = {}  # when each row last came: its clock runs on from there

    def update(self, progress: Progress) -> None:
        """A progress line from one host (any thread)."""
        with self._lock:
            now = time.monotonic()
            for row in progress.get("progress", []):
                self.rows[row["name"]] = row
                self.at[row["name"]] = now
        self.refresh(force=any(r.get("phase") not in ("starting", "waiting") for r in progress.get("progress", []))
                     and self.mode == "live")

    def _elapsed(self, row: ServiceProgress) -> float:
        elapsed = float(row.get("elapsed", 0.0))
        if row.get("phase") in ("starting", "waiting") and row["name"] in self.at:
            elapsed += time.monotonic() - self.at[row["name"]]
        return elapsed

    def _clock(self, row: ServiceProgress) -> str:
        budget = row.get("budget")
        return seconds(self._elapsed(row)) + (f"/{budget:g}s" if budget and row.get("phase") != "ready" else "")

    @staticmethod
    def _notes(row: ServiceProgress, log_chars: int) -> list[str]:
        notes = []
        if row.get("probe"):
            notes.append("probe: " + URLOPEN.sub(r"\1", row["probe"]))
        if log := row.get("log", ""):
            notes.append(f'last log: "{log if len(log) <= log_chars else log[: log_chars - 3] + "..."}"')
        return notes

    def lines(self) -> list[str]:
        width = max(len(n) for n in self.rows)
        out = []
        for name, row in self.rows.items():
            parts = [f"{name:<{width}}", f"{row.get('phase', 'starting'):<8}", self._clock(row)]
            if row.get("phase") != "ready":
                parts += self._notes(row, 1000)
            out.append("  ".join(parts))
        return out

    def plain(self) -> str:
        items = []
        for name, row in self.rows.items():
            phase = row.get("phase", "starting")
            if phase == "ready":
                items.append(f"{name} ready {seconds(self._elapsed(row))}")
                continue
            notes = self._notes(row, PLAIN_LOG_CHARS)
            state = "" if phase == "waiting" else f" {phase}"
            items.append(f"{name}{state} {self._clock(row)}" + (f" ({'; '.join(notes)})" if notes else ""))
        return "waiting: " + ", ".join(items)

    def final(self, ok: bool) -> str:
        if not ok:
            return ""
        return "ready: " + ", ".join(f"{n} {seconds(self._elapsed(r))}" for n, r in self.rows.items())


class InstallDisplay(Display):
    """Runtime installs, one line per host: packages and MB against the lock's package count."""

    def __init__(self, **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.hosts: dict[str, tuple[str, int, float, InstallProgress]] = {}  # host -> (runtime, total, start, last)

    def begin(self, host: str, runtime: str, packages: int) -> None:
        """A host starts installing `runtime` (`packages` in its lock)."""
        with self._lock:
            self.hosts[host] = (runtime, packages, time.monotonic(), {})

    def update(self, host: str, p: InstallProgress) -> None:
        """What the host's venv and pip log show now."""
        with self._lock:
            if host in self.hosts:
                runtime, total, t0, _ = self.hosts[host]
                self.hosts[host] = (runtime, total, t0, p)
        self.refresh()

    def done(self, host: str) -> None:
        """The host's install ended (its line goes)."""
        with self._lock:
            self.hosts.pop(host, None)
        self.refresh(force=self.mode == "live")

    @staticmethod
    def describe(total: int, p: InstallProgress) -> str:
        installed, collected = min(total, int(p.get("installed", 0))), min(total, int(p.get("collected", 0)))
        venv, down = float(p.get("venv_mb", 0.0)), float(p.get("downloaded_mb", 0.0))
        if installed:
            return f"installed {installed}/{total} packages, {venv:.0f} MB in the venv"
        if collected:
            return f"collected {collected}/{total} packages ({down:.0f} MB downloaded), {venv:.0f} MB in the venv"
        return f"0/{total} packages, {venv:.0f} MB in the venv"

    def lines(self) -> list[str]:
        out = []
        for host, (runtime, total, t0, p) in self.hosts.items():
            out.append(f"{host}  installing {runtime}  {self.describe(total, p)}  {seconds(time.monotonic() - t0)}"
                       + (f'  pip: "{p["last"]}"' if p.get("last") else ""))
        return out

    def plain(self) -> str:
        if not self.hosts:
            return ""
        return "installing runtime: " + ", ".join(
            f"{host} {self.describe(total, p)}, {seconds(time.monotonic() - t0)}"
            for host, (runtime, total, t0, p) in self.hosts.items())

"""Service logs on a host, read for people: the line a starting service last wrote, the tail of a log led by
its first error, without terminal escapes. Patterns are compiled when first used: `import re` costs as much
CPU as the agent's own start-up, and most operations match nothing.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Callable


class LazyPattern:
    """A regular expression compiled when it is first used: `import re` costs as much CPU as the agent's own
    start-up, and most operations match nothing. `maybe` is a cheap test that every text it matches passes: a
    text that fails it is not searched, so a plain log line never imports re."""

    def __init__(self, source: str, maybe: Callable[[str], bool] = lambda text: True):
        self.source = source
        self.maybe = maybe
        self._compiled: re.Pattern[str] | None = None

    def _pattern(self) -> re.Pattern[str]:
        if self._compiled is None:
            import re

            self._compiled = re.compile(self.source)
        return self._compiled

    def search(self, text: str) -> re.Match[str] | None:
        """re.Pattern.search."""
        return self._pattern().search(text) if self.maybe(text) else None

    def sub(self, repl: str, text: str) -> str:
        """re.Pattern.sub."""
        return self._pattern().sub(repl, text) if self.maybe(text) else text


def last_log_line(path: str) -> str:
    """The last line a service wrote to its log since its last start ('' when none): what it is busy with."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    # progress bars redraw with \r: the text after the last one is what the terminal would show
    lines = [line.strip() for line in readable(text.replace("\r", "\n")).splitlines()]
    for line in reversed(lines):
        if line.startswith("--- primectl: starting"):
            return ""
        if line and not PROBE_ECHO.search(line):
            return LOG_STAMP.sub("", line)[:200]
    return ""


# What a service logs about our own readiness probe (Dynamo's system server logs each 503 it answers):
# never what it is busy with.
PROBE_ECHO = LazyPattern(r"tower_http::trace|\bGET /(health|live|ready)\b",
                         lambda text: "tower_http::trace" in text or "GET /" in text)


# a leading ISO time: the line says when, we say how long
LOG_STAMP = LazyPattern(r"^\d{4}-\d\d-\d\dT[\d:.]+Z?\s+", lambda text: text[:4].isdigit())


ANSI_ESCAPE = LazyPattern(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])",
                          lambda text: "\x1b" in text)


def readable(text: str) -> str:
    """Text without terminal escape codes (colours, cursor moves) and other control characters but tab."""
    text = ANSI_ESCAPE.sub("", text)
    return "".join(c for c in text if c in "\t\n" or c >= " ")


ERROR_LINE = LazyPattern(r"\b([A-Za-z_][\w.]*(?:Error|Exception)): \S",
                         lambda text: "Error: " in text or "Exception: " in text)


def tail_file(path: str, lines: int) -> str:
    """The last lines of a log (plain text), led by the first exception it names when that is further up."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 262144))
            text = readable(f.read().decode(errors="replace")).splitlines()
    except FileNotFoundError:
        text = []
    starts = [i for i, line in enumerate(text) if line.startswith("--- primectl: starting")]
    start = starts[-1] if starts else 0  # only this run: from the last start marker on
    last = text[-lines:]
    first_error = next((line for line in text[start:] if ERROR_LINE.search(line)), None)
    out = [line[:400] + (" [...]" if len(line) > 400 else "") for line in last]
    if first_error and first_error not in last:
        out.insert(0, f"(first error in this start's log) {first_error.strip()[:400]}")
    return "\n".join(out)

"""Tables that read well on a terminal and stay whole in a pipe.

On a terminal a table is drawn with rich (columns fit the width, the widest
text column folds). Written to a file or another program it is plain text,
one row per line, columns padded with spaces and never cut, as kubectl
prints: `primectl status ... | grep decode` and `> status.txt` keep whole values.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether output goes to a terminal."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


def one_line(text: str) -> str:
    """A cell's text on one line: line breaks and tabs written as \\n, \\t (a row stays one line in a pipe)."""
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Space-padded columns, upper-case headers, nothing truncated (the last column is not padded). The last
    column may hold several lines: each further one starts under its first."""
    cells = [[h.upper() for h in headers],
             *[[one_line(str(c)) if i < len(row) - 1 else str(c) for i, c in enumerate(row)] for row in rows]]
    widths = [max(len(r[i].split("\n", 1)[0]) for r in cells) for i in range(len(headers))]
    indent = " " * (sum(widths[:-1]) + 3 * (len(headers) - 1))
    lines = []
    for r in cells:
        *first, last = r
        head, *more = [one_line(part) for part in last.split("\n")]
        parts = [c.ljust(widths[i]) for i, c in enumerate(first)] + [head]
        lines.append("   ".join(parts).rstrip())
        lines += [(indent + m).rstrip() for m in more]
    return "\n".join(lines) + "\n"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], *, fold: str | None = None,
                stream: TextIO | None = None) -> None:
    """A table: rich on a terminal (only column `fold` may wrap), plain columns otherwise."""
    stream = stream or sys.stdout
    if not is_terminal(stream):
        stream.write(f"{title}\n" if title else "")
        stream.write(plain_table(headers, rows))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title or None)
    for h in headers:
        t.add_column(h, no_wrap=h != fold, overflow="fold")
    for row in rows:
        t.add_row(*[escape(str(c)) for c in row])
    Console(file=stream).print(t)

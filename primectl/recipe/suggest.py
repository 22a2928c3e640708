"""Did-you-mean suggestions for error messages."""

from __future__ import annotations

import difflib


def did_you_mean(word: str, choices: list[str]) -> str:
    """' (did you mean `x`?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""

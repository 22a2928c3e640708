"""Reading Prometheus text (the /metrics pages of Dynamo workers and the frontend)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def sample_lines(text: str) -> Iterator[tuple[str, str, str]]:
    """(name, label text, value text) of every sample line; comments and other lines are skipped."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            yield m.group(1), m.group(2) or "", m.group(3)


def labels_of(label_text: str) -> dict[str, str]:
    """`a="1",b="x"` as {"a": "1", "b": "x"}."""
    return dict(_LABEL.findall(label_text))


def _parsed(text: str, name: str) -> Iterator[tuple[dict[str, str], str]]:
    for have, label_text, value in sample_lines(text):
        if have == name:
            yield labels_of(label_text), value


def counter_sum(text: str, name: str, labels: Mapping[str, str]) -> float:
    """Sum of every sample of metric `name` whose labels include `labels`."""
    total = 0.0
    for have, value in _parsed(text, name):
        if all(have.get(k) == v for k, v in labels.items()):
            try:
                total += float(value)
            except ValueError:
                continue
    return total


def samples(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of every sample of metric `name` (info metrics carry their data in labels)."""
    return [labels for labels, _ in _parsed(text, name)]

"""What the smoke and preflight reports share: the four outcomes, their tally, and the JUnit XML form.

Both reports are lists of checks that each end pass / warn / fail / n/a. Each
report keeps its own table (their columns differ); the JUnit XML that CI
systems read is written here, for both, from `Case`s: one testcase per check,
named by the check's stable id, so a reworded display text leaves a CI's
history of that testcase intact.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["pass", "warn", "fail", "n/a"]
STATUSES: tuple[Status, ...] = ("pass", "warn", "fail", "n/a")
MESSAGE_CHARS = 500
"""How much of the evidence goes into a failure's or skip's `message` attribute (the element text holds it all)."""


def tally(statuses: Iterable[Status]) -> dict[str, int]:
    """How many checks ended in each status (every status present, zero included)."""
    out: dict[str, int] = dict.fromkeys(STATUSES, 0)
    for s in statuses:
        out[s] += 1
    return out


@dataclass(frozen=True)
class Case:
    """One testcase: a check's stable id, how it ended and why."""

    classname: str
    name: str  # the check's stable id
    status: Status
    message: str  # one line: the evidence, or the detail
    text: str = ""  # the element's text when it says more than `message` (default: `message`)
    seconds: float = 0.0
    properties: Mapping[str, str] = field(default_factory=dict)  # e.g. the display text


def junit_xml(suite: str, cases: Sequence[Case], *, failure_type: str, properties: Mapping[str, str] | None = None,
              seconds: float | None = None) -> str:
    """JUnit XML: one testsuite, one testcase per check (fail: failure, n/a: skipped, warn and pass: system-out).

    `seconds` is the suite's time (default: the sum of its cases').
    """
    counts = tally(c.status for c in cases)
    total = sum(c.seconds for c in cases) if seconds is None else seconds
    suites = ET.Element("testsuites")
    node = ET.SubElement(suites, "testsuite", {
        "name": suite, "tests": str(len(cases)), "failures": str(counts["fail"]), "errors": "0",
        "skipped": str(counts["n/a"]), "time": f"{total:.3f}",
    })
    if properties:
        props = ET.SubElement(node, "properties")
        for k, v in properties.items():
            ET.SubElement(props, "property", {"name": k, "value": v})
    for c in cases:
        case = ET.SubElement(node, "testcase", {"classname": c.classname, "name": c.name, "time": f"{c.seconds:.3f}"})
        if c.properties:
            props = ET.SubElement(case, "properties")
            for k, v in c.properties.items():
                ET.SubElement(props, "property", {"name": k, "value": v})
        text = c.text or c.message
        if c.status == "fail":
            ET.SubElement(case, "failure", {"message": c.message[:MESSAGE_CHARS], "type": failure_type}).text = text
        elif c.status == "n/a":
            ET.SubElement(case, "skipped", {"message": c.message[:MESSAGE_CHARS]})
        elif c.status == "warn":
            ET.SubElement(case, "system-out").text = f"WARN: {text}"
        else:
            ET.SubElement(case, "system-out").text = text
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"

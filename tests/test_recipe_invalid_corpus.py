"""`primectl validate` on a corpus of broken recipes: every refusal names the field, the exact
file:line:col of the node to edit, and what is allowed (or a did-you-mean).

Each file under tests/invalid/ (except `_*` bases and helpers) carries its expectations as
leading comments:

    # expect: line=12 col=3 field=prefill.parallel text="not a parallel spec"
    # expect: file=_inventory_bad.yaml line=6 ...   (the problem is in another file)
    # expect: problems>=3                           (several problems reported at once)
    # needs: primectl/recipe/data/X.json            (skip until that data file exists)
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PROBLEM_RE = re.compile(r"^  (?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<rest>.*)$")
CORPUS = REPO / "tests" / "invalid"
CASES = sorted(p for p in CORPUS.glob("*.yaml") if not p.name.startswith("_"))
BASES = sorted(CORPUS.glob("_base*.yaml"))


@dataclass(frozen=True)
class Expect:
    """One problem the operator must see."""

    file: str
    line: int
    col: int | None
    field: str | None
    text: str


def expectations(case: Path) -> tuple[list[Expect], int]:
    """The `# expect:` comments of a corpus file, and the least number of problems reported."""
    found: list[Expect] = []
    at_least = 1
    for raw in case.read_text().splitlines():
        if not raw.startswith("# expect:"):
            continue
        body = raw[len("# expect:") :].strip()
        if body.startswith("problems>="):
            at_least = int(body[len("problems>=") :])
            continue
        kv = dict(word.split("=", 1) for word in shlex.split(body))
        unknown = set(kv) - {"file", "line", "col", "field", "text"}
        assert not unknown, f"{case.name}: unknown expect keys {unknown}"
        found.append(Expect(
            file=kv.get("file", case.name), line=int(kv["line"]),
            col=int(kv["col"]) if "col" in kv else None, field=kv.get("field"), text=kv["text"],
        ))
    assert found or at_least > 1, f"{case.name} has no `# expect:` line"
    return found, max(at_least, len(found))


def _matches(problem: str, want: Expect) -> bool:
    m = PROBLEM_RE.match(problem)
    if not m or Path(m["file"]).name != want.file or int(m["line"]) != want.line:
        return False
    if want.col is not None and int(m["col"]) != want.col:
        return False
    rest = m["rest"]
    if want.field is not None:
        if not rest.startswith(want.field + ": "):
            return False
        rest = rest[len(want.field) + 2 :]
    return want.text in rest


def test_corpus_is_big_enough_to_mean_something() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("base", BASES, ids=lambda p: p.name)
def test_corpus_bases_are_valid_so_each_case_fails_for_its_own_reason(
    cli: Callable[..., Any], base: Path
) -> None:
    result = cli("validate", base.relative_to(REPO))
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_validate_refuses_broken_recipe_pointing_at_the_line_to_edit(
    cli: Callable[..., Any], case: Path
) -> None:
    for raw in case.read_text().splitlines():
        if raw.startswith("# needs:") and not (REPO / raw[len("# needs:") :].strip()).exists():
            pytest.skip(f"{raw[len('# needs:') :].strip()} is not there yet")
    expected, at_least = expectations(case)
    result = cli("validate", case.relative_to(REPO))
    shown = "\n".join(result.problems()) or result.stderr
    assert result.exit_code == 2, f"exit {result.exit_code}; stdout: {result.stdout}\nstderr: {result.stderr}"
    assert "nothing was changed" in result.stderr
    problems = result.problems()
    assert len(problems) >= at_least, shown
    for problem in problems:
        assert PROBLEM_RE.match(problem), f"problem without file:line:col: {problem!r}"
    for want in expected:
        assert any(_matches(p, want) for p in problems), f"expected {want}\ngot:\n{shown}"

"""Error types shared by every stage, and the exit codes they map to."""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_CHANGES = 3  # `diff`: the deployment differs from the recipe

# A path into the recipe document: keys and list indices, e.g. ("prefill", "extra_args", 2).
RecipePath = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input, pinned to where it was written."""

    file: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{field} {self.message}"


@dataclass(frozen=True)
class Finding:
    """A semantic problem found after parsing: a recipe path and what is wrong there.

    Rules, engines and the planner return findings; the loader pins them to the
    YAML line the user must edit (`LoadedRecipe.problem`).
    """

    path: RecipePath
    message: str


class RecipeError(Exception):
    """Bad input: one or more problems, all reported together (exit code 2)."""

    def __init__(self, problems: list[Problem]):
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.column, p.field))
        super().__init__("\n".join(str(p) for p in self.problems))


class Refused(Exception):
    """The command does not apply to this deployment (e.g. a render-only target); nothing was changed (exit code 2)."""


class PlanError(Exception):
    """The recipe parsed but cannot be planned; carries findings to pin to YAML lines."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("; ".join(f.message for f in findings))


class DeployError(Exception):
    """A deployment step failed on a host (exit code 1)."""

    def __init__(self, message: str, *, service: str | None = None, log_tail: str = ""):
        self.service = service
        self.log_tail = log_tail
        super().__init__(message)


class Interrupted(DeployError):
    """Ctrl-C during a rollout, after the previous revision was put back."""


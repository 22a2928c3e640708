"""Shared test helpers: where the repository is, and running the CLI the way an operator does."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class CliResult:
    """What the operator sees: exit code, stdout, stderr."""

    exit_code: int
    stdout: str
    stderr: str

    def problems(self) -> list[str]:
        """The problem lines ("  FILE:LINE:COL: FIELD: MESSAGE") of a refused recipe, re-joined if wrapped."""
        out: list[str] = []
        for line in self.stderr.splitlines():
            if line.startswith("  "):
                out.append(line)
            elif out and line and not line.startswith("error:"):
                out[-1] += " " + line  # a wrapped continuation
        return out


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run `primectl ARGS...` in-process (typer's CliRunner), from the repository root."""
    from typer.testing import CliRunner

    from primectl.cli import app

    monkeypatch.chdir(REPO)

    def run(*args: str | os.PathLike[str]) -> CliResult:
        result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return CliResult(result.exit_code, result.stdout, result.stderr)

    return run

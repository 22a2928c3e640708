"""What the fleet integration tests share: the `primectl` command, and a fleet copy brought up for one module and
taken down again with nothing of it left running (what is left is SIGKILLed by pid, and the test fails)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from primectl.bench.fleet_copy import FleetCopy

from .sshhosts import netns_problem, processes_under

REPO = Path(__file__).resolve().parents[2]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")


def cli(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`primectl ARGS` from the repository root, as a user in a wide terminal without colour runs it."""
    return subprocess.run([PRIMECTL, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=os.environ | {"COLUMNS": "250", "NO_COLOR": "1"})


def kill_all(workdir: Path) -> None:
    """SIGKILL every process running under `workdir` (only what the test started there), by pid."""
    for pid, _ in processes_under(workdir):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@contextmanager
def fleet_up(copy: FleetCopy, run_hint: str, *up_args: str) -> Iterator[FleetCopy]:
    """`up` of the fleet copy (refused outside a private network namespace: `run_hint` says how to run it), then
    `down`, which must succeed and leave no process under its workdirs."""
    problem = netns_problem(run_hint)
    if problem:
        pytest.fail(problem, pytrace=False)
    workdirs = list(copy.workdirs.values())
    up = cli("up", copy.recipe, *up_args)
    try:
        assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
        yield copy
    finally:
        down = cli("down", copy.recipe)
        deadline = time.monotonic() + 15
        while any(processes_under(w) for w in workdirs) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for w in workdirs for p in processes_under(w)]
        for w in workdirs:
            kill_all(w)
        assert down.returncode == 0, f"down failed:\n{down.stdout}\n{down.stderr}"
        assert not left, f"processes left after down: {left}"

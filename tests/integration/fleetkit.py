"""What the fleet integration tests share: the `primectl` command, and a fleet copy brought up for one module and
taken down again with nothing of it left running (what is left is SIGKILLed by pid, and the test fails)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from primectl.bench import fleet_load
from primectl.bench.fleet_copy import FleetCopy
from tests import cliproc

from .sshhosts import netns_problem, processes_under


def cli(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`primectl ARGS` as the benchmarks run it (primectl/bench/fleet_load.py), with the tests' timeout."""
    return cliproc.primectl(*args, timeout=timeout)


def etcd_call(member: str, path: str, body: dict | None = None) -> dict:
    """One etcd v3 call through its JSON gateway (POST /v3/<path>) on `member` (a client URL)."""
    req = urllib.request.Request(f"{member}/v3/{path}", data=json.dumps(body or {}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def until(check, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    """Whether check() turned true within `timeout` seconds (polled every 50 ms, once more at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


def kill_all(workdir: Path) -> None:
    """SIGKILL every process running under `workdir` (only what the test started there), by pid."""
    fleet_load.kill_under([workdir])


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
        fleet_load.kill_under(workdirs)
        assert down.returncode == 0, f"down failed:\n{down.stdout}\n{down.stderr}"
        assert not left, f"processes left after down: {left}"

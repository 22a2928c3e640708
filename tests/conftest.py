"""Shared test helpers: where the repository is, and running the CLI the way an operator does.

Under pytest-xdist (`make test` runs `pytest -n ...`) every worker first moves into a network namespace of
its own with only loopback up (`own_network_namespace`), before any fixture starts anything: each worker's
sshd hosts, etcd, Dynamo frontends, Slurm daemons and nspawn bridge then bind the same fixed addresses and
ports as in a serial run without ever meeting another worker's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLONE_NEWNET = 0x40000000
# How `pytest -n N` (pytest-xdist) hands out tests: see `work_unit`.
# Modules whose tests share something costly (a module-scoped deployment, a vLLM engine loaded once, tests that
# run in order against one deployment) go to one worker whole; so does every module under tests/integration/.
WHOLE_MODULES = {"tests/test_dynamo_vllm_cpu_bridge.py", "tests/test_vllm_cpu_seed_bridge.py",
                 "tests/test_vllm_import_check.py", "tests/test_plugins.py", "tests/test_component_plugin.py"}
# Handed out first, the longest first, so that no worker starts one of them when the others are nearly done.
LONGEST_FIRST = ("tests/integration/test_demo_vllm.py", "tests/integration/test_slurm_target.py",
                 "tests/integration/test_live_change.py", "tests/integration/test_systemd_hosts.py",
                 "tests/kernels/test_kernels_tools.py", "tests/test_dynamo_vllm_cpu_bridge.py",
                 "tests/integration/test_apply_failures.py", "tests/test_vllm_cpu_seed_bridge.py",
                 "tests/integration/test_demo_bench.py")


def own_network_namespace() -> str | None:
    """Move this process (its calling thread, and so every process it starts from now on) into a new network
    namespace and bring its loopback up; why not, or None on success. Needs root (CAP_SYS_ADMIN)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())} (xdist workers need root)"
    r = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip link set lo up` in the worker's namespace failed: {r.stderr.strip()}"
    return None


def _deaf(signum: int, frame: object) -> None:
    """A SIGINT handler that does nothing (see pytest_configure)."""


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT handled instead of ignored, and in an xdist worker a network namespace of its own, before anything
    is started.

    An ignored signal stays ignored in every process started from there, so the tests that interrupt `primectl
    up` or `sweep` with SIGINT would see it shrugged off. It is ignored when pytest itself was started in the
    background by a shell without job control (`make test &` in a script: POSIX has such commands ignore SIGINT),
    and in every xdist worker (execnet leaves Ctrl-C to the controller). exec resets a handled signal to its
    default in each child: pytest gets Python's own handler, a worker one that does nothing (it stays deaf to
    Ctrl-C as before).
    """
    worker = hasattr(config, "workerinput")
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, _deaf if worker else signal.default_int_handler)
    if not worker:
        return
    problem = own_network_namespace()
    if problem:  # workers sharing one namespace would bind each other's addresses and ports
        raise pytest.UsageError(f"xdist worker {config.workerinput['workerid']}: {problem}; run without -n")


def work_unit(nodeid: str) -> str:
    """What xdist schedules a test with: its module (WHOLE_MODULES, tests/integration/), else the test alone."""
    module = nodeid.split("::", 1)[0]
    return module if module.startswith("tests/integration/") or module in WHOLE_MODULES else nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduler with `work_unit` as the scope, units handed out in collection order.

    (Not `--dist loadgroup` with xdist_group marks: with pytest 9 xdist 3.8 cannot tag node ids with the group.)
    """
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the order pytest_collection_modifyitems chose
    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist: the modules of LONGEST_FIRST first (each keeps its own order, and so does the rest)."""
    if not hasattr(config, "workerinput"):
        return
    rank = {m: i for i, m in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


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
def gate_url() -> Iterator[str]:
    """A local readiness gate's URL; it answers tests.exposition.Gate.status."""
    from tests.exposition import serve_gate

    with serve_gate() as url:
        yield url


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

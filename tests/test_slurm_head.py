"""What `up` does to the head's Prometheus and Alertmanager of a monitored Slurm deployment (targets/slurm_head.py):
start what does not run, restart on a new command line, reload on new files, leave alone otherwise, and refuse
files that promtool or amtool reject with nothing replaced.

A process that "runs" here is a `sleep` this test starts and records in the head's pid file: a stand-in for
Prometheus, since deciding needs only its pid and start time. Starting, reloading and stopping the real ones is
tests/integration/test_slurm_monitoring.py. promtool and amtool are the real ones.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from primectl.errors import DeployError
from primectl.host.processes import starttime
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.targets.slurm import SlurmTarget
from primectl.targets.slurm_head import Head, decide

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("/usr/bin/promtool", "/usr/bin/amtool")


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    """The monitored glm53 for target slurm, its job_dir and the head's directories under tmp_path."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'glm53.yaml'}\nslurm:\n  job_dir: {tmp_path / 'jobs'}\n"
                      f"  head_dir: {tmp_path / 'etc'}\n  head_data_dir: {tmp_path / 'data'}\n")
    return plan_recipe(recipe, target="slurm")[1]


@pytest.fixture
def release(plan: Plan) -> dict[str, bytes]:
    return SlurmTarget().render(plan)


@pytest.fixture
def stand_ins() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def installed(head: Head, stand_ins: list[subprocess.Popen[bytes]], *, running: tuple[str, ...]) -> None:
    """The head as a finished `up` leaves it: its files and run scripts in place, `running` with a pid file."""
    os.makedirs(head.layout.path("run"), exist_ok=True)
    for p in head.processes:
        for name, data in p.files.items():
            Path(head.dir, name).write_bytes(data)
        Path(head.layout.script(p.name)).parent.mkdir(parents=True, exist_ok=True)
        Path(head.layout.script(p.name)).write_bytes(p.script)
        if p.name in running:
            proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
            stand_ins.append(proc)
            while starttime(proc.pid) is None:
                pass
            Path(head.layout.pidfile(p.name)).write_text(f"{proc.pid} {starttime(proc.pid)}\n")


def test_decide() -> None:
    assert decide(running=False, argv_changed=True, files_changed=True) == "start"
    assert decide(running=True, argv_changed=True, files_changed=False) == "restart"
    assert decide(running=True, argv_changed=False, files_changed=True) == "reload"
    assert decide(running=True, argv_changed=False, files_changed=False) == "keep"


def test_a_first_up_starts_both(plan: Plan, release: dict[str, bytes]) -> None:
    head = Head(plan, release)
    todo = head.plan()
    assert {n: a for n, (a, _) in todo.items()} == {"prometheus": "start", "alertmanager": "start"}
    assert head.dir == str(Path(plan.target.options["head_dir"]) / plan.name)


def test_running_with_the_same_files_is_left_alone_and_new_files_reload(
        plan: Plan, release: dict[str, bytes], stand_ins: list[subprocess.Popen[bytes]]) -> None:
    head = Head(plan, release)
    installed(head, stand_ins, running=("prometheus", "alertmanager"))
    assert {n: a for n, (a, _) in head.plan().items()} == {"prometheus": "keep", "alertmanager": "keep"}
    assert head.apply(lambda _: None) == {"prometheus": "keep", "alertmanager": "keep"}
    assert [p.poll() for p in stand_ins] == [None, None], "nothing was signalled"

    changed = {**release, "monitoring/head/primectl.rules.yml": release["monitoring/head/primectl.rules.yml"] + b"\n"}
    todo = Head(plan, changed).plan()
    assert todo["prometheus"] == ("reload", "primectl.rules.yml changed: reload it (SIGHUP)")
    assert todo["alertmanager"][0] == "keep"


def test_a_new_command_line_restarts_and_a_stopped_one_starts(
        plan: Plan, release: dict[str, bytes], stand_ins: list[subprocess.Popen[bytes]]) -> None:
    head = Head(plan, release)
    installed(head, stand_ins, running=("prometheus",))
    Path(head.layout.script("prometheus")).write_text("#!/bin/bash\nexec /usr/bin/prometheus --an-older-flag\n")
    todo = head.plan()
    assert todo["prometheus"][0] == "restart" and todo["alertmanager"][0] == "start"


@pytest.mark.skipif(not all(os.path.exists(t) for t in TOOLS), reason="promtool/amtool are not installed")
@pytest.mark.parametrize("path, bad, tool", [
    ("monitoring/head/alertmanager.yml", b"route:\n  receiver: nobody-defined\n", "amtool check-config"),
    ("monitoring/head/primectl.rules.yml", b"groups:\n- name: x\n  rules:\n  - alert: A\n    expr: up ==\n",
     "promtool check"),
])
def test_a_file_the_tools_reject_is_refused_with_nothing_replaced(
        plan: Plan, release: dict[str, bytes], stand_ins: list[subprocess.Popen[bytes]],
        path: str, bad: bytes, tool: str) -> None:
    head = Head(plan, release)
    installed(head, stand_ins, running=("prometheus", "alertmanager"))
    before = {n: Path(head.dir, n).read_bytes() for p in head.processes for n in p.files}
    broken = Head(plan, {**release, path: bad})
    with pytest.raises(DeployError) as refused:
        broken.apply(lambda _: None)
    assert tool in str(refused.value) and "nothing in" in str(refused.value)
    assert {n: Path(head.dir, n).read_bytes() for n in before} == before
    assert not Path(head.dir, "incoming").exists()
    assert [p.poll() for p in stand_ins] == [None, None], "the running ones were not signalled"

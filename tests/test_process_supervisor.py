"""The process supervisor stops what a service started, also after its main process died.

vLLM's main process starts an engine core and workers; a kill -9 of the main process leaves them
running in its session. Real processes, a temp workdir, stopped by pid/session only.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from primectl.host.process_supervisor import ProcessSupervisor
from primectl.host.processes import starttime
from primectl.plan.layout import Layout


def _release(workdir: Path, script: str) -> Layout:
    (workdir / "releases" / "r1" / "bin").mkdir(parents=True)
    (workdir / "releases" / "r1" / "bin" / "svc.sh").write_text(script)
    (workdir / "current").symlink_to("releases/r1")
    return Layout(str(workdir))


def _wait_file(path: Path) -> str:
    deadline = time.monotonic() + 10
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return path.read_text().strip()


def _wait_own_session(child: int, parent: int) -> None:
    """`$!` is written right after the fork, before the child's setsid(2) ran."""
    deadline = time.monotonic() + 10
    while os.getsid(child) == os.getsid(parent):
        assert time.monotonic() < deadline, f"{child} never made a session of its own"
        time.sleep(0.02)


def test_stop_after_the_main_process_was_killed_stops_its_orphaned_children(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    layout = _release(tmp_path / "wd", f"#!/bin/bash\nsleep 300 &\necho $! > {child_pid_file}\nexec sleep 300\n")
    sup = ProcessSupervisor(layout)
    pid, error = sup.start({"name": "svc", "unit": "u", "stop_timeout": 5})
    assert error is None and pid
    child = int(_wait_file(child_pid_file))
    assert starttime(child) is not None
    os.kill(pid, signal.SIGKILL)  # the operator's (or the OOM killer's) kill -9 of the main process
    deadline = time.monotonic() + 5
    while starttime(pid) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert sup.liveness("svc", "u")["alive"] is False
    assert starttime(child) is not None, "the child outlived its parent, as vLLM's engine core does"
    sup.stop({"name": "svc", "unit": "u", "stop_timeout": 5}, remove=False)
    deadline = time.monotonic() + 5
    while starttime(child) is not None:
        assert time.monotonic() < deadline, "the orphaned child was left running"
        time.sleep(0.02)
    assert not Path(layout.pidfile("svc")).exists()


def test_stop_returns_only_once_the_orphaned_children_have_ended(tmp_path: Path) -> None:
    """A killed child with memory to hand back (vLLM's engine core) takes a while to exit; `down` returning before
    it has ended let the next `up` race it (and left the process listed under the workdir)."""
    child_pid_file = tmp_path / "child.pid"
    hog = "import sys; b = b'x' * (768 << 20); print(len(b), flush=True); import time; time.sleep(300)"
    layout = _release(tmp_path / "wd", f"#!/bin/bash\npython3 -c \"{hog}\" > {tmp_path}/hog.out &\n"
                                       f"echo $! > {child_pid_file}\nexec sleep 300\n")
    sup = ProcessSupervisor(layout)
    pid, _ = sup.start({"name": "svc", "unit": "u", "stop_timeout": 5})
    assert pid
    child = int(_wait_file(child_pid_file))
    _wait_file(tmp_path / "hog.out")  # its memory is written
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while starttime(pid) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    sup.stop({"name": "svc", "unit": "u", "stop_timeout": 5}, remove=False)
    assert starttime(child) is None, "stop returned while the child it killed was still exiting"


def test_stop_of_a_running_service_ends_its_whole_session(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    layout = _release(tmp_path / "wd", f"#!/bin/bash\nsetsid sleep 300 &\necho $! > {child_pid_file}\nexec sleep 300\n")
    sup = ProcessSupervisor(layout)
    pid, _ = sup.start({"name": "svc", "unit": "u"})
    assert pid
    child = int(_wait_file(child_pid_file))
    _wait_own_session(child, pid)
    assert sup.stop({"name": "svc", "unit": "u", "stop_timeout": 5}, remove=False) is True
    assert starttime(pid) is None
    # a child that made a session of its own is not the service's: it must be left alone
    assert starttime(child) is not None
    os.kill(child, signal.SIGKILL)


def test_a_spawned_helper_runs_in_its_own_session_and_logs_and_a_missing_one_is_an_error(tmp_path: Path) -> None:
    from primectl.host.processes import spawn_session

    log = tmp_path / "helper.log"
    keep = os.open(tmp_path / "held", os.O_WRONLY | os.O_CREAT)  # a descriptor the helper must not inherit
    try:
        pid = spawn_session(["sh", "-c", "echo out; echo err >&2; ls /proc/$$/fd; sed -n 's/^SigIgn:\\t//p' /proc/$$/status"],
                            cwd=str(tmp_path), log=str(log))
    finally:
        os.close(keep)
    assert os.getsid(pid) == pid or not starttime(pid)  # a session leader (unless already gone)
    assert os.waitpid(pid, 0)[1] == 0
    lines = log.read_text().split()
    assert lines[:2] == ["out", "err"] and sorted(lines[2:-1]) == ["0", "1", "2"], lines
    ignored = int(lines[-1], 16)  # Python ignores SIGPIPE and SIGXFSZ; a helper must get the defaults back
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), lines[-1]
    try:
        spawn_session(["/nonexistent/helper"], cwd=str(tmp_path), log=str(log))
    except OSError as exc:
        assert "/nonexistent/helper" in str(exc)
    else:
        raise AssertionError("a helper that cannot be executed must raise")


def _zombie_children(parent: int) -> list[int]:
    """The children of `parent` that have exited but were never waited for."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == parent and stat[0] == "Z":
            found.append(int(entry))
    return found


def test_an_agent_session_leaves_no_zombie_of_what_it_started(tmp_path: Path) -> None:
    """A kept connection's agent serves request after request; a helper (or service) it started that exits
    is collected by the next request, not held as a zombie until the session ends."""
    import json
    import subprocess
    import sys

    agent = subprocess.Popen([sys.executable, "-c", "import sys; from primectl.host.agent import main; "
                              "sys.exit(main(['agent', 'serve']))"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert agent.stdin and agent.stdout

    def call(op: str, **args: object) -> dict:
        agent.stdin.write(json.dumps({"op": op, "args": {"workdir": str(tmp_path), **args}}) + "\n")
        agent.stdin.flush()
        return json.loads(agent.stdout.readline())

    try:
        spawned = call("spawn", argv=["true"], cwd=str(tmp_path), log=str(tmp_path / "helper.log"))
        assert spawned["ok"], spawned
        deadline = time.monotonic() + 5
        while Path(f"/proc/{spawned['pid']}/stat").exists() and not _zombie_children(agent.pid):
            assert time.monotonic() < deadline, "the helper never exited"
            time.sleep(0.02)
        assert call("read", path="nothing")["ok"]
        assert _zombie_children(agent.pid) == [], "an exited helper is still the session's zombie"
    finally:
        agent.stdin.close()
        agent.wait(timeout=10)


def test_a_services_watch_is_found_in_its_session_and_nothing_outside_it_is_signalled(tmp_path: Path) -> None:
    """Before a worker drains, the watch its run script started beside it is ended (it must not end the
    draining worker); only that session's processes are looked at."""
    import subprocess

    from primectl.host.processes import WATCH_ENV, end_watches, session_of

    watch_pid_file = tmp_path / "watch.pid"
    layout = _release(tmp_path / "wd", f"#!/bin/bash\n{WATCH_ENV}=u sleep 300 &\necho $! > {watch_pid_file}\n"
                                       "exec sleep 300\n")
    sup = ProcessSupervisor(layout)
    pid, error = sup.start({"name": "svc", "unit": "u", "stop_timeout": 5})
    assert error is None and pid
    watch = int(_wait_file(watch_pid_file))
    deadline = time.monotonic() + 10
    while f"{WATCH_ENV}=u".encode() not in Path(f"/proc/{watch}/environ").read_bytes():  # `$!` is known before exec
        assert time.monotonic() < deadline, "the watch never started"
        time.sleep(0.02)
    outsider = subprocess.Popen(["sleep", "300"], env={**os.environ, WATCH_ENV: "u"}, start_new_session=True)
    try:
        assert end_watches("u", session_of(pid)) == [watch]
        deadline = time.monotonic() + 5
        while starttime(watch) is not None:
            assert time.monotonic() < deadline, "the watch was not ended"
            time.sleep(0.02)
        assert starttime(pid) is not None and outsider.poll() is None
    finally:
        outsider.kill()
        outsider.wait()
        sup.stop({"name": "svc", "unit": "u", "stop_timeout": 5}, remove=False)

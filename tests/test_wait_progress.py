"""Long waits show what they wait for (issue 20, item 8): services coming up and runtimes installing.

In a pipe, `up` writes a plain `waiting: ...` line every few seconds naming each waiting service with
its elapsed time against its budget, what its probe saw and its log's last line; on a terminal the
same lines are redrawn in place. `provision` shows packages and MB done. All of it on stderr.
"""

from __future__ import annotations

import io
import os
import pty
from pathlib import Path
from typing import Any

import pytest

from primectl.deploy import progress as progress_mod
from primectl.deploy import provision as provision_mod
from primectl.deploy.client import HostClient
from primectl.deploy.cluster import ConnectionPolicy, opened
from primectl.deploy.progress import InstallDisplay, WaitProgress
from primectl.deploy.transport import LocalTransport
from primectl.errors import DeployError
from primectl.host.agent import dispatch
from primectl.host.logs import last_log_line
from primectl.host.wire import Progress
from primectl.plan.model import HostPlan
from tests.test_rollout_fake import Env


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def _slow_decode(env: Env, monkeypatch: pytest.MonkeyPatch, mode: str) -> Any:
    monkeypatch.setenv("PRIMECTL_PROGRESS", mode)
    monkeypatch.setenv("PRIMECTL_PROGRESS_EVERY_S", "0")  # a plain line at every progress line the agent sends
    env.world.ready_after = {"decode-0": 4}
    return env.plan(decode={"startup_timeout_s": 600})


def test_up_in_a_pipe_prints_plain_waiting_lines_with_elapsed_budget_probe_and_last_log(
        env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env.up(_slow_decode(env, monkeypatch, "plain"))
    out, err = capsys.readouterr()
    assert out == ""  # stdout stays clean for pipes
    assert "\x1b" not in err
    waiting = [line for line in err.splitlines() if line.startswith("waiting: ") and "decode-0 " in line]
    assert len(waiting) >= 2, err
    assert any("decode-0 0s/600s (probe: fake connection refused; last log: \"Loading weights... " in line
               for line in waiting), waiting
    assert any("prefill-0 ready" in line for line in waiting), waiting
    assert any(line.startswith("ready: ") and "decode-0" in line for line in err.splitlines()), err


def test_up_on_a_terminal_redraws_one_line_per_service_in_place(
        env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Live lines are cut to the terminal's width: 100 columns, the fallback when stderr is no terminal (a
    # pytest-xdist worker has COLUMNS=80 in its environment, too narrow for the frame looked for below).
    monkeypatch.setenv("COLUMNS", "100")
    env.up(_slow_decode(env, monkeypatch, "live"))
    err = capsys.readouterr().err
    assert "\x1b[3F" in err  # back up over the wave's three lines to redraw them
    assert "\x1b[2K" in err
    assert not any(line.startswith("waiting: ") for line in err.splitlines())
    frames = err.split("\x1b[2K")
    assert any(f.startswith("decode-0   waiting   0s/600s  probe: fake connection refused  last log: \"Loading")
               for f in frames), frames
    assert any(f.startswith("decode-0   ready     0s") for f in frames), frames


def test_a_service_that_exits_shows_as_exited_with_its_last_log_line(
        env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    env.up(env.plan())
    monkeypatch.setenv("PRIMECTL_PROGRESS", "plain")
    monkeypatch.setenv("PRIMECTL_PROGRESS_EVERY_S", "0")
    env.world.faults["decode-0"] = "exit-at-start"
    with pytest.raises(DeployError):
        env.up(env.plan(decode={"max_num_seqs": 8}))
    assert "decode-0 exited 0s/1s" in capsys.readouterr().err


def test_the_mode_follows_whether_stderr_is_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIMECTL_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    parent, child = pty.openpty()
    try:
        with open(child, "w", closefd=False) as tty:
            assert WaitProgress(["a"], stream=tty).mode == "live"
    finally:
        os.close(parent)
        os.close(child)
    assert WaitProgress(["a"], stream=io.StringIO()).mode == "plain"
    monkeypatch.setenv("PRIMECTL_PROGRESS", "off")
    assert WaitProgress(["a"], stream=io.StringIO()).mode == "off"


def test_a_real_local_service_reports_its_log_while_its_probe_waits(tmp_path: Path) -> None:
    """LocalTransport streams the real agent's progress lines (a child process) before its result."""
    work = tmp_path / "work"
    (work / "releases" / "r1" / "bin").mkdir(parents=True)
    (work / "releases" / "r1" / "bin" / "slow.sh").write_text(
        "echo 'Loading weights 1/2'\nsleep 0.6\necho 'Loading weights 2/2'\nsleep 0.6\n"
        f"touch {work}/ready\nexec sleep 60\n")
    (work / "current").symlink_to("releases/r1")
    host = HostPlan.model_validate({"name": "local", "address": "127.0.0.1", "port": 22, "user": "me",
                                    "identity_file": None, "connection": "local",
                                    "workdir": str(work), "gpus": 0})
    client = HostClient("local", LocalTransport(host), str(work), "process")
    seen: list[Progress] = []
    svc = {"name": "slow", "unit": "slow", "stop_timeout": 5}
    probe = {"kind": "command", "command": ["test", "-e", f"{work}/ready"], "timeout_s": 30, "interval_s": 0.1}
    try:
        result = client.start_wait([svc], [{"name": "slow", "unit": "slow", "probe": probe}],  # type: ignore[list-item, typeddict-item]
                                   timeout=60, progress=seen.append)
    finally:
        client.stop([svc])  # type: ignore[list-item]
    assert result["ok"] and result["ready"] == ["slow"]
    rows = [row for p in seen for row in p["progress"]]
    assert rows[0]["phase"] == "starting" and rows[-1]["phase"] == "ready"
    waiting = [r for r in rows if r["phase"] == "waiting"]
    assert waiting and all(r["budget"] == 30 for r in waiting)
    assert any(r["log"].startswith("Loading weights") for r in waiting), waiting
    assert any(r["probe"] == "exit 1: " for r in waiting), waiting


FAKE_INSTALL = """#!/bin/bash
set -e
venv="$1"
site="$venv/lib/python3.11/site-packages"
mkdir -p "$site/pip-26.0.dist-info" "$venv/bin"
echo "Collecting alpha==1.0 (from -r lock (line 1))"
echo "  Downloading alpha-1.0-py3-none-any.whl (2.5 MB)"
echo "Collecting beta==2.0 (from -r lock (line 2))"
echo "  Downloading beta-2.0-py3-none-any.whl (512.0 kB)"
echo "Installing collected packages: alpha, beta"
mkdir -p "$site/alpha-1.0.dist-info" "$site/alpha"
head -c 3000000 /dev/zero > "$site/alpha/data.bin"
sleep 1.5
mkdir -p "$site/beta-2.0.dist-info"
echo "Successfully installed alpha-1.0 beta-2.0"
printf 'alpha==1.0\\nbeta==2.0\\ngamma==3.0\\n' > "$venv/pip-freeze.txt"
"""


def test_provision_shows_packages_and_mb_done_against_the_lock(
        env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PRIMECTL_PROGRESS", "plain")
    monkeypatch.setenv("PRIMECTL_PROGRESS_EVERY_S", "0")
    monkeypatch.setattr(provision_mod, "INSTALL_POLL_S", 0.05)
    del env.base["software"]
    plan = env.plan()
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    rt = plan.serving.runtime["h1"]
    (scripts / rt.lock).write_text("# a lock\nalpha==1.0 \\\n    --hash=sha256:00\nbeta==2.0\ngamma==3.0\n")
    (scripts / "install-runtime.sh").write_text(FAKE_INSTALL)
    monkeypatch.setattr(provision_mod, "scripts_dir", lambda: scripts)
    said: list[str] = []
    with opened(plan, ConnectionPolicy(connector=env.world.connector()), said.append) as cluster:
        done = provision_mod.provision(cluster, say=said.append)
    assert {r.action for r in done} == {"installed"}
    assert any("installing runtime" in s and "(cpu, lock" in s and "3 packages)" in s for s in said), said
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("installing runtime: ")]
    assert any("h1 installed 1/3 packages, 3 MB in the venv" in line for line in lines), lines


def test_install_progress_counts_the_venvs_packages_and_what_pip_collected(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for d in ("pip-26.0.dist-info", "alpha-1.0.dist-info", "beta-2.0.dist-info", "alpha"):
        (site / d).mkdir(parents=True)
    (site / "alpha" / "x.so").write_bytes(b"\0" * 2_000_000)
    log = tmp_path / "install.log"
    log.write_text("Collecting alpha==1.0\n  Downloading alpha-1.0.whl (1.5 GB)\nCollecting beta==2.0\n"
                   "  Downloading beta-2.0.whl (300.0 kB)\nInstalling collected packages: alpha, beta\n")
    r = dispatch("install_progress", {"workdir": str(tmp_path), "venv": str(tmp_path / "venv"), "log": str(log)})
    assert r == {"ok": True, "code": 0, "installed": 2, "venv_mb": 2.0, "collected": 2, "downloaded_mb": 1500.3,
                 "last": "Installing collected packages: alpha, beta"}
    assert InstallDisplay.describe(5, r) == "installed 2/5 packages, 2 MB in the venv"  # type: ignore[arg-type]
    assert provision_mod.lock_packages(b"# c\na==1 \\\n    --hash=sha256:0\nb[x]==2\n\n") == 2


def test_a_plain_line_comes_only_every_interval_and_the_clock_runs_between_reports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMECTL_PROGRESS", "plain")
    stream = io.StringIO()
    clock = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    shown = WaitProgress(["decode-0"], stream=stream, every=5)
    report: Progress = {"progress": [{"name": "decode-0", "phase": "waiting", "elapsed": 10.0, "budget": 600,
                                      "probe": "HTTP 503", "log": "Loading weights..."}]}
    shown.update(report)
    assert stream.getvalue() == ""  # the first line comes one interval in
    clock[0] += 5
    shown.update(report)
    clock[0] += 1
    shown.update(report)  # too soon for another
    clock[0] += 31
    shown.refresh()
    assert stream.getvalue().splitlines() == [
        'waiting: decode-0 10s/600s (probe: HTTP 503; last log: "Loading weights...")',
        'waiting: decode-0 41s/600s (probe: HTTP 503; last log: "Loading weights...")',
    ]


def test_the_last_log_line_is_what_the_service_is_busy_with_not_its_answer_to_our_probe(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_text("old run's last words\n--- primectl: starting svc at 2026-12-01T00:00:00 ---\n")
    assert last_log_line(str(log)) == ""  # nothing from this start yet
    with log.open("a") as f:
        f.write("2026-12-01T19:58:49.179849Z  INFO loading: Loading safetensors 10%\rLoading safetensors 60%\n"
                "2026-12-01T19:58:51.775355Z ERROR tower_http::trace::on_failure: response failed status=503\n")
    assert last_log_line(str(log)) == "Loading safetensors 60%"


class FlushedWrites(io.StringIO):
    """A stdout that keeps what each flush would have sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def flush(self) -> None:
        self.sent.append(self.getvalue())
        self.seek(0)
        self.truncate()


def test_a_wait_ends_with_its_last_progress_line_and_its_result_in_one_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over SSH each write the agent flushes is a packet the controller's connection reads (72 hosts, 72 of
    them): the line that says `ready` and the result right behind it leave the agent together."""
    import json
    import socket

    from primectl.host import agent

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        wait = {"workdir": str(tmp_path), "progress_s": 1.0, "waits": [
            {"name": "decode-0", "probe": {"kind": "tcp", "host": "127.0.0.1", "port": listening.getsockname()[1]}}]}
        out = FlushedWrites()
        monkeypatch.setattr("sys.stdout", out)
        monkeypatch.setattr("sys.stdin", io.StringIO(""))
        agent.serve(json.dumps({"op": "wait", "args": wait}) + "\n")
    last = out.sent[-1].splitlines()
    assert json.loads(last[-1])["ok"] is True
    assert [row["phase"] for row in json.loads(last[-2])["progress"]] == ["ready"]

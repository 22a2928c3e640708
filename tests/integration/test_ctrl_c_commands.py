"""Ctrl-C while a transport runs a shell command stops the command and reaches primectl.

Invoke's and Fabric's runners, left as they are, swallow KeyboardInterrupt during a command (they forward
`\\x03` to it and wait on): a Ctrl-C during an agent call on `connection: local`, or during a provisioning
install over SSH, was lost. Each test runs a transport in a child process as `up` does, runs `sleep 20`
through it, sends SIGINT to that process alone and expects KeyboardInterrupt at once. Real OpenSSH for the
remote case (the shared sshd hosts).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.sshhosts import SSHHosts

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys, time
from primectl.deploy.connect import connect
from primectl.plan.model import HostPlan

host = HostPlan(**json.loads(sys.argv[1]))
t = connect(host, known_hosts=sys.argv[2] or None, accept_new_host_keys=False)
print("running", flush=True)
t0 = time.monotonic()
try:
    t.run(sys.argv[3])
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - t0:.1f}s", flush=True)
    sys.exit(130)
print("the command finished: the Ctrl-C was lost", flush=True)
"""


def _interrupt(host: dict[str, object], known_hosts: str, pidfile: Path) -> tuple[int, str, float]:
    """Run `sleep 20` on `host` in a child, SIGINT the child once the command runs; (exit, output, seconds)."""
    command = f"echo $$ > {pidfile}; exec sleep 20"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(host), known_hosts, command], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "running"
        deadline = time.monotonic() + 15
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=15)
        return proc.returncode, out, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (killed, not yet reaped by whoever inherited it) does not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop(pidfile: Path, grace_s: float = 2.0) -> bool:
    """Kill the command the test started, by its pid; whether it was still running `grace_s` after the
    interrupt's answer (the transport's kill is delivered, not waited for)."""
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return False
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _alive(pid):
        return False
    os.kill(pid, signal.SIGKILL)
    return True


def test_ctrl_c_during_a_local_command_kills_it_and_raises(tmp_path: Path) -> None:
    host = {"name": "local", "address": "127.0.0.1", "port": 22, "user": "root", "identity_file": None,
            "connection": "local", "workdir": str(tmp_path), "gpus": 0}
    pidfile = tmp_path / "cmd.pid"
    try:
        code, out, seconds = _interrupt(host, "", pidfile)
    finally:
        still_running = _stop(pidfile)
    assert code == 130 and "interrupted after" in out, out
    assert seconds < 5, f"{seconds:.1f}s to stop"
    assert not still_running, "the interrupted command kept running"


def test_a_ctrl_c_as_the_local_command_starts_leaves_it_not_running(tmp_path: Path) -> None:
    """A Ctrl-C in the moment after the command started and before Invoke waits on it (it starts its I/O
    threads) used to leave the command running (2 of 30 in a loop like this one): at 0..14 ms after the
    transport opened, whatever had started must end."""
    left = []
    for delay_ms in range(15):
        pidfile = tmp_path / f"cmd{delay_ms}.pid"
        host = {"name": "local", "address": "127.0.0.1", "port": 22, "user": "root", "identity_file": None,
                "connection": "local", "workdir": str(tmp_path), "gpus": 0}
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(host), "",
                                 f"echo $$ > {pidfile}; exec sleep 20"], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
            time.sleep(delay_ms / 1000)
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if _stop(pidfile):
            left.append(delay_ms)
    assert not left, f"commands left running after a Ctrl-C at {left} ms"


def test_ctrl_c_during_an_ssh_command_closes_it_and_raises(ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    h = ssh_hosts.hosts[0]
    host = {"name": h.name, "address": h.address, "port": h.port, "user": "root",
            "identity_file": str(ssh_hosts.client_key), "connection": "ssh", "workdir": str(tmp_path), "gpus": 0}
    known = ssh_hosts.known_hosts(tmp_path / "known_hosts", [h])
    pidfile = tmp_path / "cmd.pid"
    try:
        code, out, seconds = _interrupt(host, str(known), pidfile)
    finally:
        _stop(pidfile)  # closing the channel does not end a command that neither reads nor writes
    assert code == 130 and "interrupted after" in out, out
    assert seconds < 5, f"{seconds:.1f}s to stop"

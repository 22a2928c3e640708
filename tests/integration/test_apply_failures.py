"""`up` when things go wrong: unreachable hosts, sshd dying mid-push, services that fail, taken ports.

Real sshd hosts and real etcd; Dynamo components are the FAKE engine runtime
(tests/fakes/fake_python, faults injected with FAKE_FAIL), named `fake_engine`.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from pathlib import Path

import pytest

from .conftest import LAYOUT, Deployment

pytestmark = pytest.mark.integration


def test_unreachable_host_changes_nothing(deployment: Deployment) -> None:
    deployment.up_ok()
    before = deployment.snapshot()
    pids = deployment.pids()
    deployment.write({"decode": {"env": {"DECODE_TUNING": "c"}}, "prefill": {"env": {"PREFILL_TUNING": "c"}}})
    deployment.hosts["h3"].stop()

    r = deployment.up()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "connecting failed on 1 host(s); nothing was changed" in r.stderr
    assert "h3 (127.0.0.4:" in r.stderr and "cannot connect" in r.stderr
    assert deployment.snapshot() == before
    assert deployment.pids() == pids
    assert not (deployment.workdir("h1") / "lock").exists()
    assert not list((deployment.workdir("h2") / "incoming").glob("*"))


def test_sshd_killed_mid_push_keeps_previous_revision_fake_engine(deployment: Deployment) -> None:
    """Kill h2's sshd (listener and open sessions, by pid) while `up` uploads h2's new release."""
    deployment.up_ok()
    before = deployment.snapshot()
    pids = deployment.pids()
    h2 = deployment.hosts["h2"]
    incoming = deployment.workdir("h2") / "incoming"
    # Only h2's bundle changes; bulky env values (each under the 128 KiB exec limit) keep the upload open a little
    # longer: ~1 MB, so the watcher still sees it in progress when other tests load the CPU (pytest -n). Random
    # text, since bundles travel compressed.
    deployment.write({"prefill": {"env": {f"PREFILL_TUNING_{i}": secrets.token_urlsafe(75_000) for i in range(10)}}})

    killed: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if any(incoming.glob("*.release*")):  # the SFTP upload has begun
                killed.extend(h2.kill_hard())
                return
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = deployment.up()
    finally:
        stop.set()
        watcher.join(5)
    assert killed, "the upload to h2 was never seen; sshd was not killed"
    assert r.returncode == 1, r.stdout + r.stderr
    assert "h2" in r.stderr and ("connection lost" in r.stderr or "upload" in r.stderr), r.stderr
    assert "nothing was changed" in r.stderr

    h2.start()
    after = deployment.snapshot()
    assert after["h2"]["current"] == before["h2"]["current"]
    assert after["h2"]["state"] == before["h2"]["state"]
    assert {h: after[h] for h in ("h1", "h3")} == {h: before[h] for h in ("h1", "h3")}
    assert deployment.pids() == pids
    code, doc = deployment.status_json()
    assert code == 0 and doc["healthy"] is True
    # The interrupted upload is simply redone by the next `up`.
    deployment.up_ok()
    assert deployment.current("h2") != before["h2"]["current"]


def _assert_rolled_back(deployment: Deployment, before: dict) -> None:
    for h in LAYOUT:
        assert deployment.current(h) == before[h]["current"], f"{h}: current link not restored"
        assert deployment.state(h) == before[h]["state"], f"{h}: state changed by a failed up"
    code, doc = deployment.status_json()
    assert code == 0 and doc["healthy"] is True, doc
    assert deployment.cli("status").returncode == 0


def test_service_exiting_at_start_rolls_back_with_log_tail_fake_engine(deployment: Deployment) -> None:
    deployment.up_ok()
    before = deployment.snapshot()
    pids = deployment.pids()
    deployment.write({"decode": {"env": {"FAKE_FAIL": "exit"}}})

    r = deployment.up()
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr
    assert "exited before it became ready" in err and "on h3" in err
    assert "rolled back to the previous revision" in err
    assert "previous revision is healthy again" in err
    assert "--- last lines of decode-" in err
    assert "failing at start as asked (FAKE_FAIL=exit)" in err  # the service's own log lines
    _assert_rolled_back(deployment, before)
    after = deployment.pids()
    assert {s: after[s] for s in ("etcd", "frontend", "prefill-0")} == {
        s: pids[s] for s in ("etcd", "frontend", "prefill-0")}


def test_readiness_timeout_rolls_back_fake_engine(deployment: Deployment) -> None:
    deployment.up_ok()
    before = deployment.snapshot()
    deployment.write({"decode": {"env": {"FAKE_FAIL": "never-ready"}, "startup_timeout_s": 3}})

    t0 = time.monotonic()
    r = deployment.up()
    assert r.returncode == 1, r.stdout + r.stderr
    assert time.monotonic() - t0 < 30
    assert "not ready after 3s" in r.stderr and "HTTP 503" in r.stderr, r.stderr
    assert "rolled back to the previous revision" in r.stderr
    assert "--- last lines of decode-" in r.stderr
    _assert_rolled_back(deployment, before)


def test_port_already_taken_changes_nothing(deployment: Deployment) -> None:
    port = deployment.ports["worker_system"]  # prefill-0's system port on h2
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.3", port))
        squatter.listen(8)
        r = deployment.up()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"port {port} on h2 (127.0.0.3) is already in use; prefill-0 needs it" in r.stderr
    assert "nothing was changed" in r.stderr
    assert deployment.leftovers() == {}
    for h in LAYOUT:
        wd = deployment.workdir(h)
        for name in ("releases", "current", "state.json", "run", "lock", "incoming"):
            assert not (wd / name).exists(), f"{h}: {name} exists after a refused up"


def test_failed_smoke_rolls_back_fake_engine(deployment: Deployment) -> None:
    """`up` runs smoke last; the fake engine serves health only, so its chat checks fail and `up` rolls back."""
    deployment.up_ok()
    before = deployment.snapshot()
    deployment.write({"decode": {"env": {"DECODE_TUNING": "smoke"}}})
    r = deployment.cli("up", "--skip-preflight", timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "smoke" in r.stderr.lower() and "rolled back to the previous revision" in r.stderr
    _assert_rolled_back(deployment, before)


def _mtimes(directory: Path, pattern: str) -> dict[str, int]:
    """name -> mtime of the files matching `pattern` (one a stop removes between the listing and the stat is left out)."""
    out = {}
    for p in directory.glob(pattern):
        try:
            out[p.name] = p.stat().st_mtime_ns
        except FileNotFoundError:
            pass
    return out


def test_ctrl_c_mid_rollout_rolls_back_fake_engine(deployment: Deployment) -> None:
    """The operator presses Ctrl-C while new decode workers are still starting."""
    import signal

    deployment.up_ok()
    before = deployment.snapshot()
    # Ready after 6 s: the Ctrl-C comes ~0.1 s after the replacements start (after the surge twins, also 6 s), and
    # the rollback waits the rest of the 6 s for them.
    deployment.write({"decode": {"env": {"FAKE_FAIL": "slow:6"}, "startup_timeout_s": 60}})
    proc = deployment.popen("up", "--no-smoke", "--skip-preflight")
    marker = deployment.workdir("h3") / "run"
    deadline = time.monotonic() + 60
    # wait until the new decode workers have been started (their pidfiles are rewritten)
    old = _mtimes(marker, "decode-*.pid")
    while time.monotonic() < deadline:
        now = _mtimes(marker, "decode-*.pid")
        if now and all(now.get(k) != v for k, v in old.items()):
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the new decode workers never started")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "interrupted: rolling back" in err and "previous revision is healthy again" in err
    _assert_rolled_back(deployment, before)

"""Guard rails of `up` over real SSH: the cluster lock, host-key checking, secrets.

Real sshd hosts and real etcd; Dynamo components are the FAKE engine runtime
(tests/fakes/fake_python), named `fake_engine`.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import uuid

import pytest

from .conftest import LAYOUT, Deployment
from .sshhosts import keygen

pytestmark = pytest.mark.integration


def _kill_when_locked(deployment: Deployment, proc: subprocess.Popen[str]) -> None:
    """SIGKILL a background `up` (by pid) once it holds the lock: it leaves a stale lock behind."""
    deployment.wait_for(deployment.workdir("h1") / "lock" / "owner.json")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)


def test_concurrent_up_is_refused_fake_engine(deployment: Deployment) -> None:
    lock_file = deployment.workdir("h1") / "lock" / "owner.json"
    deployment.write({"decode": {"env": {"FAKE_FAIL": "slow:4"}}})  # decode becomes ready after 4 s
    first = deployment.popen("up", "--no-smoke", "--skip-preflight")
    try:
        deployment.wait_for(lock_file)
        owner = json.loads(lock_file.read_text())
        second = deployment.up()
        assert second.returncode == 1, second.stdout + second.stderr
        assert f"is locked by root@{owner['host']} pid {first.pid} running `up`" in second.stderr
        assert "nothing was changed" in second.stderr
        out, err = first.communicate(timeout=90)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, out + err
    assert not lock_file.exists()
    pids = deployment.pids()

    # An `up` killed with SIGKILL leaves its lock. Its holder is provably gone (this machine, this boot, its pid
    # no longer runs): the next `up` takes the lock over, says so, and finishes the change.
    deployment.write({"decode": {"env": {"FAKE_FAIL": "slow:2"}}})
    _kill_when_locked(deployment, deployment.popen("up", "--no-smoke", "--skip-preflight"))
    took = deployment.up()
    assert took.returncode == 0, took.stdout + took.stderr
    assert "took over the lock of `up`" in took.stderr and "no longer runs" in took.stderr, took.stderr
    assert not lock_file.exists()

    # A holder that cannot be proved gone (it ran on another machine) is refused, with how to break the lock.
    for how in ("unlock", "--break-lock"):
        deployment.write({"decode": {"env": {"FAKE_FAIL": f"slow:{1 if how == 'unlock' else 2}"}}})
        _kill_when_locked(deployment, deployment.popen("up", "--no-smoke", "--skip-preflight"))
        owner = json.loads(lock_file.read_text())
        lock_file.write_text(json.dumps(owner | {"host": "another-controller"}))
        refused = deployment.up()
        assert refused.returncode == 1 and "locked by root@another-controller" in refused.stderr, refused.stderr
        assert "`primectl unlock RECIPE` or `--break-lock`" in refused.stderr, refused.stderr
        if how == "unlock":
            unlocked = deployment.cli("unlock")
            assert unlocked.returncode == 0, unlocked.stderr
            assert f"lock of {deployment.name} on h1 removed" in unlocked.stderr
            deployment.up_ok()
        else:
            deployment.up_ok("--break-lock")
        assert not lock_file.exists()
    after = deployment.pids()
    assert {s: after[s] for s in ("etcd", "frontend", "prefill-0")} == {
        s: pids[s] for s in ("etcd", "frontend", "prefill-0")}
    code, doc = deployment.status_json()
    assert code == 0 and doc["healthy"] is True


def test_unknown_host_key_refused_fake_engine(deployment: Deployment) -> None:
    fresh = deployment.tmp / "fresh_known_hosts"  # does not exist yet: every key is unknown
    deployment.write({"known_hosts": str(fresh)})

    r = deployment.up()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "unknown host key" in r.stderr and "--accept-new-host-keys" in r.stderr
    for h in LAYOUT:
        assert not deployment.workdir(h).exists(), f"{h} was touched despite an unknown host key"
    assert deployment.cli("status").returncode == 1

    deployment.up_ok("--accept-new-host-keys")
    recorded = fresh.read_text()
    for h in deployment.hosts.values():
        assert h.known_hosts_line().split(" ", 1)[1].strip() in recorded, f"{h.name}'s key was not recorded"
        assert h.known_hosts_line().split()[0] in recorded
    # Recorded keys are now trusted without the flag.
    assert deployment.cli("status").returncode == 0

    # A CHANGED key is refused, with or without the flag, and the file is left alone.
    impostor = deployment.tmp / "impostor_key"
    keygen(impostor, "impostor")
    h2 = deployment.hosts["h2"]
    kind, b64 = (impostor.with_suffix(".pub")).read_text().split()[:2]
    changed = deployment.tmp / "changed_known_hosts"
    who = h2.known_hosts_line().split()[0]
    changed.write_text("".join(line if not line.startswith(who + " ") else f"{who} {kind} {b64}\n"
                               for line in deployment.known_hosts.read_text().splitlines(keepends=True)))
    content = changed.read_text()
    deployment.write({"known_hosts": str(changed), "decode": {"env": {"DECODE_TUNING": "d"}}})
    for args in ((), ("--accept-new-host-keys",)):
        r = deployment.up(*args)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "h2 (127.0.0.3:" in r.stderr and "host key CHANGED" in r.stderr, r.stderr
        assert changed.read_text() == content
    assert deployment.cli("diff").returncode == 1


def test_secrets_reach_the_service_and_never_leak_fake_engine(deployment: Deployment) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    var = f"TEST_SECRET_{uuid.uuid4().hex[:8].upper()}"  # `secrets: {API_KEY: env:TEST_SECRET_...}`
    assert var not in os.environ
    env = {var: secret}
    secrets = {"secrets": {"API_KEY": f"env:{var}"}}
    deployment.write(secrets)

    # Missing env var: bad input (exit 2), and nothing on any host.
    missing = deployment.up()
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "secrets.API_KEY" in missing.stderr and f"env:{var}" in missing.stderr
    assert "nothing was changed" in missing.stderr
    for h in LAYOUT:
        assert not deployment.workdir(h).exists()

    r = deployment.up_ok(env=env)
    seen = [r.stdout, r.stderr]
    for h in LAYOUT:
        f = deployment.workdir(h) / "secrets" / f"{deployment.name}.env"
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f"{h}: {oct(f.stat().st_mode)}"
        assert f.read_text() == f"API_KEY={secret}\n"
    pids = deployment.pids()
    for svc, pid in pids.items():
        if svc != "etcd":
            with open(f"/proc/{pid}/environ", "rb") as fh:
                assert f"API_KEY={secret}".encode() in fh.read().split(b"\0"), f"{svc} did not get the secret"

    plan = deployment.cli("plan", "-o", "json", env=env)
    assert plan.returncode == 0 and "API_KEY" in plan.stdout  # the name is shown, the value never
    deployment.write(secrets | {"decode": {"env": {"DECODE_TUNING": "e"}}})
    diff = deployment.cli("diff", env=env)
    assert diff.returncode == 3 and "+export DECODE_TUNING=e" in diff.stdout
    logs = deployment.cli("logs", "decode-0", env=env)
    assert logs.returncode == 0 and "fake runtime: -m dynamo.mocker" in logs.stdout
    code, _ = deployment.status_json()
    seen += [plan.stdout, plan.stderr, diff.stdout, diff.stderr, logs.stdout, logs.stderr]
    for i, text in enumerate(seen):
        assert secret not in text, f"secret leaked in command output #{i}"
    assert code == 0
    # On the hosts the value lives in the 0600 secrets file only: not in run scripts, units, state, logs.
    for h in LAYOUT:
        wd = deployment.workdir(h)
        for f in wd.rglob("*"):
            if f.is_file() and f.parent.name != "secrets":
                assert secret.encode() not in f.read_bytes(), f"secret written to {f}"

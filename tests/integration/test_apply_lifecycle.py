"""An operator's day with `up`, `status`, `diff`, `down` over real SSH (3 sshd hosts, real etcd).

Dynamo components are the FAKE engine runtime (tests/fakes/fake_python): tests that start
them say `fake_engine`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request

import pytest

from .conftest import ETCD, LAYOUT, Deployment
from .sshhosts import pid_alive, processes_under, recorded_pids, wait_gone

pytestmark = pytest.mark.integration


def test_up_on_three_hosts_then_status_healthy_fake_engine(deployment: Deployment) -> None:
    r = deployment.up_ok(preflight=True)  # the operator's default path, preflight included
    assert "ready: http://127.0.0.2:" in r.stderr
    for h in ("h1", "h2", "h3"):
        assert f"pushed {h}: revision" in r.stderr

    table = deployment.cli("status")
    assert table.returncode == 0, table.stdout + table.stderr
    assert "healthy" in table.stdout and "NOT HEALTHY" not in table.stdout

    code, doc = deployment.status_json()
    assert code == 0
    assert doc["healthy"] is True and doc["gate"]["ok"] is True
    assert {s["service"]: s["host"] for s in doc["services"]} == {
        svc: h for h, svcs in LAYOUT.items() for svc in svcs}
    assert all(s["healthy"] for s in doc["services"])

    # Really running, on the right "host": pid files + /proc, in that host's workdir, on its release.
    pids = deployment.pids()
    for h, services in LAYOUT.items():
        wd = deployment.workdir(h)
        assert {f for f in os.listdir(wd / "run") if f.endswith(".pid")} == {f"{s}.pid" for s in services}
        assert deployment.current(h) == deployment.state(h)["revision"]
        # what a later `up` reads if this one had been killed before it recorded: the revision each started from
        assert {s: (wd / "run" / f"{s}.release").read_text() for s in services} == {
            s: deployment.current(h) for s in services}
        running = {pid for pid, _ in processes_under(wd)}
        assert {pids[s] for s in services} <= running
    # etcd is the real one, and healthy.
    with open(f"/proc/{pids['etcd']}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0].decode() == ETCD
    url = f"http://127.0.0.2:{deployment.ports['etcd_client']}/health"
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert json.load(resp)["health"] == "true"
    # Everything else is the fake runtime.
    with open(f"/proc/{pids['decode-0']}/cmdline", "rb") as f:
        assert b"fake_python" in f.read()


def test_up_ten_times_restarts_nothing_fake_engine(deployment: Deployment) -> None:
    deployment.up_ok()
    before = deployment.pids()
    state_before = {h: deployment.state(h) for h in LAYOUT}
    for _ in range(10):
        r = deployment.up_ok()
        assert "no changes" in r.stderr
        assert "starting" not in r.stderr and "pushed" not in r.stderr
    assert deployment.pids() == before
    assert {h: deployment.state(h) for h in LAYOUT} == state_before


def test_changing_decode_env_restarts_only_the_decode_workers_fake_engine(deployment: Deployment) -> None:
    """`decode.env` applies to every decode worker: exactly those restart; etcd, prefill, frontend stay."""
    deployment.up_ok()
    nothing = deployment.cli("diff")
    assert nothing.returncode == 0, nothing.stdout + nothing.stderr
    assert "no changes" in nothing.stdout
    before = deployment.pids()

    deployment.write({"decode": {"env": {"DECODE_TUNING": "b"}}})
    d = deployment.cli("diff")
    assert d.returncode == 3, d.stdout + d.stderr
    marked = {m[2]: m[3] for m in re.finditer(r"^[~+!\- ] (h\d)\s+(\S+)\s+(\S+)", d.stdout, re.M)}
    assert marked == {"etcd": "keep", "frontend": "keep", "balancer": "keep", "prefill-0": "keep",
                      "decode-0": "change", "decode-1": "change"}, d.stdout
    assert "+export DECODE_TUNING=b" in d.stdout
    assert "2 to change, 4 unchanged" in d.stdout

    r = deployment.up_ok()
    assert "starting decode-0, decode-1" in r.stderr
    assert "2 started, 4 unchanged" in r.stderr
    after = deployment.pids()
    for svc in ("etcd", "frontend", "balancer", "prefill-0"):
        assert after[svc] == before[svc], f"{svc} was restarted"
    for svc in ("decode-0", "decode-1"):
        assert after[svc] != before[svc], f"{svc} was not restarted"
        assert not pid_alive(before[svc])
        with open(f"/proc/{after[svc]}/environ", "rb") as f:
            assert b"DECODE_TUNING=b" in f.read().split(b"\0")

    again = deployment.cli("diff")
    assert again.returncode == 0 and "no changes" in again.stdout, again.stdout + again.stderr


def test_kill_9_shows_in_status_and_next_up_heals_fake_engine(deployment: Deployment) -> None:
    deployment.up_ok()
    before = deployment.pids()
    os.kill(before["decode-0"], signal.SIGKILL)
    assert not wait_gone([before["decode-0"]], 5)

    code, doc = deployment.status_json()
    assert code == 1 and doc["healthy"] is False
    rows = {s["service"]: s for s in doc["services"]}
    assert rows["decode-0"]["running"] is False and rows["decode-0"]["healthy"] is False
    assert all(rows[s]["healthy"] for s in rows if s != "decode-0")
    table = deployment.cli("status")
    assert table.returncode == 1 and "NOT HEALTHY" in table.stdout

    d = deployment.cli("diff")
    assert d.returncode == 3 and "restart" in d.stdout and "not running" in d.stdout, d.stdout

    r = deployment.up_ok()
    assert "starting decode-0" in r.stderr and "decode-1" not in r.stderr
    after = deployment.pids()
    assert after["decode-0"] != before["decode-0"]
    assert {s: p for s, p in after.items() if s != "decode-0"} == {
        s: p for s, p in before.items() if s != "decode-0"}
    code, doc = deployment.status_json()
    assert code == 0 and doc["healthy"] is True


def test_down_leaves_no_process_behind_fake_engine(deployment: Deployment) -> None:
    deployment.up_ok()
    pids = deployment.pids()
    assert len(pids) == 6

    r = deployment.cli("down")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stopped 6 of 6 service(s)" in r.stderr
    assert not wait_gone(pids.values(), 5), "a service outlived `down`"
    assert deployment.leftovers() == {}
    for h in LAYOUT:
        wd = deployment.workdir(h)
        assert list((wd / "run").glob("*.pid")) == []
        assert (wd / "state.json").exists() and (wd / "current").is_symlink()  # files stay without --purge
        assert not (wd / "lock").exists()
    status = deployment.cli("status")
    assert status.returncode == 1

    r = deployment.cli("down", "--purge")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stopped 0 of 6 service(s)" in r.stderr and "were not running); files removed" in r.stderr
    for h in LAYOUT:
        left = sorted(os.listdir(deployment.workdir(h)))
        assert left == [], f"{h}: --purge left {left}"


def _without_h3(deployment: Deployment) -> None:
    """The recipe with h3 gone: its two decode workers move to h2."""
    deployment.write({"hosts": deployment.base["hosts"][:2], "decode": {"hosts": ["h2"]}})


def test_dropping_a_host_from_the_recipe_stops_its_services_fake_engine(deployment: Deployment) -> None:
    """A host left out of the recipe is not forgotten: `diff` lists its services as removals, `up` stops
    them and records on the host that it left, and later `up`s do not touch it again."""
    deployment.up_ok()
    on_h3 = recorded_pids(deployment.workdir("h3"))
    assert set(on_h3) == {"decode-0", "decode-1"}
    assert set(deployment.state("h1")["roster"]) == {"h1", "h2", "h3"}

    _without_h3(deployment)
    d = deployment.cli("diff")
    assert d.returncode == 3, d.stdout + d.stderr
    marked = {(m[1], m[2]): m[3] for m in re.finditer(r"^[~+!\- ] (h\d)\s+(\S+)\s+(\S+)", d.stdout, re.M)}
    assert marked[("h3", "decode-0")] == marked[("h3", "decode-1")] == "remove", d.stdout
    assert marked[("h2", "decode-0")] == marked[("h2", "decode-1")] == "add", d.stdout
    assert "host dropped from the recipe" in d.stdout
    assert all(pid_alive(p) for p in on_h3.values()), "diff must not stop anything"

    r = deployment.up_ok()
    assert "h3 left the deployment" in r.stderr, r.stderr
    assert wait_gone(on_h3.values(), 10) == [], "h3's decode workers still run"
    assert processes_under(deployment.workdir("h3")) == []
    h3 = deployment.state("h3")
    assert h3 is not None and h3["services"] == {} and h3["retired"] is True
    assert set(deployment.state("h1")["roster"]) == {"h1", "h2"}
    assert set(recorded_pids(deployment.workdir("h2"))) == {"prefill-0", "decode-0", "decode-1"}

    touched = (deployment.workdir("h3") / "state.json").stat().st_mtime_ns
    again = deployment.up_ok()
    assert "no changes" in again.stderr, again.stderr
    assert (deployment.workdir("h3") / "state.json").stat().st_mtime_ns == touched, "h3 was touched again"


def test_a_dropped_host_that_is_down_is_retried_by_the_next_up_fake_engine(deployment: Deployment) -> None:
    """Dropping a host because it is unreachable must not block `up`; its services are stopped once it is back."""
    deployment.up_ok()
    on_h3 = recorded_pids(deployment.workdir("h3"))
    _without_h3(deployment)
    h3 = deployment.cluster.hosts[2]
    h3.stop()
    try:
        r = deployment.up_ok()
        assert "h3" in r.stderr and "cannot be inspected" in r.stderr and "will try again" in r.stderr, r.stderr
        assert all(pid_alive(p) for p in on_h3.values()), "nothing could have reached h3"
        assert "h3" in deployment.state("h1")["roster"], "the unreachable host must stay on the roster"
    finally:
        h3.start()
    r = deployment.up_ok()
    assert "h3 left the deployment" in r.stderr, r.stderr
    assert wait_gone(on_h3.values(), 10) == []
    assert set(deployment.state("h1")["roster"]) == {"h1", "h2"}

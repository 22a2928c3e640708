"""An operator's day with `supervisor: systemd` on three hosts that run a real systemd as PID 1.

The hosts are the session's systemd-nspawn containers (tests/integration/nspawnhosts.py,
10.77.0.2-4); primectl reaches them over SSH like any machine and drives their systemd: units
installed under /etc/systemd/system, daemon-reload, enable + restart per wave, readiness, liveness
from `systemctl show`. etcd is the real /usr/bin/etcd inside the containers; Dynamo components are
the FAKE engine runtime (tests/fakes/fake_python, bound read-only into the hosts). The test's own
checks look at each host's systemd directly (nsenter), not through primectl.

Run in a private network namespace:
    unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest tests/integration/test_systemd_hosts.py -q'
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.plan.layout import unit_name

from . import conftest
from .conftest import LAYOUT, REPO, Deployment, nspawn_runtime
from .nspawnhosts import NspawnHost, NspawnHosts
from .sshhosts import wait_for
from .test_demo_cluster import _metrics, check_serving

pytestmark = pytest.mark.integration
RESTART_SEC = 1  # the recipe's restart_delay_s: its units' RestartSec (5 by default)
UNIT_PROPS = ("ActiveState", "SubState", "MainPID", "NRestarts", "UnitFileState", "LoadState")


class SystemdDeployment(Deployment):
    """A Deployment on the nspawn hosts with `supervisor: systemd`, plus views of each host's systemd."""

    def __init__(self, cluster: NspawnHosts, tmp: Path, name: str, index: int):
        super().__init__(cluster, tmp, name, index)  # type: ignore[arg-type]  # same shape as SSHHosts
        self.machines: dict[str, NspawnHost] = {h.name: h for h in cluster.hosts[:3]}
        self.base["supervisor"] = "systemd"
        self.base["restart_delay_s"] = RESTART_SEC
        self.path = self.write()
        self.layout: dict[str, set[str]] = LAYOUT  # host -> services of the recipe in use
        self.teardown: Path | None = None  # the recipe `down --purge` runs with afterwards (default: the base)

    def unit(self, service: str) -> str:
        return f"{unit_name(self.name, service)}.service"

    def host_of(self, service: str) -> NspawnHost:
        return self.machines[next(h for h, svcs in self.layout.items() if service in svcs)]

    def show(self, service: str, *props: str) -> dict[str, str]:
        """`systemctl show -p ...` of a service's unit on its host."""
        args = [a for p in (props or UNIT_PROPS) for a in ("-p", p)]
        out = self.host_of(service).run("systemctl", "show", self.unit(service), *args).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def units(self) -> dict[str, dict[str, str]]:
        """service -> its unit's properties, for every service of the recipe in use."""
        return {svc: self.show(svc) for svcs in self.layout.values() for svc in svcs}

    def main_pids(self) -> dict[str, int]:
        """service -> MainPID as systemd sees it (inside the host's pid namespace); 0 when not running."""
        return {svc: int(props["MainPID"]) for svc, props in self.units().items()}

    def our_units(self, host: NspawnHost) -> dict[str, list[str]]:
        """What the host's systemd knows of this deployment: loaded units, unit files, enablement links."""
        pattern = f"{unit_name(self.name, '')}*"
        loaded = host.run("systemctl", "list-units", "--all", "--plain", "--no-legend", pattern).stdout.split("\n")
        files = host.run("systemctl", "list-unit-files", "--no-legend", pattern, check=False).stdout.split("\n")
        links = host.run("sh", "-c", f"ls /etc/systemd/system/*.wants/ | grep -F {unit_name(self.name, '')}",
                         check=False).stdout.split("\n")
        return {k: [line.split()[0] for line in v if line.strip()] for k, v in
                {"loaded": loaded, "files": files, "links": links}.items()}

    def reloads(self, host: NspawnHost) -> int:
        """How many times the host's systemd reloaded its units since boot (its own journal)."""
        out = host.run("journalctl", "-b", "_PID=1", "-o", "cat", "--no-pager").stdout
        return out.count("Reloading.")


@pytest.fixture
def systemd_deployment(nspawn_hosts: NspawnHosts, tmp_path: Path, request: pytest.FixtureRequest
                       ) -> Iterator[SystemdDeployment]:
    """A fresh deployment (own name, ports, workdirs) on the shared systemd hosts.

    Afterwards every host is running again, `down --purge --break-lock` removes the deployment, and no
    unit of it may remain on any host (loaded, as a file, or enabled): a leftover fails the test.
    """
    index = next(conftest._counter)
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:20].strip("-")
    dep = SystemdDeployment(nspawn_hosts, tmp_path, f"s{index:02d}-{slug}", index)
    yield dep
    for h in nspawn_hosts.hosts:
        if not h.pid:
            h.boot()
    down = dep.cli("down", "--purge", "--break-lock", recipe=dep.teardown or dep.write(file="teardown.yaml"))
    left = {h.name: units for h in nspawn_hosts.hosts if any((units := dep.our_units(h)).values())}
    for h in left:  # clean up for the next test, then fail
        host = nspawn_hosts[h]
        host.run("sh", "-c", f"systemctl disable --now '{unit_name(dep.name, '')}*'; "
                 f"rm -f /etc/systemd/system/{unit_name(dep.name, '')}*; systemctl daemon-reload; "
                 f"systemctl reset-failed '{unit_name(dep.name, '')}*'", check=False)
    assert down.returncode == 0, f"teardown `down --purge` failed:\n{down.stdout}\n{down.stderr}"
    assert not left, f"units left behind after `down --purge`: {left}"


def status(dep: SystemdDeployment) -> tuple[int, dict[str, Any], dict[str, dict[str, Any]]]:
    """`status -o json`: exit code, document, rows by service."""
    code, doc = dep.status_json()
    return code, doc, {s["service"]: s for s in doc["services"]}


def test_up_on_three_systemd_hosts_runs_enabled_units_and_status_is_healthy(
        systemd_deployment: SystemdDeployment) -> None:
    dep = systemd_deployment
    r = dep.up_ok()
    assert "ready: http://10.77.0.2:" in r.stderr, r.stderr

    units = dep.units()
    for svc, props in units.items():
        assert props["ActiveState"] == "active" and props["SubState"] == "running", (svc, props)
        assert props["UnitFileState"] == "enabled", (svc, props)
        assert props["NRestarts"] == "0"
        host = dep.host_of(svc)
        unit_file = host.path(f"/etc/systemd/system/{dep.unit(svc)}").read_text()
        assert f"ExecStart=/bin/bash {dep.workdir(host.name)}/current/bin/{svc}.sh" in unit_file

    code, doc, rows = status(dep)
    assert code == 0 and doc["healthy"] is True, doc
    for svc, row in rows.items():
        assert row["state"] == "active (running)" and row["restarts"] == 0, row
        assert row["pid"] == int(units[svc]["MainPID"]), (row, units[svc])
    wide = dep.cli("status", "-o", "wide")
    assert wide.returncode == 0 and "active (running)" in wide.stdout, wide.stdout

    again = dep.up_ok()
    assert "no changes" in again.stderr
    assert dep.main_pids() == {svc: int(p["MainPID"]) for svc, p in units.items()}

    # `logs` reads the service's own output from the log file the unit appends to; `--journal`, what
    # systemd said about the unit (it has none of the service's output: StandardOutput=append:).
    logs = dep.cli("logs", "decode-0")
    assert logs.returncode == 0, logs.stderr
    assert "--- primectl: starting decode-0 at" in logs.stdout and "fake runtime: -m dynamo.mocker" in logs.stdout
    journal = dep.cli("logs", "decode-0", "--journal")
    assert journal.returncode == 0, journal.stderr
    assert f"Started {dep.unit('decode-0')} - primectl {dep.name}: decode-0" in journal.stdout, journal.stdout
    assert "fake runtime" not in journal.stdout


def test_changing_one_service_restarts_only_its_unit(systemd_deployment: SystemdDeployment) -> None:
    dep = systemd_deployment
    dep.up_ok()
    before = dep.main_pids()
    dep.write({"prefill": {"env": {"PREFILL_TUNING": "b"}}})
    r = dep.up_ok()
    assert "starting prefill-0" in r.stderr and "1 started, 5 unchanged" in r.stderr, r.stderr
    after = dep.units()
    for svc, props in after.items():
        assert props["ActiveState"] == "active" and props["UnitFileState"] == "enabled", (svc, props)
        if svc == "prefill-0":
            assert int(props["MainPID"]) != before[svc]
        else:
            assert int(props["MainPID"]) == before[svc], f"{svc} was restarted"
    environ = dep.host_of("prefill-0").run("cat", f"/proc/{after['prefill-0']['MainPID']}/environ").stdout
    assert "PREFILL_TUNING=b" in environ.split("\0")
    assert "HOME=/root" in environ.split("\0"), "the unit's User=root gives services a HOME (Dynamo needs one)"
    code, doc = dep.status_json()
    assert code == 0 and doc["healthy"] is True, doc


def test_a_unit_crashing_at_start_is_rolled_back_and_nothing_keeps_restarting(
        systemd_deployment: SystemdDeployment) -> None:
    """First `up` with a crashing worker: every unit it installed is removed. Later a change that crashes:
    the previous revision runs again. Either way no unit is left in systemd's restart loop."""
    dep = systemd_deployment
    dep.write({"decode": {"env": {"FAKE_FAIL": "exit"}}})
    first = dep.up()
    assert first.returncode == 1, first.stdout + first.stderr
    assert "exited before it became ready" in first.stderr and "rolled back" in first.stderr, first.stderr
    for h in dep.machines.values():
        assert not any(dep.our_units(h).values()), f"{h.name} keeps units of a deployment that never came up"
    for svc, props in dep.units().items():
        assert props["LoadState"] == "not-found" and props["ActiveState"] == "inactive", (svc, props)

    dep.write()  # the good recipe
    dep.up_ok()
    good = dep.main_pids()
    dep.write({"decode": {"env": {"FAKE_FAIL": "exit"}}})
    r = dep.up()
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr
    assert "exited before it became ready" in err and "on h3" in err, err
    assert "previous revision is healthy again" in err, err
    # The failure shows the worker's own last lines and what systemd saw (from the journal).
    assert "failing at start as asked (FAKE_FAIL=exit)" in err, err
    assert f"--- systemd about {unit_name(dep.name, 'decode-')}" in err, err
    assert "Main process exited, code=exited, status=7/NOTRUNNING" in err, err

    settled = dep.units()
    for svc, props in settled.items():
        assert (props["ActiveState"], props["SubState"], props["UnitFileState"]) == ("active", "running", "enabled"), \
            (svc, props)
    assert {s: int(p["MainPID"]) for s, p in settled.items() if not s.startswith("decode")} == \
        {s: p for s, p in good.items() if not s.startswith("decode")}
    time.sleep(RESTART_SEC + 1)  # a unit still failing would have been restarted by now
    assert dep.units() == settled
    code, doc = dep.status_json()
    assert code == 0 and doc["healthy"] is True, doc


def test_kill_9_of_a_worker_is_restarted_by_systemd_and_status_says_so(systemd_deployment: SystemdDeployment) -> None:
    dep = systemd_deployment
    dep.up_ok()
    before = dep.main_pids()
    h3 = dep.host_of("decode-0")
    h3.run("kill", "-9", str(before["decode-0"]))
    restarted = wait_for(lambda: dep.show("decode-0"),
                         lambda p: p["ActiveState"] == "active" and p["MainPID"] not in ("0", str(before["decode-0"])),
                         RESTART_SEC + 15, "systemd restarting the killed worker", interval=0.2)
    assert restarted["NRestarts"] == "1"
    assert dep.show("decode-0", "RestartUSec") == {"RestartUSec": f"{RESTART_SEC}s"}  # the recipe's restart_delay_s

    code, doc, rows = status(dep)
    assert code == 0 and doc["healthy"] is True, doc
    assert rows["decode-0"]["restarts"] == 1 and rows["decode-0"]["state"] == "active (running)", rows["decode-0"]
    assert rows["decode-0"]["pid"] == int(restarted["MainPID"])
    assert all(rows[s]["restarts"] == 0 for s in rows if s != "decode-0")
    table = dep.cli("status")
    assert "restarted 1x by the supervisor" in table.stdout, table.stdout
    journal = dep.cli("logs", "decode-0", "--journal")
    assert "Main process exited, code=killed, status=9/KILL" in journal.stdout, journal.stdout
    assert "Scheduled restart job, restart counter is at 1." in journal.stdout

    r = dep.up_ok()  # systemd already healed it: nothing to do
    assert "no changes" in r.stderr, r.stderr
    assert dep.main_pids() == before | {"decode-0": int(restarted["MainPID"])}
    code, doc, rows = status(dep)
    assert code == 0 and doc["healthy"] is True, doc
    assert rows["decode-0"]["restarts"] == 1, "`up` with nothing to do must not reset systemd's restart count"


def test_rebooting_a_host_brings_its_units_back_and_up_restarts_nothing(
        nspawn_hosts: NspawnHosts, systemd_deployment: SystemdDeployment) -> None:
    """h1 (etcd + frontend) reboots: its enabled units start at boot; `up` afterwards has nothing to do."""
    dep = systemd_deployment
    dep.up_ok()
    before = dep.main_pids()
    h1 = dep.machines["h1"]
    seconds = h1.reboot()
    print(f"\nreboot of h1: {seconds:.2f}s")

    _, doc = wait_for(dep.status_json, lambda s: s[0] == 0, 60, "status healthy after the reboot", interval=0.2)
    assert doc["healthy"] is True
    units = dep.units()
    for svc in LAYOUT["h1"]:
        props = units[svc]
        assert (props["ActiveState"], props["UnitFileState"]) == ("active", "enabled"), (svc, props)
        # Started by the boot itself, after network-online.target: the host's address was there
        # at the first try (no failed start, no automatic restart).
        assert props["NRestarts"] == "0", (svc, props)
    journal = h1.run("journalctl", "-b", "-u", dep.unit("etcd"), "-o", "cat", "--no-pager").stdout
    assert journal.count("Started ") == 1 and "Main process exited" not in journal, journal
    assert {s: int(units[s]["MainPID"]) for s in before if s not in LAYOUT["h1"]} == \
        {s: p for s, p in before.items() if s not in LAYOUT["h1"]}

    r = dep.up_ok()
    assert "no changes" in r.stderr, r.stderr
    assert dep.main_pids() == {s: int(p["MainPID"]) for s, p in units.items()}


def test_a_unit_that_gave_up_at_its_start_limit_is_restarted_by_the_next_up(
        systemd_deployment: SystemdDeployment) -> None:
    """The recovery when a unit does not come back (e.g. it kept failing at boot): it sits `failed` at its
    start limit (StartLimitBurst=5 per 300 s, manual starts count too), `status` says so, `up` starts it."""
    dep = systemd_deployment
    dep.up_ok()
    before = dep.main_pids()
    h3 = dep.host_of("decode-1")
    for _ in range(6):  # 1 start by `up` + 5 more: the sixth is refused by the start limit
        h3.run("systemctl", "restart", dep.unit("decode-1"), check=False)
    failed = dep.show("decode-1", "ActiveState", "Result")
    assert failed == {"ActiveState": "failed", "Result": "start-limit-hit"}, failed
    refused = h3.run("systemctl", "start", dep.unit("decode-1"), check=False)
    assert refused.returncode != 0, "systemd refuses to start a unit at its start limit"

    code, _, rows = status(dep)
    assert code == 1 and rows["decode-1"]["running"] is False and rows["decode-1"]["state"] == "failed (failed)", rows
    d = dep.cli("diff")
    assert d.returncode == 3 and re.search(r"decode-1\s+restart\s+not running", d.stdout), d.stdout
    r = dep.up_ok()
    assert "starting decode-1" in r.stderr and "1 started, 5 unchanged" in r.stderr, r.stderr
    after = dep.units()
    assert (after["decode-1"]["ActiveState"], after["decode-1"]["SubState"]) == ("active", "running")
    assert {s: int(p["MainPID"]) for s, p in after.items() if s != "decode-1"} == \
        {s: p for s, p in before.items() if s != "decode-1"}
    code, doc = dep.status_json()
    assert code == 0 and doc["healthy"] is True, doc


def test_down_stops_and_disables_every_unit_and_purge_removes_them(systemd_deployment: SystemdDeployment) -> None:
    dep = systemd_deployment
    dep.up_ok()
    r = dep.cli("down")
    assert r.returncode == 0 and "stopped 6 of 6 service(s)" in r.stderr, r.stdout + r.stderr
    for svc, props in dep.units().items():
        assert (props["ActiveState"], props["UnitFileState"]) == ("inactive", "disabled"), (svc, props)
    for h in dep.machines.values():
        ours = dep.our_units(h)
        assert ours["links"] == [], f"{h.name}: enabled units left: {ours['links']}"
        assert sorted(ours["files"]) == sorted(dep.unit(s) for s in LAYOUT[h.name])  # kept without --purge
        assert h.run("pgrep", "-f", "fake_python|/usr/bin/etcd", check=False).stdout == ""
    code, _, rows = status(dep)
    assert code == 1 and {r["state"] for r in rows.values()} == {"inactive (dead), disabled"}, rows

    reloads = {h.name: dep.reloads(h) for h in dep.machines.values()}
    r = dep.cli("down", "--purge")
    assert r.returncode == 0 and "files removed" in r.stderr, r.stdout + r.stderr
    for h in dep.machines.values():
        assert not any(dep.our_units(h).values()), (h.name, dep.our_units(h))
        assert dep.reloads(h) > reloads[h.name], f"{h.name}: no daemon-reload after the unit files went"
    for svc, props in dep.units().items():
        assert props["LoadState"] == "not-found", (svc, props)


def test_demo_stack_serves_chat_under_systemd_on_three_hosts(systemd_deployment: SystemdDeployment) -> None:
    """recipes/demo-systemd.yaml for real: Dynamo frontend + KV router, mocker workers, Mooncake master, etcd,
    each a systemd unit on its host; a chat answer through the openai client; kill -9 of a decode worker is
    healed by systemd and the stack serves again."""
    runtime = nspawn_runtime()
    if runtime is None:
        pytest.fail("no runtime venv bound into the nspawn hosts: build .runtime (make runtime) or set "
                    f"{conftest.NSPAWN_RUNTIME_ENV}", pytrace=False)
    dep = systemd_deployment
    fe_port = dep.frontend_port
    doc = {
        "extends": str(REPO / "recipes" / "demo-systemd.yaml"),
        "name": dep.name, "namespace": dep.name,
        "hosts": dep.base["hosts"], "known_hosts": dep.base["known_hosts"],
        "frontend": {"port": fe_port},
        "ports": dep.ports | {"mooncake_rpc": fe_port + 60, "mooncake_metadata": fe_port + 61,
                              "mooncake_metrics": fe_port + 62},
        "software": {"python": str(runtime / "bin" / "python")},
        "prefill": {"startup_timeout_s": 180}, "decode": {"startup_timeout_s": 180},
    }
    dep.path = dep.teardown = dep.tmp / "demo-systemd.yaml"
    dep.path.write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = yaml.safe_load(dep.cli("plan", "--output", "json").stdout)
    assert plan["supervisor"] == "systemd"
    dep.layout = {}
    for svc in plan["services"]:
        dep.layout.setdefault(svc["host"], set()).add(svc["name"])
    assert dep.layout == {"h1": {"etcd", "frontend", "balancer", "mooncake-master"}, "h2": {"prefill-0"},
                          "h3": {"decode-0", "decode-1"}}

    t0 = time.monotonic()
    up = dep.cli("up", "--no-smoke", "--skip-preflight", timeout=600)
    print(f"\ndemo stack up under systemd: {time.monotonic() - t0:.1f}s")
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
    for svc, props in dep.units().items():
        assert (props["ActiveState"], props["SubState"], props["UnitFileState"]) == ("active", "running", "enabled"), \
            (svc, props)
    t0 = time.monotonic()
    check_serving(plan["endpoint"], _metrics(plan))
    print(f"chat checks: {time.monotonic() - t0:.1f}s")
    code, doc_status = dep.status_json()
    assert code == 0 and doc_status["healthy"] is True, doc_status

    before = dep.show("decode-1")
    dep.host_of("decode-1").run("kill", "-9", before["MainPID"])
    t0 = time.monotonic()
    wait_for(dep.status_json, lambda s: s[0] == 0 and next(
        r for r in s[1]["services"] if r["service"] == "decode-1")["restarts"] == 1, 240,
        "systemd restarting the killed decode worker and status healthy again", interval=0.2)
    print(f"decode-1 back after kill -9: {time.monotonic() - t0:.1f}s")
    check_serving(plan["endpoint"], _metrics(plan))

"""Changing a live deployment under load when systemd supervises it: the demo stack on the three nspawn hosts
(systemd 252 as PID 1, reached over SSH; tests/integration/nspawnhosts.py) while streaming clients in this test
process send chat requests through the openai client with retries off. Every request must end with a
finish_reason.

Under `supervisor: systemd` a drain takes another path than on the local demo (test_live_change.py): the agent
SIGTERMs the unit's MainPID (the worker leaves discovery), watches its in-flight gauge down to 0, then
`systemctl kill --signal=SIGKILL` and `restart`/`stop` the unit (KillMode=mixed, TimeoutStopSec covering the
drain). The two changes here both go through it: a decode argument (a new generation: surge twins start as
units of their own beside the old workers, which are drained and restarted, then the twins are drained,
stopped and their units removed) and decode scaled down (the removed worker drained, its unit stopped,
disabled and removed). Besides the clients' count, each drained unit's journal and log must show that it was
signalled by the drain first and stopped only after it (never systemd's own SIGKILL at the stop timeout).

A controller that dies mid-change (issue #37 item 3): `up` killed with SIGKILL under load with the surge twin
units up, again while the old workers drain, then `up` finishes the change; and `down` right after such a kill
stops the twin units, whose unit files the module's `down --purge` must remove too.

One frontend, so that a request lost to one of Dynamo's prefill races reaches the client and the frontend's log
explains it (behind HAProxy, `frontend.replicas: 2`, such a 503 comes before any byte and is sent again:
`benchmarks/live_change.py --systemd` measures that layout, frontend rows included).

Run in a private network namespace:
    unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest tests/integration/test_systemd_live_change.py -q'
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.bench.liveload import LiveLoad, LoadReport
from primectl.bench.liveload import up_killed_at as liveload_up_killed_at
from primectl.plan.layout import unit_name

from . import conftest
from .conftest import PRIMECTL, REPO, deep_merge, nspawn_runtime
from .generation_races import ANSWERS, race_causes
from .nspawnhosts import NspawnHosts
from .test_systemd_hosts import SystemdDeployment

pytestmark = pytest.mark.integration

FRONTEND_PORT = 29000
PORTS = {
    "response_stream": 29004, "etcd_client": 29002, "etcd_peer": 29003, "worker_system": 29010, "tcp_rpc": 29020,
    "bootstrap": 29030, "kv_events": 29040, "mooncake_rpc": 29050, "mooncake_metadata": 29051,
    "mooncake_metrics": 29052, "nixl_side_channel": 29060, "dp_rpc": 29070,
    "frontend_replica": 29090,
}
CLIENTS = 3
LOAD_S = 3.0  # load before and after each change
# What systemd logs when it had to SIGKILL a unit itself (its stop timeout ran out): a drain never gets there.
SYSTEMD_TIMEOUT_KILL = ("timed out. Killing", "Killing process")


def flat_recipe(path: Path) -> dict[str, Any]:
    """A recipe with its `extends` chain merged in (so a key the base sets can be removed: None deletes)."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    if "extends" in doc:
        base = flat_recipe((path.parent / doc.pop("extends")).resolve())
        doc = deep_merge(base, doc)
    return doc


@dataclass
class SystemdLive:
    dep: SystemdDeployment
    doc: dict[str, Any]
    endpoint: str
    since: dict[str, str] = field(default_factory=dict)  # host -> its clock when the current change began
    frontend_at: int = 0  # how much of the frontend's log was there when the current change began

    def write(self) -> None:
        self.dep.path.write_text(yaml.safe_dump(self.doc, sort_keys=False))

    def relayout(self) -> None:
        """Which host runs which service, from `plan` of the recipe as written now."""
        r = self.dep.cli("plan", "--output", "json")
        assert r.returncode == 0, f"plan failed:\n{r.stdout}\n{r.stderr}"
        plan = yaml.safe_load(r.stdout)
        self.dep.layout = {}
        for svc in plan["services"]:
            self.dep.layout.setdefault(svc["host"], set()).add(svc["name"])

    def mark(self) -> None:
        """Remember each host's clock: the journal lines of the next change are those after it."""
        self.since = {h: m.run("date", "+%Y-%m-%d %H:%M:%S.%N").stdout.strip()[:26]
                      for h, m in self.dep.machines.items()}
        self.frontend_at = len(self.log("h1", "frontend"))

    def frontend_log(self) -> str:
        """What the frontend logged since mark()."""
        return self.log("h1", "frontend")[self.frontend_at:]

    def journal(self, host: str, unit_service: str) -> str:
        """What the host's systemd logged about a service's unit since mark()."""
        m = self.dep.machines[host]
        return m.run("journalctl", "-u", self.dep.unit(unit_service), "--since", self.since[host], "-o", "cat",
                     "--no-pager").stdout

    def errors(self, last: int = 30) -> str:
        """The last error and warning lines of every service's log on every host (for a failure's message)."""
        lines = []
        for h in self.dep.machines:
            for p in sorted((self.dep.workdir(h) / "logs").glob("*.log")):
                lines += [f"{h} {p.name}: {line[:400]}" for line in p.read_text(errors="replace").splitlines()
                          if re.search(r"\b(ERROR|WARN)\b|primectl: starting", line)]
        return "\n".join(lines[-last:])

    def log(self, host: str, service: str) -> str:
        """The service's own log (the unit appends to it), as this test reads it through the bind mount."""
        path = self.dep.workdir(host) / "logs" / f"{service}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def systemd_live(nspawn_hosts: NspawnHosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdLive]:
    """demo-systemd (one frontend, etcd and Mooncake master on h1, prefill on h2, two decoders on h3) up on the
    nspawn hosts, for the whole module; `down --purge` and no unit left afterwards."""
    runtime = nspawn_runtime()
    if runtime is None:
        pytest.fail("no runtime venv bound into the nspawn hosts: build .runtime (make runtime) or set "
                    f"{conftest.NSPAWN_RUNTIME_ENV}", pytrace=False)
    index = next(conftest._counter)
    dep = SystemdDeployment(nspawn_hosts, tmp_path_factory.mktemp("systemd-live"), f"s{index:02d}-live", index)
    doc = deep_merge(flat_recipe(REPO / "recipes" / "demo-systemd.yaml"), {
        "name": dep.name, "namespace": dep.name,
        "hosts": dep.base["hosts"], "known_hosts": dep.base["known_hosts"],
        "frontend": {"port": FRONTEND_PORT}, "ports": PORTS,
        "software": {"python": str(runtime / "bin" / "python")},
        "prefill": {"startup_timeout_s": 180}, "decode": {"startup_timeout_s": 180},
        "ratio": None,  # decode is scaled: no fixed P:D ratio to keep
        # As in test_live_change.py: at the demo's 10x each closed-loop client streams ~700 tokens a second and
        # the CPU goes into serving them; at 0.5x a request stays in flight ~10x longer (more are mid-stream when a
        # unit drains) for a fraction of the CPU.
        "mocker": {"speedup_ratio": 0.5},
    })
    dep.path = dep.teardown = dep.tmp / "live.yaml"
    live = SystemdLive(dep, doc, f"http://{nspawn_hosts['h1'].address}:{FRONTEND_PORT}")
    live.write()
    live.relayout()
    try:
        t0 = time.monotonic()
        up = dep.cli("up", "--no-smoke", "--skip-preflight", timeout=600)
        print(f"\nlive demo up under systemd: {time.monotonic() - t0:.1f}s")
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        yield live
    finally:
        for h in dep.machines:  # kept beside the recipe: `down --purge` removes the workdirs
            if (dep.workdir(h) / "logs").is_dir():
                shutil.copytree(dep.workdir(h) / "logs", dep.tmp / f"logs-{h}", dirs_exist_ok=True)
        down = dep.cli("down", "--purge", "--break-lock", timeout=300)
        left = {h.name: units for h in nspawn_hosts.hosts if any((units := dep.our_units(h)).values())}
        assert down.returncode == 0, f"`down --purge` failed:\n{down.stdout}\n{down.stderr}"
        assert not left, f"units left behind after `down --purge`: {left}"


def under_load(live: SystemdLive, *, generation_races: bool = False) -> tuple[LoadReport, str]:
    """`up` of the recipe as written while CLIENTS stream chat requests; what they saw, what `up` printed.

    Nothing may be lost; with `generation_races` (a change that starts a new generation), except at most 2
    requests answered 503 or 500 before any byte, each of which the frontend's log explains as one of RACES."""
    live.mark()
    load = LiveLoad(live.endpoint, "demo", clients=CLIENTS, deadline_s=600)
    with load:
        time.sleep(LOAD_S)
        t0 = time.monotonic()
        r = live.dep.cli("up", "--no-smoke", "--skip-preflight", timeout=400)
        print(f"\nup under load: {time.monotonic() - t0:.1f}s, exit {r.returncode}")
        time.sleep(LOAD_S)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"up failed:\n{out}"
    assert_lost_only_to_races(live, load.report, out, generation_races=generation_races)
    return load.report, out


def assert_lost_only_to_races(live: SystemdLive, report: LoadReport, out: str, *, generation_races: bool) -> None:
    """Nothing lost; with `generation_races`, except at most 2 requests answered 503 or 500 before any byte,
    each of which the frontend's log (since mark()) explains as one of RACES."""
    assert report.served > 0, "the clients got nothing served at all"
    causes = race_causes(live.frontend_log())
    print(f"served {report.served}, lost {len(report.lost)}; the frontend's 5xx: {causes}")
    wall = time.time() - time.monotonic()
    when = ", ".join(time.strftime("%H:%M:%S", time.gmtime(o.started + wall)) + f".{(o.started + wall) % 1:.3f}"[2:]
                     + f"Z +{o.ended - o.started:.3f}s" for o in report.lost)
    lost = f"{len(report.lost)} of {len(report.outcomes)} requests lost: {report.seen()} (started {when})"
    context = f"{lost}; frontend: {causes}\n{out}\n--- errors in the logs ---\n{live.errors()}"
    if not generation_races:
        assert not report.lost, context
    else:
        assert all(o.detail in ANSWERS and o.tokens == 0 for o in report.lost), context
        assert len(report.lost) <= 2, context
        # each one the frontend itself answered (what `diff` promises: "or a few requests answered 503
        # (retryable)"); RACES names the causes its log shows, and the message carries them. A CI run here saw one
        # 503 with none of those lines, so a cause is reported, not required. The balancer in front of the frontend
        # resends such an answer before its first byte, so the frontend may have sent more than clients lost.
        assert causes["503 sent"] + causes["500 sent"] >= len(report.lost), context


def old_process_log(live: SystemdLive, host: str, service: str, *, replaced: bool) -> str:
    """What the service's previous process wrote (the log holds one section per start; `replaced`: a new process
    has started since, so the previous section is the one before the last)."""
    sections = re.split(rf"^--- primectl: starting {re.escape(service)} at .*$", live.log(host, service), flags=re.M)
    return sections[-2] if replaced else sections[-1]


def assert_stopped_after_a_drain(live: SystemdLive, host: str, service: str, *, replaced: bool,
                                 served: bool = True) -> None:
    """The service's old process got the drain's SIGTERM (Dynamo logs its graceful shutdown), finished every
    request it had been given before it went (each `request received` has its `request completed`), and its
    unit was stopped by primectl, never by systemd's own SIGKILL at the unit's stop timeout."""
    log = old_process_log(live, host, service, replaced=replaced)
    assert "Received shutdown signal" in log, f"{service}: the old process never got the drain's SIGTERM"
    received = set(re.findall(r"request received request_id=(\S+)", log))
    completed = set(re.findall(r"request completed request_id=(\S+)", log))
    assert received or not served, f"{service}: the old process served nothing (the load did not reach it)"
    assert received <= completed, f"{service}: stopped with requests unfinished: {sorted(received - completed)}"
    journal = live.journal(host, service)
    assert not any(k in journal for k in SYSTEMD_TIMEOUT_KILL), f"{service}: systemd killed it at a timeout:\n{journal}"
    # Exited by itself once drained, or SIGKILLed by primectl after the drain (`systemctl kill`: "on client request").
    assert f"{live.dep.unit(service)}: Deactivated successfully." in journal or "on client request" in journal, journal


def test_a_decode_argument_change_surges_a_new_generation_of_units_and_loses_no_request(
        systemd_live: SystemdLive) -> None:
    live, dep = systemd_live, systemd_live.dep
    before = dep.main_pids()
    live.doc["decode"]["max_num_seqs"] = int(live.doc["decode"].get("max_num_seqs") or 64) - 8
    live.write()
    diff = dep.cli("diff")
    assert diff.returncode == 3 and "surge, new generation" in diff.stdout, diff.stdout
    _, out = under_load(live, generation_races=True)
    assert "surge: starting prefill-0-surge beside prefill-0 (prefill first" in out, out
    assert "surge: starting decode-0-surge, decode-1-surge beside decode-0, decode-1" in out, out

    after = dep.units()
    for svc in ("prefill-0", "decode-0", "decode-1"):
        props = after[svc]
        assert (props["ActiveState"], props["SubState"], props["UnitFileState"]) == ("active", "running", "enabled")
        assert int(props["MainPID"]) != before[svc], f"{svc} was not replaced"
        assert re.search(rf"^{svc}: drained in [\d.]+s, nothing cut$", out, re.M), out
        assert_stopped_after_a_drain(live, "h2" if svc.startswith("prefill") else "h3", svc, replaced=True)
    for twin, host in (("prefill-0-surge", "h2"), ("decode-0-surge", "h3"), ("decode-1-surge", "h3")):
        m = dep.machines[host]
        props = dict(line.split("=", 1) for line in m.run(
            "systemctl", "show", dep.unit(twin), "-p", "LoadState", "-p", "ActiveState").stdout.splitlines())
        assert props == {"LoadState": "not-found", "ActiveState": "inactive"}, (twin, props)
        journal = live.journal(host, twin)
        assert f"Started {dep.unit(twin)}" in journal, journal  # it ran as a unit of its own
        assert "Scheduled restart job" not in journal, f"{twin} came back by itself after its drain:\n{journal}"
        assert_stopped_after_a_drain(live, host, twin, replaced=False, served=False)  # the router may not pick it
    code, doc = dep.status_json()
    assert code == 0 and doc["healthy"] is True, doc


def test_scaling_decode_down_drains_the_removed_unit_and_loses_no_request(systemd_live: SystemdLive) -> None:
    live, dep = systemd_live, systemd_live.dep
    live.doc["decode"]["workers"] = 3
    live.write()
    up = dep.cli("up", "--no-smoke", "--skip-preflight", timeout=400)
    assert up.returncode == 0, up.stdout + up.stderr
    live.relayout()
    assert "decode-2" in dep.layout["h3"], dep.layout
    pids = dep.main_pids()
    live.doc["decode"]["workers"] = 2
    live.write()
    under_load(live)
    assert_stopped_after_a_drain(live, "h3", "decode-2", replaced=False)
    h3 = dep.machines["h3"]
    props = dict(line.split("=", 1) for line in h3.run(
        "systemctl", "show", dep.unit("decode-2"), "-p", "LoadState", "-p", "ActiveState").stdout.splitlines())
    assert props == {"LoadState": "not-found", "ActiveState": "inactive"}, props
    assert not h3.path(f"/etc/systemd/system/{dep.unit('decode-2')}").exists()
    live.relayout()
    assert dep.main_pids() == {s: p for s, p in pids.items() if s != "decode-2"}, "a worker that stays was restarted"


def up_killed_at(live: SystemdLive, line: str) -> str:
    """`up` of the recipe, killed with SIGKILL as soon as it prints a line starting with `line`; what it printed."""
    killed, out = liveload_up_killed_at(PRIMECTL, live.dep.path, line, cwd=REPO, timeout_s=300,
                                        args=("--skip-preflight",))
    assert killed, f"`up` did not print {line!r} (it ended, or 300 s passed):\n{out}"
    return out


def twin_units(dep: SystemdDeployment) -> dict[str, list[str]]:
    """host -> the deployment's surge twin units its systemd has loaded (running or not)."""
    return {h.name: twins for h in dep.machines.values() if (twins := [u for u in dep.our_units(h)["loaded"]
                                                                       if "-surge" in u])}


def test_an_up_killed_mid_surge_is_finished_by_the_next_up_without_a_lost_request(systemd_live: SystemdLive) -> None:
    """The controller dies (SIGKILL) twice in one decode change under load: once as the decode twins start (the
    prefill twin up beside prefill-0), once while the old workers drain. Each next `up` takes over the dead run's
    lock, keeps the twin units it started from the same revision, and finishes the change; clients lose nothing
    beyond the generation races, a further `up` has nothing to do, and no twin unit is left on any host (the
    module's teardown then checks that `down --purge` leaves no unit at all)."""
    live, dep = systemd_live, systemd_live.dep
    live.relayout()
    live.doc["decode"]["max_num_seqs"] = int(live.doc["decode"].get("max_num_seqs") or 64) + 4
    live.write()
    live.mark()
    load = LiveLoad(live.endpoint, "demo", clients=CLIENTS, deadline_s=600)
    with load:
        time.sleep(LOAD_S)
        t0 = time.monotonic()
        first = up_killed_at(live, "surge: starting decode-0-surge")
        left = twin_units(dep)
        second = up_killed_at(live, "surge: draining and replacing decode")
        r = dep.cli("up", "--no-smoke", "--skip-preflight", timeout=400)
        print(f"\ntwo killed ups and one more: {time.monotonic() - t0:.1f}s, exit {r.returncode}")
        time.sleep(LOAD_S)
    out = first + second + r.stdout + r.stderr
    assert r.returncode == 0, out
    assert dep.unit("prefill-0-surge") in left.get("h2", []), f"no twin unit was up when `up` was killed: {left}"
    assert "took over the lock of `up`" in second and "no longer runs" in second, second
    assert "surge twin(s) an interrupted `up` started from this revision" in second, second
    assert "took over the lock of `up`" in r.stderr, r.stderr
    assert_lost_only_to_races(live, load.report, out, generation_races=True)

    again = dep.cli("up", "--no-smoke", "--skip-preflight")
    assert again.returncode == 0 and "no changes" in again.stderr, again.stdout + again.stderr
    code, doc = dep.status_json()
    assert code == 0 and doc["healthy"] is True, doc
    assert not twin_units(dep), f"twin units left after the change: {twin_units(dep)}"
    for svc, props in dep.units().items():
        assert (props["ActiveState"], props["SubState"]) == ("active", "running"), (svc, props)


def active_units(dep: SystemdDeployment) -> dict[str, list[str]]:
    """host -> the deployment's units its systemd runs (active or activating)."""
    pattern = f"{unit_name(dep.name, '')}*"
    out = {h: dep.machines[h].run("systemctl", "list-units", "--state=active,activating", "--plain", "--no-legend",
                                  pattern).stdout.split("\n") for h in dep.machines}
    return {h: units for h, lines in out.items() if (units := [line.split()[0] for line in lines if line.strip()])}


def test_down_after_an_up_killed_mid_surge_stops_its_twin_units(systemd_live: SystemdLive) -> None:
    """`down` right after an `up` killed with its twins up (the run recorded nothing of them) takes over the dead
    run's lock and stops every unit of the deployment, the twins included; the module's teardown then checks that
    `down --purge` leaves no unit file or enablement either. Last in the module: it leaves the deployment down."""
    live, dep = systemd_live, systemd_live.dep
    live.relayout()
    live.doc["decode"]["max_num_seqs"] = int(live.doc["decode"].get("max_num_seqs") or 64) - 4
    live.write()
    up_killed_at(live, "surge: starting decode-0-surge")
    left = twin_units(dep)
    assert dep.unit("prefill-0-surge") in left.get("h2", []), f"no twin unit was up when `up` was killed: {left}"
    down = dep.cli("down", timeout=300)
    assert down.returncode == 0 and "took over the lock of `up`" in down.stderr, down.stdout + down.stderr
    assert not active_units(dep), f"units still running after `down`: {active_units(dep)}"

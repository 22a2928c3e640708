"""Changing a live deployment under load, for real: `recipes/demo-live.yaml` (the real Dynamo frontend, two
replicas behind a real HAProxy, mocker workers, a real Mooncake master) while streaming clients send chat
requests through the openai client with retries off. Every request must end with a finish_reason.

What each test changes is what an operator changes: a decode argument (a new generation starts beside the
old one), a prefill argument, a frontend setting (rolled through the replicas, drained at the balancer),
`primectl restart` and `primectl drain` of one worker, and scaling decode back down (drained). And what an
operator does not: `kill -9` of a decode worker, which Dynamo's migration and the balancer's retries absorb.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.bench.liveload import LiveLoad, LoadReport, counter_delta, deployment_counters
from primectl.bench.liveload import up_killed_at as liveload_up_killed_at
from primectl.host.haproxy import balancer_servers, balancer_stat
from primectl.host.processes import starttime
from primectl.plan.layout import Layout

from .conftest import PRIMECTL, REPO
from .generation_races import ANSWERS
from .test_demo_smoke import _cmd, demo_up

pytestmark = pytest.mark.integration

FRONTEND_PORT = 32000
PORTS = {
    "response_stream": 32004, "etcd_client": 32002, "etcd_peer": 32003, "worker_system": 32010, "tcp_rpc": 32020,
    "bootstrap": 32030, "kv_events": 32040, "mooncake_rpc": 32050, "mooncake_metadata": 32051,
    "mooncake_metrics": 32052, "nixl_side_channel": 32060, "dp_rpc": 32070, "frontend_replica": 32090,
}
CLIENTS = 4
LOAD_S = 3.0  # load before and after each change
# The flags of most `up`s here. Preflight (host facts, a NIXL read and a Mooncake round trip between fresh
# runtime processes: ~5 s of CPU) proves nothing about a change under load, and the module's first change, the
# down-then-up and the up that takes over a killed run's lock keep it: preflight against a live deployment.
QUICK_UP = ("--no-smoke", "--skip-preflight")


@dataclass
class Live:
    recipe: Path
    workdir: Path
    doc: dict[str, Any]

    def write(self) -> None:
        self.recipe.write_text(yaml.safe_dump(self.doc, sort_keys=False))

    def ready(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{FRONTEND_PORT}/v1/models/{self.doc['model']['served_name']}/ready"
        with urllib.request.urlopen(url, timeout=5) as resp:
            result: dict[str, Any] = json.loads(resp.read())
        return result

    def pid(self, service: str) -> int | None:
        try:
            pid_s, start = Path(Layout(str(self.workdir)).pidfile(service)).read_text().split()
        except (OSError, ValueError):
            return None
        return int(pid_s) if starttime(int(pid_s)) == start else None


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """demo-live, up (no smoke), in its own workdir and ports; `down` and no leftovers afterwards."""
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    doc["frontend"]["replicas"] = 2
    doc["prefill"]["groups"] = 2
    doc.pop("ratio", None)  # the test scales decode: no ratio to keep
    # The load's clients are closed loops: at the demo's 10x each one streams ~700 tokens a second and the stack's
    # CPU goes into serving them, not into the change, and is taken from every test running beside this one. At
    # 0.5x a request stays in flight ~10x longer (more of them are mid-stream when a worker drains, restarts or
    # dies) for a fraction of the CPU (docs/testing.md).
    doc["mocker"]["speedup_ratio"] = 0.5
    with demo_up(tmp_path_factory.mktemp("live-change"), doc, "live-change", FRONTEND_PORT, PORTS,
                 "PRIMECTL_RUNTIME_PYTHON", up_timeout=600) as (recipe, workdir):
        yield Live(recipe, workdir, yaml.safe_load(recipe.read_text()))


def under_load(live: Live, *args: str) -> tuple[LoadReport, str]:
    """Run `primectl <args>` while CLIENTS stream chat requests; what they saw, and what primectl printed."""
    load = LiveLoad(f"http://127.0.0.1:{FRONTEND_PORT}", "demo", clients=CLIENTS, deadline_s=400)
    with load:
        import time

        time.sleep(LOAD_S)
        r = _cmd(*args, timeout=300)
        time.sleep(LOAD_S)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        logs = sorted((live.workdir / "logs").glob("*.log"))
        seen = [f"{p.name}: {line}" for p in logs for line in p.read_text(errors="replace").splitlines()
                if "Rejected" in line or "ERROR" in line][-8:]
        pytest.fail(f"primectl {' '.join(args)} failed:\n{out}\n--- errors in the logs ---\n" + "\n".join(seen))
    return load.report, out


def assert_nothing_lost(report: LoadReport, out: str) -> None:
    assert report.served > 0, "the clients got nothing served at all"
    assert not report.lost, f"{len(report.lost)} of {len(report.outcomes)} requests lost: {report.seen()}\n{out}"


def assert_lost_only_to_generation_races(report: LoadReport, out: str) -> None:
    """Nothing lost but at most 2 requests answered 503/500 before any byte: Dynamo 1.6.1's generation races."""
    assert report.served > 0, "the clients got nothing served at all"
    other = [o for o in report.lost if o.detail not in ANSWERS or o.tokens]
    assert not other, f"{len(other)} of {len(report.outcomes)} requests lost: {report.seen()}\n{out}"
    assert len(report.lost) <= 2, f"{len(report.lost)} requests lost to the generation races: {report.seen()}"


def test_a_decode_argument_change_starts_a_new_generation_and_loses_no_request(live: Live) -> None:
    before = live.ready()["namespaces"]
    live.doc["decode"]["max_num_seqs"] = 48
    live.write()
    diff = _cmd("diff", str(live.recipe))
    assert diff.returncode == 3 and "surge, new generation" in diff.stdout and "expected loss 0" in diff.stdout, diff.stdout
    report, out = under_load(live, "up", str(live.recipe), "--no-smoke")
    assert_lost_only_to_generation_races(report, out)
    assert "surge: starting prefill-0-surge, prefill-1-surge beside prefill-0, prefill-1 (prefill first" in out, out
    assert "surge: starting decode-0-surge, decode-1-surge beside decode-0, decode-1" in out, out
    now = live.ready()["namespaces"]
    (generation,) = now  # only the new generation is left registered
    assert generation not in before and now[generation]["worker_types"]["decode"]["workers"] == 2
    assert now[generation]["worker_types"]["prefill"]["workers"] == 2
    assert all(live.pid(f"{w}-surge") is None for w in ("prefill-0", "prefill-1", "decode-0", "decode-1"))


def test_a_frontend_change_rolls_through_the_replicas_behind_the_balancer(live: Live) -> None:
    balancer = live.pid("balancer")
    live.doc["frontend"]["session_affinity"]["ttl_secs"] = 900
    live.write()
    report, out = under_load(live, "up", str(live.recipe), *QUICK_UP)
    assert_nothing_lost(report, out)
    assert "rolling frontend 1/2: frontend" in out and "rolling frontend 2/2: frontend-1" in out, out
    assert live.pid("balancer") == balancer, "the balancer restarted: clients' endpoint went away"


def change_under_load(live: Live, diff_says: str) -> str:
    """The recipe as edited: `diff` says `diff_says` (exit 3), then `up` under load loses nothing and keeps the
    balancer's process (clients' endpoint); what `up` printed."""
    balancer = live.pid("balancer")
    live.write()
    diff = _cmd("diff", str(live.recipe))
    assert diff.returncode == 3 and diff_says in diff.stdout, diff.stdout
    report, out = under_load(live, "up", str(live.recipe), *QUICK_UP)
    assert_nothing_lost(report, out)
    assert live.pid("balancer") == balancer, "the balancer restarted: clients' endpoint went away"
    return out


def test_a_third_frontend_replica_joins_and_leaves_the_balancer_by_reloads_under_load(live: Live) -> None:
    live.doc["frontend"]["replicas"] = 3
    out = change_under_load(live, "balancer: reloads in place")
    assert "reloaded balancer on local in place" in out, out
    sock = str(live.workdir / "run" / "balancer.haproxy.sock")
    assert balancer_servers(sock, "frontends") == ["frontend", "frontend-1", "frontend-2"]
    live.doc["frontend"]["replicas"] = 2
    change_under_load(live, "balancer: reloads in place")
    assert live.pid("frontend-2") is None
    assert balancer_servers(sock, "frontends") == ["frontend", "frontend-1"]


def replicas_up(live: Live, within_s: float = 15) -> dict[str, dict[str, str]]:
    """The balancer's replica rows once its health checks call every replica UP (a check that timed out on a busy
    machine marks a replica down for a moment: `fall 2` at 250-500 ms)."""
    import time

    deadline = time.monotonic() + within_s
    while True:
        rows = {r["svname"]: r for r in balancer_stat(str(live.workdir / "run" / "balancer.haproxy.sock"))
                if r.get("pxname") == "frontends" and r["svname"] in ("frontend", "frontend-1", "frontend-2")}
        if all(r["status"].startswith("UP") for r in rows.values()) or time.monotonic() > deadline:
            assert all(r["status"].startswith("UP") for r in rows.values()), {n: r["status"] for n, r in rows.items()}
            return rows
        time.sleep(0.25)


def test_frontend_replicas_moved_to_new_ports_are_re_pointed_at_the_balancer_under_load(live: Live) -> None:
    live.doc["ports"]["frontend_replica"] = 32094
    change_under_load(live, "back in the balancer at its new address; expected loss 0")
    rows = replicas_up(live)
    assert rows["frontend"]["addr"] == "127.0.0.1:32094" and rows["frontend-1"]["addr"] == "127.0.0.1:32095", rows
    assert _cmd("diff", str(live.recipe)).returncode == 0, "the balancer's reloaded configuration differs from the plan"


def test_restart_of_one_decoder_loses_no_request(live: Live) -> None:
    old = live.pid("decode-1")
    report, out = under_load(live, "restart", str(live.recipe), "decode-1")
    assert_nothing_lost(report, out)
    assert "decode-1: restarted, ready and back in the router's count" in out, out
    assert live.pid("decode-1") not in (None, old)


def test_drain_stops_one_decoder_without_a_lost_request_and_up_brings_it_back(live: Live) -> None:
    report, out = under_load(live, "drain", str(live.recipe), "decode-0")
    assert_nothing_lost(report, out)
    assert "decode-0: drained in" in out and "nothing cut" in out and "stopped" in out, out
    assert live.pid("decode-0") is None
    up = _cmd("up", str(live.recipe), *QUICK_UP, timeout=300)
    assert up.returncode == 0 and live.pid("decode-0") is not None, up.stdout + up.stderr


def test_scaling_decode_down_drains_the_removed_worker(live: Live) -> None:
    live.doc["decode"]["workers"] = 3
    live.write()
    assert _cmd("up", str(live.recipe), *QUICK_UP, timeout=300).returncode == 0
    live.doc["decode"]["workers"] = 2
    live.write()
    report, out = under_load(live, "up", str(live.recipe), *QUICK_UP)
    assert_nothing_lost(report, out)
    assert live.pid("decode-2") is None


# After a kill -9 the load runs past the file store's TTL (10 s): until discovery drops the dead worker the
# router may still pick it, and those requests must not be lost either.
AFTER_KILL_S = 12.0
KILL_CLIENTS = 6  # as in the benchmark: more requests in flight, more of them in the prefill-to-decode hand-off


def test_kill_9_of_a_decode_worker_loses_no_request(live: Live) -> None:
    """kill -9 of each decoder in turn under load. Dynamo migrates the requests that were on it (the mocker's
    prefill finishes before decode starts, so a retried request books its prefill afresh); one Dynamo fails
    before its stream began is sent again by the balancer; the frontends keep the dead worker out of routing
    until discovery drops it. No client sees an error, and `up` brings the worker back."""
    import signal
    import time

    moved: dict[str, int] = {}
    for worker in ("decode-0", "decode-1"):
        pid = live.pid(worker)
        assert pid is not None, f"{worker} is not running"
        before = deployment_counters(live.workdir)
        load = LiveLoad(f"http://127.0.0.1:{FRONTEND_PORT}", "demo", clients=KILL_CLIENTS, deadline_s=400)
        with load:
            time.sleep(LOAD_S)
            os.kill(pid, signal.SIGKILL)
            time.sleep(AFTER_KILL_S)
        after = deployment_counters(live.workdir)
        report = load.report
        lost = [f"{o.detail} (after {o.tokens} tokens)" for o in report.lost]
        assert report.served > 0, "the clients got nothing served at all"
        assert not lost, (f"kill -9 of {worker}: {len(lost)} of {len(report.outcomes)} requests lost: {lost}; "
                          f"migrations {counter_delta(before, after, 'migration')}, outcomes "
                          f"{counter_delta(before, after, 'migration_outcome')}")
        for kind, n in counter_delta(before, after, "migration").items():
            moved[kind] = moved.get(kind, 0) + n
        up = _cmd("up", str(live.recipe), *QUICK_UP, timeout=300)
        assert up.returncode == 0 and live.pid(worker) not in (None, pid), up.stdout + up.stderr
    # The kills hit requests in flight (else nothing above was tested): Dynamo moved them to the other decoder.
    assert sum(moved.values()) > 0, f"no request was migrated: {moved}"


def test_a_renamed_model_is_served_through_the_balancer_by_the_new_name(live: Live) -> None:
    """The balancer's health check names the model: it must follow a rename while both generations serve, or it
    calls every replica down once the old name's workers drain, and no replica could come back into rotation."""
    import time

    balancer = live.pid("balancer")
    live.doc["model"]["served_name"] = "demo-renamed"
    live.write()
    up = _cmd("up", str(live.recipe), *QUICK_UP, timeout=300)
    out = up.stdout + up.stderr
    assert up.returncode == 0, out
    said = [line for line in out.splitlines() if line.startswith(("surge: draining and replacing decode", "reloaded balancer"))]
    assert said and said[0].startswith("reloaded balancer"), out  # the check moved before the old name's decoders drained
    assert live.pid("balancer") == balancer, "the balancer restarted: clients' endpoint went away"
    assert set(replicas_up(live)) == {"frontend", "frontend-1"}
    load = LiveLoad(f"http://127.0.0.1:{FRONTEND_PORT}", "demo-renamed", clients=2, deadline_s=60)
    with load:
        time.sleep(2)
    assert_nothing_lost(load.report, out)


def test_agent_sized_prompts_lose_nothing_through_a_decode_change(live: Live) -> None:
    """24 KB prompts (more than HAProxy's default 16 KiB buffer, which it never resends) through a new
    generation of decode workers: a request Dynamo fails before its first byte is resent whole by the balancer,
    whose buffer holds a prompt at the model's context limit."""
    import time

    seqs = int(live.doc["decode"].get("max_num_seqs") or 64)
    live.doc["decode"]["max_num_seqs"] = seqs - 4
    live.write()
    load = LiveLoad(f"http://127.0.0.1:{FRONTEND_PORT}", live.doc["model"]["served_name"], clients=CLIENTS,
                    deadline_s=400, prompt_bytes=24 << 10)
    with load:
        time.sleep(LOAD_S)
        r = _cmd("up", str(live.recipe), *QUICK_UP, timeout=300)
        time.sleep(LOAD_S)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_lost_only_to_generation_races(load.report, r.stdout + r.stderr)
    assert not any(panicked(p) for p in (live.workdir / "logs").glob("*.log")), "an engine panicked"


def panicked(log: Path) -> bool:
    return "panicked at" in log.read_text(errors="replace")


def test_down_then_up_of_a_balanced_deployment_starts_it_again(live: Live) -> None:
    """`down` (a rack taken down for maintenance), then `up`: every service starts again, the frontend replicas
    before the balancer whose admin socket the stopped one left behind, and nothing is surged past a stopped
    worker."""
    down = _cmd("down", str(live.recipe), timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    diff = _cmd("diff", str(live.recipe))
    assert diff.returncode == 3 and "surge" not in diff.stdout, diff.stdout
    up = _cmd("up", str(live.recipe), "--no-smoke", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert live.ready()["ready"] is True
    assert set(replicas_up(live)) == {"frontend", "frontend-1"}
    again = _cmd("diff", str(live.recipe))
    assert again.returncode == 0 and "no changes" in again.stdout, again.stdout


def up_killed_at(live: Live, line: str) -> str:
    """`primectl up` of the recipe, killed with SIGKILL as soon as it prints a line starting with `line`; what it
    had printed."""
    killed, out = liveload_up_killed_at(PRIMECTL, live.recipe, line, cwd=REPO, timeout_s=300)
    assert killed, f"`up` did not print {line!r} (it ended, or 300 s passed):\n{out}"
    return out


def test_an_up_killed_mid_surge_is_finished_by_the_next_up_without_a_lost_request(live: Live) -> None:
    """The controller dies (SIGKILL) twice in one decode change under load: once with the surge twins up, once
    while the old workers drain. Each next `up` takes over the dead run's lock, waits for the dead run's last
    host call, keeps the twins and the replaced workers it started from the same revision, and finishes the
    change; clients lose nothing, a further `up` has nothing to do, and no twin is left running."""
    import time

    seqs = int(live.doc["decode"].get("max_num_seqs") or 64)
    live.doc["decode"]["max_num_seqs"] = seqs + 8
    live.write()
    load = LiveLoad(f"http://127.0.0.1:{FRONTEND_PORT}", live.doc["model"]["served_name"], clients=CLIENTS,
                    deadline_s=400)
    with load:
        time.sleep(LOAD_S)
        first = up_killed_at(live, "surge: starting decode-0-surge")
        second = up_killed_at(live, "surge: draining and replacing decode")
        assert "took over the lock of `up`" in second and "no longer runs" in second, second
        assert "surge twin(s) an interrupted `up` started from this revision" in second, second
        r = _cmd("up", str(live.recipe), "--no-smoke", timeout=300)
        time.sleep(LOAD_S)
    out = first + second + r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "took over the lock of `up`" in r.stderr, r.stderr
    assert_lost_only_to_generation_races(load.report, out)
    again = _cmd("up", str(live.recipe), *QUICK_UP)
    assert again.returncode == 0 and "no changes" in again.stderr, again.stdout + again.stderr
    (generation,) = live.ready()["namespaces"].values()
    assert generation["worker_types"]["decode"]["workers"] == 2, generation
    assert all(live.pid(f"{w}-surge") is None for w in ("prefill-0", "prefill-1", "decode-0", "decode-1"))


def test_benchmark_script_counts_what_clients_lose() -> None:
    """benchmarks/live_change.py is what docs/live-changes.md's table comes from: it runs and reports a count."""
    import subprocess

    env = os.environ | {"PRIMECTL_PROGRESS": "off"}
    r = subprocess.run([str(Path(PRIMECTL).parent / "python"), "benchmarks/live_change.py", "--recipe",
                        "recipes/demo-live.yaml", "--scenarios", "none", "--before", "1", "--after", "1",
                        "--port", "32500"], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "none " in r.stdout and "lost   0" in r.stdout and "total lost: 0" in r.stdout, r.stdout

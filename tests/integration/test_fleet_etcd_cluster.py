"""The fleet's gateway etcd as a three-member cluster outlives one member's loss (issue 39).

A copy of the demo fleet (primectl.bench.fleet_copy) whose `gateway.etcd_hosts` names three `connection: local`
hosts on 127.0.0.2, .3 and .4 (each with a workdir of its own) goes `up`: three real etcd 3.4 members form one
cluster, the replicas and the edge on 127.0.0.1. With a key from `primectl keys create`, chat through the edge is
answered. Then the member every client tries first, made the cluster's leader, is SIGKILLed (by pid):

- requests through the edge keep being answered, none lost;
- the replica's own etcd watch, on that member, misses no change written while it moves to the next one;
- `keys create` still works and the new key is accepted by both replicas; `keys revoke` still reaches both;
- `primectl status` still answers, healthy;
- a site SIGKILLed opens its breaker on both replicas (the breaker still propagates through the cluster);
- `down` leaves no process under any workdir.

Run inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python .venv/bin/pytest tests/integration/test_fleet_etcd_cluster.py -q'
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from primectl.bench.fleet_copy import FleetCopy, write_fleet

from .fleetkit import cli, etcd_call, fleet_up, kill_all, until
from .sshhosts import processes_under

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python "
       ".venv/bin/pytest tests/integration/test_fleet_etcd_cluster.py -q'")
EDGE = 19_700
SITE_B = "etcdfleet-site-b"




def chat(base: str, key: str, text: str = "hi") -> int:
    """POST one short chat; the HTTP status."""
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status if json.loads(resp.read()).get("choices") else 0
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # refused, reset, timed out: lost
        return -1


def health(replica: str) -> dict:
    try:
        with urllib.request.urlopen(f"{replica}/health", timeout=5) as resp:
            return json.loads(resp.read())
    except OSError:
        return {}




# Runs on the host runtime (it has aiohttp): the replica's own Etcd class, from the package the gateway's release
# holds, watches a prefix on every member, the first one first. The member it watches is SIGKILLed and, before the
# event loop runs again (so before the watch can move to the next member), a key is written through another member.
# A replica whose watch misses such a change keeps a revoked key working until it restarts.
WATCH_GAP = """
import asyncio, base64, json, os, signal, sys, time, urllib.request
import aiohttp

sys.path.insert(0, sys.argv[1])
from fleet_gateway.etcd import Etcd
members, pid = json.loads(sys.argv[2]), int(sys.argv[3])


def put(key):  # blocking on purpose; retried (a write waits out the election of a new leader)
    body = json.dumps({"key": base64.b64encode(key.encode()).decode(), "value": "MQ=="}).encode()
    deadline = time.monotonic() + 15
    while True:
        try:
            req = urllib.request.Request(members[1] + "/v3/kv/put", data=body, method="POST")
            return urllib.request.urlopen(req, timeout=1).read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


async def main():
    seen = asyncio.Queue()
    async with aiohttp.ClientSession() as session:
        etcd = Etcd(session, list(members))
        watch = asyncio.create_task(etcd.watch("/watch-gap/", lambda k, v: seen.put_nowait(k)))
        while True:  # the watch is up once it reports a change
            put("/watch-gap/before")
            try:
                await asyncio.wait_for(seen.get(), 0.5)
                break
            except asyncio.TimeoutError:
                pass
        os.kill(pid, signal.SIGKILL)
        put("/watch-gap/during")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if await asyncio.wait_for(seen.get(), 0.5) == "/watch-gap/during":
                    print("seen")
                    break
            except asyncio.TimeoutError:
                pass
        else:
            print("missed")
        watch.cancel()


asyncio.run(main())
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetCopy]:
    copy = write_fleet(tmp_path_factory.mktemp("fleet"), port=EDGE, name="etcdfleet", etcd_members=3)
    # the sites' own preflight and smoke tests are test_fleet_demo's; here only the gateway's etcd is under test
    with fleet_up(copy, RUN, "--no-smoke", "--skip-preflight"):
        yield copy


def test_one_members_loss_loses_no_request_and_keys_and_the_breaker_still_work(fleet: FleetCopy) -> None:
    members = fleet.etcd_members
    listed = etcd_call(members[2], "cluster/member/list")["members"]
    assert sorted(m["clientURLs"][0] for m in listed) == members  # one cluster of the three
    config = json.loads((fleet.workdirs["gateway"] / "current" / "config" / "gateway-0.json").read_text())
    assert config["etcd"] == members  # every replica knows every member, the first one first

    made = cli("keys", "create", fleet.recipe, "--team", "research")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert chat(fleet.edge, key) == 200

    # the member every client tries first becomes the leader, then dies: an election and a failover at once
    first = next(m for m in listed if m["clientURLs"][0] == members[0])
    leader = etcd_call(members[1], "maintenance/status")["leader"]
    if leader != first["ID"]:
        owner = next(m["clientURLs"][0] for m in listed if m["ID"] == leader)
        etcd_call(owner, "maintenance/transfer-leadership", {"targetID": first["ID"]})
    assert until(lambda: etcd_call(members[1], "maintenance/status")["leader"] == first["ID"], 10)
    pids = [pid for pid, cmd in processes_under(fleet.workdirs["etcd-0"]) if cmd.startswith("/usr/bin/etcd ")]
    assert len(pids) == 1, processes_under(fleet.workdirs["etcd-0"])

    outcomes: list[int] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set() and len(outcomes) < 2000:
            outcomes.append(chat(fleet.edge, key, "go on"))

    loader = threading.Thread(target=load)
    loader.start()
    try:
        time.sleep(0.5)
        gap = subprocess.run([os.environ.get("PRIMECTL_RUNTIME_PYTHON", ".runtime/bin/python"), "-I", "-c", WATCH_GAP,
                              str(fleet.workdirs["gateway"] / "current" / "gateway-replica"), json.dumps(members),
                              str(pids[0])],
                             capture_output=True, text=True, timeout=60, cwd=REPO)
        killed_at = len(outcomes)
        assert gap.stdout.strip() == "seen", (
            f"a change written while the watched member died was lost: {gap.stdout}{gap.stderr[-2000:]}")
        assert not processes_under(fleet.workdirs["etcd-0"])

        made = cli("keys", "create", fleet.recipe, "--team", "later")
        assert made.returncode == 0, made.stdout + made.stderr
        new_key = made.stdout.strip()
        assert until(lambda: all(chat(r, new_key) == 200 for r in fleet.replicas), 5), (
            "a key created after the member's loss is not accepted by every replica")

        status = cli("status", fleet.recipe, "-o", "json")
        assert status.returncode == 0, status.stdout + status.stderr
        assert all(r["ready"] for r in json.loads(status.stdout)["replicas"])
    finally:
        stop.set()
        loader.join(timeout=60)
    assert len(outcomes) > killed_at + 5 and set(outcomes) == {200}, outcomes

    keys = json.loads(cli("keys", "list", fleet.recipe, "-o", "json").stdout)
    later = next(k["id"] for k in keys if k["team"] == "later")
    assert cli("keys", "revoke", fleet.recipe, later).returncode == 0
    assert until(lambda: all(chat(r, new_key) == 401 for r in fleet.replicas), 5), "the revocation did not reach"

    def breakers() -> list[str | None]:
        return [health(r).get("deployments", {}).get(SITE_B, {}).get("breaker") for r in fleet.replicas]

    kill_all(fleet.workdirs["b"])  # site b is lost: a replica's failures there open its breaker, shared in etcd
    for i in range(40):  # each request fails over to site a; some try site b first
        assert chat(fleet.edge, key, f"turn {i}") == 200
        if breakers() == ["open", "open"]:
            break
    assert breakers() == ["open", "open"]

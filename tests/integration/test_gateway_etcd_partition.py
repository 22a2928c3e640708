"""A gateway etcd member cut off from the network, as the gateway replica's etcd client sees it (issue 39).

Three real etcd 3.4 members with the gateway's own flags (primectl.components.etcd.etcd_cluster, with the watch
progress interval the fleet plan gives them), each in a network namespace of its own across a veth link
(tests/integration/netns_sites.py), routed to each other through the test's namespace. The member every client
tries first is made the leader, then its link is cut: it drops packets and refuses nothing, so a client learns of
it only through its own timeouts. The replica's etcd client (primectl/fleet/gateway/etcd.py, run on the host
runtime, which has aiohttp) must then:

- keep a 3 s lease alive (a replica's admission blocks hang on it) through the member it can still reach;
- not wait out the cut member's timeout on every call, only on the first;
- move its watch to another member within three progress intervals and miss no change written meanwhile.

Run inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python .venv/bin/pytest tests/integration/test_gateway_etcd_partition.py -q'
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from primectl.components.etcd import EtcdMember, etcd_cluster
from primectl.fleet.plan import WATCH_PROGRESS_S

from .fleetkit import etcd_call, until
from .netns_sites import Site, sites_up
from .sshhosts import kill_pids, netns_problem, wait_gone

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python "
       ".venv/bin/pytest tests/integration/test_gateway_etcd_partition.py -q'")
CLIENT, PEER = 2379, 2380

# The replica's Etcd class, loaded from its source file: a watch and a kept-alive lease run while the first
# member is cut off (sys.argv[3] is a file the test creates to say so), then a change is written through another
# member. It prints what it saw as JSON.
CLIENT_SCRIPT = """
import asyncio, importlib.util, json, os, sys, time
import aiohttp

spec = importlib.util.spec_from_file_location("gateway_etcd", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
members, progress, cut = json.loads(sys.argv[2]), float(sys.argv[4]), sys.argv[3]


async def main():
    out = {"keepalives": [], "calls": []}
    seen = asyncio.Queue()
    async with aiohttp.ClientSession() as session:
        etcd = mod.Etcd(session, list(members), progress)
        watch = asyncio.create_task(etcd.watch("/gap/", lambda k, v: seen.put_nowait(k)))
        while True:  # the watch is up once it reports a change
            await etcd.put("/gap/before", "1")
            try:
                await asyncio.wait_for(seen.get(), 0.5)
                break
            except asyncio.TimeoutError:
                pass
        lease = await etcd.grant(3)
        print("ready", flush=True)
        while not os.path.exists(cut):
            await asyncio.sleep(0.05)
        t_cut = time.monotonic()
        deadline = t_cut + 4 * progress + 6
        wrote = None
        while time.monotonic() < deadline:  # keep the lease alive once a second, as a replica does
            t0 = time.monotonic()
            try:
                out["keepalives"].append([round(t0 - t_cut, 2), await etcd.keepalive(lease)])
            except RuntimeError as exc:
                out["keepalives"].append([round(t0 - t_cut, 2), str(exc)])
            out["calls"].append(round(time.monotonic() - t0, 2))
            if wrote is None and time.monotonic() - t_cut > 1:
                await etcd.put("/gap/during", "1")
                wrote = time.monotonic()
            await asyncio.sleep(max(0.0, 1 - (time.monotonic() - t0)))
            while not seen.empty():
                if seen.get_nowait() == "/gap/during":
                    out["watch_moved_s"] = round(time.monotonic() - t_cut, 2)
            if "watch_moved_s" in out:
                break
        watch.cancel()
    print(json.dumps(out), flush=True)


asyncio.run(main())
"""


def answers(member: str) -> bool:
    """Whether the member answers yet (a starting one refuses connections)."""
    try:
        return bool(etcd_call(member, "maintenance/status"))
    except OSError:
        return False


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Site]]:
    problem = netns_problem(RUN)
    if problem:
        pytest.fail(problem, pytrace=False)
    root = tmp_path_factory.mktemp("etcd-partition")
    with sites_up(root / "netns", [f"etcd{i}" for i in range(3)], sshd=False, first=21,
                  routed=True) as sites:
        on = list(sites.values())
        cluster = [EtcdMember(name=f"gateway-etcd-{i}", member=f"m{i}", host=s.name, address=s.address,
                              workdir=str(root / f"m{i}")) for i, s in enumerate(on)]
        services = etcd_cluster(cluster, token="partition-test", client_port=CLIENT, peer_port=PEER,
                                progress_s=WATCH_PROGRESS_S)
        procs = [s.run(svc.argv, root / f"m{i}.log") for i, (s, svc) in enumerate(zip(on, services, strict=True))]
        try:
            for s in on:
                assert until(lambda s=s: answers(f"http://{s.address}:{CLIENT}"), 30), (
                    (root / "m0.log").read_text()[-2000:])
            yield on
        finally:
            kill_pids([p.pid for p in procs])
            wait_gone([p.pid for p in procs], 10)
            for p in procs:
                p.wait(5)


def test_a_member_cut_off_costs_one_timeout_and_the_watch_moves_without_missing_a_change(members: list[Site],
                                                                                        tmp_path: Path) -> None:
    urls = [f"http://{s.address}:{CLIENT}" for s in members]
    listed = etcd_call(urls[1], "cluster/member/list")["members"]
    first = next(m for m in listed if m["clientURLs"][0] == urls[0])
    leader = etcd_call(urls[1], "maintenance/status")["leader"]
    if leader != first["ID"]:  # the member every client tries first leads: the cut forces an election too
        owner = next(m["clientURLs"][0] for m in listed if m["ID"] == leader)
        etcd_call(owner, "maintenance/transfer-leadership", {"targetID": first["ID"]})
    assert until(lambda: etcd_call(urls[1], "maintenance/status")["leader"] == first["ID"], 10)

    cut = tmp_path / "cut"
    script = REPO / "primectl" / "fleet" / "gateway" / "etcd.py"
    client = subprocess.Popen([os.environ.get("PRIMECTL_RUNTIME_PYTHON", str(REPO / ".runtime" / "bin" / "python")),
                               "-I", "-c", CLIENT_SCRIPT, str(script), json.dumps(urls), str(cut),
                               str(WATCH_PROGRESS_S)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "ready", client.stderr.read() if client.stderr else ""
        members[0].partition()
        cut.touch()
        out, err = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        members[0].restore()
    doc = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    assert doc, err[-3000:]
    # the lease never lapsed: every keepalive found it alive
    assert doc["keepalives"] and all(alive is True for _, alive in doc["keepalives"]), doc
    # a call waited out the cut member's connect timeout (1 s); the calls after it went straight to a member that
    # answers (had each tried the cut member first, every one would have taken the timeout)
    slow = [c for c in doc["calls"] if c >= 0.95]
    assert slow and len(slow) <= len(doc["calls"]) // 3, doc
    # the watch, on the cut member, moved within three progress intervals (and the election) and saw the change
    assert "watch_moved_s" in doc and doc["watch_moved_s"] <= 3 * WATCH_PROGRESS_S + 4, doc

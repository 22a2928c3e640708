#!/usr/bin/env python3
"""What a fleet does with more load than it has room for, and with clients that give up.

Brings a copy of the demo fleet up (primectl.bench.fleet_copy: two mocker sites of `--capacity` slots each, two
gateway replicas with a queue, HAProxy in front) and creates a key. Then:

1. **Overload.** `3 x --capacity` streaming clients (three times one site's capacity) run in a closed loop for
   `--seconds`. Each request ends as: served (a finish_reason), 429 with Retry-After, 429 without it, or lost
   (anything else). Every 20 ms the replicas' in-flight counts are summed; the peak must stay within the fleet's
   capacity plus replicas x block.
2. **Cancelled streams.** `--cancels` streams are opened and dropped by their clients: a third before the first
   byte, a third after the first chunk, a third a few chunks in. When they are gone, every replica must report 0
   requests in flight and hold no more than its one spare block per site; the blocks etcd lists must be exactly
   the ones the replicas say they hold.

It binds loopback ports, so it refuses to run outside a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/fleet_overload.py'

Targets: 0 lost, every refusal a 429 with Retry-After, peak admitted <= capacity + replicas x block, 0 slots
leaked after the cancelled streams. Exit 1 when one is missed.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from primectl.bench.fleet_copy import FleetCopy  # noqa: E402
from primectl.bench.fleet_load import cli, health, with_fleet  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python "
            ".venv/bin/python benchmarks/fleet_overload.py'")
NAME = "overload"


def admitted(fleet: FleetCopy) -> tuple[int, int, int]:
    """(in flight, slots granted, blocks held) summed over every replica and site."""
    docs = [d for r in fleet.replicas for d in health(r).get("deployments", {}).values()]
    return sum(d["inflight"] for d in docs), sum(d["granted"] for d in docs), len(docs)


def etcd_blocks(fleet: FleetCopy) -> int:
    """How many admission blocks etcd lists as held."""
    prefix = f"/primectl/fleet/{NAME}/admit/".encode()
    body = json.dumps({"key": base64.b64encode(prefix).decode(),
                       "range_end": base64.b64encode(prefix[:-1] + bytes([prefix[-1] + 1])).decode(),
                       "count_only": True}).encode()
    req = urllib.request.Request(f"{fleet.etcd}/v3/kv/range", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return int(json.loads(resp.read()).get("count", 0))


def overload(fleet: FleetCopy, key: str, clients: int, seconds: float) -> tuple[dict[str, int], int]:
    """Closed-loop streaming clients for `seconds`: each outcome's count, and the peak admitted."""
    import httpx2 as httpx

    counts: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    peak = [0]

    def note(how: str) -> None:
        with lock:
            counts[how] = counts.get(how, 0) + 1

    def client(n: int) -> None:
        body = {"model": "demo", "messages": [{"role": "user", "content": f"client {n}"}], "max_tokens": 64,
                "stream": True}
        with httpx.Client(base_url=f"{fleet.edge}/v1", headers={"Authorization": f"Bearer {key}"},
                          timeout=120) as c:
            while not stop.is_set():
                try:
                    with c.stream("POST", "/chat/completions", json=body) as r:
                        if r.status_code == 429:
                            r.read()
                            note("429" if r.headers.get("Retry-After") else "429 without Retry-After")
                            time.sleep(float(r.headers.get("Retry-After") or 1) / 10)
                            continue
                        finished = r.status_code == 200 and any('"finish_reason":"' in line.replace(" ", "")
                                                               for line in r.iter_lines())
                        note("served" if finished else f"lost: HTTP {r.status_code}")
                except httpx.HTTPError as exc:
                    note(f"lost: {type(exc).__name__}")

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], admitted(fleet)[0])
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)] + [threading.Thread(target=watch)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=180)
    return counts, peak[0]


def cancel_streams(fleet: FleetCopy, key: str, n: int, parallel: int) -> dict[str, int]:
    """`n` streams dropped by their clients, at three points; how many of each were dropped."""
    import httpx2 as httpx

    counts = {"before the first byte": 0, "after the first chunk": 0, "a few chunks in": 0}
    lock = threading.Lock()
    body = {"model": "demo", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 500, "stream": True}
    local = threading.local()

    def one(i: int) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=f"{fleet.edge}/v1", headers={"Authorization": f"Bearer {key}"},
                                        timeout=httpx.Timeout(60, read=60))
        how = list(counts)[i % 3]
        try:
            if how == "before the first byte":
                with httpx.Client(timeout=httpx.Timeout(60, read=0.001)) as c:  # gives up before any byte
                    c.post(f"{fleet.edge}/v1/chat/completions", json=body,
                           headers={"Authorization": f"Bearer {key}"})
            else:
                with local.client.stream("POST", "/chat/completions", json=body) as r:
                    for j, _ in enumerate(r.iter_lines()):
                        if j >= (0 if how == "after the first chunk" else 6):
                            break
                    # closing the response mid-stream drops the connection
        except httpx.HTTPError:
            pass
        with lock:
            counts[how] += 1

    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, range(n)))
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=16, help="each site's concurrent requests")
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--queue", type=int, default=8, help="requests each replica holds waiting")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--cancels", type=int, default=10_000)
    ap.add_argument("--parallel", type=int, default=32, help="cancelled streams open at once")
    ap.add_argument("--port", type=int, default=19_900)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    refusal = netns_problem(RUN_HINT)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    replicas = 2

    def measure(fleet: FleetCopy) -> int:
        key = cli("keys", "create", fleet.recipe, "--team", "bench").stdout.strip()
        clients = 3 * args.capacity
        counts, peak = overload(fleet, key, clients, args.seconds)
        bound = 2 * args.capacity + replicas * args.block
        t0 = time.monotonic()
        dropped = cancel_streams(fleet, key, args.cancels, args.parallel)
        cancel_s = time.monotonic() - t0
        time.sleep(2)
        inflight, granted, pools = admitted(fleet)
        in_etcd = etcd_blocks(fleet)
        held_blocks = -(-granted // args.block)
        spare_most = pools * args.block
        print(f"fleet overload: {clients} streaming clients (3x one site's capacity of {args.capacity}) for "
              f"{args.seconds:.0f} s, queue {args.queue} per replica")
        print("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print(f"  peak admitted {peak}, bound capacity + replicas x block = {bound}")
        print(f"cancelled streams: {sum(dropped.values())} in {cancel_s:.0f} s ("
              + ", ".join(f"{v} {k}" for k, v in dropped.items()) + ")")
        print(f"  after: {inflight} in flight, {granted} slots granted (spares allowed: {spare_most}), "
              f"{in_etcd} blocks in etcd, {held_blocks} held by replicas")
        leaked = inflight + max(0, granted - spare_most)
        print(f"  slots leaked: {leaked}")
        lost = sum(v for k, v in counts.items() if k not in ("served", "429"))
        if args.json:
            args.json.write_text(json.dumps({"outcomes": counts, "peak": peak, "bound": bound,
                                             "cancelled": dropped, "leaked": leaked}, indent=2))
        return 0 if lost == 0 and peak <= bound and leaked == 0 and counts.get("served") else 1

    return with_fleet(measure, "primectl-fleet-overload-", port=args.port, name=NAME, capacity=args.capacity,
                      block=args.block, replicas=replicas, admission={"queue": args.queue, "queue_timeout_s": 2})


if __name__ == "__main__":
    sys.exit(main())

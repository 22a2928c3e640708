#!/usr/bin/env python3
"""What clients of a fleet see when one gateway replica dies under load, and when its capacity comes back.

Brings a copy of the demo fleet up (primectl.bench.fleet_copy: two mocker sites, each on a context of 524,288
tokens, behind two gateway replicas and HAProxy), creates a key, and runs `--clients` streaming chat clients
through the edge with the openai client (retries off), each sending its own agent-sized prompt (`--prompt-kb`,
600 by default) in a loop. `--before` seconds in, the replica gateway-0 (its pid from its /health) is SIGKILLed;
the load runs `--after` seconds more.

It prints how the requests ended (primectl.bench.fleet_load: ok, lost before first byte, cut mid-stream, no
finish_reason, hung); the seconds from the kill until etcd holds no admission block on the dead replica's lease;
how many requests the edge sent again (its admin socket's retry and redispatch counters); and the edge's
tune.bufsize and maxconn, with the most memory their buffers can take (two per connection) and
HAProxy's resident memory, before and at its peak under this load.

Targets: 0 lost before the first byte (the edge sends again every request the replica had not answered: it holds
the whole request, up to tune.bufsize), 0 hung, 0 ended without a finish_reason or an error, and the blocks gone
within the lease TTL + 1 s. Streams the replica was relaying when it died are cut: counted, not a miss.

It binds loopback ports, so it refuses to run outside a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/fleet_replica_loss.py'
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from primectl.bench.fleet_copy import FleetCopy  # noqa: E402
from primectl.bench.fleet_load import CUT, HUNG, LOST, NO_FINISH, OK, Load, cli, health, tally, with_fleet  # noqa: E402
from primectl.fleet.etcd_client import Etcd  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python "
            ".venv/bin/python benchmarks/fleet_replica_loss.py'")
MIB = 1 << 20


def blocks_on_lease(fleet: FleetCopy, name: str, lease: str) -> int:
    """Admission blocks etcd holds on `lease` (a replica's)."""
    prefix = f"/primectl/fleet/{name}/admit/"
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    doc = Etcd([fleet.etcd]).call("kv/range", {"key": base64.b64encode(prefix.encode()).decode(),
                                               "range_end": base64.b64encode(end.encode()).decode()})
    return sum(1 for kv in doc.get("kvs", []) if str(kv.get("lease", "")) == lease)


def edge_settings(fleet: FleetCopy) -> tuple[int, int]:
    """(tune.bufsize, maxconn) of the running edge's configuration."""
    text = (fleet.workdirs["gateway"] / "current" / "config" / "balancer.haproxy.cfg").read_text()
    bufsize = re.search(r"^\s*tune\.bufsize\s+(\d+)", text, re.M)
    maxconn = re.search(r"^\s*maxconn\s+(\d+)", text, re.M)
    if not bufsize or not maxconn:
        raise SystemExit("the edge's configuration names no tune.bufsize or maxconn")
    return int(bufsize.group(1)), int(maxconn.group(1))


def edge_resends(fleet: FleetCopy) -> dict[str, int]:
    """The edge's backend counters from its admin socket (`show stat`): requests it sent again to a replica
    (`wretr`) or to the other one (`wredis`)."""
    from primectl.components.haproxy import BACKEND, admin_socket
    from primectl.host.haproxy import balancer_server

    row = balancer_server(admin_socket(str(fleet.workdirs["gateway"])), f"{BACKEND}/BACKEND")
    return {k: int(row.get(k) or 0) for k in ("wretr", "wredis")}


def haproxy_rss(fleet: FleetCopy) -> int:
    """Resident bytes of the edge's HAProxy processes (master and worker)."""
    from primectl.bench.fleet_load import processes_under

    total = 0
    for pid in processes_under(fleet.workdirs["gateway"]):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"haproxy" not in f.read().split(b"\0")[0]:
                    continue
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prompt-kb", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--before", type=float, default=10)
    ap.add_argument("--after", type=float, default=10)
    ap.add_argument("--hang", type=float, default=60)
    ap.add_argument("--port", type=int, default=20_000)
    ap.add_argument("--ttl", type=int, default=3, help="the replicas' lease TTL (admission.lease_ttl_s)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    refusal = netns_problem(RUN_HINT)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    name = "replicaloss"
    return with_fleet(lambda fleet: run(args, fleet, name), "primectl-fleet-bench-", port=args.port, name=name,
                      capacity=64, block=4, lease_ttl_s=args.ttl)


def run(args: argparse.Namespace, fleet: FleetCopy, name: str) -> int:
    key = cli("keys", "create", fleet.recipe, "--team", "bench").stdout.strip()
    bufsize, maxconn = edge_settings(fleet)
    rss = {"idle": haproxy_rss(fleet), "peak": 0}
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            rss["peak"] = max(rss["peak"], haproxy_rss(fleet))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load = Load()
    load.start(fleet.edge, key, args.clients, args.prompt_kb * 1024, args.max_tokens)
    time.sleep(args.before)
    victim = health(fleet.replicas[0])
    lease = str(victim.get("lease") or "")
    held = blocks_on_lease(fleet, name, lease) if lease else 0
    t_kill = time.monotonic()
    os.kill(int(victim["pid"]), signal.SIGKILL)
    gone_s: float | None = None
    while time.monotonic() - t_kill < args.ttl + 10:
        if blocks_on_lease(fleet, name, lease) == 0:
            gone_s = time.monotonic() - t_kill
            break
        time.sleep(0.05)
    time.sleep(max(0.0, args.after - (time.monotonic() - t_kill)))
    load.finish(args.hang)
    resent = edge_resends(fleet)
    sampling.set()
    sampler.join()
    around = [o for o in load.outcomes if o.started <= t_kill <= (o.ended or float("inf"))]
    after = [o for o in load.outcomes if o.started > t_kill]
    before = [o for o in load.outcomes if o not in around and o not in after]
    rows = {"before the kill": tally(before), "running at the kill": tally(around), "after the kill": tally(after)}
    counts = tally(load.outcomes)
    order = [OK, LOST, CUT, NO_FINISH, HUNG]
    print(f"fleet replica loss: {args.clients} streaming clients, {args.prompt_kb} KB prompts, "
          f"gateway-0 (pid {victim['pid']}, {held} admission blocks) SIGKILLed {args.before:g} s in")
    for phase, c in rows.items():
        print(f"  {phase:20} " + ", ".join(f"{k} {c.get(k, 0)}" for k in order))
    print(f"  {'all':20} " + ", ".join(f"{k} {counts.get(k, 0)}" for k in order))
    print(f"  the edge sent {resent['wretr']} requests again ({resent['wredis']} of them to the other replica)")
    gone = f"{gone_s:.2f} s" if gone_s is not None else "NEVER"
    print(f"  its admission blocks gone from etcd {gone} after the kill (target <= lease TTL {args.ttl} s + 1 s)")
    bound = 2 * bufsize * maxconn
    print(f"  edge: tune.bufsize {bufsize // 1024} KiB, maxconn {maxconn}: buffers bounded by 2 x bufsize x "
          f"maxconn = {bound / MIB:.0f} MiB; HAProxy resident {rss['idle'] / MIB:.1f} MiB idle, "
          f"{rss['peak'] / MIB:.1f} MiB at its peak under this load")
    details = sorted({o.detail for o in load.outcomes if o.detail})[:5]
    for d in details:
        print(f"    {d[:160]}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "all": counts, "blocks_gone_s": gone_s, "blocks_held": held,
                                         "resent": resent,
                                         "bufsize": bufsize, "maxconn": maxconn, "rss": rss}, indent=2))
    missed = [why for why, bad in [
        ("requests lost before the first byte", counts.get(LOST, 0) > 0),
        ("requests hung", counts.get(HUNG, 0) > 0),
        ("streams ended without a finish_reason or an error", counts.get(NO_FINISH, 0) > 0),
        ("the replica held no block when it died", held == 0),
        ("blocks not back within TTL + 1 s", gone_s is None or gone_s > args.ttl + 1),
        ("no request served", counts.get(OK, 0) == 0)] if bad]
    if missed:
        print("  MISSED: " + "; ".join(missed))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What clients of a fleet see when all traffic moves from one deployment to another, and the old one goes down.

Brings a copy of the demo fleet up (primectl.bench.fleet_copy: sites a and b, weight 1 each, behind two gateway
replicas and HAProxy), creates a key, and runs `--clients` streaming chat clients through the edge with the openai
client (retries off): short prompts, or agent-sized ones with `--prompt-kb`. `--before` seconds in, site a's
weight goes to 0 in the fleet recipe and `primectl up` of the fleet rolls the gateway replicas (only the gateway
changes); then `primectl down` of site a's recipe stops it; the load runs `--after` seconds more.

It prints how the requests ended (primectl.bench.fleet_load: ok, lost before first byte, cut mid-stream, no
finish_reason, hung) per phase, how long the shift and the down took, and how many requests site a was sent
after the shift's `up` returned (from the replicas' usage records: 0 when the shift took effect).

Target: 0 lost (before or after the first byte), 0 without a finish_reason, 0 hung, 0 sent to site a after the
shift.

It binds loopback ports, so it refuses to run outside a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/fleet_blue_green.py'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from primectl.bench.fleet_copy import FleetCopy  # noqa: E402
from primectl.bench.fleet_load import CUT, HUNG, LOST, NO_FINISH, OK, Load, cli, tally, with_fleet  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python "
            ".venv/bin/python benchmarks/fleet_blue_green.py'")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--prompt-kb", type=int, default=0, help="each client's prompt in KB (0: a short one)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--before", type=float, default=8)
    ap.add_argument("--after", type=float, default=8)
    ap.add_argument("--hang", type=float, default=60)
    ap.add_argument("--port", type=int, default=20_400)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    refusal = netns_problem(RUN_HINT)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    return with_fleet(lambda fleet: run(args, fleet), "primectl-fleet-bench-", port=args.port, name="bluegreen",
                      capacity=64, block=4)


def site_requests(fleet: FleetCopy, site: str) -> int:
    """Requests the replicas have recorded as sent to `site` (their usage databases)."""
    r = cli("usage", fleet.recipe, "--by", "deployment", "--since", "0", "-o", "json")
    return sum(row["requests"] for row in json.loads(r.stdout or "{}").get("rows", []) if row.get("deployment") == site)


def run(args: argparse.Namespace, fleet: FleetCopy) -> int:
    key = cli("keys", "create", fleet.recipe, "--team", "bench").stdout.strip()
    load = Load()
    load.start(fleet.edge, key, args.clients, args.prompt_kb * 1024, args.max_tokens)
    time.sleep(args.before)
    doc = yaml.safe_load(fleet.recipe.read_text())
    doc["deployments"][0]["weight"] = 0
    fleet.recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    t_shift = time.monotonic()
    shifted = cli("up", fleet.recipe)
    t_down = time.monotonic()
    served_a = site_requests(fleet, "bluegreen-site-a")
    gone = cli("down", fleet.sites["a"])
    t_gone = time.monotonic()
    time.sleep(args.after)
    load.finish(args.hang)
    late_a = site_requests(fleet, "bluegreen-site-a") - served_a
    phases = {"before the shift": [o for o in load.outcomes if o.started < t_shift],
              "during the shift": [o for o in load.outcomes if t_shift <= o.started < t_down],
              "during site a's down": [o for o in load.outcomes if t_down <= o.started < t_gone],
              "after site a was down": [o for o in load.outcomes if o.started >= t_gone]}
    counts = tally(load.outcomes)
    order = [OK, LOST, CUT, NO_FINISH, HUNG]
    untouched = shifted.stderr.count("no changes")
    print(f"fleet blue/green: {args.clients} streaming clients, "
          f"{f'{args.prompt_kb} KB prompts' if args.prompt_kb else 'short prompts'}, {args.max_tokens} tokens each")
    print(f"  weight shift a -> b: `up` {'ok' if shifted.returncode == 0 else 'FAILED'} in {t_down - t_shift:.1f} s "
          f"({untouched} of 2 deployments untouched); `down` of site a "
          f"{'ok' if gone.returncode == 0 else 'FAILED'} in {t_gone - t_down:.1f} s")
    print(f"  site a served {served_a} requests until the shift's `up` returned, {late_a} after it")
    for phase, outcomes in phases.items():
        c = tally(outcomes)
        print(f"  {phase:22} " + ", ".join(f"{k} {c.get(k, 0)}" for k in order))
    print(f"  {'all':22} " + ", ".join(f"{k} {counts.get(k, 0)}" for k in order))
    for d in sorted({o.detail for o in load.outcomes if o.detail})[:5]:
        print(f"    {d[:160]}")
    if args.json:
        args.json.write_text(json.dumps({name: tally(o) for name, o in phases.items()} | {"all": counts}, indent=2))
    lost = sum(counts.get(k, 0) for k in (LOST, CUT, NO_FINISH, HUNG))
    missed = [why for why, bad in [
        (f"{lost} requests lost", lost > 0),
        ("the shift's `up` failed or changed a deployment", shifted.returncode != 0 or untouched != 2),
        ("`down` of site a failed", gone.returncode != 0),
        ("site a was sent requests after the shift", late_a > 0),
        ("no request served", counts.get(OK, 0) == 0)] if bad]
    if missed:
        print("  MISSED: " + "; ".join(missed))
        if shifted.returncode != 0 or gone.returncode != 0:
            print(shifted.stdout + shifted.stderr + gone.stdout + gone.stderr, file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What clients of a fleet see when a whole site dies, and when it comes back.

Brings a copy of the demo fleet up (primectl.bench.fleet_copy: two mocker sites behind two gateway replicas and
HAProxy, each site on a context of 524,288 tokens, each in a network namespace of its own reached over SSH across
a veth link: tests/integration/netns_sites.py), creates a key, and runs `--clients` streaming chat clients
through the openai client (retries off), each sending its own agent-sized prompt (`--prompt-kb`, 600 by
default: ~460K tokens of the demo's tokenizer, cached turn to turn) for `--max-tokens` (256) in a loop.
`--before` seconds in, site a is lost, once per `--loss`: `kill` SIGKILLs every process in its namespace (its
kernel still refuses connections); `partition` first takes its link down (nothing answers: connections time out,
streams stall until the gateway's `stall_s`). `--after` seconds later the link is back and `primectl up` of site
a brings it back, and the load runs on until both replicas have closed its breaker and `--after` seconds more.

Each request ends as one of: ok (a finish_reason), lost before its first byte (an error before any chunk),
ended by an error event (a well-formed SSE error after some chunks), no finish_reason (the stream stopped
without one), hung (still open `--hang` seconds after the end). It prints a row per phase (site lost, site
back), the time from the breaker's trip (etcd's record) until every replica routes around it, and how many
requests site a served again after its breaker closed.

It binds loopback ports and makes network namespaces and links, so it refuses to run outside a private network
namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/fleet_failover.py'

Targets, for each loss: 0 lost before the first byte, 0 without a finish_reason or an error, 0 hung, every
replica routes around the dead site within 0.5 s of the trip, 0 lost when it comes back.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from primectl.bench.fleet_copy import SITES, FleetCopy, write_fleet  # noqa: E402
from primectl.bench.fleet_load import Load, Outcome, cli, health, kill_under, tally  # noqa: E402
from primectl.checks.smoke import words  # noqa: E402
from tests.integration.netns_sites import Site, reach, sites_up  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python "
            ".venv/bin/python benchmarks/fleet_failover.py'")


def client_loop(fleet: FleetCopy, key: str, n: int, prompt_kb: int, max_tokens: int, load: Load) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{fleet.edge}/v1", api_key=key, max_retries=0, timeout=300)
    prompt = words(max(1, prompt_kb * 1024 // 6), f"client {n}")
    while not load.stop.is_set():
        o = Outcome(time.monotonic())
        load.outcomes.append(o)
        chunks = 0
        try:
            stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=max_tokens, stream=True)
            finish = None
            for ch in stream:
                chunks += 1
                if ch.choices and ch.choices[0].finish_reason:
                    finish = ch.choices[0].finish_reason
            o.how = "ok" if finish else "no finish_reason"
        except Exception:
            o.how = "error event" if chunks else "lost before first byte"
        o.ended = time.monotonic()


def breaker_seen(fleet: FleetCopy, site: str, want: str, timeout: float) -> float | None:
    """When (time.time()) every replica first reported `site`'s breaker as `want`; None if not within timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [health(r).get("deployments", {}).get(site, {}).get("breaker") for r in fleet.replicas]
        if all(s == want for s in states):
            return time.time()
        time.sleep(0.01)
    return None


def tripped_at(fleet: FleetCopy, name: str, site: str) -> float | None:
    """When the breaker was written (the `since` etcd holds), from the controller's etcd client."""
    from primectl.fleet.etcd_client import Etcd

    doc = Etcd([fleet.etcd]).prefix(f"/primectl/fleet/{name}/breaker/{site}")
    return next((float(json.loads(v)["since"]) for v in doc.values()), None)


def continued(fleet: FleetCopy, site: str) -> int:
    """Streams `site` broke that the replicas went on with from another deployment (their continuations_total)."""
    import urllib.request

    total = 0
    for r in fleet.replicas:
        with urllib.request.urlopen(f"{r}/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("primectl_gateway_continuations_total{") and f'deployment="{site}"' in line:
                    total += int(float(line.rsplit(" ", 1)[1]))
    return total


def lose_and_return(fleet: FleetCopy, site: Site, loss: str, args: argparse.Namespace, key: str, name: str
                    ) -> tuple[dict[str, dict[str, int]], float | None, float | None, int, bool, int]:
    """One site loss under load and the site's return: the rows, the breaker's propagation, when it closed again
    (seconds after `up` began), what site a served after that, whether `up` worked, how many of its streams went
    on from site b."""
    site_a = f"{name}-site-a"
    continued_before = continued(fleet, site_a)
    load = Load()
    threads = [threading.Thread(target=client_loop, args=(fleet, key, n, args.prompt_kb, args.max_tokens, load),
                                daemon=True)
               for n in range(args.clients)]
    for t in threads:
        t.start()
    time.sleep(args.before)
    t_kill = time.monotonic()
    if loss == "partition":
        site.partition()
    site.kill()
    seen_open = breaker_seen(fleet, site_a, "open", 30)
    trip = tripped_at(fleet, name, site_a)
    time.sleep(args.after)
    t_back, wall_back = time.monotonic(), time.time()
    site.restore()
    back = cli("up", fleet.sites["a"])
    seen_closed = breaker_seen(fleet, site_a, "closed", 60)
    usage_before = _site_requests(fleet, site_a)
    time.sleep(args.after)
    load.stop.set()
    for t in threads:
        t.join(timeout=args.hang)
    lost_phase = [o for o in load.outcomes if t_kill <= o.started < t_back or (o.started < t_kill <= o.ended)]
    back_phase = [o for o in load.outcomes if o.started >= t_back]
    propagation = (seen_open - trip) if seen_open and trip else None
    rows = {"site lost": tally(lost_phase), "site back": tally(back_phase)}
    returned = _site_requests(fleet, site_a) - usage_before
    closed = seen_closed - wall_back if seen_closed else None
    return rows, propagation, closed, returned, back.returncode == 0, continued(fleet, site_a) - continued_before


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prompt-kb", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=256, help="per answer: long enough that streams are running "
                                                                 "when the site is lost")
    ap.add_argument("--before", type=float, default=8)
    ap.add_argument("--after", type=float, default=8)
    ap.add_argument("--hang", type=float, default=60)
    ap.add_argument("--stall", type=float, default=10, help="the gateway's stall_s")
    ap.add_argument("--loss", default="kill,partition",
                    help="how site a is lost, in turn: kill (every process SIGKILLed) and/or partition (its link "
                         "cut first: nothing answers)")
    ap.add_argument("--port", type=int, default=19_800)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    refusal = netns_problem(RUN_HINT)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    losses = args.loss.split(",")
    if not set(losses) <= {"kill", "partition"}:
        print(f"--loss: {args.loss!r}; allowed: kill, partition (comma-separated)", file=sys.stderr)
        return 2
    name = "failover"
    with tempfile.TemporaryDirectory(prefix="primectl-fleet-bench-") as tmp, \
            sites_up(Path(tmp) / "netns", SITES) as sites:
        fleet = write_fleet(Path(tmp), port=args.port, name=name, capacity=64, block=4, stall_s=args.stall,
                            site_hosts=reach(sites, Path(tmp) / "known_hosts"))
        up = cli("up", fleet.recipe)
        if up.returncode != 0:
            print(up.stdout + up.stderr, file=sys.stderr)
            return 1
        try:
            key = cli("keys", "create", fleet.recipe, "--team", "bench").stdout.strip()
            print(f"fleet failover: {args.clients} streaming clients, {args.prompt_kb} KB prompts, each site in a "
                  f"network namespace of its own, stall_s {args.stall:g}")
            ok, report = True, {}
            for loss in losses:
                rows, propagation, closed, returned, back_ok, went_on = lose_and_return(fleet, sites["a"], loss, args,
                                                                                       key, name)
                how = ("every process SIGKILLed" if loss == "kill"
                       else "its link cut, then every process SIGKILLed")
                print(f"site a lost: {how}")
                for phase, counts in rows.items():
                    print(f"  {phase:10} " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
                print(f"  streams site a broke that went on from site b: {went_on}")
                routed = f"{propagation:.3f} s" if propagation is not None else "NEVER"
                print(f"  breaker: every replica routes around site a {routed} after the trip")
                when = f"{closed:.1f} s after `up` began" if closed is not None else "NEVER"
                print(f"  site a back: `up` {'ok' if back_ok else 'FAILED'}, breaker closed on every replica "
                      f"{when}; site a served {returned} requests after that")
                bad = sum(v for counts in rows.values() for k, v in counts.items() if k not in ("ok", "error event"))
                ok &= bad == 0 and propagation is not None and propagation <= 0.5 and returned > 0 and back_ok
                report[loss] = {"rows": rows, "propagation_s": propagation, "closed_s": closed, "returned": returned,
                                "continued": went_on}
            if args.json:
                args.json.write_text(json.dumps(report, indent=2))
            return 0 if ok else 1
        finally:
            cli("down", fleet.recipe)
            kill_under(list(fleet.workdirs.values()))  # what this benchmark started, by pid


def _site_requests(fleet: FleetCopy, site: str) -> int:
    r = cli("usage", fleet.recipe, "--by", "deployment", "--since", "0", "-o", "json")
    rows = json.loads(r.stdout or "{}").get("rows", [])
    return sum(row["requests"] for row in rows if row.get("deployment") == site)


if __name__ == "__main__":
    sys.exit(main())

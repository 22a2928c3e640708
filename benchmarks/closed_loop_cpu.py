#!/usr/bin/env python3
"""What a closed-loop load costs the machine at each mocker speed: why the load-bearing tests slow the mocker.

The live-change tests keep clients streaming chat requests through a change; each client sends its next request
as soon as the last one ends. On the demo's mocker (speedup_ratio 10) a request lasts a few tens of milliseconds,
so the clients, the frontend and the mocker take every core they can get, from the change under test and from
every test beside it. A slower mocker keeps the same number of requests in flight, each for longer, for less CPU.

For each `--speedups` value this brings up recipes/demo.yaml (no smoke, its own workdir), runs `--clients`
streaming clients (primectl.bench.liveload, as the tests do) for `--seconds`, and prints the requests served, how
long one took, and the CPU the whole machine spent (all processes, from /proc/stat), then the ratio of the CPU at
the first speedup to that at each other. The machine should be otherwise idle.

It binds the demo's loopback ports, so it refuses to run outside a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python \\
        .venv/bin/python benchmarks/closed_loop_cpu.py'
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.fanout import cpu_busy_s  # noqa: E402
from primectl.bench.liveload import LiveLoad  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python "
            ".venv/bin/python benchmarks/closed_loop_cpu.py'")
PRIMECTL = str(Path(sys.executable).parent / "primectl")


def measure(root: Path, speedup: float, clients: int, seconds: float) -> tuple[int, float, float]:
    """Requests served, mean seconds per request and machine CPU seconds for one speedup."""
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    doc["hosts"][0]["workdir"] = str(root / f"wd-{speedup:g}")
    doc["mocker"]["speedup_ratio"] = speedup
    if os.environ.get("PRIMECTL_RUNTIME_PYTHON"):
        doc.setdefault("software", {})["python"] = os.environ["PRIMECTL_RUNTIME_PYTHON"]
    recipe = root / f"demo-{speedup:g}.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    up = subprocess.run([PRIMECTL, "up", "--no-smoke", "--skip-preflight", str(recipe)], capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(f"up failed at speedup {speedup:g}:\n{up.stdout}{up.stderr}")
    try:
        port = doc["frontend"]["port"]
        c0 = cpu_busy_s()
        with LiveLoad(f"http://127.0.0.1:{port}", doc["model"]["served_name"], clients=clients,
                      deadline_s=seconds) as load:
            time.sleep(seconds)
        cpu = cpu_busy_s() - c0
        done = [o for o in load.report.outcomes if o.ok]
        mean = sum(o.ended - o.started for o in done) / len(done) if done else float("nan")
        return len(done), mean, cpu
    finally:
        subprocess.run([PRIMECTL, "down", str(recipe)], capture_output=True, text=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speedups", default="10,2,1,0.5", help="mocker speedup_ratio values, comma-separated")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15)
    args = ap.parse_args()
    problem = netns_problem(RUN_HINT)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    speedups = [float(x) for x in args.speedups.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="closed-loop-") as tmp:
        for speedup in speedups:
            rows.append((speedup, *measure(Path(tmp), speedup, args.clients, args.seconds)))
    print(f"{args.clients} closed-loop clients for {args.seconds:g} s on the demo stack")
    print(f"{'speedup':>8} {'served':>7} {'s/request':>10} {'CPU-s':>7} {'CPU ratio':>10}")
    for speedup, served, mean, cpu in rows:
        print(f"{speedup:>8g} {served:>7} {mean:>10.3f} {cpu:>7.1f} {rows[0][3] / cpu:>9.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

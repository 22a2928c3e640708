#!/usr/bin/env python3
"""Time the demo cluster: warm `primectl up recipes/demo.yaml` to ready, and (with --cold) a cold `make demo`.

Warm: the runtime venv exists; the demo is taken down, then `up` is timed until the readiness
gate passes (smoke included). Cold: the demo's workdir (runtime venv included) is removed and
`make demo` is timed from there; system packages and primectl's own venv are assumed present,
and the pip cache may be warm, so this is a lower bound for a truly fresh machine.

    .venv/bin/python benchmarks/demo_time.py [--cold] [--runs 3]

Targets: cold `make demo` <= 300 s, warm time-to-ready <= 30 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
RECIPE = str(REPO / "recipes" / "demo.yaml")
WORKDIR = Path("/tmp/primectl-demo")


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cold", action="store_true", help="also time a cold `make demo` (reinstalls the runtime)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if args.cold:
        subprocess.run([PRIMECTL, "down", RECIPE, "--purge"], cwd=REPO, capture_output=True)
        shutil.rmtree(WORKDIR, ignore_errors=True)
        cold = timed(["make", "demo"])
        print(f"cold make demo: {cold:.1f} s (target <= 300 s) {'OK' if cold <= 300 else 'MISSED'}")
    warm = []
    for _ in range(args.runs):
        subprocess.run([PRIMECTL, "down", RECIPE], cwd=REPO, capture_output=True)
        warm.append(timed([PRIMECTL, "up", RECIPE]))
    med = statistics.median(warm)
    print(f"warm up to ready (incl. CLI start and smoke): median {med:.1f} s over {len(warm)} runs "
          f"{[round(w, 1) for w in warm]} (target <= 30 s) {'OK' if med <= 30 else 'MISSED'}")
    subprocess.run([PRIMECTL, "down", RECIPE], cwd=REPO, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

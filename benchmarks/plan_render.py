"""How long primectl takes to think about a big deployment, and to say hello.

Times, on recipes/bench-4rack.yaml (4 GB200 NVL72 racks: 72 trays, 4 NVLink domains, 75
services), the in-process path `primectl render` runs: load + validate (schema, semantic rules,
trial plan) + plan + render every host's bundle (no writing). Then `primectl --help` as a
subprocess, which is what an operator feels first.

    .venv/bin/python benchmarks/plan_render.py [--runs N]

Targets: load+validate+plan+render < 0.5 s (median), `primectl --help` < 0.3 s (median).
Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "bench-4rack.yaml"
TARGET_PIPELINE_S = 0.5
TARGET_HELP_S = 0.3


def pipeline_once() -> tuple[float, int, int]:
    """One load+validate+plan+render; returns seconds, services, files rendered."""
    from primectl.planner.build import build_plan
    from primectl.planner.load import load_recipe
    from primectl.render.bundle import render_plan

    start = time.perf_counter()
    loaded = load_recipe(RECIPE)
    plan = build_plan(loaded.recipe)
    bundles = render_plan(plan)
    elapsed = time.perf_counter() - start
    return elapsed, len(plan.services), sum(len(b.files) for b in bundles.values())


def help_once() -> float:
    """`primectl --help` in a fresh interpreter, as the console script runs it."""
    exe = Path(sys.executable).with_name("primectl")
    cmd = [str(exe), "--help"] if exe.exists() else [sys.executable, "-m", "primectl.cli", "--help"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="timed runs of each measurement (median reported)")
    args = ap.parse_args()

    cold, services, files = pipeline_once()  # first run: imports, template compilation, schema build
    warm = [pipeline_once()[0] for _ in range(args.runs)]
    helps = [help_once() for _ in range(args.runs)]
    pipeline, help_s = statistics.median(warm), statistics.median(helps)

    print(f"recipe: {RECIPE.relative_to(REPO)} ({services} services, {files} files rendered)")
    print(f"load+validate+plan+render: first {cold * 1000:.0f} ms (imports included), "
          f"median {pipeline * 1000:.0f} ms of {args.runs} (min {min(warm) * 1000:.0f}, max {max(warm) * 1000:.0f})"
          f"  target < {TARGET_PIPELINE_S * 1000:.0f} ms: {'ok' if pipeline < TARGET_PIPELINE_S else 'MISSED'}")
    print(f"primectl --help (subprocess): median {help_s * 1000:.0f} ms of {args.runs} "
          f"(min {min(helps) * 1000:.0f}, max {max(helps) * 1000:.0f})"
          f"  target < {TARGET_HELP_S * 1000:.0f} ms: {'ok' if help_s < TARGET_HELP_S else 'MISSED'}")
    return 0 if pipeline < TARGET_PIPELINE_S and help_s < TARGET_HELP_S else 1


if __name__ == "__main__":
    sys.exit(main())

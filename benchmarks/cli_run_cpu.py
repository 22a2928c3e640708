#!/usr/bin/env python3
"""What one `primectl` run costs the machine, started fresh and forked by tests/cliproc.py's zygote.

The suite runs `primectl` ~450 times; a fresh interpreter spends most of a short run importing typer, pydantic,
rich, jinja2, PyYAML, ssh2 and primectl's own modules. tests/cliproc.py forks each run from a process that has
imported those already.
This runs the same commands `--runs` times each way, alternating, and prints the CPU the whole machine spent per
run (all processes, from /proc/stat: the zygote's children are not this process's), and the ratio. The machine
should be otherwise idle.

    .venv/bin/python benchmarks/cli_run_cpu.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.fanout import cpu_busy_s  # noqa: E402
from tests import cliproc  # noqa: E402

PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
COMMANDS = (("plan", "recipes/demo.yaml"), ("validate", "recipes/glm53.yaml"), ("diff", "recipes/demo.yaml"),
            ("validate", "tests/invalid/parallel_dep7.yaml"))


def main() -> int:
    """Print CPU-s per run for each command, fresh and forked, and fresh/forked."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs of each command each way (default 10)")
    args = ap.parse_args()
    env = os.environ | {"COLUMNS": "200", "NO_COLOR": "1"}
    cliproc.run([PRIMECTL, "--help"], cwd=REPO, env=env, timeout=60)  # the zygote's own start is not a run's cost
    print("| command | fresh CPU-s/run | forked CPU-s/run | ratio |\n|---|---|---|---|")
    for cmd in COMMANDS:
        spent = {"fresh": 0.0, "forked": 0.0}
        codes = set()
        for _ in range(args.runs):
            for way in spent:
                t0 = cpu_busy_s()
                if way == "fresh":
                    r = subprocess.run([PRIMECTL, *cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
                else:
                    r = cliproc.run([PRIMECTL, *cmd], cwd=REPO, env=env, timeout=120)
                spent[way] += cpu_busy_s() - t0
                codes.add(r.returncode)
        fresh, forked = spent["fresh"] / args.runs, spent["forked"] / args.runs
        print(f"| `primectl {' '.join(cmd)}` (exit {'/'.join(map(str, sorted(codes)))}) | {fresh:.2f} | "
              f"{forked:.2f} | {fresh / forked:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

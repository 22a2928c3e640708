#!/usr/bin/env python3
"""Try the Slurm demo on one machine: a throw-away Slurm cluster, then up, chat, status, down.

Run it inside a private network namespace (only loopback), as `make demo-slurm` does:

    unshare --net -- sh -c 'ip link set lo up && .venv/bin/python scripts/demo_slurm.py'

It starts munged, slurmctld and three slurmd (n1-n3 on 127.0.0.2-4, tests/integration/slurmcluster.py,
stopped by pid), runs `primectl up recipes/demo-slurm.yaml` against it (the runtime is installed on a
node from .demo/wheelhouse), sends one streamed chat completion with the openai client, prints
`primectl status`, then `primectl down` and stops the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.slurmcluster import make_base_dir, problem, start_cluster  # noqa: E402

RECIPE = REPO / "recipes" / "demo-slurm.yaml"
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
JOB_DIR = Path("/tmp/primectl-demo-slurm")  # recipes/demo-slurm.yaml's slurm.job_dir


def main() -> int:
    """Bring the Slurm demo up, use it, take it down."""
    why = problem()
    if why:
        print(why, file=sys.stderr)
        return 2
    base = make_base_dir("primectl-demo-slurm-cluster-")
    cluster = start_cluster(base)
    env = cluster.client_env()
    try:
        up = [PRIMECTL, "up", str(RECIPE), "--wheelhouse", str(REPO / ".demo" / "wheelhouse")]
        if subprocess.run(up, cwd=REPO, env=env).returncode != 0:
            return 1
        from openai import OpenAI

        state = json.loads((JOB_DIR / "demo-slurm" / "state.json").read_text())
        endpoint = f"http://{state['hosts']['h1']['address']}:8000/v1"
        client = OpenAI(base_url=endpoint, api_key="none")
        stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=12, stream=True)
        print(f"chat via {endpoint}:", "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        subprocess.run([PRIMECTL, "status", str(RECIPE)], cwd=REPO, env=env)
        return 0
    finally:
        subprocess.run([PRIMECTL, "down", str(RECIPE), "--break-lock"], cwd=REPO, env=env)
        left = cluster.stop()
        if left:
            print(f"stopped the cluster with leftovers (killed by pid): {left}", file=sys.stderr)
        if os.environ.get("PRIMECTL_KEEP_SLURM") != "1":
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

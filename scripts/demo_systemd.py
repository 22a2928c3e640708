#!/usr/bin/env python3
"""Try `supervisor: systemd` on one machine: three hosts with systemd as PID 1, then up, chat, status, down.

Run it as root inside a private network namespace, as `make demo-systemd` does:

    unshare --net -- sh -c 'ip link set lo up && .venv/bin/python scripts/demo_systemd.py'

It boots three systemd-nspawn hosts (tests/integration/nspawnhosts.py: 10.77.0.2-4 on a bridge
that exists only in that namespace, the cached root file system from scripts/make-rootfs.sh),
binds the Dynamo/Mooncake runtime venv (.runtime, or $PRIMECTL_NSPAWN_RUNTIME) read-only into
them, writes .demo/nspawn/ (key, known_hosts, and a recipe extending recipes/demo-systemd.yaml
with software.python pointing at that runtime), runs `primectl up`, sends one streamed chat
completion with the openai client, prints `primectl status -o wide`, then `primectl down
--purge` and shuts the hosts down.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.nspawnhosts import nspawn_problem, runtime_binds, start_nspawn_hosts  # noqa: E402

PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
DEMO = REPO / ".demo" / "nspawn"


def main() -> int:
    """Boot the hosts, bring the stack up under systemd, use it, take it all down."""
    problem = nspawn_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    runtime = Path(os.environ.get("PRIMECTL_NSPAWN_RUNTIME") or REPO / ".runtime")
    if not (runtime / "bin" / "python").exists():
        print(f"no runtime venv at {runtime}: run `make runtime` (or set PRIMECTL_NSPAWN_RUNTIME)", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="primectl-demo-systemd-"))
    hosts = start_nspawn_hosts(base, 3, binds=runtime_binds(runtime))
    DEMO.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(hosts.client_key, DEMO / "id_ed25519")
    (DEMO / "id_ed25519").chmod(0o600)
    hosts.known_hosts(DEMO / "known_hosts")
    recipe = DEMO / "demo-systemd.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo-systemd.yaml'}\nsoftware:\n  python: {runtime / 'bin' / 'python'}\n")
    print(f"hosts running: {', '.join(f'{h.name} {h.address}' for h in hosts.hosts)}; recipe {recipe}")
    try:
        if subprocess.run([PRIMECTL, "up", str(recipe)], cwd=REPO).returncode != 0:
            return 1
        from openai import OpenAI

        client = OpenAI(base_url="http://10.77.0.2:8000/v1", api_key="none")
        stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=12, stream=True)
        print("chat:", "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        subprocess.run([PRIMECTL, "status", str(recipe), "-o", "wide"], cwd=REPO)
        return 0
    finally:
        subprocess.run([PRIMECTL, "down", str(recipe), "--purge", "--break-lock"], cwd=REPO)
        left = hosts.close()
        if left:
            print(f"killed leftover container processes: {left}", file=sys.stderr)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

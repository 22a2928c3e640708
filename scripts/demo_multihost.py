#!/usr/bin/env python3
"""Try the multi-host demo on one machine: three throw-away sshd "hosts", then up, chat, status, down.

Run it inside a private network namespace (only loopback), as `make demo-multihost` does:

    unshare --net -- sh -c 'ip link set lo up && .venv/bin/python scripts/demo_multihost.py'

It starts sshd on 127.0.0.2-4 (by pid), writes .demo/ssh/id_ed25519 and known_hosts for
recipes/demo-multihost.yaml, runs `primectl up`, sends one streamed chat completion with the
openai client, prints `primectl status`, then `primectl down` and stops the sshd hosts.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.sshhosts import kill_leftovers, netns_problem, start_hosts  # noqa: E402

RECIPE = REPO / "recipes" / "demo-multihost.yaml"
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")


def main() -> int:
    """Bring the three-host demo up, use it, take it down."""
    problem = netns_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="primectl-demo-hosts-"))
    hosts = start_hosts(base, 3, port=22)
    ssh = REPO / ".demo" / "ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(hosts.client_key, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    hosts.known_hosts(ssh / "known_hosts")
    try:
        up = [PRIMECTL, "up", str(RECIPE), "--wheelhouse", str(REPO / ".demo" / "wheelhouse")]
        if subprocess.run(up, cwd=REPO).returncode != 0:
            return 1
        from openai import OpenAI

        client = OpenAI(base_url="http://127.0.0.2:8000/v1", api_key="none")
        stream = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=12, stream=True)
        print("chat:", "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        subprocess.run([PRIMECTL, "status", str(RECIPE)], cwd=REPO)
        return 0
    finally:
        subprocess.run([PRIMECTL, "down", str(RECIPE), "--break-lock"], cwd=REPO)
        for h in ("h1", "h2", "h3"):
            kill_leftovers(Path("/tmp/primectl-demo-mh") / h)
        hosts.stop()


if __name__ == "__main__":
    sys.exit(main())

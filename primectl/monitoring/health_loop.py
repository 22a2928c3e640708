#!/usr/bin/env python3
"""A host's health checks on a timer, written as node_exporter textfile metrics (stdlib only; shipped to hosts).

Every `--interval` seconds it runs the checks and replaces `<textfile-dir>/primectl_health.prom` atomically:
`primectl_health_check_ok{check=...}` (1 pass, 0 fail), `primectl_health_check_timestamp_seconds`, and, where it
is given a readiness gate, `primectl_gate_ready` (1 while the gate answers 200). A check that fails between
launches then fires an alert.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import urllib.error
import urllib.request


def disk_ok(path: str, min_free_gb: float = 1.0) -> bool:
    """At least `min_free_gb` free where the deployment writes."""
    return shutil.disk_usage(path).free >= min_free_gb * (1 << 30)


def gate_ready(url: str) -> bool:
    """The readiness gate answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def render(checks: dict[str, bool], host: str, gate: bool | None) -> str:
    """The textfile's content."""
    out = ["# HELP primectl_health_check_ok 1 when primectl's host check passes, 0 when it fails.",
           "# TYPE primectl_health_check_ok gauge"]
    out += [f'primectl_health_check_ok{{check="{name}",check_host="{host}"}} {int(ok)}' for name, ok in checks.items()]
    out += ["# HELP primectl_health_check_timestamp_seconds When the checks last ran.",
            "# TYPE primectl_health_check_timestamp_seconds gauge", f"primectl_health_check_timestamp_seconds {time.time():.3f}"]
    if gate is not None:
        out += ["# HELP primectl_gate_ready 1 while the deployment's readiness gate answers 200.",
                "# TYPE primectl_gate_ready gauge", f"primectl_gate_ready {int(gate)}"]
    return "\n".join(out) + "\n"


def write(directory: str, text: str) -> None:
    """Replace the textfile atomically (node_exporter never reads half of one)."""
    tmp = os.path.join(directory, f".primectl_health.prom.{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, os.path.join(directory, "primectl_health.prom"))


def main(argv: list[str]) -> int:
    """Run the checks until killed."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--textfile-dir", required=True)
    ap.add_argument("--interval", type=float, default=15)
    ap.add_argument("--host", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--gate")
    ap.add_argument("--once", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.textfile_dir, exist_ok=True)
    while True:
        checks = {"disk": disk_ok(args.workdir)}
        write(args.textfile_dir, render(checks, args.host, gate_ready(args.gate) if args.gate else None))
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

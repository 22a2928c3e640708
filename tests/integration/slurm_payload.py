"""A stand-in service for Slurm job steps: HTTP on its own node's address, polite about SIGTERM.

    python slurm_payload.py --port PORT [--ignore-term] [--exit-after SECONDS --exit-code N]

It finds the address of the node it runs on the way a job step must when several nodes
share one host name: `scontrol show node -o $SLURMD_NODENAME` -> NodeAddr. GET /health
answers 200 with JSON (node, address, step, job, CUDA_VISIBLE_DEVICES, pid). On SIGTERM it
prints "stopping on SIGTERM" and exits 0 (or ignores the signal with --ignore-term).
Standard library only.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType


def node_address(node: str) -> str:
    """NodeAddr of `node` as slurmctld knows it."""
    out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, check=True).stdout
    for word in out.split():
        if word.startswith("NodeAddr="):
            return word.removeprefix("NodeAddr=")
    raise SystemExit(f"no NodeAddr for {node}: {out!r}")


def main() -> None:
    """Serve /health on this node's address until SIGTERM (or --exit-after)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--exit-after", type=float, default=None)
    ap.add_argument("--exit-code", type=int, default=0)
    args = ap.parse_args()

    node = os.environ["SLURMD_NODENAME"]
    address = node_address(node)
    info = {"node": node, "address": address, "job": os.environ.get("SLURM_JOB_ID"),
            "step": os.environ.get("SLURM_STEP_ID"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "pid": str(os.getpid())}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(info).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, args.port), Health)

    def on_term(signum: int, frame: FrameType | None) -> None:
        print("stopping on SIGTERM", flush=True)
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else on_term)
    if args.exit_after is not None:
        def leave() -> None:
            time.sleep(args.exit_after)
            print(f"exiting with {args.exit_code}", flush=True)
            os._exit(args.exit_code)
        threading.Thread(target=leave, daemon=True).start()
    print(f"listening on {address}:{args.port} node={node} step={info['job']}.{info['step']} "
          f"cuda={info['cuda']} pid={os.getpid()}", flush=True)
    server.serve_forever(poll_interval=0.05)
    server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()

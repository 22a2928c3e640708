#!/usr/bin/env python3
"""Ends a Dynamo worker that can no longer serve, so that its supervisor starts it again (or `status` names it).

Shipped in the release as probes/worker_watch.py; a worker's run script starts it beside the worker (same
session, so it stops with it). It ends the worker with SIGKILL (a clean exit would not be restarted by systemd,
Restart=on-failure) in two cases:

- **Its engine died inside a live process.** Dynamo's engines run on tokio tasks: a Rust panic in one (seen:
  Dynamo 1.6.1's mocker, aisimulate-core 0.13.0 `host_offload/tier.rs:1222`) ends the engine, while the process,
  its /health (200, `ready`, every endpoint `ready`, canary health checks on) and its discovery entry live on.
  Requests routed to it then fail. The one sign is the panic's line on the worker's stderr, which both
  supervisors append to the service's log file: the watch follows the file its worker's stderr is open on
  (/proc/PID/fd/2), from where it stood when the watch started, and a line with Rust's `panicked at` ends it.
- **The frontend stopped listing it** (with --url and --expect, when discovery is Dynamo's file store). That
  store lets any process delete an entry its owner has not refreshed for 10 s, and the owner never writes it
  back: a worker stalled that long runs on, answering its own /health, while the frontend routes nothing to
  it. Once the listing has held --expect (the worker's request-plane address), its absence for --grace seconds
  in a row ends the worker. A listing it cannot read (the frontend restarting) counts as neither. On etcd a
  worker whose lease lapses ends itself.

Every --interval seconds it looks. It exits when the worker exits, and on SIGTERM (primectl ends it before it
drains the worker). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import urllib.request
from typing import IO

PANIC = b"panicked at"  # Rust's panic message: "thread '<name>' (<tid>) panicked at <file>:<line>:<col>:"
LINE_MAX = 1 << 16


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def listing(url: str) -> bytes | None:
    """The frontend's listing, None when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return bytes(resp.read(8 << 20))
    except (OSError, ValueError):
        return None


class StderrFollower:
    """The lines the worker writes to its stderr from now on, where that is a regular file (a log)."""

    def __init__(self, pid: int):
        self.file: IO[bytes] | None = None
        self.partial = b""
        try:
            path = os.readlink(f"/proc/{pid}/fd/2")
        except OSError:
            return
        if os.path.isfile(path):
            self.file = open(path, "rb")  # kept open while the worker runs
            self.file.seek(0, os.SEEK_END)

    def new_lines(self) -> list[bytes]:
        """Complete lines appended since the last call (a line longer than LINE_MAX is cut)."""
        if self.file is None:
            return []
        data = self.partial + self.file.read()
        *lines, self.partial = data.split(b"\n")
        self.partial = self.partial[-LINE_MAX:]
        return lines


def end(pid: int, why: str) -> None:
    """Say why on the worker's log, then SIGKILL it."""
    print(f"primectl worker_watch: {why}; ending pid {pid} so that it starts again", flush=True)
    os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pid", type=int, required=True, help="the worker's pid")
    ap.add_argument("--url", help="the frontend's listing (Dynamo's /health); with --expect")
    ap.add_argument("--expect", help="what the listing holds while it lists the worker")
    ap.add_argument("--grace", type=float, default=30.0, help="seconds unlisted before the worker is ended")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between looks")
    ap.add_argument("--no-panic-check", action="store_true", help="do not follow the worker's stderr")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    stderr = None if args.no_panic_check else StderrFollower(args.pid)
    expect = args.expect.encode() if args.url and args.expect else None
    seen = False
    missing_since: float | None = None
    while alive(args.pid):
        time.sleep(args.interval)
        panic = next((line for line in (stderr.new_lines() if stderr else []) if PANIC in line), None)
        if panic is not None and alive(args.pid):
            end(args.pid, "the engine panicked inside the worker, which would go on answering /health while every "
                          f"request routed to it fails ({panic.decode(errors='replace').strip()[:300]})")
            return 0
        if expect is None:
            continue
        body = listing(args.url)
        if body is None:
            continue
        if expect in body:
            seen, missing_since = True, None
            continue
        if not seen:  # not registered yet: a worker still starting
            continue
        now = time.monotonic()
        missing_since = missing_since or now
        if now - missing_since >= args.grace and alive(args.pid):
            end(args.pid, f"the frontend ({args.url}) has not listed this worker ({args.expect}) for "
                          f"{now - missing_since:.0f}s: its discovery registration is gone (the file store drops an "
                          "entry not refreshed for 10 s, and the worker never writes it back)")
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

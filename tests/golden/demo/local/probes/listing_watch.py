#!/usr/bin/env python3
"""Ends a Dynamo worker that the frontend has stopped listing, so that its supervisor starts it again.

Shipped in the release as probes/listing_watch.py; a worker's run script starts it beside the worker (same
session, so it stops with it) when discovery is Dynamo's file store. That store lets any process delete an
entry its owner has not refreshed for 10 s, and the owner never writes it back: a worker stalled that long
(a paused VM, a disk that blocked it) runs on, answering its own /health, while the frontend routes nothing
to it. On etcd the worker ends itself when its lease lapses; this gives the file store the same end.

Every --interval seconds it reads the frontend's listing (--url, Dynamo's /health). Once the listing has
held --expect (the worker's request-plane address), its absence for --grace seconds in a row ends the worker
with SIGKILL: a clean exit would not be restarted by systemd (Restart=on-failure), and nothing is routed to
the worker any more. A listing it cannot read (the frontend restarting) counts as neither. It exits when the
worker exits, and on SIGTERM (primectl ends it before it drains the worker). Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import urllib.request


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pid", type=int, required=True, help="the worker's pid")
    ap.add_argument("--url", required=True, help="the frontend's listing (Dynamo's /health)")
    ap.add_argument("--expect", required=True, help="what the listing holds while it lists the worker")
    ap.add_argument("--grace", type=float, default=30.0, help="seconds unlisted before the worker is ended")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between reads of the listing")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    expect = args.expect.encode()
    seen = False
    missing_since: float | None = None
    while alive(args.pid):
        time.sleep(args.interval)
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
            print(f"primectl listing_watch: the frontend ({args.url}) has not listed this worker ({args.expect}) for "
                  f"{now - missing_since:.0f}s: its discovery registration is gone (the file store drops an entry "
                  f"not refreshed for 10 s, and the worker never writes it back); ending pid {args.pid} so that "
                  "it starts again and registers", flush=True)
            os.kill(args.pid, signal.SIGKILL)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

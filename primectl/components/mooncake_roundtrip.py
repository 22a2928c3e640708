#!/usr/bin/env python3
"""Readiness probe for the Mooncake tier: put a value through the master and read it back.

Runs on the host with the runtime's Python (it imports `mooncake.store`);
exits 0 when the value comes back intact, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> int:
    """Set up a store client, put a random value, get it back, compare."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--master", required=True, help="host:port of mooncake_master's RPC server")
    ap.add_argument("--metadata", required=True, help="http://host:port/metadata")
    ap.add_argument("--local-hostname", required=True)
    ap.add_argument("--protocol", default="tcp")
    args = ap.parse_args()

    # The transfer engine skips loopback when it looks for an address to bind;
    # name the host's own address explicitly (a loopback-only host has no other).
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", args.local_hostname)
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup(args.local_hostname, args.metadata, 16 * 1024 * 1024, 16 * 1024 * 1024,
                     args.protocol, "", args.master)
    if rc != 0:
        print(f"mooncake store setup failed: rc={rc}", file=sys.stderr)
        return 1
    key = f"primectl-probe-{os.getpid()}-{time.time_ns()}"
    value = os.urandom(4096)
    try:
        rc = store.put(key, value)
        if rc != 0:
            print(f"put failed: rc={rc}", file=sys.stderr)
            return 1
        got = store.get(key)
        if bytes(got) != value:
            print(f"get returned {len(got)} bytes that differ from the {len(value)} put", file=sys.stderr)
            return 1
        store.remove(key, force=True)  # a plain remove fails while the read lease holds
    finally:
        store.close()
    print(f"mooncake round trip ok ({len(value)} bytes via {args.master})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""NIXL transfer probe for `primectl preflight`, run with the host runtime's Python on both ends.

    serve --meta FILE [--mem DRAM|VRAM] [--gpu N] [--mib M] [--timeout S]
        (prefill side) registers a buffer filled with a known pattern, writes its agent
        metadata and buffer descriptor to FILE (atomically), then waits until the reader
        notifies it (or the timeout passes) and exits.
    read --meta FILE [--mem DRAM|VRAM] [--gpu N] [--iters K]
        (decode side) loads that metadata, READs the whole buffer K times over UCX, checks
        every byte, notifies the target and prints one JSON line with the bandwidth.

The controller moves FILE from one host to the other. Exit 0 ok, 1 failed (JSON says why).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import time
from typing import Any


def _buffer(mem: str, gpu: int, nbytes: int, seed: int | None) -> tuple[Any, int, int]:
    """(keep-alive object, address, device id); filled with the pattern when seed is given."""
    if mem == "VRAM":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("VRAM probe: torch.cuda is not available in the runtime")
        t = torch.zeros(nbytes, dtype=torch.uint8, device=f"cuda:{gpu}")
        if seed is not None:
            t.copy_(_pattern_torch(nbytes, seed).to(t.device))
        return t, int(t.data_ptr()), gpu
    import numpy as np

    a = np.zeros(nbytes, dtype=np.uint8)
    if seed is not None:
        a[:] = _pattern_np(nbytes, seed)
    return a, int(a.ctypes.data), 0


def _pattern_np(nbytes: int, seed: int) -> Any:
    import numpy as np

    # a 251-byte period (prime, so it never lines up with page or block sizes), rotated by the seed
    return np.resize(np.roll(np.arange(251, dtype=np.uint8), seed), nbytes)


def _pattern_torch(nbytes: int, seed: int) -> Any:
    import torch

    return torch.from_numpy(_pattern_np(nbytes, seed))


PROGRESS_DELAY_US = 1000
"""The progress thread's poll timeout for DRAM probes. NIXL's Python API hard-codes 0, a thread that spins a core
for the agent's whole life (primectl/bridges/nixl_progress_bridge.py): each probe pair burnt ~3 s of CPU, most of
it waiting for the other side to start. VRAM probes keep upstream's spin, as the GPU workers do."""


def _agent(name: str, mem: str) -> Any:
    from nixl_cu12 import _api

    config = _api.nixl_agent_config(backends=["UCX"])
    if mem == "VRAM":
        return _api.nixl_agent(name, config)
    original = _api.nixlBind.nixlAgent

    def with_delay(agent_name: str, agent_config: Any) -> Any:
        agent_config.pthrDelay = PROGRESS_DELAY_US
        return original(agent_name, agent_config)

    _api.nixlBind.nixlAgent = with_delay
    try:
        return _api.nixl_agent(name, config)
    finally:
        _api.nixlBind.nixlAgent = original


def serve(args: argparse.Namespace) -> dict[str, Any]:
    nbytes = args.mib * 1024 * 1024
    seed = os.getpid() % 251
    agent = _agent(f"primectl-preflight-target-{os.getpid()}", args.mem)
    keep, addr, dev = _buffer(args.mem, args.gpu, nbytes, seed)
    agent.register_memory([(addr, nbytes, dev, "")], args.mem)
    doc = {"agent": agent.name, "metadata": base64.b64encode(agent.get_agent_metadata()).decode(),
           "addr": addr, "nbytes": nbytes, "dev": dev, "mem": args.mem, "seed": seed}
    tmp = f"{args.meta}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, args.meta)
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        notifs = agent.get_new_notifs()
        if any(b"done" in m for msgs in notifs.values() for m in msgs):
            del keep
            return {"ok": True, "served": nbytes}
        time.sleep(0.01)
    return {"ok": False, "error": f"no reader finished within {args.timeout:g}s"}


def read(args: argparse.Namespace) -> dict[str, Any]:
    with open(args.meta) as f:
        doc = json.load(f)
    nbytes = int(doc["nbytes"])
    agent = _agent(f"primectl-preflight-reader-{os.getpid()}", args.mem)
    keep, addr, dev = _buffer(args.mem, args.gpu, nbytes, None)
    agent.register_memory([(addr, nbytes, dev, "")], args.mem)
    remote = agent.add_remote_agent(base64.b64decode(doc["metadata"]))
    local_d = agent.get_xfer_descs([(addr, nbytes, dev)], args.mem)
    remote_d = agent.get_xfer_descs([(int(doc["addr"]), nbytes, int(doc["dev"]))], doc["mem"])
    times: list[float] = []
    for i in range(args.iters + 1):  # the first READ also sets up the UCX endpoint: not timed
        handle = agent.initialize_xfer("READ", local_d, remote_d, remote, b"")
        t0 = time.perf_counter()
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        dt = time.perf_counter() - t0
        agent.release_xfer_handle(handle)
        if state != "DONE":
            return {"ok": False, "error": f"READ {i} ended in state {state}"}
        if i:
            times.append(dt)
    if args.mem == "VRAM":
        import torch

        torch.cuda.synchronize()
        got = keep.cpu().numpy()
    else:
        got = keep
    bad = int((got != _pattern_np(nbytes, int(doc["seed"]))).sum())
    agent.send_notif(remote, b"done")
    time.sleep(0.1)  # let the notification leave before the agent goes away
    if bad:
        return {"ok": False, "error": f"{bad} of {nbytes} bytes read differ from what the target holds"}
    med = statistics.median(times)
    return {"ok": True, "bytes": nbytes, "iters": len(times), "median_s": med,
            "gb_s": round(nbytes / med / 1e9, 3), "best_gb_s": round(nbytes / min(times) / 1e9, 3),
            "mem": args.mem, "remote_mem": doc["mem"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["serve", "read"])
    ap.add_argument("--meta", required=True)
    ap.add_argument("--mem", choices=["DRAM", "VRAM"], default="DRAM")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    try:
        result = serve(args) if args.mode == "serve" else read(args)
    except Exception as exc:  # reported to the controller as one JSON line
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())

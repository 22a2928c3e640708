"""Self-test of the kernels against the PyTorch reference: ``python -m primectl_kernels.selftest``.

Exit codes: 0 = all checks pass, 1 = bad numerics (or a check crashed),
3 = no GPU present (pass ``--allow-cpu`` to run small shapes under the Triton
interpreter instead).  ``--json`` prints one JSON object for preflight checks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from primectl_kernels import compiled_gpu

EXIT_OK = 0
EXIT_NUMERICS = 1
EXIT_NO_GPU = 3


@dataclass
class Check:
    """Outcome of one self-test check."""

    name: str
    passed: bool
    max_err: float
    tol: float
    seconds: float
    detail: str = ""


def _run_checks(device: str, small: bool) -> list[Check]:
    import torch

    from primectl_kernels import codec, decode, reference

    checks: list[Check] = []
    g = torch.Generator().manual_seed(1234)

    def timed(name: str, tol: float, fn: Callable[[], tuple[float, str]]) -> None:
        t0 = time.perf_counter()
        try:
            err, detail = fn()
            if device == "cuda":
                torch.cuda.synchronize()
            ok = math.isfinite(err) and err <= tol
        except Exception as exc:  # a crash is a failed check, reported with its message
            err, detail, ok = float("nan"), f"{type(exc).__name__}: {exc}", False
        checks.append(Check(name, ok, err, tol, time.perf_counter() - t0, detail))

    n_tok = 64 if small else 4096
    lat = (torch.randn(n_tok, 512, generator=g) * torch.logspace(-3, 3, n_tok).unsqueeze(1)).to(torch.bfloat16)
    rope = (torch.randn(n_tok, 64, generator=g) * 4).to(torch.bfloat16)
    lat_d, rope_d = lat.to(device), rope.to(device)

    def mismatches(a: torch.Tensor, b: torch.Tensor) -> tuple[float, str]:
        bad = int((a.cpu() != b).sum())
        return float(bad), f"{bad} of {b.numel()} bytes differ"

    timed(
        "quantize_nvfp4 (bytes vs reference)",
        0.0,
        lambda: mismatches(codec.quantize_nvfp4(lat_d, rope_d), reference.quantize_nvfp4_ref(lat, rope)),
    )
    timed(
        "quantize_fp8 (bytes vs reference)",
        0.0,
        lambda: mismatches(codec.quantize_fp8(lat_d, rope_d), reference.quantize_fp8_ref(lat, rope)),
    )
    rows4 = reference.quantize_nvfp4_ref(lat, rope)
    rows8 = reference.quantize_fp8_ref(lat, rope)

    def maxdiff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, str]:
        return float((a.cpu() - b).abs().max()), ""

    timed(
        "dequantize_nvfp4 (vs reference)",
        0.0,
        lambda: maxdiff(codec.dequantize_nvfp4(rows4.to(device)), reference.dequantize_nvfp4_ref(rows4)),
    )
    timed(
        "dequantize_fp8 (vs reference)",
        0.0,
        lambda: maxdiff(codec.dequantize_fp8(rows8.to(device)), reference.dequantize_fp8_ref(rows8)),
    )

    # decode
    if small:
        t, h, topk, num_blocks, block_size = 3, 16, 96, 8, 32
    else:
        t, h, topk, num_blocks, block_size = 15, 16, 2048, 256, 64
    n_rows = num_blocks * block_size
    lat_c = torch.randn(n_rows, 512, generator=g) * 1.5
    rope_c = torch.randn(n_rows, 64, generator=g)
    cache4 = reference.quantize_nvfp4_ref(lat_c, rope_c).view(num_blocks, block_size, -1)
    cache8 = reference.quantize_fp8_ref(lat_c, rope_c).view(num_blocks, block_size, -1)
    idx = torch.stack([torch.randperm(n_rows, generator=g)[:topk] for _ in range(t)]).to(torch.int32)
    idx[:, ::5] = -1  # empty slots
    idx[-1, topk // 2 :] = -1
    q = (torch.randn(t, h, 576, generator=g) * 2).to(torch.bfloat16)
    sm = 1.0 / math.sqrt(576)
    tol = 4e-3
    ref4 = reference.sparse_mla_decode_ref(q, cache4, idx, sm, "nvfp4")
    ref8 = reference.sparse_mla_decode_ref(q, cache8, idx, sm, "fp8")
    ref_staged = reference.sparse_mla_decode_ref(q, reference.restage_nvfp4_to_fp8_ref(cache4), idx, sm, "fp8")
    assert isinstance(ref4, torch.Tensor) and isinstance(ref8, torch.Tensor) and isinstance(ref_staged, torch.Tensor)
    q_d, i_d, c4_d, c8_d = q.to(device), idx.to(device), cache4.to(device), cache8.to(device)

    def dec(fn: Any, cache: torch.Tensor, ref: torch.Tensor) -> tuple[float, str]:
        out = fn(q_d, cache, i_d, sm)
        return float((out.cpu() - ref).abs().max()), f"T={t} H={h} topk={topk}"

    timed("decode nvfp4 native (vs reference)", tol, lambda: dec(decode.decode_nvfp4_native, c4_d, ref4))
    timed("decode nvfp4 staged (vs reference)", tol, lambda: dec(decode.decode_nvfp4_staged, c4_d, ref_staged))
    timed("decode fp8 (vs reference)", tol, lambda: dec(decode.decode_fp8, c8_d, ref8))
    return checks


def main(argv: list[str] | None = None) -> int:
    """Run the self-test; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="python -m primectl_kernels.selftest", description=__doc__)
    ap.add_argument(
        "--allow-cpu", action="store_true", help="without a GPU, run small shapes under the Triton interpreter"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args(argv)

    interpret_env = os.environ.get("TRITON_INTERPRET", "0") == "1"
    gpu = compiled_gpu()
    if not gpu and not args.allow_cpu:
        msg = "no GPU present: kernels selftest needs CUDA (pass --allow-cpu to run under the Triton interpreter)"
        if args.json:
            print(json.dumps({"status": "no_gpu", "exit_code": EXIT_NO_GPU, "message": msg}))
        else:
            print(f"kernels selftest: {msg}", file=sys.stderr)
        return EXIT_NO_GPU
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import
        if "triton" in sys.modules and not interpret_env:
            print("kernels selftest: triton was imported before TRITON_INTERPRET could be set", file=sys.stderr)
            return EXIT_NUMERICS
    mode = "gpu" if gpu else "cpu-interpreter"
    device = "cuda" if gpu else "cpu"
    device_name = "cpu"
    if gpu:
        import torch

        device_name = torch.cuda.get_device_name()

    t0 = time.perf_counter()
    checks = _run_checks(device, small=not gpu)
    total = time.perf_counter() - t0
    ok = all(c.passed for c in checks)
    code = EXIT_OK if ok else EXIT_NUMERICS
    if args.json:
        print(
            json.dumps(
                {
                    "status": "pass" if ok else "fail",
                    "exit_code": code,
                    "mode": mode,
                    "device": device_name,
                    "seconds": round(total, 3),
                    "checks": [asdict(c) for c in checks],
                }
            )
        )
    else:
        print(
            f"kernels selftest: mode={mode} device={device_name}"
            + (" (Triton interpreter, small shapes)" if not gpu else "")
        )
        for c in checks:
            status = "PASS" if c.passed else "FAIL"
            extra = f"  [{c.detail}]" if c.detail else ""
            print(
                f"  {status}  {c.name:<40s} max_err={c.max_err:.3e} tol={c.tol:.1e}"
                f" time={c.seconds * 1e3:8.1f} ms{extra}"
            )
        print(f"kernels selftest: {'PASS' if ok else 'FAIL'} ({len(checks)} checks, {total:.1f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())

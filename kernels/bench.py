"""GPU benchmark of the sparse MLA decode variants and the codecs: ``python -m kernels.bench``.

Times the native NVFP4, staged NVFP4 and FP8 decode kernels at T=15 query
tokens x 2,048 selected positions x 16 heads, sweeps T, times the codecs, and
reports achieved bandwidth (bytes the kernel must read / time) against the HBM
roofline of the detected device (H200 4.8 TB/s, B200/GB200 8 TB/s; otherwise
"unknown").  FlashMLA / FlashInfer are compared when importable.  Without a
GPU it exits with code 3.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable
from typing import Any

EXIT_NO_GPU = 3
SWEEP_T = (1, 2, 4, 8, 15, 20, 32, 35, 64)


def hbm_peak_bytes_per_s(name: str) -> float | None:
    """Peak HBM bandwidth for known devices (from the project facts), else ``None``."""
    n = name.upper()
    if "H200" in n:
        return 4.8e12
    if "GB200" in n or "B200" in n:
        return 8.0e12
    return None


def _bench(fn: Callable[[], Any], rep_ms: int) -> float:
    """Median microseconds per call (triton.testing.do_bench, CUDA-event timed)."""
    import triton.testing

    ms = triton.testing.do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median")
    return float(ms) * 1e3


def _decode_bytes(t: int, h: int, valid_rows: int, row_bytes: int, staged: bool) -> int:
    """Bytes a decode launch must move at minimum: q, indices, selected rows, output."""
    q = t * h * 576 * 2
    idx = valid_rows * 4
    out = t * h * 512 * 4
    rows = valid_rows * row_bytes
    if staged:  # read nvfp4 rows, write + read the 656-byte fp8 staging rows
        rows = valid_rows * (352 + 2 * 656)
    return q + idx + out + rows


def _comparisons(q: Any, idx: Any, t: int, h: int, topk: int, sm: float, rep_ms: int) -> dict[str, str]:
    """Best-effort timings of FlashMLA / FlashInfer sparse MLA decode (guarded imports)."""
    import torch

    res: dict[str, str] = {}
    try:
        import flash_mla
    except ImportError:
        res["flash_mla"] = "not installed"
    else:
        try:
            # FlashMLA sparse FP8 decode: kvcache [num_blocks, 64, 1, 656] uint8, indices [B, s_q, topk]
            blocks = max(1, math.ceil((int(idx.max()) + 1) / 64))
            kv = torch.zeros(blocks, 64, 1, 656, dtype=torch.uint8, device="cuda")
            qq = q.view(t, 1, h, 576)
            ii = idx.view(t, 1, topk)
            meta, splits = flash_mla.get_mla_metadata(
                torch.full((t,), blocks * 64, dtype=torch.int32, device="cuda"), h, 1, topk=topk, is_fp8_kvcache=True
            )

            def run() -> Any:
                return flash_mla.flash_mla_with_kvcache(
                    qq,
                    kv,
                    None,
                    None,
                    512,
                    meta,
                    splits,
                    softmax_scale=sm,
                    causal=False,
                    is_fp8_kvcache=True,
                    indices=ii,
                )

            res["flash_mla"] = f"{_bench(run, rep_ms):.1f} us (fp8 sparse)"
        except Exception as exc:  # API drift across versions: report, don't fail the bench
            res["flash_mla"] = f"failed: {type(exc).__name__}: {exc}"[:200]
    try:
        import flashinfer
    except ImportError:
        res["flashinfer"] = "not installed"
    else:
        has = hasattr(flashinfer, "decode") and hasattr(flashinfer.decode, "trtllm_batch_decode_with_kv_cache_mla")
        res["flashinfer"] = f"installed ({getattr(flashinfer, '__version__', '?')}); trtllm sparse MLA decode " + (
            "present (SM100+ only, not timed here)" if has else "absent"
        )
    return res


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="python -m kernels.bench", description=__doc__)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--cache-tokens", type=int, default=131072, help="rows in the paged cache")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--fill", type=float, default=1.0, help="fraction of valid (non -1) slots")
    ap.add_argument("--rep-ms", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("kernels bench: torch is not installed", file=sys.stderr)
        return EXIT_NO_GPU
    if not torch.cuda.is_available():
        print(
            "kernels bench: no GPU present; the benchmark needs CUDA (use `python -m kernels.selftest "
            "--allow-cpu` for a CPU correctness run)",
            file=sys.stderr,
        )
        return EXIT_NO_GPU

    from kernels import codec, decode, reference

    name = torch.cuda.get_device_name()
    peak = hbm_peak_bytes_per_s(name)
    peak_txt = f"{peak / 1e12:.1f} TB/s" if peak else "unknown"
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(0)
    h, topk = args.heads, args.topk
    n_rows = args.cache_tokens
    nb = math.ceil(n_rows / args.block_size)
    lat = torch.randn(nb * args.block_size, 512, generator=g).to(dev, torch.bfloat16)
    rope = torch.randn(nb * args.block_size, 64, generator=g).to(dev, torch.bfloat16)
    cache4 = codec.quantize_nvfp4(lat, rope).view(nb, args.block_size, 352)
    cache8 = codec.quantize_fp8(lat, rope).view(nb, args.block_size, 656)
    sm = 1.0 / math.sqrt(576)
    results: dict[str, Any] = {
        "device": name,
        "hbm_peak": peak_txt,
        "heads": h,
        "topk": topk,
        "fill": args.fill,
        "decode": [],
        "codec": [],
        "compare": {},
    }

    def make(t: int) -> tuple[Any, Any, int]:
        idx = torch.stack([torch.randperm(nb * args.block_size, generator=g)[:topk] for _ in range(t)]).to(torch.int32)
        if args.fill < 1.0:
            idx[:, int(topk * args.fill) :] = -1
        valid = int((idx >= 0).sum())
        q = torch.randn(t, h, 576, generator=g).to(dev, torch.bfloat16)
        return q, idx.to(dev), valid

    variants: list[tuple[str, Callable[..., Any], Any, int, bool]] = [
        ("nvfp4_native", decode.decode_nvfp4_native, cache4, 352, False),
        ("nvfp4_staged", decode.decode_nvfp4_staged, cache4, 352, True),
        ("fp8", decode.decode_fp8, cache8, 656, False),
    ]
    print(f"device: {name}; HBM roofline: {peak_txt}; heads={h} topk={topk} fill={args.fill}")
    print(f"{'T':>4} {'variant':<14} {'us':>9} {'GB/s':>9} {'% roof':>7}  max_err_vs_ref")
    ts = sorted(set(SWEEP_T) | {15})
    for t in ts:
        q, idx, valid = make(t)
        for vname, fn, cache, rb, staged in variants:
            us = _bench(functools.partial(fn, q, cache, idx, sm), args.rep_ms)
            nbytes = _decode_bytes(t, h, valid, rb, staged)
            bw = nbytes / (us * 1e-6)
            frac = f"{100 * bw / peak:6.1f}%" if peak else "   n/a"
            err = ""
            if t == 15:
                fmt = "fp8" if vname == "fp8" else "nvfp4"
                ref_cache = reference.restage_nvfp4_to_fp8_ref(cache.cpu()) if staged else cache.cpu()
                ref = reference.sparse_mla_decode_ref(q.cpu(), ref_cache, idx.cpu(), sm, "fp8" if staged else fmt)
                assert isinstance(ref, torch.Tensor)
                err = f"{float((fn(q, cache, idx, sm).cpu() - ref).abs().max()):.2e}"
            print(f"{t:>4} {vname:<14} {us:9.1f} {bw / 1e9:9.1f} {frac:>7}  {err}")
            results["decode"].append(
                {"T": t, "variant": vname, "us": us, "bytes": nbytes, "GBps": bw / 1e9, "max_err": err}
            )
        if t == 15:
            results["compare"] = _comparisons(q, idx, t, h, topk, sm, args.rep_ms)
            for k, v in results["compare"].items():
                print(f"  compare {k}: {v}")

    print("codec (tokens x us, GB/s of bytes read+written):")
    for n in (16, 256, 4096):
        lt, rp = lat[:n], rope[:n]
        rows4, rows8 = cache4.view(-1, 352)[:n], cache8.view(-1, 656)[:n]
        codec_cases: list[tuple[str, Callable[[], Any], int]] = [
            ("quantize_nvfp4", functools.partial(codec.quantize_nvfp4, lt, rp), n * (1152 + 352)),
            ("quantize_fp8", functools.partial(codec.quantize_fp8, lt, rp), n * (1152 + 656)),
            ("dequantize_nvfp4", functools.partial(codec.dequantize_nvfp4, rows4), n * (352 + 2304)),
            ("dequantize_fp8", functools.partial(codec.dequantize_fp8, rows8), n * (656 + 2304)),
        ]
        for cname, fn2, nbytes in codec_cases:
            us = _bench(fn2, args.rep_ms)
            print(f"  {cname:<17} n={n:<5} {us:8.1f} us {nbytes / (us * 1e-6) / 1e9:8.1f} GB/s")
            results["codec"].append({"op": cname, "n": n, "us": us, "GBps": nbytes / (us * 1e-6) / 1e9})
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

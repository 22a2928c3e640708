"""GPU benchmark of the sparse MLA decode variants and the codecs: ``python -m primectl_kernels.bench``.

Times the native NVFP4, staged NVFP4 and FP8 decode kernels at T=15 query
tokens x 2,048 selected positions x 16 heads, sweeps T, times the codecs, and
reports achieved bandwidth (bytes the launch must move / time) against the HBM
roofline of the detected device (datasheet: H200 4.8 TB/s, B200/GB200 8 TB/s)
and against a device-to-device copy measured in the same run.

How it times: each measurement captures one CUDA graph that calls the kernel
on several independent input sets (different queries and row indices into a
cache far larger than L2, enough sets that their rows exceed L2 three times
over), replays it, and reports the median device time per call.  This is the
time a serving engine that replays graphs sees; the eager time at T=15
(``triton.testing.do_bench``, host launch included) is reported beside it.

``--tune`` first searches tile size, warps, pipelining and split count at T=15
for each kernel and uses the winners for everything after.  Without a GPU it
exits with code 3, unless ``--allow-cpu`` is given: then every code path runs at
toy sizes under the Triton interpreter with wall-clock timings, which checks
the benchmark itself and says nothing about speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from primectl_kernels import compiled_gpu

EXIT_NO_GPU = 3
SWEEP_T = (1, 2, 4, 8, 15, 20, 32, 35, 64)
SPLIT_CANDIDATES: tuple[int | None, ...] = (None, 4, 8, 16, 32, 64)
VARIANTS = ("nvfp4_native", "nvfp4_staged", "fp8")


def hbm_peak_bytes_per_s(name: str) -> float | None:
    """Datasheet HBM bandwidth for known devices, else ``None``."""
    n = name.upper()
    if "H200" in n:
        return 4.8e12
    if "GB200" in n or "B200" in n:
        return 8.0e12
    if "H100" in n:
        return 3.35e12
    return None


def default_tuning(variant: str) -> Any:
    """The decode module's default launch for a benchmark variant (staged runs the fp8 kernel)."""
    from primectl_kernels import decode

    return decode.DEFAULT_TUNINGS["nvfp4" if variant == "nvfp4_native" else "fp8"]


def decode_bytes(t: int, h: int, valid_rows: int, row_bytes: int, staged: bool) -> int:
    """Bytes a decode launch must move at minimum: q, indices, selected rows, FP32 output.

    For the staged variant the selected nvfp4 rows are read, written as 656-byte
    fp8 rows and read again.
    """
    q = t * h * 576 * 2
    idx = valid_rows * 4
    out = t * h * 512 * 4
    rows = valid_rows * row_bytes
    if staged:
        rows = valid_rows * (352 + 2 * 656)
    return q + idx + out + rows


def wall_us(calls: Sequence[Callable[[], Any]]) -> float:
    """Wall-clock microseconds per call, one pass (the CPU / interpreter stand-in for :func:`graph_us`)."""
    t0 = time.perf_counter()
    for c in calls:
        c()
    return (time.perf_counter() - t0) * 1e6 / max(len(calls), 1)


def graph_us(calls: Sequence[Callable[[], Any]], reps: int = 20) -> float:
    """Median device microseconds per call: one CUDA graph runs every call once per replay."""
    import torch

    if not compiled_gpu():
        return wall_us(calls)

    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile / autotune outside the capture
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(calls))
    del graph
    return float(statistics.median(times))


def eager_us(fn: Callable[[], Any], rep_ms: int = 100) -> float:
    """Median microseconds per eager call (``do_bench``: L2 flushed, host launch included)."""
    import triton.testing

    if not compiled_gpu():
        return wall_us([fn])
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")) * 1e3


def copy_bandwidth(device: str) -> float:
    """Measured device-to-device copy bandwidth in bytes/s (bytes read + written), 1 GiB buffers."""
    import torch

    n = 1 << 30 if device == "cuda" else 1 << 24
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    us = graph_us([lambda: dst.copy_(src)], reps=10)
    return 2 * n / (us * 1e-6)


@dataclasses.dataclass
class Case:
    """Inputs for one decode measurement: several independent (q, indices) sets."""

    t: int
    fill: float
    qs: list[Any]
    idxs: list[Any]
    valid_rows: int  # per set


class Bench:
    """Caches, input sets and timing of the decode variants on one GPU."""

    def __init__(self, heads: int, topk: int, cache_tokens: int, block_size: int, device: str = "cuda", seed: int = 0) -> None:
        import torch

        from primectl_kernels import codec

        self.torch = torch
        self.device = device
        self.h, self.topk, self.block_size = heads, topk, block_size
        self.nb = math.ceil(cache_tokens / block_size)
        self.n_rows = self.nb * block_size
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)) if device == "cuda" else 1
        lat = torch.randn(self.n_rows, 512, generator=self.gen, device=device).to(torch.bfloat16)
        rope = torch.randn(self.n_rows, 64, generator=self.gen, device=device).to(torch.bfloat16)
        self.cache4 = codec.quantize_nvfp4(lat, rope).view(self.nb, block_size, 352)
        self.cache8 = codec.quantize_fp8(lat, rope).view(self.nb, block_size, 656)
        self.lat, self.rope = lat, rope
        self.sm = 1.0 / math.sqrt(576)

    def case(self, t: int, fill: float, min_sets: int = 4, max_sets: int = 256) -> Case:
        """Enough independent input sets at ``t`` that their rows exceed L2 three times."""
        torch = self.torch
        per_set = t * self.topk * 352 * fill
        sets = int(min(max_sets, max(min_sets, math.ceil(3 * self.l2 / max(per_set, 1)))))
        if self.device != "cuda":
            sets = 1  # no cache to defeat; the interpreter is slow
        qs, idxs = [], []
        valid = 0
        for _ in range(sets):
            idx = torch.stack([torch.randperm(self.n_rows, generator=self.gen, device=self.device)[: self.topk] for _ in range(t)]).to(
                torch.int32
            )
            if fill < 1.0:
                idx[:, int(self.topk * fill) :] = -1
            valid = int((idx >= 0).sum())
            idxs.append(idx)
            qs.append(torch.randn(t, self.h, 576, generator=self.gen, device=self.device).to(torch.bfloat16))
        return Case(t, fill, qs, idxs, valid)

    def fn(self, variant: str) -> tuple[Callable[..., Any], Any, int, bool]:
        """(decode function, cache, row bytes, staged?) of a variant."""
        from primectl_kernels import decode

        if variant == "nvfp4_native":
            return decode.decode_nvfp4_native, self.cache4, 352, False
        if variant == "nvfp4_staged":
            return decode.decode_nvfp4_staged, self.cache4, 352, True
        return decode.decode_fp8, self.cache8, 656, False

    def time(self, variant: str, case: Case, tuning: Any, splits: int | None, reps: int = 20) -> float:
        """Median graph-replay microseconds per decode call."""
        fn, cache, _, _ = self.fn(variant)
        calls = [(lambda q=q, i=i: fn(q, cache, i, self.sm, splits, tuning)) for q, i in zip(case.qs, case.idxs, strict=True)]
        return graph_us(calls, reps)

    def max_err(self, variant: str, case: Case, tuning: Any, splits: int | None) -> float:
        """Max abs error of one call against the FP32 PyTorch reference (on the CPU)."""
        from primectl_kernels import reference

        fn, cache, _, staged = self.fn(variant)
        q, idx = case.qs[0], case.idxs[0]
        out = fn(q, cache, idx, self.sm, splits, tuning).cpu()
        used = idx[idx >= 0].unique()
        flat = cache.view(-1, cache.shape[-1])
        # the reference only needs the selected rows: compact them to keep the CPU work small
        remap = self.torch.full((self.n_rows,), -1, dtype=self.torch.int64, device=self.device)
        remap[used.long()] = self.torch.arange(used.numel(), device=self.device)
        small_idx = self.torch.where(idx >= 0, remap[idx.clamp(min=0).long()], -1).cpu()
        rows = flat[used.long()].cpu().view(1, -1, cache.shape[-1])
        if staged:
            rows = reference.restage_nvfp4_to_fp8_ref(rows)
        fmt = "fp8" if (staged or variant == "fp8") else "nvfp4"
        ref = reference.sparse_mla_decode_ref(q.cpu(), rows, small_idx, self.sm, fmt)
        assert isinstance(ref, self.torch.Tensor)
        return float((out - ref).abs().max())


def tune(
    bench: Bench,
    t: int,
    fill: float,
    candidates: Sequence[Any],
    split_candidates: Sequence[int | None],
    log: Callable[[str], None],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Search tuning x splits at ``t`` for the nvfp4 and fp8 kernels; returns the winners and every row."""

    case = bench.case(t, fill)
    rows: list[dict[str, Any]] = []
    best: dict[str, Any] = {}
    for variant in ("nvfp4_native", "fp8"):
        for tuning in candidates:
            for splits in split_candidates:
                try:
                    us = bench.time(variant, case, tuning, splits, reps=10)
                except Exception as exc:  # a config that fails to compile or launch is reported, not fatal
                    log(f"  tune {variant} {tuning} splits={splits}: failed: {type(exc).__name__}: {exc}"[:300])
                    continue
                rows.append({"variant": variant, "tuning": dataclasses.asdict(tuning), "splits": splits, "us": us})
                if variant not in best or us < best[variant][2]:
                    best[variant] = (tuning, splits, us)
        if variant not in best:
            log(f"  tune {variant}: every candidate failed; keeping the default tuning")
            best[variant] = (default_tuning(variant), None, float("nan"))
            continue
        tuning, splits, us = best[variant]
        log(f"  tune {variant}: best {tuning} splits={splits or 'auto'} {us:.1f} us")
    winners = {"nvfp4_native": best["nvfp4_native"][0], "fp8": best["fp8"][0], "nvfp4_staged": best["fp8"][0]}
    return winners, rows


def comparisons() -> dict[str, str]:
    """Which reference libraries are importable (FlashMLA / FlashInfer); they are not timed here."""
    out: dict[str, str] = {}
    for mod in ("flash_mla", "flashinfer"):
        try:
            m = __import__(mod)
        except ImportError:
            out[mod] = "not installed"
        else:
            out[mod] = f"installed ({getattr(m, '__version__', '?')}); no comparable sparse nvfp4 decode timed"
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="python -m primectl_kernels.bench", description=__doc__)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--topk", type=int, help="selected positions per query (default 2048; 64 with --allow-cpu)")
    ap.add_argument("--cache-tokens", type=int, help="rows in the paged cache (default 1,048,576; 1024 on CPU)")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--fill", type=float, action="append", help="fraction of valid (non -1) slots; repeatable")
    ap.add_argument("--tune", action="store_true", help="search tile/warps/stages/splits at T=15 first")
    ap.add_argument("--candidates", type=int, help="tune over the first N of decode.TUNING_CANDIDATES only (each one compiles twice)")
    ap.add_argument("--sweep", help="comma-separated T values (default 1,2,4,8,15,20,32,35,64; 1,2 on CPU)")
    ap.add_argument("--no-codec", action="store_true", help="skip the codec table and the unfused PyTorch reference")
    ap.add_argument("--json-out", type=Path, help="write every measurement as JSON here")
    ap.add_argument("--allow-cpu", action="store_true", help="without a GPU, run every code path at toy sizes (no speed figures)")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("kernels bench: torch is not installed", file=sys.stderr)
        return EXIT_NO_GPU
    gpu = compiled_gpu()
    if not gpu and not args.allow_cpu:
        print(
            "kernels bench: no GPU present; the benchmark needs CUDA (use `python -m primectl_kernels.selftest "
            "--allow-cpu` for a CPU correctness run)",
            file=sys.stderr,
        )
        return EXIT_NO_GPU
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first triton import
    import triton

    from primectl_kernels import decode

    def log(msg: str) -> None:
        print(msg, flush=True)

    device = "cuda" if gpu else "cpu"
    topk = args.topk or (2048 if gpu else 64)
    cache_tokens = args.cache_tokens or ((1 << 20) if gpu else 1024)
    block_size = args.block_size if gpu else 16
    sweep_txt = args.sweep or (",".join(map(str, SWEEP_T)) if gpu else "1,2")
    t_tune = 15 if gpu else 2
    candidates = decode.TUNING_CANDIDATES[: args.candidates or (None if gpu else 2)]
    split_candidates = SPLIT_CANDIDATES if gpu else (None, 2)
    name = torch.cuda.get_device_name() if gpu else "cpu (Triton interpreter; timings are meaningless)"
    peak = hbm_peak_bytes_per_s(name) if gpu else None
    copy_bw = copy_bandwidth(device)
    fills = args.fill or [1.0]
    sweep = sorted({int(x) for x in sweep_txt.split(",") if x} | {t_tune})
    results: dict[str, Any] = {
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "hbm_peak_GBps": peak / 1e9 if peak else None,
        "copy_GBps": copy_bw / 1e9,
        "heads": args.heads,
        "topk": topk,
        "cache_tokens": cache_tokens,
        "decode": [],
        "tune": [],
        "codec": [],
    }
    log(
        f"device: {name}; torch {torch.__version__}; triton {triton.__version__}; "
        f"HBM datasheet {peak / 1e12 if peak else float('nan'):.2f} TB/s; measured copy {copy_bw / 1e12:.2f} TB/s"
    )
    bench = Bench(args.heads, topk, cache_tokens, block_size, device)
    tunings: dict[str, Any] = {v: default_tuning(v) for v in VARIANTS}
    try:
        if args.tune:
            log(f"tuning at T={t_tune} (median device time per call):")
            tunings, rows = tune(bench, t_tune, fills[0], candidates, split_candidates, log)
            results["tune"] = rows
        results["tunings"] = {v: dataclasses.asdict(t) for v, t in tunings.items()}
        _sweep(bench, sweep, fills, tunings, split_candidates, t_tune, peak, copy_bw, results, log)
        if not args.no_codec:
            _reference_and_codec(bench, t_tune, results, log)
    finally:
        if args.json_out:
            args.json_out.write_text(json.dumps(results, indent=1, default=str))
            log(f"\nwrote {args.json_out}")
    return 0


def _sweep(
    bench: Bench,
    sweep: Sequence[int],
    fills: Sequence[float],
    tunings: dict[str, Any],
    split_candidates: Sequence[int | None],
    t_check: int,
    peak: float | None,
    copy_bw: float,
    results: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """Time every variant at every T (best of the split candidates), with error and eager time at ``t_check``."""
    for fill in fills:
        log(f"\ndecode: heads={bench.h} topk={bench.topk} fill={fill} (us = device time per call, graph replay)")
        log(
            f"{'T':>4} {'variant':<13} {'us':>8} {'splits':>6} {'us@auto':>8} {'GB/s':>8} {'%HBM':>6} {'%copy':>6}"
            f" {'eager us':>9} {'max_err':>9}"
        )
        for t in sweep:
            case = bench.case(t, fill)
            for variant in VARIANTS:
                try:
                    _measure(bench, case, variant, tunings[variant], split_candidates, t == t_check, peak, copy_bw, results, log)
                except Exception as exc:  # one broken variant must not hide the others' numbers
                    log(f"{t:>4} {variant:<13} failed: {type(exc).__name__}: {exc}"[:400])
                    results["decode"].append({"T": t, "fill": fill, "variant": variant, "error": repr(exc)[:400]})


def _measure(
    bench: Bench,
    case: Case,
    variant: str,
    tuning: Any,
    split_candidates: Sequence[int | None],
    check: bool,
    peak: float | None,
    copy_bw: float,
    results: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """Time one variant on one case at every split candidate; record the best (and error / eager time if ``check``)."""
    t = case.t
    fill = case.fill
    _, _, row_bytes, staged = bench.fn(variant)
    timed: dict[int | None, float] = {s: bench.time(variant, case, tuning, s) for s in split_candidates}
    best_splits = min(timed, key=lambda s: timed[s])
    us = timed[best_splits]
    nbytes = decode_bytes(t, bench.h, case.valid_rows, row_bytes, staged)
    bw = nbytes / (us * 1e-6)
    rec: dict[str, Any] = {
        "T": t,
        "fill": fill,
        "variant": variant,
        "us": us,
        "us_auto_splits": timed[None],
        "best_splits": best_splits,
        "bytes": nbytes,
        "GBps": bw / 1e9,
        "pct_hbm": 100 * bw / peak if peak else None,
        "pct_copy": 100 * bw / copy_bw,
    }
    if check:
        fn, cache, _, _ = bench.fn(variant)
        q, idx = case.qs[0], case.idxs[0]
        rec["eager_us"] = eager_us(lambda: fn(q, cache, idx, bench.sm, best_splits, tuning))
        rec["max_err"] = bench.max_err(variant, case, tuning, best_splits)
    log(
        f"{t:>4} {variant:<13} {us:8.1f} {best_splits or 'auto':>6} {timed[None]:8.1f} {bw / 1e9:8.0f}"
        f" {rec['pct_hbm'] or float('nan'):6.1f} {rec['pct_copy']:6.1f}"
        f" {rec.get('eager_us', float('nan')):9.1f} {rec.get('max_err', float('nan')):9.2e}"
    )
    results["decode"].append(rec)


def _reference_and_codec(bench: Bench, t_check: int, results: dict[str, Any], log: Callable[[str], None]) -> None:
    """The unfused PyTorch reference for scale, and the codec timings."""
    from primectl_kernels import codec, reference

    # unfused PyTorch (dequantise the selected rows, then softmax attention) at T=15, for scale
    case = bench.case(t_check, 1.0, min_sets=1, max_sets=1)
    q, idx = case.qs[0], case.idxs[0]
    torch_us = eager_us(lambda: reference.sparse_mla_decode_ref(q, bench.cache4, idx, bench.sm, "nvfp4"), 200)
    results["torch_reference_us"] = torch_us
    log(f"\nunfused PyTorch reference (nvfp4, T={t_check}, eager): {torch_us:.0f} us")
    results["compare"] = comparisons()
    for k, v in results["compare"].items():
        log(f"compare {k}: {v}")

    log("\ncodec (graph replay; GB/s of bytes read + written):")
    for n in (4096, 65536, 262144) if bench.device == "cuda" else (16,):
        if n > bench.n_rows:
            continue
        lt, rp = bench.lat[:n], bench.rope[:n]
        rows4, rows8 = bench.cache4.view(-1, 352)[:n], bench.cache8.view(-1, 656)[:n]
        codec_cases: list[tuple[str, Callable[[], Any], int]] = [
            ("quantize_nvfp4", functools.partial(codec.quantize_nvfp4, lt, rp), n * (1152 + 352)),
            ("quantize_fp8", functools.partial(codec.quantize_fp8, lt, rp), n * (1152 + 656)),
            ("dequantize_nvfp4", functools.partial(codec.dequantize_nvfp4, rows4), n * (352 + 2304)),
            ("dequantize_fp8", functools.partial(codec.dequantize_fp8, rows8), n * (656 + 2304)),
        ]
        for cname, fn2, nbytes in codec_cases:
            us = graph_us([fn2], reps=20)
            gbps = nbytes / (us * 1e-6) / 1e9
            log(f"  {cname:<17} n={n:<7} {us:9.1f} us {gbps:8.0f} GB/s")
            results["codec"].append({"op": cname, "n": n, "us": us, "GBps": gbps})


if __name__ == "__main__":
    sys.exit(main())

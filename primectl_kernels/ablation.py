"""Where the decode time goes: ``python -m primectl_kernels.ablation`` (GPU).

Times, at the decode's own grid, split count and tile size, a kernel that does
only the decode's memory access (``primectl_kernels.gather_probe``) next to the full
decode. The difference is the on-chip work: dequantising, the QK and PV dots,
the online softmax and the merge. Without a GPU it exits with code 3;
``--allow-cpu`` runs it at toy sizes under the interpreter (no speed figures).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

from primectl_kernels import compiled_gpu

EXIT_NO_GPU = 3


def main(argv: list[str] | None = None) -> int:
    """Print gather-only vs full decode time per T and format; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m primectl_kernels.ablation", description=__doc__)
    ap.add_argument("--sweep", default="1,15,64", help="comma-separated T values")
    ap.add_argument("--allow-cpu", action="store_true", help="toy sizes under the Triton interpreter")
    args = ap.parse_args(argv)
    import torch

    gpu = compiled_gpu()
    if not gpu and not args.allow_cpu:
        print("kernels ablation: no GPU present (pass --allow-cpu for a toy run)", file=sys.stderr)
        return EXIT_NO_GPU
    if not gpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before the first triton import
    from primectl_kernels import decode
    from primectl_kernels.bench import Bench, graph_us
    from primectl_kernels.gather_probe import gather_only

    device = "cuda" if gpu else "cpu"
    topk, cache_tokens, block = (2048, 1 << 20, 64) if gpu else (64, 1024, 16)
    bench = Bench(16, topk, cache_tokens, block, device)
    print(f"{'T':>4} {'format':<6} {'splits':>6} {'gather-only us':>15} {'full decode us':>15} {'on-chip share':>14}")
    for t in (int(x) for x in args.sweep.split(",") if x):
        case = bench.case(t, 1.0)
        for fmt, variant, cache, row_bytes in (("nvfp4", "nvfp4_native", bench.cache4, 352), ("fp8", "fp8", bench.cache8, 656)):
            tune = decode.DEFAULT_TUNINGS[fmt]
            splits = decode.choose_num_splits(t, bench.h, topk, torch.device(device), tune)
            calls = [
                functools.partial(gather_only, cache, i, row_bytes, splits, tune.block_n, tune.num_warps)
                for i in case.idxs
            ]
            gather = graph_us(calls)
            full = bench.time(variant, case, tune, None)
            print(f"{t:>4} {fmt:<6} {splits:>6} {gather:15.1f} {full:15.1f} {100 * (full - gather) / full:13.0f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile every kernel for real GPU architectures without a GPU: ``python -m kernels.compile_check``.

The Triton interpreter (what the CPU tests use) accepts code that the GPU
compiler rejects, and it says nothing about registers or spills.  This check
lowers each kernel through Triton's real CUDA pipeline (TTIR -> TTGIR -> LLVM
-> PTX -> cubin, with the ``ptxas`` that ships in the triton wheel) for the
requested SM versions and reports registers, local-memory spills and shared
memory per kernel, read from the cubin with the wheel's ``cuobjdump``.

Exit codes: 0 = everything compiled (and, with ``--no-spills``, nothing
spilled), 1 = a compile failed or spilled, 3 = triton is missing or running
under ``TRITON_INTERPRET=1`` (the interpreter replaces the compiler).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNAVAILABLE = 3

DEFAULT_ARCHS = (90, 100)
_RESOURCE_RE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
# pointer arguments and strides the wrappers pass are 16-byte aligned / multiples
# of 16; Triton specialises those at launch, so the check specialises them too
_DIV16_ARGS = frozenset(
    {
        "q_ptr",
        "cache_ptr",
        "cache_f32_ptr",
        "cache_i16_ptr",
        "idx_ptr",
        "o_ptr",
        "lse_ptr",
        "stride_block",
        "stride_qh",
        "rows_per_split",
        "o_part_ptr",
        "lse_part_ptr",
        "out_ptr",
        "lse_out_ptr",
        "stage_ptr",
        "stage_f32_ptr",
        "stage_i16_ptr",
        "new_idx_ptr",
        "lat_ptr",
        "rope_ptr",
        "out_f32_ptr",
        "out_i16_ptr",
        "rows_ptr",
        "rows_f32_ptr",
        "rows_i16_ptr",
    }
)


@dataclass(frozen=True)
class KernelSpec:
    """One kernel specialisation as the wrappers launch it."""

    label: str
    kernel: Callable[[], Any]  # returns the @triton.jit function (imported lazily)
    arg_types: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int | None = None
    max_registers: int | None = None


@dataclass
class CompileResult:
    """Resources of one compiled kernel (or why it failed)."""

    arch: int
    label: str
    ok: bool
    registers: int = 0
    local_bytes: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    notes: list[str] = field(default_factory=list)


def kernel_specs(all_tunings: bool = False) -> list[KernelSpec]:
    """Every kernel specialisation the codec and decode wrappers launch (decode at each
    format's default tuning, or at every candidate ``kernels.bench --tune`` tries)."""
    from kernels import codec, decode

    dec_types = {
        "q_ptr": "*bf16",
        "cache_ptr": "*u8",
        "cache_f32_ptr": "*fp32",
        "cache_i16_ptr": "*i16",
        "idx_ptr": "*i32",
        "o_ptr": "*fp32",
        "lse_ptr": "*fp32",
        "qk_scale": "fp32",
    }
    specs: list[KernelSpec] = []
    kernels = {"nvfp4": lambda: decode._decode_nvfp4_kernel, "fp8": lambda: decode._decode_fp8_kernel}
    pairs = (
        [(fmt, tune) for tune in decode.TUNING_CANDIDATES for fmt in kernels]
        if all_tunings
        else list(decode.DEFAULT_TUNINGS.items())
    )
    for fmt, tune in pairs:
        consts = {
            "BLOCK_H": decode.BLOCK_H,
            "BLOCK_N": tune.block_n,
            "SKIP_EMPTY": tune.skip_empty_tiles,
            "PREFETCH": tune.prefetch,
        }
        tag = (
            f"n{tune.block_n} w{tune.num_warps} s{tune.num_stages or '-'}"
            f" {'skip' if tune.skip_empty_tiles else 'noskip'}{' pf' if tune.prefetch else ''}"
            f"{f' r{tune.max_registers}' if tune.max_registers else ''}"
        )
        specs.append(
            KernelSpec(
                f"decode_{fmt} [{tag}]", kernels[fmt], dec_types, consts, tune.num_warps, tune.num_stages, tune.max_registers
            )
        )
    specs.append(
        KernelSpec(
            "merge",
            lambda: decode._merge_kernel,
            {"o_part_ptr": "*fp32", "lse_part_ptr": "*fp32", "out_ptr": "*fp32", "lse_out_ptr": "*fp32"},
            {"BLOCK_S": 64, "BLOCK_D": decode.MERGE_BLOCK_D},
        )
    )
    specs.append(
        KernelSpec(
            "stage_nvfp4_to_fp8",
            lambda: decode._stage_nvfp4_to_fp8_kernel,
            {
                "cache_ptr": "*u8",
                "idx_ptr": "*i32",
                "stage_ptr": "*u8",
                "stage_f32_ptr": "*fp32",
                "stage_i16_ptr": "*i16",
                "new_idx_ptr": "*i32",
            },
            {"BLOCK_T": 8},
        )
    )
    quant_types = {
        "lat_ptr": "*bf16",
        "rope_ptr": "*bf16",
        "out_ptr": "*u8",
        "out_f32_ptr": "*fp32",
        "out_i16_ptr": "*i16",
        "slot_ptr": "*i64",
    }
    for fmt_nvfp4, row in ((True, 352), (False, 656)):
        for slots in (False, True):
            specs.append(
                KernelSpec(
                    f"quantize_{'nvfp4' if fmt_nvfp4 else 'fp8'}{' (slot_mapping)' if slots else ''}",
                    lambda: codec._quant_kernel,
                    quant_types,
                    {"HAS_SLOTS": slots, "FMT_NVFP4": fmt_nvfp4, "ROW_BYTES": row, "BLOCK_T": codec.DEFAULT_BLOCK_T},
                )
            )
    specs.append(
        KernelSpec(
            "dequantize_nvfp4",
            lambda: codec._dequant_nvfp4_kernel,
            {"rows_ptr": "*u8", "out_ptr": "*fp32"},
            {"BLOCK_T": codec.DEFAULT_BLOCK_T},
        )
    )
    specs.append(
        KernelSpec(
            "dequantize_fp8",
            lambda: codec._dequant_fp8_kernel,
            {"rows_ptr": "*u8", "rows_f32_ptr": "*fp32", "rows_i16_ptr": "*i16", "out_ptr": "*fp32"},
            {"BLOCK_T": codec.DEFAULT_BLOCK_T},
        )
    )
    return specs


def _cuobjdump() -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def compile_one(spec: KernelSpec, arch: int) -> CompileResult:
    """Compile ``spec`` for ``sm_<arch>`` and read its resource usage from the cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = spec.kernel()
    names = list(fn.arg_names)
    signature = {n: ("constexpr" if n in spec.constexprs else spec.arg_types.get(n, "i32")) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in _DIV16_ARGS}
    options: dict[str, Any] = {"num_warps": spec.num_warps}
    if spec.num_stages is not None:
        options["num_stages"] = spec.num_stages
    if spec.max_registers is not None:
        options["maxnreg"] = spec.max_registers
    res = CompileResult(arch=arch, label=spec.label, ok=False)
    t0 = time.perf_counter()
    try:
        src = ASTSource(fn=fn, signature=signature, constexprs=dict(spec.constexprs), attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as exc:  # a compile error is the result being reported
        res.error = f"{type(exc).__name__}: {exc}".strip()[-2000:]
        res.seconds = time.perf_counter() - t0
        return res
    res.seconds = time.perf_counter() - t0
    res.shared_bytes = int(compiled.metadata.shared)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True, check=False)
    m = _RESOURCE_RE.search(out.stdout)
    if m is None:
        res.error = f"could not read resource usage: {(out.stdout + out.stderr).strip()[-300:]}"
        return res
    res.registers, res.stack_bytes, _, res.local_bytes = (int(g) for g in m.groups())
    res.ok = True
    return res


def run_checks(archs: tuple[int, ...], all_tunings: bool = False) -> list[CompileResult]:
    """Compile every spec for every arch."""
    return [compile_one(spec, arch) for arch in archs for spec in kernel_specs(all_tunings)]


def main(argv: list[str] | None = None) -> int:
    """Compile the kernels for the given architectures; returns the process exit code."""
    ap = argparse.ArgumentParser(prog="python -m kernels.compile_check", description=__doc__)
    ap.add_argument("--arch", type=int, action="append", help="SM version, e.g. 90 (H100/H200) or 100 (B200/GB200)")
    ap.add_argument("--no-spills", action="store_true", help="also fail when a kernel uses local memory or a stack frame (register spills)")
    ap.add_argument("--all-tunings", action="store_true", help="decode at every candidate tuning, not just the default")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernels compile_check: unset TRITON_INTERPRET (the interpreter replaces the compiler)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        import triton  # noqa: F401
    except ImportError:
        print("kernels compile_check: triton is not installed", file=sys.stderr)
        return EXIT_UNAVAILABLE
    archs = tuple(args.arch or DEFAULT_ARCHS)
    results = run_checks(archs, args.all_tunings)
    failed = [r for r in results if not r.ok or (args.no_spills and (r.local_bytes or r.stack_bytes))]
    if args.json:
        print(json.dumps({"ok": not failed, "results": [asdict(r) for r in results]}))
    else:
        print(f"{'arch':<6} {'kernel':<40} {'regs':>5} {'local B':>8} {'stack B':>8} {'shared B':>9} {'s':>5}")
        for r in results:
            if r.ok:
                print(
                    f"sm_{r.arch:<3} {r.label:<40} {r.registers:>5} {r.local_bytes:>8} {r.stack_bytes:>8}"
                    f" {r.shared_bytes:>9} {r.seconds:5.1f}"
                )
            else:
                print(f"sm_{r.arch:<3} {r.label:<40} FAILED: {r.error}")
        print(f"kernels compile_check: {'PASS' if not failed else 'FAIL'} ({len(results)} compiles)")
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

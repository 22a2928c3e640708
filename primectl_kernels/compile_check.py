"""Compile every kernel for real GPU architectures without a GPU: ``python -m primectl_kernels.compile_check``.

The Triton interpreter (what the CPU tests use) accepts code that the GPU
compiler rejects, and it says nothing about registers, spills or instruction
counts.  This check lowers each kernel through Triton's real CUDA pipeline
(TTIR -> TTGIR -> LLVM -> PTX -> cubin, with the ``ptxas`` that ships in the
triton wheel) for the requested SM versions and reports per kernel:

* registers, local-memory spills and stack (``cuobjdump --dump-resource-usage``),
  shared memory (Triton's metadata);
* the static instruction count of the main loop (the loop over tiles of rows),
  counted in the SASS that the wheel's ``nvdisasm`` prints for the cubin
  (``primectl_kernels.sass``), with the subroutines it calls counted separately; when no
  ``nvdisasm`` is found the count comes from the PTX between the loop labels
  (the ``src`` column says which); ``--lines N`` also lists the N source lines
  that contribute most instructions to each loop body (from the line info).

``--against REV`` also builds the kernels of git revision ``REV`` (its
``primectl_kernels/`` tree from ``git archive``, or ``kernels/`` before the package was
renamed, measured with this file's code in a subprocess) and prints both side by side
as ``REV -> now``.

Exit codes: 0 = everything compiled (and, with ``--no-spills``, nothing
spilled), 1 = a compile failed or spilled (in the working tree; ``REV``'s
failures are only reported), 3 = triton is missing or running under
``TRITON_INTERPRET=1`` (the interpreter replaces the compiler), 4 = ``REV``
could not be built (not a git checkout, unknown revision).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# relative: this file and sass.py are also copied into an older revision's tree, whose
# package may be named ``kernels`` (see revision_results)
from .sass import LoopStats, ptx_loop_stats, sass_loop_stats

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNAVAILABLE = 3
EXIT_NO_REVISION = 4

DEFAULT_ARCHS = (90, 100)
# files of this tool that measure a revision's kernels (copied over the revision's own)
TOOL_FILES = ("compile_check.py", "sass.py")
# the package directory a revision may hold, newest name first (``kernels`` until it was renamed so as not
# to collide with the import name of Hugging Face's ``kernels`` distribution)
PACKAGE_DIRS = ("primectl_kernels", "kernels")
_RESOURCE_RE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
# pointer arguments and strides the wrappers pass are 16-byte aligned / multiples
# of 16; Triton specialises those at launch, so the check specialises them too
_DIV16_ARGS = frozenset(
    {
        "q_ptr",
        "cache_ptr",
        "cache_f32_ptr",
        "cache_i16_ptr",
        "cache_i32_ptr",
        "idx_ptr",
        "scratch_ptr",
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
# argument types by name (anything not listed and not constexpr is an i32 scalar)
_ARG_TYPES = {
    "q_ptr": "*bf16",
    "cache_ptr": "*u8",
    "cache_f32_ptr": "*fp32",
    "cache_i16_ptr": "*i16",
    "cache_i32_ptr": "*i32",
    "idx_ptr": "*i32",
    "scratch_ptr": "*i32",
    "o_ptr": "*fp32",
    "lse_ptr": "*fp32",
    "qk_scale": "fp32",
    "o_part_ptr": "*fp32",
    "lse_part_ptr": "*fp32",
    "out_ptr": "*fp32",
    "lse_out_ptr": "*fp32",
    "stage_ptr": "*u8",
    "stage_f32_ptr": "*fp32",
    "stage_i16_ptr": "*i16",
    "new_idx_ptr": "*i32",
    "lat_ptr": "*bf16",
    "rope_ptr": "*bf16",
    "out_f32_ptr": "*fp32",
    "out_i16_ptr": "*i16",
    "slot_ptr": "*i64",
    "rows_ptr": "*u8",
    "rows_f32_ptr": "*fp32",
    "rows_i16_ptr": "*i16",
}


@dataclass(frozen=True)
class KernelSpec:
    """One kernel specialisation as the wrappers launch it."""

    label: str
    kernel: Callable[[], Any]  # returns the @triton.jit function (imported lazily)
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int | None = None
    max_registers: int | None = None
    arg_types: dict[str, str] = field(default_factory=dict)  # overrides of _ARG_TYPES


@dataclass
class CompileResult:
    """Resources and main-loop size of one compiled kernel (or why it failed)."""

    arch: int
    label: str
    ok: bool
    registers: int = 0
    local_bytes: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0
    seconds: float = 0.0
    error: str = ""
    loop: dict[str, Any] = field(default_factory=dict)  # asdict(LoopStats) + "effective"
    notes: list[str] = field(default_factory=list)

    @property
    def spill_bytes(self) -> int:
        """Local memory plus stack frame: what ptxas spilled."""
        return self.local_bytes + self.stack_bytes


def _tuning_tag(tune: Any) -> str:
    flags = [f"n{tune.block_n}", f"w{tune.num_warps}", f"s{tune.num_stages or '-'}"]
    if getattr(tune, "compact", False):
        flags.append("compact")
    if getattr(tune, "skip_empty_tiles", False):
        flags.append("skip")
    if tune.prefetch:
        flags.append("pf")
    if tune.max_registers:
        flags.append(f"r{tune.max_registers}")
    return " ".join(flags)


def _decode_constexprs(decode: Any, tune: Any) -> dict[str, Any]:
    """Every constexpr a decode kernel of any revision may take, from its tuning (unused ones are dropped)."""
    return {
        "BLOCK_H": decode.BLOCK_H,
        "BLOCK_N": tune.block_n,
        "SKIP_EMPTY": getattr(tune, "skip_empty_tiles", False),
        "PREFETCH": tune.prefetch,
        "COMPACT": getattr(tune, "compact", False),
        "PAGED": False,  # the wrappers' common case: blocks packed back to back
        "SCAN": 2048,  # the compaction scan's chunk at top-k 2048
    }


def kernel_specs(all_tunings: bool = False) -> list[KernelSpec]:
    """Every kernel specialisation the codec and decode wrappers launch (decode at each
    format's default tuning, or at every candidate ``primectl_kernels.bench --tune`` tries)."""
    from . import codec, decode

    specs: list[KernelSpec] = []
    kernels = {"nvfp4": lambda: decode._decode_nvfp4_kernel, "fp8": lambda: decode._decode_fp8_kernel}
    pairs = (
        [(fmt, tune) for tune in decode.TUNING_CANDIDATES for fmt in kernels]
        if all_tunings
        else list(decode.DEFAULT_TUNINGS.items())
    )
    for fmt, tune in pairs:
        specs.append(
            KernelSpec(
                f"decode_{fmt} [{_tuning_tag(tune)}]",
                kernels[fmt],
                _decode_constexprs(decode, tune),
                tune.num_warps,
                tune.num_stages,
                tune.max_registers,
            )
        )
    specs.append(KernelSpec("merge", lambda: decode._merge_kernel, {"BLOCK_S": 64, "BLOCK_D": decode.MERGE_BLOCK_D}))
    specs.append(KernelSpec("stage_nvfp4_to_fp8", lambda: decode._stage_nvfp4_to_fp8_kernel, {"BLOCK_T": 8, "PAGED": False}))
    for fmt_nvfp4, row in ((True, 352), (False, 656)):
        for slots in (False, True):
            specs.append(
                KernelSpec(
                    f"quantize_{'nvfp4' if fmt_nvfp4 else 'fp8'}{' (slot_mapping)' if slots else ''}",
                    lambda: codec._quant_kernel,
                    {"HAS_SLOTS": slots, "FMT_NVFP4": fmt_nvfp4, "ROW_BYTES": row, "BLOCK_T": codec.DEFAULT_BLOCK_T},
                    arg_types={"out_ptr": "*u8"},
                )
            )
    specs.append(KernelSpec("dequantize_nvfp4", lambda: codec._dequant_nvfp4_kernel, {"BLOCK_T": codec.DEFAULT_BLOCK_T}))
    specs.append(KernelSpec("dequantize_fp8", lambda: codec._dequant_fp8_kernel, {"BLOCK_T": codec.DEFAULT_BLOCK_T}))
    return specs


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def loop_stats(cubin_path: str, ptx: str) -> LoopStats:
    """Main-loop counts from the cubin's SASS (the wheel's ``nvdisasm``), else from the PTX."""
    nvdisasm = _tool("nvdisasm")
    if os.access(nvdisasm, os.X_OK):
        out = subprocess.run([nvdisasm, "-c", "-g", cubin_path], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip():
            return sass_loop_stats(out.stdout)
    return ptx_loop_stats(ptx)


def compile_one(spec: KernelSpec, arch: int, dump_dir: Path | None = None) -> CompileResult:
    """Compile ``spec`` for ``sm_<arch>``; read its resources from the cubin and count its main loop."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    res = CompileResult(arch=arch, label=spec.label, ok=False)
    t0 = time.perf_counter()
    try:
        fn = spec.kernel()
        names = list(fn.arg_names)
        wanted = {p.name for p in fn.params if p.is_constexpr}
        missing = wanted - set(spec.constexprs)
        if missing:
            raise ValueError(f"no value for constexpr {sorted(missing)}")
        constexprs = {k: v for k, v in spec.constexprs.items() if k in wanted}
        types = {**_ARG_TYPES, **spec.arg_types}
        signature = {n: ("constexpr" if n in constexprs else types.get(n, "i32")) for n in names}
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in _DIV16_ARGS}
        options: dict[str, Any] = {"num_warps": spec.num_warps}
        if spec.num_stages is not None:
            options["num_stages"] = spec.num_stages
        if spec.max_registers is not None:
            options["maxnreg"] = spec.max_registers
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as exc:  # a compile error is the result being reported
        res.error = f"{type(exc).__name__}: {exc}".strip()[-2000:]
        res.seconds = time.perf_counter() - t0
        return res
    res.seconds = time.perf_counter() - t0
    res.shared_bytes = int(compiled.metadata.shared)
    cubin: bytes = compiled.asm["cubin"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:  # cuobjdump and nvdisasm read the same file
        f.write(cubin)
        f.flush()
        out = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True, check=False)
        m = _RESOURCE_RE.search(out.stdout)
        if m is None:
            res.error = f"could not read resource usage: {(out.stdout + out.stderr).strip()[-300:]}"
            return res
        res.registers, res.stack_bytes, _, res.local_bytes = (int(g) for g in m.groups())
        stats = loop_stats(f.name, compiled.asm["ptx"])
    res.loop = {**asdict(stats), "effective": stats.effective}
    if dump_dir is not None:
        stem = re.sub(r"[^\w.-]+", "_", f"sm{arch}_{spec.label}").strip("_")
        dump_dir.mkdir(parents=True, exist_ok=True)
        for key in ("ttgir", "ptx"):
            (dump_dir / f"{stem}.{key}").write_text(compiled.asm[key])
        (dump_dir / f"{stem}.cubin").write_bytes(cubin)
    res.ok = True
    return res


def run_checks(
    archs: tuple[int, ...], all_tunings: bool = False, only: str | None = None, dump_dir: Path | None = None
) -> list[CompileResult]:
    """Compile every spec (whose label contains ``only``, if given) for every arch."""
    specs = [s for s in kernel_specs(all_tunings) if only is None or only in s.label]
    return [compile_one(spec, arch, dump_dir) for arch in archs for spec in specs]


# ----------------------------------------------------------------------------
# another revision's kernels
# ----------------------------------------------------------------------------


class RevisionError(RuntimeError):
    """The revision to compare against could not be checked out or measured."""


def _repo_root() -> Path:
    here = Path(__file__).resolve().parent
    out = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RevisionError(f"not a git checkout: {out.stderr.strip()}")
    return Path(out.stdout.strip())


def revision_results(rev: str, archs: tuple[int, ...], all_tunings: bool, only: str | None) -> tuple[str, list[CompileResult]]:
    """Compile revision ``rev``'s kernels (its ``primectl_kernels/`` or, before the rename, ``kernels/`` tree,
    measured with this tool's code): returns (short commit hash, results)."""
    root = _repo_root()
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", f"{rev}^{{commit}}"], capture_output=True, text=True, check=False)
    if sha.returncode != 0:
        raise RevisionError(f"unknown revision {rev!r}: {sha.stderr.strip()}")
    tree = subprocess.run(["git", "-C", str(root), "ls-tree", "--name-only", sha.stdout.strip(), "--", *PACKAGE_DIRS],
                          capture_output=True, text=True, check=False)
    pkg = next((d for d in PACKAGE_DIRS if d in tree.stdout.split()), PACKAGE_DIRS[0])
    archive = ["git", "-C", str(root), "archive", "--format=tar", sha.stdout.strip(), pkg]
    tar = subprocess.run(archive, capture_output=True, check=False)
    if tar.returncode != 0:
        raise RevisionError(f"git archive {rev} {pkg}: {tar.stderr.decode(errors='replace').strip()}")
    with tempfile.TemporaryDirectory(prefix="kernels-rev-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as tf:
            tf.extractall(tmp, filter="data")
        here = Path(__file__).resolve().parent
        for name in TOOL_FILES:
            shutil.copyfile(here / name, Path(tmp) / pkg / name)
        cmd = [sys.executable, "-m", f"{pkg}.compile_check", "--json", *[a for arch in archs for a in ("--arch", str(arch))]]
        if all_tunings:
            cmd.append("--all-tunings")
        if only:
            cmd += ["--only", only]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
        # the revision's kernels first; keep the rest of the path (e.g. another triton) but no other tree of them
        keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                if p and not any((Path(p) / d).is_dir() for d in PACKAGE_DIRS)]
        env["PYTHONPATH"] = os.pathsep.join([tmp, *keep])
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
        try:
            report = json.loads(out.stdout)
        except json.JSONDecodeError as exc:
            raise RevisionError(f"compile_check at {rev} printed no report: {(out.stdout + out.stderr).strip()[-1500:]}") from exc
    if not report.get("kernels_dir", "").startswith(str(Path(tmp).resolve())):
        raise RevisionError(f"the check at {rev} imported kernels from {report.get('kernels_dir')!r}, not from the revision")
    fields = set(CompileResult.__dataclass_fields__)
    return sha.stdout.strip(), [CompileResult(**{k: v for k, v in r.items() if k in fields}) for r in report["results"]]


def _pair(before: list[CompileResult], after: list[CompileResult]) -> list[tuple[CompileResult | None, CompileResult | None]]:
    """Match results by (arch, label); a kernel whose launch tag changed matches by its base name."""

    def base(r: CompileResult) -> str:
        return r.label.split(" [", 1)[0]

    pairs: list[tuple[CompileResult | None, CompileResult | None]] = []
    left = list(before)
    for a in after:
        match = next((b for b in left if b.arch == a.arch and b.label == a.label), None)
        if match is None:
            same = [b for b in left if b.arch == a.arch and base(b) == base(a)]
            if len(same) == 1 and sum(1 for x in after if x.arch == a.arch and base(x) == base(a)) == 1:
                match = same[0]
        if match is not None:
            left.remove(match)
        pairs.append((match, a))
    pairs.extend((b, None) for b in left)
    return pairs


# ----------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------

_LOOP_CLASSES = ("mma", "smem", "lmem", "shfl", "bar", "cvt", "int", "fp")


def _cell(r: CompileResult | None, what: str) -> str:
    if r is None:
        return "-"
    if not r.ok:
        return "FAIL"
    if what == "regs":
        return str(r.registers)
    if what == "spill":
        return str(r.spill_bytes)
    if what == "smem":
        return str(r.shared_bytes)
    loop = r.loop or {}
    if what.startswith("class:"):
        return str((loop.get("classes") or {}).get(what[6:], "-")) if loop.get("instructions") else "-"
    if what == "total":
        return str(loop.get("total_instructions") or "-")
    if what == "loop":
        return str(loop.get("instructions") or "-")
    if what == "calls":
        return f"+{loop['call_instructions']}" if loop.get("call_instructions") else ("0" if loop.get("instructions") else "-")
    return str(loop.get("source", "-"))


def _pair_cell(b: CompileResult | None, a: CompileResult | None, what: str, sep: str = " -> ") -> str:
    """``'before -> now'``, or one value where both are the same."""
    before, now = _cell(b, what), _cell(a, what)
    return now if before == now else f"{before}{sep}{now}"


def _row_label(b: CompileResult | None, a: CompileResult | None) -> str:
    if a is None or b is None or a.label == b.label:
        return (a or b).label  # type: ignore[union-attr]
    return f"{a.label} (was [{b.label.split(' [', 1)[-1]})"


def format_table(after: list[CompileResult], before: list[CompileResult] | None = None, rev: str = "") -> str:
    """The report: one row per (arch, kernel); with ``before``, each cell reads ``before -> now``."""
    cols = ("regs", "spill", "smem", "total", "loop", "calls")
    head = {"regs": "regs", "spill": "spill B", "smem": "shared B", "total": "all instr", "loop": "loop instr", "calls": "+calls"}
    pairs = _pair(before, after) if before is not None else [(None, a) for a in after]
    labels = [_row_label(b, a) for b, a in pairs]
    width = max([len(x) for x in labels] + [6]) + 1
    cw = 16 if before is not None else 11
    lines = [f"cells: {rev} -> working tree"] if before is not None else []
    lines.append(
        f"{'arch':<7}{'kernel':<{width}}"
        + "".join(f"{head[c]:>{cw}}" for c in cols)
        + "  src  loop body by class ("
        + " ".join(_LOOP_CLASSES)
        + ")"
    )
    for (b, a), label in zip(pairs, labels, strict=True):
        ref = a or b
        assert ref is not None
        cells = "".join(f"{(_pair_cell(b, a, c) if before is not None else _cell(a, c)):>{cw}}" for c in cols)
        if before is not None:
            classes = " ".join(_pair_cell(b, a, f"class:{k}", ">") for k in _LOOP_CLASSES)
        else:
            classes = " ".join(_cell(a, f"class:{k}") for k in _LOOP_CLASSES)
        lines.append(f"sm_{ref.arch:<4}{label:<{width}}{cells}  {_cell(a or b, 'src'):<4} {classes}")
        for r in (b, a):
            if r is not None and not r.ok:
                lines.append(f"       {f'({rev}) ' if r is b else ''}{r.label} FAILED: {r.error}")
    return "\n".join(lines)


def format_lines(results: list[CompileResult], top: int) -> str:
    """The ``top`` source lines that put most instructions into each kernel's loop body."""
    here = Path(__file__).resolve().parent
    sources: dict[str, list[str]] = {}

    def text(where: str) -> str:
        name, _, num = where.rpartition(":")
        if name not in sources:
            path = here / name
            sources[name] = path.read_text().splitlines() if path.is_file() else []
        src = sources[name]
        return src[int(num) - 1].strip()[:100] if num.isdigit() and 0 < int(num) <= len(src) else ""

    out = []
    for r in results:
        lines = (r.loop or {}).get("lines") or {}
        if not lines:
            continue
        out.append(f"sm_{r.arch} {r.label}: loop body instructions by source line")
        out.extend(f"  {n:>5}  {where:<16} {text(where)}" for where, n in list(lines.items())[:top])
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Compile the kernels for the given architectures; returns the process exit code."""
    ap = argparse.ArgumentParser(
        prog="python -m primectl_kernels.compile_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--arch", type=int, action="append", help="SM version, e.g. 90 (H100/H200) or 100 (B200/GB200)")
    ap.add_argument("--no-spills", action="store_true", help="also fail when a kernel uses local memory or a stack frame (register spills)")
    ap.add_argument("--all-tunings", action="store_true", help="decode at every candidate tuning, not just the default")
    ap.add_argument("--only", metavar="TEXT", help="only kernels whose label contains TEXT (e.g. decode_nvfp4)")
    ap.add_argument("--against", metavar="REV", help="also compile git revision REV's kernels and print both side by side")
    ap.add_argument("--lines", metavar="N", type=int, default=0, help="list the N source lines with most instructions in each loop")
    ap.add_argument("--dump", metavar="DIR", type=Path, help="write each kernel's TTGIR, PTX and cubin into DIR")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("kernels compile_check: unset TRITON_INTERPRET (the interpreter replaces the compiler)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.lines:  # Triton's cache key ignores where a function sits in its file: cached line info can be stale
        os.environ["TRITON_ALWAYS_COMPILE"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError:
        print("kernels compile_check: triton is not installed", file=sys.stderr)
        return EXIT_UNAVAILABLE
    archs = tuple(args.arch or DEFAULT_ARCHS)
    before: list[CompileResult] | None = None
    rev = ""
    if args.against:
        try:
            rev, before = revision_results(args.against, archs, args.all_tunings, args.only)
        except RevisionError as exc:
            print(f"kernels compile_check: --against {args.against}: {exc}", file=sys.stderr)
            return EXIT_NO_REVISION
    results = run_checks(archs, args.all_tunings, args.only, args.dump)
    failed = [r for r in results if not r.ok or (args.no_spills and r.spill_bytes)]
    if args.json:
        from . import codec  # the package the kernels were compiled from (this file's, whatever its name)

        report: dict[str, Any] = {
            "ok": not failed,
            "kernels_dir": str(Path(codec.__file__).resolve().parent),
            "results": [asdict(r) for r in results],
        }
        if before is not None:
            report["against"] = {"revision": rev, "results": [asdict(r) for r in before]}
        print(json.dumps(report))
    else:
        print(format_table(results, before, rev))
        if args.lines:
            print(format_lines(results, args.lines))
        extra = f", plus {len(before)} at {rev}" if before is not None else ""
        print(f"kernels compile_check: {'PASS' if not failed else 'FAIL'} ({len(results)} compiles{extra})")
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

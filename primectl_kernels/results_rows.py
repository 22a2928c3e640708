"""Markdown rows for primectl_kernels/RESULTS.md from a GPU run's JSON: ``python -m primectl_kernels.results_rows``.

``scripts/kernels-gpu-run.sh`` calls it on the device machine with the files
``primectl_kernels.bench --json-out`` and ``primectl_kernels.selftest --json`` wrote; the rows it
prints carry the commit (``--commit``, else ``git``, else ``unknown``) and a hash
of ``primectl_kernels/*.py``, so a figure can be traced to the code it measured even when
the machine's copy of the tree has no git metadata.  Pure Python: no torch needed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

VARIANTS = ("nvfp4_native", "nvfp4_staged", "fp8")
CODEC_OPS = ("quantize_nvfp4", "quantize_fp8", "dequantize_nvfp4", "dequantize_fp8")


def source_hash(kernels_dir: Path) -> str:
    """First 12 hex digits of the SHA-256 over ``kernels_dir/*.py`` (names and contents, sorted by name)."""
    h = hashlib.sha256()
    for path in sorted(kernels_dir.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def git_commit(root: Path) -> str | None:
    """Short commit hash of ``root`` with ``+dirty`` when primectl_kernels/ has changes, or None outside git."""
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "primectl_kernels"],
                           capture_output=True, text=True, check=False)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _us(x: Any) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) else "-"


def decode_rows(benches: Iterable[dict[str, Any]], commit: str) -> list[str]:
    """One table row per (fill, T): the three variants' best time and native / fp8."""
    by_key: dict[tuple[float, int], dict[str, Any]] = {}
    for bench in benches:
        for rec in bench.get("decode", []):
            key = (float(rec["fill"]), int(rec["T"]))
            by_key.setdefault(key, {})[rec["variant"]] = rec
    lines = [
        "| commit | fill | T | nvfp4 native (us) | nvfp4 staged (us) | fp8 (us) | native / fp8 | native max err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (fill, t), recs in sorted(by_key.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        us = {v: recs.get(v, {}).get("us") for v in VARIANTS}
        ratio = us["nvfp4_native"] / us["fp8"] if isinstance(us["nvfp4_native"], float) and us["fp8"] else None
        err = recs.get("nvfp4_native", {}).get("max_err")
        lines.append(
            f"| {commit} | {fill:g} | {t} | {_us(us['nvfp4_native'])} | {_us(us['nvfp4_staged'])} | {_us(us['fp8'])}"
            f" | {f'{ratio:.2f}' if ratio else '-'} | {f'{err:.1e}' if isinstance(err, float) else '-'} |"
        )
    return lines


def codec_rows(bench: dict[str, Any], commit: str) -> list[str]:
    """One row per codec op: microseconds at each token count measured."""
    sizes = sorted({int(c["n"]) for c in bench.get("codec", [])})
    if not sizes:
        return []
    lines = ["| commit | op | " + " | ".join(f"n={n:,}" for n in sizes) + " |", "|---|---|" + "---:|" * len(sizes)]
    for op in CODEC_OPS:
        cells = {int(c["n"]): c for c in bench["codec"] if c["op"] == op}
        lines.append(f"| {commit} | {op} | " + " | ".join(_us(cells.get(n, {}).get("us")) for n in sizes) + " |")
    return lines


def selftest_line(selftest: dict[str, Any]) -> str:
    """``selftest: PASS; ...`` with every check's maximum error."""
    checks = "; ".join(f"{c['name']} {'ok' if c['passed'] else 'FAIL'} {c['max_err']:.2g}" for c in selftest.get("checks", []))
    return f"selftest: {selftest.get('status', '?').upper()} ({selftest.get('device', '?')}): {checks}"


def render(benches: list[dict[str, Any]], selftest: dict[str, Any] | None, commit: str, src: str, date: str) -> str:
    """The whole block: heading, decode table, codec table (from the first bench with codec figures), selftest."""
    first = benches[0] if benches else {}
    head = (
        f"### GPU run {date}: commit {commit}, kernels source {src}"
        f" ({first.get('device', '?')}, torch {first.get('torch', '?')}, triton {first.get('triton', '?')})"
    )
    out = [head, ""]
    if selftest is not None:
        out += [selftest_line(selftest), ""]
    out += decode_rows(benches, commit) + [""]
    codec = next((b for b in benches if b.get("codec")), None)
    if codec is not None:
        out += codec_rows(codec, commit) + [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the RESULTS.md block for the given JSON files; returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m primectl_kernels.results_rows", description=__doc__)
    ap.add_argument("--bench", type=Path, action="append", default=[], help="primectl_kernels.bench --json-out file (repeatable)")
    ap.add_argument("--selftest", type=Path, help="primectl_kernels.selftest --json output")
    ap.add_argument("--commit", help="commit the measured tree is at (default: git, else 'unknown')")
    ap.add_argument("--date", default="", help="date of the run (printed as given)")
    args = ap.parse_args(argv)
    kernels_dir = Path(__file__).resolve().parent
    benches = [json.loads(p.read_text()) for p in args.bench if p.is_file()]
    selftest = None
    if args.selftest and args.selftest.is_file():
        text = args.selftest.read_text().strip().splitlines()
        selftest = json.loads(text[-1]) if text else None
    commit = args.commit or git_commit(kernels_dir.parent) or "unknown"
    print(render(benches, selftest, commit, source_hash(kernels_dir), args.date))
    return 0


if __name__ == "__main__":
    sys.exit(main())

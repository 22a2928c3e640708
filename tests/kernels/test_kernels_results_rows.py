"""RESULTS.md rows from a GPU run's JSON (``primectl_kernels.results_rows``, pure Python)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from primectl_kernels import results_rows

ROOT = Path(__file__).resolve().parents[2]

BENCH = {
    "device": "NVIDIA H200",
    "torch": "2.11.0+cu130",
    "triton": "3.6.0",
    "decode": [
        {"T": 15, "fill": 1.0, "variant": "nvfp4_native", "us": 20.0, "max_err": 3.1e-5},
        {"T": 15, "fill": 1.0, "variant": "nvfp4_staged", "us": 80.5},
        {"T": 15, "fill": 1.0, "variant": "fp8", "us": 25.0},
        {"T": 1, "fill": 1.0, "variant": "nvfp4_native", "us": 9.0},
        {"T": 1, "fill": 1.0, "variant": "fp8", "us": 10.0},
        {"T": 1, "fill": 1.0, "variant": "nvfp4_staged", "error": "RuntimeError()"},
    ],
    "codec": [
        {"op": op, "n": n, "us": float(i + k)} for i, op in enumerate(results_rows.CODEC_OPS) for k, n in enumerate((4096, 65536))
    ],
}
FILL = {"device": "NVIDIA H200", "decode": [{"T": 15, "fill": 0.5, "variant": v, "us": 12.0} for v in results_rows.VARIANTS]}
SELFTEST = {
    "status": "pass",
    "device": "NVIDIA H200",
    "checks": [{"name": "decode nvfp4 native (vs reference)", "passed": True, "max_err": 1.8e-4}],
}


def test_rows_carry_commit_source_and_every_measurement() -> None:
    text = results_rows.render([BENCH, FILL], SELFTEST, "abc1234", "0123456789ab", "2026-12-02")
    lines = text.splitlines()
    assert lines[0].startswith("### GPU run 2026-12-02: commit abc1234, kernels source 0123456789ab (NVIDIA H200")
    assert "selftest: PASS (NVIDIA H200): decode nvfp4 native (vs reference) ok 0.00018" in text
    # fill 1.0 first, then by T; a variant that failed shows '-'
    assert "| abc1234 | 1 | 1 | 9.0 | - | 10.0 | 0.90 | - |" in lines
    assert "| abc1234 | 1 | 15 | 20.0 | 80.5 | 25.0 | 0.80 | 3.1e-05 |" in lines
    assert "| abc1234 | 0.5 | 15 | 12.0 | 12.0 | 12.0 | 1.00 | - |" in lines
    full = lines.index("| abc1234 | 1 | 15 | 20.0 | 80.5 | 25.0 | 0.80 | 3.1e-05 |")
    assert full < lines.index("| abc1234 | 0.5 | 15 | 12.0 | 12.0 | 12.0 | 1.00 | - |")
    assert "| commit | op | n=4,096 | n=65,536 |" in lines
    assert "| abc1234 | dequantize_fp8 | 3.0 | 4.0 |" in lines


def test_source_hash_follows_the_kernel_sources(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    first = results_rows.source_hash(tmp_path)
    (tmp_path / "a.py").write_text("x = 2\n")
    assert results_rows.source_hash(tmp_path) != first and len(first) == 12


def test_cli_reads_the_files_the_gpu_script_writes(tmp_path: Path) -> None:
    (tmp_path / "bench.json").write_text(json.dumps(BENCH))
    (tmp_path / "selftest.json").write_text("a warning line\n" + json.dumps(SELFTEST) + "\n")
    res = subprocess.run(
        [sys.executable, "-m", "primectl_kernels.results_rows",
         "--bench", str(tmp_path / "bench.json"), "--bench", str(tmp_path / "missing.json"),
         "--selftest", str(tmp_path / "selftest.json"), "--commit", "feedbee", "--date", "today"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("### GPU run today: commit feedbee, kernels source ")
    assert "| feedbee | 1 | 15 | 20.0 | 80.5 | 25.0 | 0.80 | 3.1e-05 |" in res.stdout
    assert results_rows.source_hash(ROOT / "primectl_kernels") in res.stdout.splitlines()[0]

"""The kernels' command-line tools as an operator runs them: the GPU compile check and the benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed; kernel tests need torch + triton")
pytest.importorskip("triton", reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], interpret: bool, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0", TRITON_DEFAULT_FP_FUSION="1")
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_every_kernel_compiles_for_hopper_and_blackwell() -> None:
    """The real Triton -> PTX -> ptxas pipeline (not the interpreter) for sm_90 and sm_100, no GPU needed."""
    res = _run(["primectl_kernels.compile_check", "--arch", "90", "--arch", "100", "--json"], interpret=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(res.stdout)
    labels = {(r["arch"], r["label"].split(" [")[0]) for r in report["results"]}
    for arch in (90, 100):
        for kernel in ("decode_nvfp4", "decode_fp8", "merge", "stage_nvfp4_to_fp8", "quantize_nvfp4", "dequantize_fp8"):
            assert (arch, kernel) in labels
    for r in report["results"]:
        assert r["ok"] and 0 < r["registers"] <= 255, r
        if r["label"].startswith("decode_"):  # the loop over tiles is found and counted in the SASS
            assert r["loop"]["source"] == "sass"
            assert 0 < r["loop"]["instructions"] < r["loop"]["total_instructions"], r["loop"]
            assert r["loop"]["classes"]["mma"] > 0


def test_compile_check_refuses_to_run_under_the_interpreter() -> None:
    res = _run(["primectl_kernels.compile_check", "--arch", "90"], interpret=True)
    assert res.returncode == 3
    assert "TRITON_INTERPRET" in res.stderr


def test_bench_runs_every_code_path(tmp_path: Path) -> None:
    """`primectl_kernels.bench`: tuning, the T sweep with errors against the reference, the codec table.

    On a GPU host it runs for real at small sizes; elsewhere under the interpreter (``--allow-cpu``).
    """
    import torch

    out = tmp_path / "bench.json"
    gpu = torch.cuda.is_available()
    # under the interpreter 4 heads take the same code paths as 16 for ~half the CPU
    size = ["--topk", "256", "--cache-tokens", "65536"] if gpu else ["--allow-cpu", "--heads", "4"]
    res = _run(["primectl_kernels.bench", *size, "--tune", "--candidates", "2", "--sweep", "2", "--json-out", str(out)], interpret=not gpu)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["tune"], "the tuning search recorded nothing"
    t_check = 15 if gpu else 2
    rows = [r for r in report["decode"] if r["T"] == t_check]
    assert {r["variant"] for r in rows} == {"nvfp4_native", "nvfp4_staged", "fp8"}
    for r in rows:
        assert "error" not in r, r
        assert r["max_err"] < 4e-3 and r["us"] > 0
    assert {c["op"] for c in report["codec"]} == {"quantize_nvfp4", "quantize_fp8", "dequantize_nvfp4", "dequantize_fp8"}
    if not gpu:
        assert "meaningless" in report["device"]  # a CPU run never passes itself off as a speed figure


def test_bench_without_gpu_exits_3() -> None:
    res = _run(["primectl_kernels.bench"], interpret=True)
    assert res.returncode == 3
    assert "no GPU" in res.stderr


def test_gather_probe_reads_exactly_the_selected_rows() -> None:
    """The ablation's memory-only kernel must read what the decode reads: every valid selected row, once."""
    import torch

    from primectl_kernels.gather_probe import gather_only

    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available() else "cuda"
    g = torch.Generator().manual_seed(5)
    cache = torch.randint(0, 256, (4, 16, 352), generator=g, dtype=torch.uint8)
    idx = torch.stack([torch.randperm(64, generator=g)[:40] for _ in range(2)]).to(torch.int32)
    idx[0, ::3] = -1
    sums = gather_only(cache.to(device), idx.to(device), 352, splits=2, block_n=16, num_warps=4).cpu()
    flat = cache.view(-1, 352).to(torch.int64)
    want = [int(flat[row[row >= 0].long()].sum()) for row in idx]
    assert sums.view(2, -1).sum(dim=1).tolist() == want


def test_compile_check_counts_the_main_loop_against_a_revision() -> None:
    """`--against REV` builds REV's kernels too and prints registers, spills, shared memory and the
    main loop's SASS instruction count side by side (the check CI runs, for one kernel and arch)."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, check=False).returncode != 0:
        pytest.skip("not a git checkout")
    res = _run(["primectl_kernels.compile_check", "--arch", "90", "--only", "decode_nvfp4", "--against", "HEAD"], interpret=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
    lines = res.stdout.splitlines()
    assert lines[0] == f"cells: {head.stdout.strip()} -> working tree"
    assert "loop instr" in lines[1] and "regs" in lines[1]
    rows = [ln for ln in lines if ln.startswith("sm_90  decode_nvfp4")]
    assert len(rows) == 1, res.stdout
    assert " sass " in rows[0]  # counted in the cubin's SASS, not the PTX fallback
    # every number in the row (regs, spills, shared, instruction counts) is there for both sides
    assert "FAIL" not in rows[0] and rows[0].count(" - ") == 0, rows[0]


def test_compile_check_unknown_revision_exits_4() -> None:
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, check=False).returncode != 0:
        pytest.skip("not a git checkout")
    res = _run(["primectl_kernels.compile_check", "--arch", "90", "--only", "merge", "--against", "no-such-rev-0000"], interpret=False)
    assert res.returncode == 4
    assert "unknown revision" in res.stderr


STEPS = ("env", "selftest", "bench", "rows", "fill 0.5", "ablation")


def _gpu_script(tmp_path: Path, deadline: int) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable, SKIP_PYTEST="1", KERNELS_COMMIT="cafe123", DEADLINE_S=str(deadline))
    env.pop("TRITON_INTERPRET", None)
    script = ROOT / "scripts" / "kernels-gpu-run.sh"
    res = subprocess.run(["bash", str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=deadline + 60, check=False)
    return res, out


def test_gpu_script_runs_every_step_and_writes_rows(tmp_path: Path) -> None:
    """The prepared GPU pass, here where each step finds no GPU and ends at once: every step is logged
    with its exit code, and the RESULTS.md rows carry the commit it was given."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU this is the real multi-minute run")
    res, out = _gpu_script(tmp_path, 300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    log = (out / "log.txt").read_text()
    for name in STEPS:
        assert f"=== {name} (cap" in log and f"{name} exit: " in log, name
    assert "selftest exit: 3" in log and "bench exit: 3" in log  # no GPU: exit code 3, not a crash
    assert "=== done at" in log
    rows = (out / "results-rows.md").read_text()
    assert rows.startswith("### GPU run ") and "commit cafe123, kernels source " in rows
    assert len(list(out.iterdir())) <= 8  # what the device tool returns


def test_gpu_script_skips_steps_past_its_deadline(tmp_path: Path) -> None:
    res, out = _gpu_script(tmp_path, 1)
    assert res.returncode == 0
    log = (out / "log.txt").read_text()
    for name in STEPS:
        assert f"{name} skipped: out of time" in log, name

"""`primectl bench` (plain and --sla) and `primectl ab` against a real demo (Dynamo frontend + mocker workers).

Brings up its own copy of recipes/demo.yaml (own name, workdir and ports) once for the module,
and brings it down at the end, checking no process is left in its workdir. Runs inside
`unshare --net` like the rest of the integration suite; needs AIPerf (.venv-bench) and the
runtime venv (PRIMECTL_RUNTIME_PYTHON).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from primectl.bench.aiperf import AIPerfMissing, find_aiperf
from tests import cliproc

from .conftest import log_errors

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
FRONTEND_PORT = 18_480


def processes_under(workdir: Path) -> list[tuple[int, str]]:
    """(pid, cmdline) of processes whose cwd is inside `workdir`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cwd = os.readlink(d / "cwd")
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cwd == str(workdir) or cwd.startswith(str(workdir) + "/"):
            out.append((int(d.name), cmd))
    return out


def cli(*args: str | Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return cliproc.primectl(*args, timeout=timeout)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """recipes/demo.yaml copied to tmp (own workdir and ports) plus demo-variant.yaml next to it; up, then down."""
    try:
        find_aiperf()
    except AIPerfMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    tmp = tmp_path_factory.mktemp("bench")
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    workdir = tmp / "wd"
    doc["name"] = doc["namespace"] = "benchdemo"
    doc["hosts"][0]["workdir"] = str(workdir)
    doc["frontend"]["port"] = FRONTEND_PORT
    doc["ports"] = {"worker_system": 18_481, "mooncake_rpc": 18_490, "mooncake_metadata": 18_491,
                    "mooncake_metrics": 18_492, "bootstrap": 18_493, "response_stream": 18_500, "tcp_rpc": 18_510,
                    "kv_events": 18_520, "frontend_replica": 18_530}
    if os.environ.get("PRIMECTL_RUNTIME_PYTHON"):
        doc.setdefault("software", {})["python"] = os.environ["PRIMECTL_RUNTIME_PYTHON"]
    # AIPerf's clients are closed loops: at the demo's 10x they take every core they can get, from this stack and
    # from every test beside it, for figures these tests do not judge. At 1x each request takes ~5x longer and a
    # run costs about a third of the CPU (docs/testing.md).
    doc["mocker"]["speedup_ratio"] = 1
    recipe = tmp / "demo.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copyfile(REPO / "recipes" / "demo-variant.yaml", tmp / "demo-variant.yaml")  # extends: demo.yaml
    up = cli("up", recipe, "--no-smoke")
    try:
        assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
        yield recipe
    finally:
        down = cli("down", recipe)
        deadline = time.monotonic() + 10
        while processes_under(workdir) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes_under(workdir)
        for pid, _ in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        assert down.returncode == 0, f"down failed:\n{down.stdout}\n{down.stderr}"
        assert not left, f"processes left after down: {left}"


def test_bench_writes_a_valid_summary_and_plots(demo: Path, tmp_path: Path) -> None:
    r = cli("bench", demo, "--duration", "5", "--concurrency", "3", "--runs-dir", tmp_path, "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr + log_errors(demo.parent / "wd")
    s = json.loads(r.stdout)
    run = Path(s["run_dir"])
    assert s["valid"] and s["status"] == "VALID" and run.parent == tmp_path
    assert run.name.endswith("-benchdemo")
    assert json.loads((run / "summary.json").read_text())["status"] == "VALID"
    f = s["figures"]
    for k in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "tok_s_per_user",
              "output_tok_s_per_gpu", "request_throughput_rps"):
        assert f[k] is not None and f[k] > 0, k
    assert f["error_rate"] == 0 and f["output_tokens_total"] > 0
    assert s["gpu"]["count"] == 3 and "GPU slot" in s["gpu"]["basis"]
    assert 0 < s["prefix_cache"]["hit_rate"] <= 1 and s["prefix_cache"]["source"]
    assert s["workload"]["preset"] == "agentic-demo"  # picked for engine mocker
    assert s["sessions"]["session_id_stable_across_turns"] is True
    for name in ("input.jsonl", "aiperf/profile_export_aiperf.json", "aiperf/profile_export_aiperf.csv",
                 "aiperf/profile_export.jsonl", "metrics-before.txt", "metrics-after.txt", "plots/latency.png",
                 "plots/turns.png"):
        assert (run / name).stat().st_size > 0, name
    assert (run / "plots" / "latency.png").read_bytes()[:4] == b"\x89PNG"
    # the server's metrics are scraped once, by bench itself (above): AIPerf neither scrapes nor polls GPUs
    assert not list((run / "aiperf").glob("server_metrics_export*")) and not list(run.rglob("*gpu_telemetry*"))

    # Exact token counts: the server's prompt count minus our count is the same for every request
    # at the same turn (only chat-template tokens differ), so every delta and reply arrived whole.
    rows = [json.loads(x) for x in (run / "input.jsonl").read_text().splitlines()]
    expected: dict[tuple[str, int], int] = {}
    history: dict[str, int] = {}
    turn: dict[str, int] = {}
    for row in rows:
        sid = row["session_id"]
        t = turn.get(sid, 0)
        expected[(sid, t)] = history.get(sid, 0) + row["input_length"]
        history[sid] = expected[(sid, t)] + row["output_length"]
        turn[sid] = t + 1
    overhead: dict[int, set[int]] = {}
    for line in (run / "aiperf" / "profile_export.jsonl").read_text().splitlines():
        rec = json.loads(line)
        meta, m = rec["metadata"], rec["metrics"]
        key = (meta["conversation_id"], meta["turn_index"])
        if key in expected and "input_sequence_length" in m and m.get("output_sequence_length", {}).get("value"):
            overhead.setdefault(meta["turn_index"], set()).add(m["input_sequence_length"]["value"] - expected[key])
    assert overhead and all(len(v) == 1 for v in overhead.values()), overhead
    assert 0 < next(iter(overhead[0])) < 32


def test_sla_search_finds_a_knee(demo: Path, tmp_path: Path) -> None:
    r = cli("bench", demo, "--duration", "3", "--concurrency", "2", "--max-runs", "2",
            "--sla", "ttft_p90_ms<=60000", "--runs-dir", tmp_path, "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr + log_errors(demo.parent / "wd")
    rep = json.loads(r.stdout)
    assert rep["knee"] == 2 and rep["resolved"] and rep["runs"] == 2
    assert [p["concurrency"] for p in rep["probes"]] == [1, 2] and all(p["passed"] for p in rep["probes"])
    assert "probe concurrency" in r.stderr
    knee_dir = Path(rep["probes"][0]["run_dir"]).parent
    assert (knee_dir / "knee.json").exists() and (knee_dir / "knee.png").stat().st_size > 0


def test_ab_demo_vs_variant_writes_the_report(demo: Path, tmp_path: Path) -> None:
    variant = demo.with_name("demo-variant.yaml")
    r = cli("ab", demo, variant, "--repeat", "1", "--duration", "3", "--concurrency", "2", "--runs-dir", tmp_path,
            timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr + log_errors(demo.parent / "wd")
    (ab_dir,) = [p for p in tmp_path.iterdir() if p.name.endswith("-ab")]
    report = (ab_dir / "report.md").read_text()
    assert "| tok_s_per_user |" in report and "unknown (needs --repeat >= 2)" in report
    assert "A1 | VALID" in report and "B1 | VALID" in report
    for png in ("ab.png", "pareto.png"):
        assert (ab_dir / png).read_bytes()[:4] == b"\x89PNG"
    assert "deploying B" in r.stderr


def _signal_masks(pid: int) -> str:
    """How `pid` and each of its threads stood towards signals (/proc status lines), for a failure message."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            status = (task / "status").read_text().splitlines()
        except OSError:
            continue
        lines.append(task.name + " " + " ".join(ln for ln in status if ln.startswith(("Name", "Sig", "ShdPnd"))))
    return "\n".join(lines)


def _sweep_state(runs: Path) -> tuple[Path, dict] | None:
    found = sorted(runs.glob("*-sweep/sweep.json"))
    if not found:
        return None
    try:
        return found[-1].parent, json.loads(found[-1].read_text())
    except json.JSONDecodeError:  # mid-write is impossible (atomic replace), but be safe
        return None


def test_sweep_interrupted_by_ctrl_c_then_resumed_writes_every_file(demo: Path, tmp_path: Path) -> None:
    """Two variants (decode workers 1 and 2) on the real demo: Ctrl-C after the first variant's knee search,
    the deployment keeps serving, `--resume` measures only what is left and writes the report."""
    runs = tmp_path / "runs"
    env = os.environ | {"COLUMNS": "250", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [PRIMECTL, "sweep", str(demo), "--vary", "decode.workers=1,2", "--sla", "ttft_p90_ms<=60000",
         "--concurrency", "2", "--max-runs", "2", "--duration", "3", "--no-smoke", "--skip-preflight", "--predict",
         "--runs-dir", str(runs)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            got = _sweep_state(runs)
            if got and any(r["repeats"] for r in got[1]["results"].values()):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"sweep ended before it could be interrupted:\n{proc.communicate()}"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        masks = _signal_masks(proc.pid)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, f"{out}{err}\nthe sweep's threads at the signal:\n{masks}"
    got = _sweep_state(runs)
    assert got is not None
    root, state = got
    assert f"resume with: primectl sweep --resume {root}" in err
    assert state["status"] == "interrupted"
    first = state["order"][0]
    assert state["order"] == ["v02", "v01"] and state["restarts"]["v02"] == []  # the base (2 workers) is deployed
    assert len(state["results"][first]["repeats"]) == 1
    assert not state["results"].get("v01", {}).get("repeats")
    kept = {p: p.stat().st_mtime_ns for p in (root / first).rglob("summary.json")}
    assert kept
    with urllib.request.urlopen(f"http://127.0.0.1:{FRONTEND_PORT}/v1/models", timeout=10) as resp:
        assert resp.status == 200  # Ctrl-C left a deployment serving

    r = cli("sweep", "--resume", root, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr + log_errors(demo.parent / "wd")
    state = json.loads((root / "sweep.json").read_text())
    assert state["status"] == "done"
    assert {vid: len(res["repeats"]) for vid, res in state["results"].items()} == {"v01": 1, "v02": 1}
    assert {p: p.stat().st_mtime_ns for p in (root / first).rglob("summary.json")} == kept  # not measured again
    assert state["time"]["deploy_s"] > 0 and state["time"]["measure_s"] > 0
    for row in state["summary"]:
        assert row["status"] == "measured" and row["sessions"] == 2, row
        assert row["output_tok_s_per_gpu"] > 0 and row["tok_s_per_user"] > 0 and row["ttft_p90_ms"] > 0
        assert row["prediction"]["status"] == "n/a"  # the CPU demo has no perf database
    assert [r["gpus"] for r in state["summary"]] == [2, 3]  # worker slots: prefill + 1 or 2 decoders
    md = (root / "sweep.md").read_text()
    assert "| v01 | decode.workers=1 | ratio=1:1 | 2 | 2 |" in md and "s deploying" in md
    assert "n/a: hardware profile cpu" in md and "![frontier](frontier.png)" in md
    assert (root / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    w = state["winner"]
    assert w["id"] in ("v01", "v02") and "not checked against noise" in w["verdict"]
    assert w["verdict"] in r.stdout
    winner_yaml = root / "winner.yaml"
    from primectl.planner.build import plan_recipe

    won = plan_recipe(winner_yaml)[0].recipe
    assert won.decode.workers == (1 if w["id"] == "v01" else 2) and won.name == "benchdemo"

    back = cli("up", demo, "--no-smoke")  # the base again, for the tests after this one
    assert back.returncode == 0, back.stdout + back.stderr


def test_bench_reports_requests_refused_at_capacity_as_overload_not_as_errors(demo: Path, tmp_path: Path) -> None:
    """Issue #37: a deployment at capacity must read as overloaded. With a busy threshold no worker stays under
    (frontend.busy.active_prefill_tokens_threshold: 1), Dynamo's frontend answers part of the load 529; the run
    is measured (VALID), those requests are counted as overloaded and not as failed."""
    doc = yaml.safe_load(demo.read_text())
    doc["frontend"]["busy"] = {"active_prefill_tokens_threshold": 1}
    busy = tmp_path / "busy.yaml"
    busy.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        up = cli("up", busy, "--no-smoke")
        assert up.returncode == 0, up.stdout + up.stderr
        r = cli("bench", busy, "--duration", "8", "--concurrency", "8", "--runs-dir", tmp_path, "-o", "json")
        s = json.loads(r.stdout)
        f = s["figures"]
        assert f["requests_overloaded"] > 0 and f["requests_failed"] == 0, (s["errors"], s["invalid_reasons"])
        assert all(e["overloaded"] and e["code"] == 529 for e in s["errors"]), s["errors"]
        assert not any(x.startswith("error rate") for x in s["invalid_reasons"]), s["invalid_reasons"]
    finally:
        back = cli("up", demo, "--no-smoke")  # the base again, for the tests after this one
        assert back.returncode == 0, back.stdout + back.stderr

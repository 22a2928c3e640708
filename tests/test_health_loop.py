"""The health loop as it ships: the bundle `primectl render` writes, run by a plain system Python (primectl not
importable) on temp directories, its textfile read back strictly and through the real node_exporter.

Servers here bind free ports on 127.0.0.1; run this module inside `unshare --net` (tests/conftest.py does that for
xdist workers). nvidia-smi cannot run on this machine: the GPU test puts a FAKE nvidia-smi first on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from primectl.checks import health_loop as loop
from primectl.checks.host_rules import GPU_CHECKS, HostNeeds, Result, check_memory, fail, gpu_checks, ok
from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe
from tests.conftest import REPO, CliResult
from tests.exposition import (
    NODE_EXPORTER,
    PROMTOOL,
    Gate,
    Series,
    free_port,
    get,
    labels_of,
    node_exporter,
    parse,
    promtool_check,
    stop,
    value,
    wait_for_metrics,
)

HOST_PYTHON = Path("/usr/bin/python3")  # stands in for a host runtime without primectl
OK = "primectl_health_check_ok"
WARN = "primectl_health_check_warn"
TS = "primectl_health_check_timestamp_seconds"
GATE = "primectl_gate_ready"

pytestmark = pytest.mark.skipif(not (HOST_PYTHON.exists() and NODE_EXPORTER.exists() and PROMTOOL.exists()),
                                reason="needs /usr/bin/python3, prometheus-node-exporter and promtool (make system)")


def recipe(tmp: Path, **monitoring: str) -> Path:
    """The demo recipe with monitoring, its workdir under `tmp`, the health loop run by HOST_PYTHON."""
    extra = "".join(f"  {k}: {v}\n" for k, v in monitoring.items())
    path = tmp / "recipe.yaml"
    path.write_text(textwrap.dedent(f"""\
        extends: {REPO / "recipes" / "demo.yaml"}
        name: health-test
        hosts:
          - name: local
            address: 127.0.0.1
            connection: local
            workdir: {tmp / "wd"}
        software:
          python: {HOST_PYTHON}
        monitoring:
          alerts:
            webhook: http://127.0.0.1:9/alerts
        """) + extra)
    return path


def render(cli: Callable[..., CliResult], tmp: Path, **monitoring: str) -> Path:
    """`primectl render` of `recipe`; the local host's bundle directory."""
    res = cli("render", recipe(tmp, **monitoring), "-o", tmp / "out")
    assert res.exit_code == 0, res.stderr
    return tmp / "out" / "local"


@pytest.fixture
def bundle(cli: Callable[..., CliResult], tmp_path: Path) -> Path:
    return render(cli, tmp_path)


def run_once(bundle: Path, tmp: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """The shipped loop, once, by a Python that cannot import primectl; the textfile it wrote."""
    out = tmp / "textfile"
    r = subprocess.run([str(HOST_PYTHON), "-E", "-s", str(bundle / "probes" / "health_loop.py"), "--once",
                        "--textfile-dir", str(out), "--host", "h1", "--workdir", str(tmp), *args],
                       capture_output=True, text=True, timeout=60, cwd=tmp,
                       env=env or {"PATH": os.environ["PATH"]})
    assert r.returncode == 0, r.stderr
    return (out / "primectl_health.prom").read_text()


def checks(series: dict[Series, float]) -> dict[str, float]:
    """check id -> ok value."""
    return {ls["check"]: value(series, OK, check=ls["check"]) or 0.0 for ls in labels_of(series, OK)}


def test_shipped_loop_runs_without_primectl(bundle: Path, tmp_path: Path) -> None:
    probe = subprocess.run([str(HOST_PYTHON), "-E", "-s", "-c", "import primectl"], capture_output=True, cwd=tmp_path)
    assert probe.returncode != 0, "the stand-in host Python can import primectl: the test would prove nothing"
    assert sorted(p.name for p in (bundle / "probes").glob("*.py") if p.name in
                  ("health_loop.py", "preflight_host.py", "host_rules.py")) == ["health_loop.py", "host_rules.py",
                                                                                 "preflight_host.py"]
    text = run_once(bundle, tmp_path, "--min-free-gb", "0.001", "--min-available-gb", "0.001")
    promtool_check(text)
    series = parse(text)
    assert checks(series) == {"disk": 1, "memory": 1}  # no GPU checks on a host the plan gives no GPUs
    assert value(series, WARN, check="disk") == 0
    assert value(series, OK, check="disk", check_host="h1") == 1
    assert abs((value(series, TS) or 0) - time.time()) < 120
    assert value(series, "primectl_health_check_interval_seconds") == 15
    assert value(series, GATE) is None  # no --gate: not written


def test_a_disk_smaller_than_the_floor_fails_the_disk_check(bundle: Path, tmp_path: Path) -> None:
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    text = run_once(bundle, tmp_path, "--min-free-gb", str(free_gb * 10 + 1000), "--min-available-gb", "1e9")
    promtool_check(text)
    series = parse(text)
    assert checks(series) == {"disk": 0, "memory": 0}
    assert "# check disk: fail: " in text  # the detail, for whoever reads the file
    # between the floor and twice it: passes with a warning (ok stays 1)
    series = parse(run_once(bundle, tmp_path, "--min-free-gb", str(free_gb * 0.75)))
    assert value(series, OK, check="disk") == 1 and value(series, WARN, check="disk") == 1


def test_gate_ready_follows_the_gate(bundle: Path, tmp_path: Path, gate_url: str) -> None:
    Gate.status = 503
    assert value(parse(run_once(bundle, tmp_path, "--gate", gate_url)), GATE) == 0
    Gate.status = 200
    assert value(parse(run_once(bundle, tmp_path, "--gate", gate_url)), GATE) == 1
    assert value(parse(run_once(bundle, tmp_path, "--gate", f"http://127.0.0.1:{free_port()}/ready")), GATE) == 0


FAKE_NVIDIA_SMI = """#!/bin/sh
# FAKE nvidia-smi (no GPU on this machine): answers the four calls preflight_host.gpu() makes, from files beside it.
here=$(dirname "$0")
case "$1" in
  --query-gpu=*) cat "$here/query.csv" ;;
  nvlink) cat "$here/nvlink.txt" ;;
  topo) echo "GPU0 X" ;;
  *) echo "| NVIDIA-SMI 570.86.15   Driver Version: 570.86.15   CUDA Version: 12.8 |" ;;
esac
"""
NVLINK_UP = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: a)\n\t Link 0: 26.562 GB/s\n\t Link 1: 26.562 GB/s\n"


def fake_gpu(tmp: Path) -> dict[str, str]:
    """A FAKE nvidia-smi with two healthy H100s; the environment that finds it first."""
    fake = tmp / "fake-nvidia-smi"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    (fake / "query.csv").write_text("".join(
        f"{i}, NVIDIA H100 80GB HBM3, 00000000:1{i}:00.0, 570.86.15, 81559, 0, No, Enabled\n" for i in range(2)))
    (fake / "nvlink.txt").write_text(NVLINK_UP)
    return {"PATH": f"{fake}:{os.environ['PATH']}"}


def test_gpu_checks_run_where_the_plan_gives_gpus_and_a_down_nvlink_fails(bundle: Path, tmp_path: Path) -> None:
    env = fake_gpu(tmp_path)
    gpu_args = ("--gpus", "2", "--gpu-name", "H100", "--sm", "90", "--nvlink-expected")
    series = parse(run_once(bundle, tmp_path, *gpu_args, env=env))
    got = checks(series)
    assert set(got) == {"disk", "memory", *(c for c in GPU_CHECKS if c != "selftest")}
    assert got["gpu"] == got["driver"] == got["nvlink"] == 1
    # the same host with no GPU in the plan: no GPU check is written, so none can alert
    assert set(checks(parse(run_once(bundle, tmp_path, env=env)))) == {"disk", "memory"}
    # a link goes down between launches
    (tmp_path / "fake-nvidia-smi" / "nvlink.txt").write_text(NVLINK_UP.replace("Link 1: 26.562 GB/s", "Link 1: <inactive>"))
    text = run_once(bundle, tmp_path, *gpu_args, env=env)
    assert checks(parse(text))["nvlink"] == 0
    assert "# check nvlink: fail: 1 of 2 links active" in text
    # no driver at all: the gpu check fails, and the checks it makes impossible are not written
    got = checks(parse(run_once(bundle, tmp_path, *gpu_args, env={"PATH": "/nonexistent"})))
    if not Path("/usr/bin/nvidia-smi").exists():
        assert got == {"disk": 1, "memory": 1, "gpu": 0}


def test_a_check_that_raises_fails_alone_with_its_error_escaped() -> None:
    def broken() -> list[Result]:
        raise RuntimeError('bad "quote" \\ and\nnewline')

    no_gpu = HostNeeds(name="h1", address="", workdir="/", roles=frozenset(), ports={}, runtime_python="",
                       runtime_dir="", provisioned=False, expected_stamp=None, gpus=0)
    verdicts = loop.run_checks([(("gpu", "nvlink"), broken), (("ib",), lambda: gpu_checks(no_gpu, None)),
                                (("memory",), lambda: [check_memory("h1", {"total": 8 * 10**9, "available": 4 * 10**9}, 1e9)])])
    text = loop.render(verdicts, "h1", None, now=1.0, took=0.5, interval=15)
    promtool_check(text)
    series = parse(text)
    assert checks(series) == {"gpu": 0, "nvlink": 0, "memory": 1}  # the n/a ones are not written
    [err] = [ls for ls in labels_of(series, "primectl_health_check_error") if ls["check"] == "nvlink"]
    assert err["error"] == 'RuntimeError: bad "quote" \\ and\nnewline'
    # two verdicts for one check (never from the shipped checks) are written once, the worse
    assert loop.run_checks([(("memory",), lambda: [fail("h1", "memory", "low", "")]),
                            (("memory",), lambda: [ok("h1", "memory", "fine")])]) == [loop.Verdict("memory", "fail", "low")]


def test_the_loop_keeps_ticking(bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "textfile"
    proc = subprocess.Popen([str(HOST_PYTHON), "-E", "-s", str(bundle / "probes" / "health_loop.py"),
                             "--textfile-dir", str(out), "--host", "h1", "--workdir", str(tmp_path), "--interval", "0.2"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        seen: set[float] = set()
        deadline = time.monotonic() + 30
        while len(seen) < 3:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, f"only {len(seen)} distinct runs in 30 s"
            try:
                seen.add(value(parse((out / "primectl_health.prom").read_text()), TS) or 0)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
    finally:
        stop(proc)


def test_node_exporter_serves_the_rendered_loop_and_sysfs(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """The rendered node-exporter and health-loop scripts, run as `up` would run them: node_exporter exposes the
    loop's series (beside its own textfile health) and reads InfiniBand from `monitoring.sysfs`."""
    sysfs = tmp_path / "sysfs"
    shutil.copytree(REPO / "tests" / "data" / "fake-sysfs", sysfs)
    port = free_port()
    out = render(cli, tmp_path, sysfs=str(sysfs), health_interval="1s", ports=f"{{node_exporter: {port}}}")
    script = (out / "bin" / "node-exporter-local.sh").read_text()
    assert f"--path.sysfs={sysfs} " in script
    procs = [subprocess.Popen(["bash", str(out / "bin" / name)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name in ("health-local.sh", "node-exporter-local.sh")]
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for_metrics(url, procs[1])
        deadline = time.monotonic() + 30
        while True:
            series = parse(get(url))
            if value(series, OK, check="disk") is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert value(series, OK, check="disk", check_host="local") is not None, "the loop's series never showed up"
        assert value(series, "node_textfile_scrape_error") == 0
        assert value(series, "node_infiniband_state_id", device="mlx5_0", port="1") == 4
    finally:
        for p in procs:
            stop(p)


def test_node_exporter_exposes_the_textfile(bundle: Path, tmp_path: Path) -> None:
    text = run_once(bundle, tmp_path, "--min-free-gb", "1e9", "--min-available-gb", "0.001")
    with node_exporter("--collector.disable-defaults", "--collector.textfile",
                       f"--collector.textfile.directory={tmp_path / 'textfile'}", log=tmp_path / "ne.log") as url:
        page = get(url)
    series = parse(page)
    assert value(series, OK, check="disk", check_host="h1") == 0
    assert value(series, OK, check="memory", check_host="h1") == 1
    assert value(series, TS) == value(parse(text), TS)
    assert value(series, "node_textfile_scrape_error") == 0


def test_memory_rule_thresholds() -> None:
    mem = {"total": 16 * 10**9, "available": 3 * 10**9}
    assert check_memory("h1", mem, 4e9).status == "fail"
    assert check_memory("h1", mem, 2e9).status == "warn"
    assert check_memory("h1", mem, 1e9).status == "pass"
    assert check_memory("h1", {}, 1e9).status == "n/a"  # no /proc/meminfo: not written


def test_the_plan_gives_gpu_hosts_the_gpu_checks(tmp_path: Path) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text(textwrap.dedent(f"""\
        extends: {REPO / "recipes" / "glm53.yaml"}
        hosts:
          inventory: {REPO / "recipes" / "glm53-hosts.yaml"}
        monitoring:
          alerts:
            webhook: http://127.0.0.1:9/alerts
        """))
    plan = build_plan(load_recipe(path).recipe)
    health = {s.host: s for s in plan.services if s.component == "health-check"}
    tray, head = health["tray01"], health["head"]
    assert tray.argv[tray.argv.index("--gpus") + 1] == "4"
    assert tray.argv[tray.argv.index("--gpu-name") + 1] == "NVIDIA GB200"
    assert {"--multi-host", "--nvlink-expected"} <= set(tray.argv)
    assert "--gpus" not in head.argv  # the CPU head node: no GPU check can fire there
    assert sorted(f.path for f in tray.files) == ["probes/health_loop.py", "probes/host_rules.py", "probes/preflight_host.py"]

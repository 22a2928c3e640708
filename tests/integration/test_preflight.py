"""`primectl preflight` for real on the three sshd hosts, with the real host runtime.

Every check that applies to CPU hosts runs for real: SSH, workdir, OS, disk,
ports, clock, host DRAM, runtime versions against the pins, a NIXL READ from
the prefill host (h2) to the decode host (h3), and a Mooncake put/get through a
temporary master on h1. Faults are injected for real: a socket bound on a port
h2 needs, a 1 MB tmpfs mounted on h1's workdir, a runtime Python without the
pinned packages, a GPU hardware profile on hosts without `nvidia-smi`; and
`up` refuses to start (changing nothing) when preflight fails.

Needs env PRIMECTL_RUNTIME_PYTHON (the runtime venv's python, e.g.
/opt/primectl-runtime-test/bin/python or .runtime/bin/python from `make runtime`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .conftest import Deployment

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def runtime_python() -> str:
    py = os.environ.get("PRIMECTL_RUNTIME_PYTHON", "")
    if not py:
        pytest.fail("set PRIMECTL_RUNTIME_PYTHON to the host runtime's python (e.g. /opt/primectl-runtime-test/bin/python, "
                    "or $PWD/.runtime/bin/python after `make runtime`)", pytrace=False)
    if not os.access(py, os.X_OK):
        pytest.fail(f"PRIMECTL_RUNTIME_PYTHON={py} is not an executable", pytrace=False)
    return py


def real_runtime(deployment: Deployment, py: str, extra: dict[str, Any] | None = None) -> Path:
    """The test recipe on the real runtime, with a Mooncake tier whose master is on h1 (ports of its own)."""
    base = deployment.frontend_port
    changes: dict[str, Any] = {
        "software": {"python": py},
        "host_tier": {"master_host": "h1", "dram_gb_per_host": 0.25, "protocol": "tcp"},
        "ports": {"mooncake_rpc": base + 50, "mooncake_metadata": base + 51, "mooncake_metrics": base + 52},
    }
    return deployment.write(changes | (extra or {}))


def preflight(deployment: Deployment, *args: str, timeout: float = 300) -> tuple[int, dict[str, Any], str]:
    r = deployment.cli("preflight", "-o", "json", *args, timeout=timeout)
    assert r.stdout.strip().startswith("{"), f"no JSON report (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.returncode, json.loads(r.stdout), r.stderr


def checks(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["host"], r["check"]): r for r in doc["results"]}


@contextmanager
def disks_of(deployment: Deployment, sizes: dict[str, str]) -> Iterator[None]:
    """A tmpfs of a known size on each named host's workdir, so the disk checks see what the test says.

    Without it they see the free space of whatever machine runs the suite (CI's /tmp had 3.5 GB: a warning).
    """
    mounted: list[Path] = []
    try:
        for host, size in sizes.items():
            wd = deployment.workdir(host)
            wd.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(wd)], check=True)
            mounted.append(wd)
        yield
    finally:
        for wd in reversed(mounted):
            subprocess.run(["umount", str(wd)], check=True)


ROOMY = "16g"  # tmpfs reserves nothing: only what the test writes uses memory


def no_scratch_left(deployment: Deployment) -> None:
    for h in deployment.hosts:
        assert not (deployment.workdir(h) / "preflight").exists(), f"{h}: preflight scratch left behind"
    assert deployment.leftovers() == {}


def test_every_check_passes_on_healthy_hosts(deployment: Deployment, runtime_python: str) -> None:
    real_runtime(deployment, runtime_python)
    with disks_of(deployment, {h: ROOMY for h in deployment.hosts}):
        code, doc, err = preflight(deployment)
        no_scratch_left(deployment)  # while the workdirs it wrote to are still mounted
    c = checks(doc)
    bad = {k: v for k, v in c.items() if v["status"] == "fail"}
    assert code == 0 and doc["ok"] and not bad, json.dumps(bad, indent=1) + err
    for h in ("h1", "h2", "h3"):
        for check in ("ssh", "workdir", "access", "os", "disk_workdir", "ports", "clock", "runtime"):
            assert c[(h, check)]["status"] == "pass", c[(h, check)]
        assert c[(h, "gpu")]["status"] == "n/a"  # hardware profile cpu
        assert c[(h, "model")]["status"] == "n/a"  # generate: demo-tiny
    assert "4 pins match" in c[("h2", "runtime")]["detail"]
    for h in ("h2", "h3"):
        assert c[(h, "host_dram")]["status"] == "pass"
        assert c[(h, "mooncake")]["status"] == "pass", c[(h, "mooncake")]
        assert "temporary master on h1" in c[(h, "mooncake")]["detail"]
    assert c[("h3", "nixl")]["status"] == "pass", c[("h3", "nixl")]
    [t] = doc["transfers"]
    assert (t["src"], t["dst"], t["mem"], t["ok"]) == ("h2", "h3", "DRAM", True) and t["gb_s"] > 0
    print(f"\nNIXL DRAM READ h2->h3 over UCX: {t['gb_s']:.2f} GB/s; preflight took {doc['seconds']:.1f}s")


def test_port_taken_fails_with_owner_and_remediation(deployment: Deployment, runtime_python: str) -> None:
    real_runtime(deployment, runtime_python)
    port = deployment.ports["worker_system"]  # prefill-0's system port on h2
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.3", port))
        squatter.listen(8)
        code, doc, _ = preflight(deployment, "--no-fabric")
    r = checks(doc)[("h2", "ports")]
    assert code == 1 and r["status"] == "fail"
    assert f"port {port} on h2 (127.0.0.3) is already in use; prefill-0 needs it (held by pid {os.getpid()}" in r["detail"]
    assert "stop what holds the port" in r["remediation"]
    assert checks(doc)[("h3", "ports")]["status"] == "pass"
    no_scratch_left(deployment)


def test_nearly_full_disk_fails(deployment: Deployment, runtime_python: str) -> None:
    real_runtime(deployment, runtime_python)
    wd = deployment.workdir("h1")
    with disks_of(deployment, {"h1": "1m", "h2": ROOMY}):
        code, doc, _ = preflight(deployment, "--no-fabric")
    r = checks(doc)[("h1", "disk_workdir")]
    assert code == 1 and r["status"] == "fail", r
    assert r["detail"].startswith(f"0.00 GB free at {wd}, need 2.00 GB")
    assert "free at least" in r["remediation"]
    assert checks(doc)[("h2", "disk_workdir")]["status"] == "pass"


def test_runtime_without_the_pinned_versions_fails(deployment: Deployment, tmp_path: Path) -> None:
    """software.python pointing at a real Python whose environment lacks the pinned packages (a bare venv).

    Validation only accepts the supported pins, so the drift comes from the installed side, for real.
    """
    venv = tmp_path / "bare-runtime"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    deployment.write({"software": {"python": str(venv / "bin" / "python")}})
    code, doc, _ = preflight(deployment)
    c = checks(doc)
    assert code == 1
    for h in ("h1", "h2", "h3"):
        r = c[(h, "runtime")]
        assert r["status"] == "fail", r
        assert "ai-dynamo pinned 1.6.1, installed missing" in r["detail"] and "nixl pinned 1.4.1, installed missing" in r["detail"]
        assert "install the pinned versions into that runtime" in r["remediation"]
    # the fabric probes still run with that Python, and fail for the same reason
    assert c[("h3", "nixl")]["status"] == "fail" and "nixl_cu12" in c[("h3", "nixl")]["detail"], c[("h3", "nixl")]


def test_a_runtime_install_cut_short_is_left_to_up_not_blamed_on_the_fabric(deployment: Deployment) -> None:
    """primectl's own runtime venv on each host, created but never stamped (the install failed: no index, a full
    disk, a Ctrl-C). `up` installs it again before it starts anything, so preflight must not probe NIXL and
    Mooncake with it (they fail for missing packages and send the operator to check RDMA) and so block that
    `up` for good: the probes wait for the runtime, the runtime check says `up` reinstalls it."""
    recipe = real_runtime(deployment, "", {"software": None})  # no software.python: primectl's own venv
    r = deployment.cli("plan", "-o", "json", recipe=recipe)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    for h in ("h1", "h2", "h3"):
        rt = plan["serving"]["runtime"][h]
        assert rt["provisioned"], rt
        venv = Path(rt["python"]).parents[1]
        subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)  # no packages, no stamp
    code, doc, _ = preflight(deployment)
    c = checks(doc)
    for h in ("h1", "h2", "h3"):
        assert c[(h, "runtime")]["status"] == "warn" and "`up` reinstalls it" in c[(h, "runtime")]["detail"]
    for key in (("h3", "nixl"), ("h1", "mooncake")):
        assert c[key]["status"] == "n/a", c[key]
        assert "install did not finish (no stamp): `up` installs it first" in c[key]["detail"], c[key]
    assert code == 0, doc


def test_gpu_profile_on_hosts_without_nvidia_smi_fails(deployment: Deployment, runtime_python: str) -> None:
    if os.path.exists("/usr/bin/nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: the missing-driver fault cannot be shown here")
    hosts = [dict(h, gpus=0 if h["name"] == "h1" else 4) for h in deployment.base["hosts"]]
    model = dict(deployment.base["model"], generate="tiny-qwen2", arch="tiny-qwen2")  # vLLM needs weights
    deployment.write({"engine": "vllm", "hardware": {"profile": "gb200-nvl72"}, "hosts": hosts, "model": model,
                      "software": {"python": runtime_python}})
    code, doc, _ = preflight(deployment, "--no-fabric")
    c = checks(doc)
    assert code == 1
    for h in ("h2", "h3"):
        r = c[(h, "gpu")]
        assert r["status"] == "fail"
        assert r["detail"].startswith("no NVIDIA driver: nvidia-smi not found; install the driver")
        assert "4 x NVIDIA GB200" in r["remediation"]
        for check in ("driver", "ecc_xid", "nvlink", "ib", "peermem", "numa", "selftest"):
            assert c[(h, check)]["status"] == "n/a", c[(h, check)]
    assert c[("h1", "gpu")]["status"] == "n/a"  # gpus: 0
    assert "vllm pinned 0.31.0, installed missing" in c[("h2", "runtime")]["detail"]


def test_table_output_and_exit_code(deployment: Deployment, runtime_python: str) -> None:
    real_runtime(deployment, runtime_python)
    r = deployment.cli("preflight", "--no-fabric")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "preflight" in r.stdout and "OK" in r.stdout
    # piped (as here): plain columns with kubectl-style headers, nothing cut
    for word in ("HOST", "CHECK", "RESULT", "REMEDIATION", "disk_workdir", "clock"):
        assert word in r.stdout


def test_up_refuses_to_start_when_preflight_fails(deployment: Deployment, runtime_python: str) -> None:
    port = deployment.ports["worker_system"]
    before = deployment.snapshot()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.3", port))
        squatter.listen(8)
        r = deployment.up(preflight=True)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "preflight failed" in r.stderr and "nothing was changed" in r.stderr
        assert f"port {port} on h2 (127.0.0.3) is already in use; prefill-0 needs it" in r.stderr
        assert deployment.snapshot() == before
        for h in deployment.hosts:
            for name in ("releases", "current", "state.json", "run", "lock", "incoming", "preflight"):
                assert not (deployment.workdir(h) / name).exists(), f"{h}: {name} exists after a refused up"
        # --skip-preflight (the helper's default) goes straight to up's own checks, which refuse the port too
        r = deployment.up()
        assert r.returncode == 1 and "preflight" not in r.stderr and "ports are taken" in r.stderr, r.stderr
    assert deployment.leftovers() == {}

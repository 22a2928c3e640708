"""Every rendered systemd unit passes `systemd-analyze verify` (no errors, no warnings).

systemd need not be PID 1 for `verify`; it does check that ExecStart's program exists, so each
unit is verified twice: as rendered (ExecStart=/bin/bash SCRIPT), and as a copy whose workdir
paths point into a temporary root where the rendered run script really is.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe
from primectl.render.bundle import render_plan, script_path, unit_name, write_bundles

REPO = Path(__file__).resolve().parent.parent
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")

pytestmark = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None,
    reason="systemd-analyze is not installed (Debian: apt-get install -y systemd); it runs without systemd as PID 1",
)


def verify(units: list[Path]) -> None:
    assert SYSTEMD_ANALYZE
    proc = subprocess.run([SYSTEMD_ANALYZE, "verify", "--man=no", *map(str, units)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), proc.stderr + proc.stdout


@pytest.mark.parametrize("recipe", ["glm53.yaml", "demo.yaml"])
def test_every_rendered_unit_passes_systemd_analyze_verify(recipe: str, tmp_path: Path) -> None:
    plan = build_plan(load_recipe(REPO / "recipes" / recipe).recipe)
    out = tmp_path / "bundles"
    write_bundles(render_plan(plan), out)
    rendered = sorted(out.glob("*/systemd/*.service"))
    assert len(rendered) == len(plan.services) + sum(1 for s in plan.services if s.twin)  # surge twins have units too
    verify(rendered)

    # The same units with the host's workdir moved under a temporary root, where the
    # release (the `current` link), the run scripts and the log directory really exist.
    copies = tmp_path / "units"
    copies.mkdir()
    for svc in plan.services:
        host = plan.host(svc.host)
        root = tmp_path / "root" / svc.host
        workdir = root / host.workdir.lstrip("/")
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        if not (workdir / "current").exists():
            (workdir / "current").symlink_to(out / svc.host)
        unit = (out / svc.host / "systemd" / f"{unit_name(plan, svc)}.service").read_text()
        assert f"ExecStart=/bin/bash {script_path(host, svc)}\n" in unit
        moved = unit.replace(host.workdir + "/", str(workdir) + "/").replace(
            f"WorkingDirectory={host.workdir}\n", f"WorkingDirectory={workdir}\n")
        script = Path(script_path(host, svc).replace(host.workdir, str(workdir), 1))
        assert script.is_file(), script
        assert f"ExecStart=/bin/bash {script}\n" in moved
        (copies / f"{unit_name(plan, svc)}.service").write_text(moved)
    verify(sorted(copies.glob("*.service")))

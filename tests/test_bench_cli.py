"""`primectl bench` / `ab` input errors exit 2 before touching a cluster."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from primectl.cli import app

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "recipes" / "demo.yaml")


def test_missing_aiperf_exits_2_with_the_install_command(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PRIMECTL_AIPERF", str(tmp_path / "no-aiperf"))
    r = CliRunner().invoke(app, ["bench", DEMO, "--runs-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "pip install aiperf==0.13.0" in r.output


def test_bad_sla_exits_2(tmp_path) -> None:
    r = CliRunner().invoke(app, ["bench", DEMO, "--sla", "speed>=fast", "--runs-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "cannot parse SLA" in r.output


def test_ab_refuses_different_hosts(tmp_path, monkeypatch) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\nhosts:\n  - name: local\n    address: 127.0.0.9\n"
                     "    connection: local\n    workdir: /tmp/primectl-demo-other\n")
    r = CliRunner().invoke(app, ["ab", DEMO, str(other), "--runs-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "different hosts" in r.output

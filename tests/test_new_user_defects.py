"""Defects a new user hit (issue 17), each pinned by the behaviour they would notice.

Scaling a role without restarting the frontend is in tests/test_rollout_fake.py
(test_scaling_decode_adds_a_worker_and_restarts_neither_frontend_nor_the_others) and over real
SSH in tests/integration/test_apply_lifecycle.py.
"""

from __future__ import annotations

import io
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primectl.deploy.status import ServiceStatus, StatusReport, print_status
from primectl.host.logs import readable
from primectl.planner.build import plan_recipe
from primectl.targets.ssh_observe import log_command

REPO = Path(__file__).resolve().parent.parent
COLOURED = ("\x1b[2m2026-12-01T09:00:00.1Z\x1b[0m \x1b[32m INFO\x1b[0m \x1b[2mdynamo_runtime::system\x1b[0m\x1b[2m:\x1b[0m "
            "worker ready\r\n\x1b]0;title\x07\x1b[1;31mERROR\x1b[0m boom\n")


# -- 2. bad bytes in a recipe, inventory or base recipe are bad input ------------------------------------

def _latin1_recipe(tmp: Path, name: str = "r.yaml") -> Path:
    path = tmp / name
    path.write_bytes("name: demo\n# caf\xe9\n".encode("latin-1"))
    return path


def test_a_recipe_that_is_not_utf8_is_bad_input_with_the_byte_offset(cli: Callable[..., Any], tmp_path: Path) -> None:
    path = _latin1_recipe(tmp_path)
    r = cli("validate", path)
    assert r.exit_code == 2
    assert f"{path}: cannot read recipe: not UTF-8 text: byte 16 is 0xe9" in r.stderr.replace("\n", "")


def test_an_inventory_that_is_not_utf8_or_is_missing_names_the_field(cli: Callable[..., Any], tmp_path: Path) -> None:
    _latin1_recipe(tmp_path, "hosts.yaml")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\nhosts:\n  inventory: hosts.yaml\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2
    assert "r.yaml:3:3: hosts.inventory: cannot read inventory: not UTF-8 text: byte 16 is 0xe9" in r.stderr
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\nhosts:\n  inventory: nope.yaml\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2 and "hosts.inventory: cannot read inventory: No such file or directory" in r.stderr


def test_an_extends_file_that_is_missing_or_not_utf8_points_at_extends(cli: Callable[..., Any], tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("extends: missing.yaml\nname: x\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2 and "r.yaml:1:1: extends: cannot read base recipe: No such file or directory" in r.stderr
    _latin1_recipe(tmp_path, "base.yaml")
    recipe.write_text("extends: base.yaml\nname: x\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2 and "base.yaml: cannot read recipe: not UTF-8 text: byte 16 is 0xe9" in r.stderr


# -- 3. served names: refused when the API paths cannot carry them, encoded where they can ---------------

def test_a_served_name_with_a_slash_is_encoded_in_the_gate_url(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\nmodel:\n  served_name: zai-org/GLM-5.3\n")
    _, plan = plan_recipe(recipe)
    assert plan.gate.url == "http://127.0.0.1:8000/v1/models/zai-org%2FGLM-5.3/ready"
    assert plan.served_model == "zai-org/GLM-5.3"


def test_a_served_name_with_a_space_is_refused_naming_what_is_allowed(cli: Callable[..., Any], tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\nmodel:\n  served_name: my model\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2
    assert "r.yaml:3:3: model.served_name: 'my model' cannot be carried in the OpenAI API paths" in r.stderr
    assert "(' ' not allowed); allowed: letters, digits and . _ : / @ + -" in r.stderr


# -- 4. logs without terminal escape codes ----------------------------------------------------------------

def test_log_tails_shown_on_failure_are_plain_text() -> None:
    assert readable(COLOURED) == ("2026-12-01T09:00:00.1Z  INFO dynamo_runtime::system: worker ready\n"
                                  "ERROR boom\n")


def test_primectl_logs_strips_escape_codes_on_the_host(tmp_path: Path) -> None:
    _, plan = plan_recipe(REPO / "recipes" / "demo.yaml")
    host, command = log_command(plan, "decode-0", follow=False, lines=10)
    log = Path(plan.host(host).workdir) / "logs" / "decode-0.log"
    local = command.replace(str(log), str(tmp_path / "decode-0.log"))
    (tmp_path / "decode-0.log").write_text(COLOURED)
    out = subprocess.run(["/bin/sh", "-c", local], capture_output=True, text=True, check=True).stdout
    assert "\x1b" not in out and "\r" not in out
    assert "INFO dynamo_runtime::system: worker ready" in out and "ERROR boom" in out


def test_every_dynamo_process_is_told_not_to_colour_its_logs() -> None:
    _, plan = plan_recipe(REPO / "recipes" / "glm53.yaml")
    dynamo = [s for s in plan.services if s.component.startswith("dynamo-")]
    assert dynamo and all(s.env.get("NO_COLOR") == "1" for s in dynamo)


# -- 5. status in a pipe keeps whole values -------------------------------------------------------------

def _report() -> StatusReport:
    long_detail = "HTTP 503 (worker registered; waiting for prefill-0 to load 2 of 3 shards of the weights)"
    rows = [ServiceStatus("frontend", "local", "frontend", True, True, True, 4242, "8413919690ec2f8c", "HTTP 200"),
            ServiceStatus("mooncake-master", "local", "cache", True, True, False, 4243, "8413919690ec2f8c",
                          long_detail, state="active (running)", restarts=2)]
    return StatusReport("demo", rows, {"ok": True, "detail": "HTTP 200"}, "http://127.0.0.1:8000/v1/models/demo/ready")


def test_status_written_to_a_pipe_keeps_whole_headers_and_values() -> None:
    out = io.StringIO()
    print_status(_report(), "table", stream=out)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0] == "demo: NOT HEALTHY"
    assert lines[1].split() == ["SERVICE", "HOST", "ROLE", "RUNNING", "READY", "PID", "REVISION", "DETAIL"]
    row = next(line for line in lines if line.startswith("mooncake-master"))
    assert row.endswith("waiting for prefill-0 to load 2 of 3 shards of the weights) (restarted 2x by the supervisor)")
    assert "│" not in text and "…" not in text


def test_status_wide_adds_the_supervisors_view() -> None:
    out = io.StringIO()
    print_status(_report(), "wide", stream=out)
    header = out.getvalue().splitlines()[1].split()
    assert header[-3:] == ["STATE", "RESTARTS", "DETAIL"]
    assert "active (running)" in out.getvalue()


# -- 6. make demo does not install the bench tools --------------------------------------------------------

def test_make_demo_does_not_install_aiperf() -> None:
    dry = subprocess.run(["make", "-n", "-B", "demo"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "primectl up recipes/demo.yaml" in dry.stdout
    assert "aiperf" not in dry.stdout and ".venv-bench" not in dry.stdout


def test_bench_finds_an_installed_aiperf_without_installing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from primectl.bench import aiperf

    exe = tmp_path / "bin" / "aiperf"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PRIMECTL_AIPERF", str(exe))
    said: list[str] = []
    assert aiperf.ensure_aiperf(said.append) == str(exe) and said == []


def test_bench_reuses_the_aiperf_it_installed_outside_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed primectl puts AIPerf in bench_venv(); the next `bench` finds it there instead of reinstalling."""
    from primectl.bench import aiperf

    venv = tmp_path / "venv-bench"
    exe = venv / "bin" / "aiperf"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.delenv("PRIMECTL_AIPERF", raising=False)
    monkeypatch.setenv("PRIMECTL_BENCH_VENV", str(venv))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(aiperf, "_REPO", tmp_path / "not-a-checkout")
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    assert aiperf.ensure_aiperf(said.append) == str(exe) and said == []

"""The spine as an operator drives it: validate, plan, render, schema; exit codes 0 / 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PRIMECTL = Path(sys.executable).with_name("primectl")


@pytest.mark.parametrize("recipe", ["glm53.yaml", "glm53-fp8.yaml", "demo.yaml", "demo-systemd.yaml", "bench-4rack.yaml"])
def test_shipped_recipes_validate(cli: Callable[..., Any], recipe: str) -> None:
    result = cli("validate", f"recipes/{recipe}")
    assert result.exit_code == 0, result.stderr
    assert re.fullmatch(rf"recipes/{re.escape(recipe)}: valid \(\d+ services on \d+ hosts\)\n", result.stdout), \
        result.stdout


def test_refused_recipe_from_a_real_shell_exits_2_pointing_at_the_line() -> None:
    if not PRIMECTL.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    proc = subprocess.run(
        [str(PRIMECTL), "validate", "tests/invalid/parallel_dep7.yaml"], cwd=REPO, capture_output=True, text=True,
        timeout=60, env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "1 problem in the recipe; nothing was changed" in proc.stderr
    assert "tests/invalid/parallel_dep7.yaml:5:3: prefill.parallel: 'DEP7' is not a parallel spec" in proc.stderr


def test_logs_journal_needs_the_systemd_supervisor(cli: Callable[..., Any]) -> None:
    """The process supervisor keeps no journal: refused as bad input before any host is contacted."""
    result = cli("logs", "recipes/demo.yaml", "decode-0", "--journal")
    assert result.exit_code == 2
    assert "`logs --journal` needs supervisor: systemd (this recipe has process" in result.stderr


def test_missing_recipe_file_is_bad_input(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("validate", tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert "cannot read recipe: No such file or directory" in result.stderr


@pytest.mark.parametrize("text", ["", "- just\n- a list\n", "just a string\n"], ids=["empty", "list", "scalar"])
def test_recipe_that_is_not_a_mapping_is_bad_input(cli: Callable[..., Any], tmp_path: Path, text: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    result = cli("validate", path)
    assert result.exit_code == 2
    assert "a recipe must be a YAML mapping" in result.stderr


def test_plan_table_shows_placement_capacity_and_defaults(cli: Callable[..., Any]) -> None:
    result = cli("plan", "recipes/glm53.yaml")
    assert result.exit_code == 0, result.stderr
    for words in ("prefill-0-0", "decode-11", "GPUs used: 72 of 72", "ports.worker_system", "8081"):
        assert words in result.stdout


def test_plan_refuses_a_broken_recipe_like_validate(cli: Callable[..., Any]) -> None:
    result = cli("plan", "tests/invalid/not_enough_gpus.yaml", "--output", "json")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "decode.workers: cannot place decode instance" in result.stderr


def test_render_writes_one_bundle_per_host(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("render", "recipes/demo.yaml", "--out", tmp_path)
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "local" / "manifest.json").read_text())
    assert sorted(manifest["services"]) == ["balancer", "decode-0", "decode-1", "frontend", "mooncake-master", "prefill-0"]
    assert f"revision {manifest['revision']}" in result.stdout


def test_help_lists_the_spine_commands(cli: Callable[..., Any]) -> None:
    result = cli("--help")
    assert result.exit_code == 0
    for command in ("validate", "plan", "render", "schema"):
        assert command in result.stdout

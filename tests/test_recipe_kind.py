"""A recipe says what it describes with `kind:` (issue 38, item 2): `deployment`, the default, is today's recipe."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.conftest import REPO, CliResult


def extend(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\n{body}")
    return path


def test_kind_deployment_is_the_recipe_left_without_a_kind(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    said = cli("plan", extend(tmp_path, "kind: deployment\n"), "-o", "json")
    left = cli("plan", REPO / "recipes" / "demo.yaml", "-o", "json")
    assert said.exit_code == left.exit_code == 0, said.stderr + left.stderr
    a, b = json.loads(said.stdout), json.loads(left.stdout)
    assert a["recipe_hash"] == b["recipe_hash"] and a["services"] == b["services"]
    assert b["defaults"]["kind"] == "deployment"


def test_an_unknown_kind_is_refused_at_its_line(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    path = extend(tmp_path, "name: x\nkind: flet\n")
    r = cli("up", path)
    assert r.exit_code == 2
    assert r.problems() == [f"  {path}:3:1: kind: 'flet' is not allowed; allowed: deployment"], r.stderr
    assert "nothing was changed" in r.stderr


def test_the_schema_lists_the_kinds(cli: Callable[..., CliResult]) -> None:
    doc = json.loads(cli("schema").stdout)
    assert doc["properties"]["kind"]["const"] == "deployment"

"""A recipe, inventory or base recipe holding a control character (valid UTF-8, but YAML forbids it)
is bad input: exit 2, pointing at file:line:col and naming the character (issue 20, item 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primectl.errors import RecipeError
from primectl.recipe.yamlpos import load_yaml

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("char", "named"), [
    ("\x00", "U+0000 NUL"), ("\x07", "U+0007 BEL"), ("\x1b", "U+001B ESC"), ("\x7f", "U+007F DEL"),
    ("\x9b", "U+009B"), ("\ufffe", "U+FFFE"),
])
def test_load_yaml_names_the_character_and_where_it_is(char: str, named: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_yaml(f"name: demo\nmodel:\n  served_name: ab{char}c\n", "r.yaml")
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.column) == ("r.yaml", 3, 18)
    assert named in problem.message


def test_a_recipe_with_a_nul_is_bad_input_at_its_line_and_column(cli: Callable[..., Any], tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\n# a\x00comment\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2
    assert f"{recipe}:2:4: not valid YAML: character U+0000 NUL is not allowed" in r.stderr.replace("\n", "")
    assert "Traceback" not in r.stderr + r.stdout


def test_an_inventory_with_a_control_character_points_into_the_inventory(cli: Callable[..., Any],
                                                                         tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - name: a\x01b\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\nhosts:\n  inventory: hosts.yaml\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2
    assert "hosts.yaml:2:12: not valid YAML: character U+0001 SOH is not allowed" in r.stderr.replace("\n", "")


def test_an_extends_file_with_a_control_character_points_into_the_base(cli: Callable[..., Any],
                                                                       tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("name: x\x1f\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("extends: base.yaml\nname: x\n")
    r = cli("validate", recipe)
    assert r.exit_code == 2
    assert "base.yaml:1:8: not valid YAML: character U+001F US is not allowed" in r.stderr.replace("\n", "")

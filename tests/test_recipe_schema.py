"""`primectl schema`: the JSON Schema editors use to complete and check recipes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from primectl.planner.load import _read

REPO = Path(__file__).resolve().parent.parent
RECIPE_FILES = sorted(p for p in (REPO / "recipes").glob("*.yaml"))


def is_inventory(path: Path) -> bool:
    """An inventory holds only a `hosts:` list; it is not a recipe."""
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and set(data) == {"hosts"}


def is_fleet(path: Path) -> bool:
    """A `kind: fleet` recipe: checked against fleet.schema.json."""
    data = yaml.safe_load(path.read_text())
    return isinstance(data, dict) and data.get("kind") == "fleet"


RECIPES = [p for p in RECIPE_FILES if not is_inventory(p) and not is_fleet(p)]
FLEETS = [p for p in RECIPE_FILES if is_fleet(p)]


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    from typer.testing import CliRunner

    from primectl.cli import app

    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_schema_is_valid_json_schema(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    assert {"model", "hardware", "hosts", "frontend", "prefill", "decode"} <= set(schema["required"])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_schema_accepts_every_shipped_recipe(schema: dict[str, Any], recipe: Path) -> None:
    # Recipes are checked as the loader sees them: `extends` merged, the inventory read.
    data, _ = _read(recipe, str(recipe))
    jsonschema.Draft202012Validator(schema).validate(data)
    if "extends" not in yaml.safe_load(recipe.read_text()):
        jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(recipe.read_text()))


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"colour": "green"}, ()),
        ({"prefill": {"token_budget_per_gp": 1}}, ("prefill",)),
        ({"kv": {"dtype": "nvpf4"}}, ("kv", "dtype")),
        ({"ports": {"worker_system": 40000}}, ("ports", "worker_system")),
        ({"decode": {"env": {"A;B": "1"}}}, ("decode", "env")),
    ],
    ids=["unknown-top-level-key", "unknown-nested-key", "bad-literal", "system-port-over-32767", "bad-env-name"],
)
def test_schema_rejects_what_validate_rejects(
    schema: dict[str, Any], patch: dict[str, Any], where: tuple[str, ...]
) -> None:
    data, _ = _read(REPO / "recipes" / "demo.yaml", "demo.yaml")
    for key, value in patch.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    assert errors, f"schema accepted {patch}"
    assert any(tuple(e.absolute_path)[: len(where)] == where for e in errors), [e.message for e in errors]


@pytest.mark.parametrize("recipe", RECIPES + FLEETS, ids=lambda p: p.name)
def test_every_recipe_names_its_schema_for_the_editor(recipe: Path) -> None:
    first = recipe.read_text().splitlines()[0]
    want = "../fleet.schema.json" if recipe in FLEETS else "../recipe.schema.json"
    assert first == f"# yaml-language-server: $schema={want}", f"{recipe.name} line 1: {first!r}"


@pytest.mark.parametrize("recipe", FLEETS, ids=lambda p: p.name)
def test_the_fleet_schema_accepts_every_shipped_fleet_and_refuses_a_typo(recipe: Path) -> None:
    doc = json.loads((REPO / "fleet.schema.json").read_text())
    data = yaml.safe_load(recipe.read_text())
    jsonschema.Draft202012Validator(doc).validate(data)
    data["gateway"] = {**data["gateway"], "replcias": 2}
    assert list(jsonschema.Draft202012Validator(doc).iter_errors(data))


def test_cli_schema_runs_without_error(cli: Callable[..., Any]) -> None:
    result = cli("schema")
    assert result.exit_code == 0 and json.loads(result.stdout)["title"] == "primectl recipe"


def test_committed_schema_file_matches_primectl_schema():
    """recipe.schema.json (what every recipe's yaml-language-server line points at) is regenerated, not stale."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "primectl.cli", "schema"], capture_output=True, text=True, check=True, cwd=root)
    assert (root / "recipe.schema.json").read_text() == out.stdout, "run: primectl schema > recipe.schema.json"
    out = subprocess.run([sys.executable, "-m", "primectl.cli", "schema", "--kind", "fleet"], capture_output=True,
                         text=True, check=True, cwd=root)
    assert (root / "fleet.schema.json").read_text() == out.stdout, "run: primectl schema --kind fleet > fleet.schema.json"

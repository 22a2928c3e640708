"""What a recipe file describes, read before anything is planned (so that a deployment's commands never import
the fleet planner)."""

from __future__ import annotations

from pathlib import Path

from primectl.errors import RecipeError
from primectl.recipe.yamlpos import load_yaml


def recipe_kind(path: str | Path) -> str:
    """What a recipe file describes (`kind:`, default deployment); unreadable files count as deployments, whose
    loader says why."""
    try:
        data, _ = load_yaml(Path(path).read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, RecipeError):
        return "deployment"
    kind = data.get("kind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else "deployment"

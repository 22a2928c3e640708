"""Load YAML while remembering where every node was written.

Validation errors must point at the line the user has to edit, so the loader
returns, beside the plain data, a map from each node's path to its position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from primectl.errors import Problem, RecipeError, RecipePath

Path = RecipePath


@dataclass(frozen=True)
class Position:
    """Where a node was written (1-based line and column)."""

    file: str
    line: int
    column: int


class _Loader(yaml.SafeLoader):
    """SafeLoader whose scalar typing we reuse; positions are tracked separately."""


def _mark(node: Node, file: str) -> Position:
    return Position(file, node.start_mark.line + 1, node.start_mark.column + 1)


def _construct(node: Node, path: Path, file: str, positions: dict[Path, Position], loader: _Loader) -> Any:
    """Build plain data from `node`; a mapping entry's position is where its key is written."""
    positions.setdefault(path, _mark(node, file))
    if isinstance(node, MappingNode):
        loader.flatten_mapping(node)
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                mark = key_node.start_mark
                raise RecipeError(
                    [Problem(file, mark.line + 1, mark.column + 1, _dotted(path + (key,)), "duplicate key")]
                )
            positions[path + (key,)] = _mark(key_node, file)
            out[key] = _construct(value_node, path + (key,), file, positions, loader)
        return out
    if isinstance(node, SequenceNode):
        for i, child in enumerate(node.value):
            positions[path + (i,)] = _mark(child, file)
        return [_construct(child, path + (i,), file, positions, loader) for i, child in enumerate(node.value)]
    assert isinstance(node, ScalarNode)
    return loader.construct_object(node, deep=True)


def load_yaml(text: str, file: str) -> tuple[Any, dict[Path, Position]]:
    """Parse one YAML document; return the data and each node's position."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise RecipeError([Problem(file, line, col, "", f"not valid YAML: {exc.problem}")]) from None
    finally:
        loader.dispose()
    positions: dict[Path, Position] = {}
    if root is None:
        return None, positions
    return _construct(root, (), file, positions, loader), positions


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def dotted(path: Path) -> str:
    """Render a path the way users write it: `prefill.extra_args[2]`."""
    return _dotted(path)

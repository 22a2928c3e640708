"""Load YAML while remembering where every node was written.

Validation errors must point at the line the user has to edit, so the loader
returns, beside the plain data, a map from each node's path to its position.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

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


# Control characters have no Unicode name; these are their standard abbreviations.
_C0 = ("NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI "
       "DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB ESC FS GS RS US").split()


def _char_name(ch: str) -> str:
    """`U+0000 NUL`: the code point and, where there is one, its name or abbreviation."""
    code = ord(ch)
    name = _C0[code] if code < 0x20 else "DEL" if code == 0x7F else unicodedata.name(ch, "")
    if not name:
        name = "(a C1 control character)" if 0x80 <= code <= 0x9F else "(a noncharacter or surrogate)"
    return f"U+{code:04X} {name}"


def _unprintable(exc: ReaderError, text: str, file: str) -> RecipeError:
    """A character YAML forbids (PyYAML reports only its index into `text`), pinned to line:col."""
    pos = exc.position
    line = text.count("\n", 0, pos) + 1
    col = pos - (text.rfind("\n", 0, pos) + 1) + 1
    what = _char_name(chr(exc.character)) if isinstance(exc.character, int) else repr(exc.character)
    return RecipeError([Problem(file, line, col, "",
                                f"not valid YAML: character {what} is not allowed (YAML forbids control "
                                "characters); remove it or write it as an escape in a double-quoted string")])


def load_yaml(text: str, file: str) -> tuple[Any, dict[Path, Position]]:
    """Parse one YAML document; return the data and each node's position."""
    try:
        loader = _Loader(text)
    except ReaderError as exc:
        raise _unprintable(exc, text, file) from None
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

"""Generic modules name no engine (issue item 1): recipe/, checks/, targets/, deploy/, plan/, planner/, rollout/
and pipeline.py ask the Plan or the Engine protocol, never "is this vLLM?". Identifiers and string constants are
checked; docstrings, comments and field descriptions (documentation, which may name an engine as an example)
are not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GENERIC = ("recipe", "checks", "targets", "deploy", "plan", "planner", "rollout", "pipeline.py")
ENGINE_WORD = re.compile(r"(?<![A-Za-z0-9])(vllm|mocker|sglang)(?![a-z0-9])", re.IGNORECASE)
# Prose shown to users that names an engine as background, not as a choice the code makes: file -> the words.
ALLOWED = {
    ("targets/k8s_notes.py", "the vLLM Mooncake store connector"),  # explains a Mooncake setting in NOTES.txt
    ("planner/build.py", "capacity is simulated by the mocker"),  # a note on GPU-less profiles
    ("planner/build.py", "vLLM's sparse-MLA backend"),  # the capacity report's note on FP8 row sizes
}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _descriptions(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "description":
            ids |= {id(n) for n in ast.walk(node.value)}
    return ids


def engine_names(path: Path) -> list[str]:
    """`line: text` for every identifier or string constant of `path` that names an engine."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree) | _descriptions(tree)
    rel = str(path.relative_to(REPO / "primectl"))
    out = []
    for node in ast.walk(tree):
        words: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            words = [node.value]
        elif isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.alias):
            words = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or ""]
        for w in words:
            if ENGINE_WORD.search(w) and not any(f == rel and a in w for f, a in ALLOWED):
                out.append(f"primectl/{rel}:{getattr(node, 'lineno', '?')}: {w[:100]!r}")
    return out


def test_generic_modules_name_no_engine() -> None:
    tops = [REPO / "primectl" / top for top in GENERIC]
    files = [p for top in tops for p in ([top] if top.is_file() else sorted(top.rglob("*.py")))]
    assert len(files) > 30
    found = [hit for p in files for hit in engine_names(p)]
    assert found == [], "\n".join(found)


def test_the_check_sees_identifiers_and_strings_but_not_docstrings(tmp_path: Path) -> None:
    (tmp_path / "primectl").mkdir()
    f = tmp_path / "primectl" / "x.py"
    f.write_text('"""Docs may say vLLM."""\nVLLM_ENV = 1\ndef f():\n    """or the mocker"""\n    return "vllm:metric"\n'
                 'from pydantic import Field\ny = Field(description="vLLM flag")\n')
    global REPO
    old, REPO = REPO, tmp_path
    try:
        assert [h.split(": ", 1)[1] for h in engine_names(f)] == ["'VLLM_ENV'", "'vllm:metric'"]
    finally:
        REPO = old

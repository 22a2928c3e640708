"""The import graph of primectl/ has no cycles (every import counts, also those inside functions).

Imports under `if TYPE_CHECKING:` are for the type checker only and never run, so they are left out.
A cycle is reported with the modules on it, so the seam to cut is visible.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "primectl"


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The primectl modules a file imports at run time."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rsplit(".", 1)[0] if "." in name else ""
            if name and name != here:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_primectl_has_no_import_cycles() -> None:
    g = graph()
    assert len(g) > 40, "the walk found too few modules"
    assert not cycles(g), f"import cycles: {cycles(g)}"


def test_the_checker_sees_function_level_imports_and_finds_a_planted_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "primectl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from primectl import b\n")
    (pkg / "b.py").write_text("def f():\n    from primectl.a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from primectl import a\n")
    files = sorted(pkg.rglob("*.py"))
    global REPO
    old = REPO
    REPO = tmp_path
    try:
        modules = {module_name(f) for f in files}
        g = {module_name(f): imports_of(f, modules) for f in files}
    finally:
        REPO = old
    assert cycles(g) == [["primectl.a", "primectl.b"]]
    assert g["primectl.c"] == set()


def test_engines_and_targets_are_loaded_through_the_registry() -> None:
    g = graph()
    from primectl import registry

    for ref in [*registry.ENGINES.values(), *registry.TARGETS.values()]:
        module = ref.split(":")[0]
        assert module in g, f"registry names {module}, which does not exist"
    # the recipe model takes its choices from the registry, which imports no implementation
    assert g["primectl.registry"] == set()

"""The import graph of primectl/ has no cycles (every import counts, also those inside functions).

Between modules, imports under `if TYPE_CHECKING:` are for the type checker only and never run, so they
are left out. A cycle is reported with the modules on it, so the seam to cut is visible.

The same holds one level up: collapsed to their subpackages (primectl.plan, primectl.engines, ...; a
top-level module such as primectl.cli is its own node), primectl's parts form a DAG. At that level a
type-only import counts (a part that names another's types depends on it, as deploy.changes on
render.bundle's Bundle did while render imported deploy), and so do the registry's string references: a
module that calls a registry function which imports what a name refers to (`registry.engine(...)`)
depends on every module the BUILTIN tables and pyproject.toml's entry points name for that kind, as if it
imported them.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "primectl"


def module_name(path: Path, repo: Path | None = None) -> str:
    rel = path.relative_to(repo or REPO).with_suffix("")
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
    return set(import_lines(path, modules))


def import_lines(path: Path, modules: set[str], repo: Path | None = None, *, types: bool = False) -> dict[str, int]:
    """The primectl modules a file imports at run time (with `types`, for the type checker too), each with the
    line of its first import."""
    tree = ast.parse(path.read_text())
    skip = set() if types else _type_checking_lines(tree)
    here = module_name(path, repo)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    out: dict[str, int] = {}
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
                out.setdefault(name, node.lineno)
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


# --- the same, one level up: subpackages, and the registry's string references -------------------------


def package_of(module: str) -> str:
    """primectl.plan.model -> primectl.plan; a top-level module (primectl.cli) is its own node."""
    return ".".join(module.split(".")[:2])


def _literal(tree: ast.Module, name: str) -> ast.expr:
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            return node.value
    raise AssertionError(f"registry.py has no top-level {name}")


def registry_refs(repo: Path = REPO) -> dict[str, set[str]]:
    """Per kind ("engine", "target"), the modules a name may refer to: registry.py's BUILTIN tables and
    pyproject.toml's entry points of that kind's group (read, not imported)."""
    tree = ast.parse((repo / "primectl" / "registry.py").read_text())
    builtin = _literal(tree, "BUILTIN")
    assert isinstance(builtin, ast.Dict)
    groups = ast.literal_eval(_literal(tree, "GROUPS"))
    pyproject = repo / "pyproject.toml"
    entry_points = tomllib.loads(pyproject.read_text()).get("project", {}).get("entry-points", {}) if pyproject.exists() else {}
    out: dict[str, set[str]] = {}
    for key, table in zip(builtin.keys, builtin.values, strict=True):
        kind = ast.literal_eval(key) if key is not None else None
        assert isinstance(kind, str) and isinstance(table, ast.Name), ast.unparse(builtin)
        refs = {**ast.literal_eval(_literal(tree, table.id)), **entry_points.get(groups[kind], {})}
        out[kind] = {ref.partition(":")[0].strip() for ref in refs.values()}
    return out


def registry_resolvers(repo: Path = REPO) -> dict[str, set[str]]:
    """The registry's functions that import what a name refers to, each with the kinds it can import:
    those that call importlib.import_module, and those that call one of them (`load(kind, ...)`: every kind;
    `load("engine", ...)`: engines)."""
    tree = ast.parse((repo / "primectl" / "registry.py").read_text())
    kinds = set(registry_refs(repo))
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    out: dict[str, set[str]] = {}
    changed = True
    while changed:
        changed = False
        for name, f in funcs.items():
            found = set(out.get(name, set()))
            for call in (n for n in ast.walk(f) if isinstance(n, ast.Call)):
                callee = ast.unparse(call.func)
                if callee == "importlib.import_module":
                    found |= kinds
                elif callee in out:
                    found |= _narrowed(call, out[callee], kinds)
            if found != out.get(name, set()):
                out[name] = found
                changed = True
    return out


def _narrowed(call: ast.Call, can: set[str], kinds: set[str]) -> set[str]:
    """A resolver called with a literal kind first (`load("engine", name)`) imports that kind only."""
    first = call.args[0] if call.args else None
    if isinstance(first, ast.Constant) and first.value in kinds:
        return can & {first.value}
    return can


def registry_calls(path: Path, resolvers: dict[str, set[str]]) -> Iterator[tuple[str, int]]:
    """(kind, line) for every call in a file of a registry function that imports what a name refers to."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    modules: set[str] = set()  # local names bound to primectl.registry
    functions: dict[str, str] = {}  # local name -> registry function
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "primectl.registry" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "primectl":
            modules |= {a.asname or a.name for a in node.names if a.name == "registry"}
        elif isinstance(node, ast.ImportFrom) and node.module == "primectl.registry":
            functions |= {a.asname or a.name: a.name for a in node.names if a.name in resolvers}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.lineno in skip:
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in resolvers and ast.unparse(f.value) in modules | {"primectl.registry"}:
            name = f.attr
        elif isinstance(f, ast.Name) and f.id in functions:
            name = functions[f.id]
        else:
            continue
        for kind in sorted(_narrowed(node, resolvers[name], set(resolvers[name]))):
            yield kind, node.lineno


Edge = tuple[str, str]


def package_graph(repo: Path = REPO) -> tuple[dict[str, set[str]], dict[Edge, list[str]]]:
    """The subpackage graph, and for each edge the imports (type-only ones too) and registry calls that make
    it, as 'module:line -> module'."""
    package = repo / "primectl"
    files = sorted(package.rglob("*.py"))
    names = {f: module_name(f, repo) for f in files}
    modules = set(names.values())
    refs = registry_refs(repo)
    resolvers = registry_resolvers(repo)
    g: dict[str, set[str]] = {package_of(m): set() for m in modules if m != "primectl"}
    why: dict[Edge, list[str]] = {}

    def add(src: str, line: int, dst: str, how: str = "") -> None:
        a, b = package_of(src), package_of(dst)
        if dst == "primectl" or a == b or src == "primectl":
            return  # the root package's __init__ imports nothing; within a subpackage the module check rules
        g[a].add(b)
        why.setdefault((a, b), []).append(f"{src}:{line} -> {dst}{how}")

    for f in files:
        for dst, line in sorted(import_lines(f, modules, repo, types=True).items()):
            add(names[f], line, dst)
        for kind, line in registry_calls(f, resolvers):
            for dst in sorted(refs[kind] & modules):
                add(names[f], line, dst, f" (through the registry, by {kind} name)")
    return g, why


def topological_order(g: dict[str, set[str]]) -> list[str]:
    """Dependencies first (ties by name), for a graph without cycles."""
    out: list[str] = []
    done: set[str] = set()
    while len(out) < len(g):
        ready = sorted(v for v in g if v not in done and g[v] <= done)
        assert ready, "the graph has a cycle"
        out += ready
        done |= set(ready)
    return out


def describe_cycles(g: dict[str, set[str]], why: dict[Edge, list[str]]) -> str:
    lines = []
    for comp in cycles(g):
        lines.append(f"cycle of {len(comp)} packages: {', '.join(comp)}")
        # fewest imports first: the cheapest seams to cut
        for a, b in sorted((e for e in why if e[0] in comp and e[1] in comp), key=lambda e: (len(why[e]), e)):
            lines.append(f"  {a} -> {b}:")
            lines += [f"      {w}" for w in why[(a, b)]]
    return "\n".join(lines)


def test_primectl_subpackages_form_a_dag() -> None:
    g, why = package_graph()
    assert {"primectl.plan", "primectl.engines", "primectl.targets", "primectl.registry"} <= set(g), sorted(g)
    assert not cycles(g), "import cycles between subpackages (each edge with what makes it):\n" + describe_cycles(g, why)
    order = topological_order(g)
    print("primectl's packages, dependencies first:")
    for p in order:
        print(f"  {p} -> {', '.join(sorted(g[p])) or '(nothing in primectl)'}")
    # the Plan is plain data, the only input of every later stage: it depends on nothing else of primectl
    assert g["primectl.plan"] == set(), why
    # the string references are seen where engines and targets are looked up by name (edges inside their packages)
    resolvers = registry_resolvers()
    callers = {module_name(f) for f in sorted(PACKAGE.rglob("*.py")) if list(registry_calls(f, resolvers))}
    assert {"primectl.engines.base", "primectl.targets.base"} <= callers, callers


def test_the_package_check_sees_through_the_registry_and_finds_a_planted_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "primectl"
    for sub in ("engines", "plan"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "registry.py").write_text(
        "import importlib\n"
        'BUILTIN_ENGINES = {"e": "primectl.engines.e:E"}\n'
        'BUILTIN_TARGETS: dict[str, str] = {}\n'
        'GROUPS = {"engine": "primectl.engines", "target": "primectl.targets"}\n'
        'BUILTIN = {"engine": BUILTIN_ENGINES, "target": BUILTIN_TARGETS}\n'
        "def _resolve(ref):\n    return importlib.import_module(ref)\n"
        "def load(kind, name):\n    return _resolve(BUILTIN[kind][name])\n"
        'def engine(name):\n    return load("engine", name)\n'
        "def names(kind):\n    return list(BUILTIN[kind])\n"
    )
    (pkg / "engines" / "e.py").write_text("from primectl.plan import model\n")
    (pkg / "plan" / "model.py").write_text("")
    # plan.build imports no engine: it asks the registry for one by name, which imports primectl.engines.e
    (pkg / "plan" / "build.py").write_text("from primectl import registry\ndef f():\n    return registry.engine('e')\n")
    (pkg / "plan" / "names.py").write_text("from primectl.registry import names\nnames('engine')\n")  # imports nothing
    (pkg / "plan" / "direct.py").write_text("from primectl.registry import load as get\nget('target', 't')\nget('engine', 'e')\n")
    assert registry_resolvers(tmp_path) == {"_resolve": {"engine", "target"}, "load": {"engine", "target"}, "engine": {"engine"}}
    g, why = package_graph(tmp_path)
    assert cycles(g) == [["primectl.engines", "primectl.plan"]]
    assert why[("primectl.plan", "primectl.engines")] == [
        "primectl.plan.build:3 -> primectl.engines.e (through the registry, by engine name)",
        "primectl.plan.direct:3 -> primectl.engines.e (through the registry, by engine name)"]
    assert "primectl.plan.build:3 -> primectl.engines.e" in describe_cycles(g, why)
    assert g["primectl.registry"] == set()


def test_a_type_only_import_makes_a_package_edge(tmp_path: Path) -> None:
    """The cycle deploy -> render -> deploy ran through a type-only import: the package check sees it."""
    pkg = tmp_path / "primectl"
    for sub in ("deploy", "render"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "registry.py").write_text(
        "BUILTIN_ENGINES: dict[str, str] = {}\nBUILTIN_TARGETS: dict[str, str] = {}\n"
        'GROUPS = {"engine": "primectl.engines", "target": "primectl.targets"}\n'
        'BUILTIN = {"engine": BUILTIN_ENGINES, "target": BUILTIN_TARGETS}\n')
    (pkg / "deploy" / "changes.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from primectl.render.bundle import Bundle\n")
    (pkg / "deploy" / "protocol.py").write_text("")
    (pkg / "render" / "bundle.py").write_text("from primectl.deploy.protocol import Layout\n")
    g, why = package_graph(tmp_path)
    assert cycles(g) == [["primectl.deploy", "primectl.render"]]
    assert why[("primectl.deploy", "primectl.render")] == ["primectl.deploy.changes:3 -> primectl.render.bundle"]


def test_render_and_the_planner_do_not_reach_into_deploy() -> None:
    """What render and the planner need of a host (its layout, unit names) sits beside the Plan."""
    g, why = package_graph()
    for part in ("primectl.render", "primectl.planner", "primectl.plan", "primectl.host"):
        assert "primectl.deploy" not in g[part], why[(part, "primectl.deploy")]

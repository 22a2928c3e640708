#!/usr/bin/env python3
"""Check that a Dynamo wheel's vLLM imports exist in a vLLM wheel, by reading both as zip files.

For every module-level ``from vllm.X import a, b`` and ``import vllm.X`` in the Dynamo wheel's
``dynamo/vllm/**`` sources (the ``python -m dynamo.vllm`` worker) and in the modules Dynamo's vLLM
chat processor loads (``dynamo/frontend/vllm_processor.py`` and the ``dynamo`` modules it imports),
the module must resolve inside the vLLM wheel and each imported name must exist there at module
level. Nothing is imported or installed: both wheels are parsed with ``ast``, so this runs without a
GPU, without CUDA and without vLLM's dependencies.

What counts as "exists" in a vLLM module (at run time, not under ``if TYPE_CHECKING:``):
  * a binding at module level, also inside ``if``/``try``/``with``/``for`` blocks: def, class,
    assignment, annotated assignment with a value, ``import``/``from ... import`` (re-exports);
  * a submodule of a package (``from vllm.v1 import engine``), including namespace packages;
  * the names of a ``from .x import *`` inside vLLM (``__all__`` of that module, else its public names);
  * a name a module ``__getattr__`` answers for, read from its body: ``name == "x"``, ``name in
    ("x", ...)`` or ``name in TABLE`` where TABLE is a module-level dict/list/tuple/set literal.
    When ``__getattr__`` maps names to ``"module:attr"`` strings (vllm/__init__.py), the target is
    checked too.
A name that is none of these is "missing". A name the reader cannot decide (a compiled extension
module, a star import from outside vLLM, a ``__getattr__`` whose names are not literals) is "unknown":
reported and counted as a failure, since the check cannot vouch for it.

Which Dynamo imports are checked, and how a failure counts:
  * module-level statements, including class bodies (they run at import), not function bodies, not
    ``if TYPE_CHECKING:`` blocks, not tests/ directories;
  * an import inside an ``if``/``elif``/``else`` chain or a ``try`` whose handler catches ImportError
    is one of several alternatives: the statement fails only when no branch resolves (an ``if``
    without ``else`` and a handler without imports are branches that always resolve). Problems in
    branches that had a working alternative are reported as "guarded", not as failures.

Usage: check_vllm_imports.py AI_DYNAMO_WHEEL VLLM_WHEEL [--json]; exit 1 when a failure was found.
"""

from __future__ import annotations

import argparse
import ast
import json
import posixpath
import sys
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

Status = Literal["ok", "missing", "unknown"]
WORKER_ROOT = "dynamo/vllm/"
CHAT_PROCESSOR_ENTRY = "dynamo/frontend/vllm_processor.py"
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


@dataclass(frozen=True)
class ImportSite:
    """One vLLM import statement (one imported name) in the Dynamo sources."""

    file: str
    line: int
    module: str
    name: str | None  # None: `import vllm.x` (only the module must exist)


@dataclass(frozen=True)
class Problem:
    """An import that does not resolve in the vLLM wheel."""

    scope: str
    file: str
    line: int
    module: str
    name: str | None
    status: Status
    detail: str
    fatal: bool

    def describe(self) -> str:
        """One line: where, what, and why it does not resolve."""
        what = f"from {self.module} import {self.name}" if self.name else f"import {self.module}"
        kind = "" if self.fatal else " [guarded: an alternative branch resolves]"
        return f"{self.file}:{self.line}: {what}: {self.detail}{kind}"


@dataclass
class Report:
    """The result of checking one Dynamo wheel against one vLLM wheel."""

    dynamo: str
    vllm: str
    files: dict[str, int] = field(default_factory=dict)  # scope -> files read
    imports: dict[str, int] = field(default_factory=dict)  # scope -> names checked
    problems: list[Problem] = field(default_factory=list)

    @property
    def failures(self) -> list[Problem]:
        """Problems that make the import fail (no alternative branch resolves)."""
        return [p for p in self.problems if p.fatal]

    def to_json(self) -> dict[str, object]:
        """A JSON-ready summary (sorted, stable)."""
        return {
            "dynamo": self.dynamo,
            "vllm": self.vllm,
            "ok": not self.failures,
            "files": dict(sorted(self.files.items())),
            "imports_checked": dict(sorted(self.imports.items())),
            "problems": [asdict(p) for p in sorted(self.problems, key=_problem_key)],
        }


def _problem_key(p: Problem) -> tuple[str, str, int, str, str]:
    return (p.scope, p.file, p.line, p.module, p.name or "")


# --------------------------------------------------------------------------------------------------
# The vLLM side: which modules exist and which names each defines.
# --------------------------------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements that can run at import: into if/try/with/for blocks, not TYPE_CHECKING."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _runtime_statements(node.body)
            yield from _runtime_statements(node.orelse)
        elif isinstance(node, ast.Try | ast.TryStar):
            yield from _runtime_statements(node.body)
            for handler in node.handlers:
                yield from _runtime_statements(handler.body)
            yield from _runtime_statements(node.orelse)
            yield from _runtime_statements(node.finalbody)
        elif isinstance(node, ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While):
            yield from _runtime_statements(node.body)
            yield from _runtime_statements(node.orelse if not isinstance(node, ast.With | ast.AsyncWith) else [])


def _target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _target_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _target_names(target.value)


def _string_literals(node: ast.expr | None) -> list[str] | None:
    """The string keys/elements of a dict/list/tuple/set literal, or None when it is not one."""
    if isinstance(node, ast.Dict):
        keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        return keys
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


@dataclass
class ModuleInfo:
    """What one vLLM source module binds at run time."""

    names: set[str] = field(default_factory=set)
    star_sources: list[str] = field(default_factory=list)  # absolute module names of `from X import *`
    all_names: list[str] | None = None  # a literal __all__
    getattr_names: set[str] | None = None  # None: no module __getattr__
    getattr_unreadable: bool = False  # a __getattr__ exists whose names are not literals
    getattr_targets: dict[str, str] = field(default_factory=dict)  # name -> "module:attr" it loads


class WheelPackage:
    """The modules of one top-level package inside a wheel, read as source and never imported."""

    def __init__(self, wheel: zipfile.ZipFile, package: str) -> None:
        self.package = package
        self._wheel = wheel
        self.sources: dict[str, str] = {}  # module -> path of its .py (package: __init__.py)
        self.extensions: set[str] = set()  # compiled modules (names unknown)
        self.namespaces: set[str] = set()  # directories without __init__.py
        packages: set[str] = set()
        for path in wheel.namelist():
            if not path.startswith(package + "/"):
                continue
            parts = path.split("/")
            for i in range(1, len(parts)):
                self.namespaces.add(".".join(parts[:i]))
            stem, ext = posixpath.splitext(path)
            if ext == ".py":
                module = stem.replace("/", ".")
                if module.endswith(".__init__"):
                    module = module[: -len(".__init__")]
                    packages.add(module)
                self.sources[module] = path
            elif ext in (".so", ".pyd"):
                self.extensions.add(stem.split(".", 1)[0].replace("/", "."))
        self.namespaces -= packages

    def module_kind(self, module: str) -> Literal["source", "extension", "namespace"] | None:
        """How a module exists in the wheel, or None when it does not."""
        if module in self.sources:
            return "source"
        if module in self.extensions:
            return "extension"
        if module in self.namespaces:
            return "namespace"
        return None

    def is_package(self, module: str) -> bool:
        """True for a package (``__init__.py``) or namespace directory."""
        return module in self.namespaces or self.sources.get(module, "").endswith("/__init__.py")

    @cache  # noqa: B019 - one reader per wheel, alive for the whole run
    def info(self, module: str) -> ModuleInfo:
        """Parse a source module once and collect its run-time bindings."""
        path = self.sources[module]
        tree = ast.parse(self._wheel.read(path), filename=path)
        info = ModuleInfo()
        package = module if path.endswith("/__init__.py") else module.rpartition(".")[0]
        tables: dict[str, ast.expr] = {}
        for node in _runtime_statements(tree.body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                info.names.add(node.name)
                if node.name == "__getattr__" and not isinstance(node, ast.ClassDef):
                    self._read_getattr(node, info, tables, package)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    info.names.update(_target_names(target))
                    if isinstance(target, ast.Name):
                        tables[target.id] = node.value
                        if target.id == "__all__":
                            info.all_names = _string_literals(node.value)
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                info.names.update(_target_names(node.target))
                if isinstance(node.target, ast.Name):
                    tables[node.target.id] = node.value
            elif isinstance(node, ast.AugAssign):
                info.names.update(_target_names(node.target))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    info.names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, package)
                for alias in node.names:
                    if alias.name == "*":
                        info.star_sources.append(source)
                    else:
                        info.names.add(alias.asname or alias.name)
        return info

    def _read_getattr(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, info: ModuleInfo,
                      tables: dict[str, ast.expr], package: str) -> None:
        """Which names a module ``__getattr__`` answers for, from the comparisons on its argument."""
        if not fn.args.args:
            info.getattr_unreadable = True
            return
        arg = fn.args.args[0].arg
        names: set[str] = set()
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == arg):
                continue
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
                    names.add(right.value)
                elif isinstance(op, ast.In):
                    table = tables.get(right.id) if isinstance(right, ast.Name) else right
                    literal = _string_literals(table)
                    if literal is None:
                        info.getattr_unreadable = True
                        continue
                    names.update(literal)
                    if isinstance(table, ast.Dict):
                        for key, value in zip(table.keys, table.values, strict=True):
                            if (isinstance(key, ast.Constant) and isinstance(value, ast.Constant)
                                    and isinstance(value.value, str) and ":" in value.value):
                                target_module, _, attr = value.value.partition(":")
                                info.getattr_targets[str(key.value)] = f"{_resolve_relative(target_module, package)}:{attr}"
        if not names:
            info.getattr_unreadable = True
        info.getattr_names = names

    def star_names(self, module: str, seen: frozenset[str] = frozenset()) -> tuple[set[str], bool]:
        """Names ``from module import *`` binds, and whether that set is complete."""
        if self.module_kind(module) != "source" or module in seen:
            return set(), False
        info = self.info(module)
        if info.all_names is not None:
            return set(info.all_names), True
        names, complete = {n for n in info.names if not n.startswith("_")}, True
        for source in info.star_sources:
            more, ok = self.star_names(source, seen | {module})
            names |= more
            complete = complete and ok
        return names, complete

    def lookup(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> tuple[Status, str]:
        """Whether ``from module import name`` works: (status, how it resolves or why not)."""
        kind = self.module_kind(module)
        if kind is None:
            return "missing", f"module {module} does not exist in vllm {{version}}"
        if self.module_kind(f"{module}.{name}") is not None and self.is_package(module):
            return "ok", "submodule"
        if kind == "extension":
            return "unknown", f"{module} is a compiled extension module; its names cannot be read"
        if kind == "namespace":
            return "missing", f"{module} is a namespace package without a submodule {name}"
        info = self.info(module)
        if name in info.names:
            return "ok", "module-level binding"
        unknown_star = False
        for source in info.star_sources:
            if not source.startswith(self.package + ".") and source != self.package:
                unknown_star = True
                continue
            names, complete = self.star_names(source, seen | {module})
            if name in names:
                return "ok", f"re-exported by `from {source} import *`"
            unknown_star = unknown_star or not complete
        if info.getattr_names is not None and name in info.getattr_names:
            target = info.getattr_targets.get(name)
            if target and module not in seen:
                target_module, _, attr = target.partition(":")
                status, how = self.lookup(target_module, attr, seen | {module})
                if status != "ok":
                    return status, f"{module}.__getattr__ loads {target}, which does not resolve: {how}"
            return "ok", f"answered lazily by {module}.__getattr__"
        if info.getattr_unreadable:
            return "unknown", f"{module} has a __getattr__ whose names cannot be read"
        if unknown_star:
            return "unknown", f"{module} star-imports names that cannot be listed"
        return "missing", f"vllm {{version}} has no `{name}` in {module}"


def _resolve_relative(module: str, package: str) -> str:
    if not module.startswith("."):
        return module
    level = len(module) - len(module.lstrip("."))
    base = package.split(".")
    if level > 1:
        base = base[: -(level - 1)]
    rest = module.lstrip(".")
    return ".".join([*base, rest]) if rest else ".".join(base)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module name of a ``from ... import``."""
    return _resolve_relative("." * node.level + (node.module or ""), package) if node.level else node.module or ""


# --------------------------------------------------------------------------------------------------
# The Dynamo side: which vLLM imports run when a module is imported.
# --------------------------------------------------------------------------------------------------


@dataclass
class _Found:
    """A vLLM import site, its resolution, and whether an alternative branch makes a failure harmless."""

    site: ImportSite
    status: Status
    detail: str
    guarded: bool = False


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(t, ast.Name) and t.id in IMPORT_ERRORS for t in types)


class DynamoSources:
    """The Python sources of the Dynamo wheel, and the vLLM imports their module bodies run."""

    def __init__(self, wheel: zipfile.ZipFile, vllm: WheelPackage, vllm_version: str) -> None:
        self._wheel = wheel
        self._vllm = vllm
        self._version = vllm_version
        self.package = WheelPackage(wheel, "dynamo")

    def worker_files(self) -> list[str]:
        """Every non-test source under dynamo/vllm/."""
        return sorted(p for p in self._wheel.namelist()
                      if p.startswith(WORKER_ROOT) and p.endswith(".py") and "/tests/" not in p)

    def processor_files(self) -> list[str]:
        """dynamo/frontend/vllm_processor.py and every dynamo module its module body imports, transitively."""
        by_path = {path: module for module, path in self.package.sources.items()}
        entry = by_path.get(CHAT_PROCESSOR_ENTRY, "")
        parents = [".".join(entry.split(".")[:i]) for i in range(1, entry.count(".") + 1)]
        todo = [CHAT_PROCESSOR_ENTRY] + [self.package.sources[p] for p in parents if p in self.package.sources]
        done: set[str] = set()
        while todo:
            path = todo.pop()
            if path in done or path not in by_path:
                continue
            done.add(path)
            module = by_path[path]
            package = module if path.endswith("/__init__.py") else module.rpartition(".")[0]
            tree = ast.parse(self._wheel.read(path), filename=path)
            for node in _import_time_statements(tree.body):
                targets: list[str] = []
                if isinstance(node, ast.ImportFrom):
                    base = _absolute(node, package)
                    targets = [base] + [f"{base}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                for target in targets:
                    parts = target.split(".")
                    for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
                        sub = ".".join(parts[:i])
                        if sub in self.package.sources:
                            todo.append(self.package.sources[sub])
        return sorted(done)

    def check_file(self, path: str) -> list[_Found]:
        """Resolve every vLLM import the module body of `path` runs, with its alternative structure."""
        tree = ast.parse(self._wheel.read(path), filename=path)
        found, _ = self._block(tree.body, path)
        return found

    def _block(self, body: list[ast.stmt], path: str) -> tuple[list[_Found], bool]:
        """Imports in a block, and whether every one of them resolves (problems here are fatal)."""
        found: list[_Found] = []
        ok = True
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                for item in self._resolve(node, path):
                    found.append(item)
                    ok = ok and item.status == "ok"
            elif isinstance(node, ast.If):
                if _is_type_checking(node.test):
                    more, good = self._block(node.orelse, path)
                    found += more
                    ok = ok and good
                    continue
                branches = [node.body]
                tail = node.orelse
                while len(tail) == 1 and isinstance(tail[0], ast.If) and not _is_type_checking(tail[0].test):
                    branches.append(tail[0].body)
                    tail = tail[0].orelse
                branches.append(tail)  # an absent else is a branch that imports nothing
                more, good = self._choice(branches, path)
                found += more
                ok = ok and good
            elif isinstance(node, ast.Try | ast.TryStar):
                guarded = [h.body for h in node.handlers if _catches_import_error(h)]
                if guarded:
                    more, good = self._choice([node.body + node.orelse, *guarded], path)
                else:
                    more, good = self._block(node.body + node.orelse, path)
                found += more
                ok = ok and good
                unguarded = [h.body for h in node.handlers if not _catches_import_error(h)]
                for extra in [*unguarded, node.finalbody]:
                    more, good = self._block(extra, path)
                    found += more
                    ok = ok and good
            elif isinstance(node, ast.ClassDef | ast.With | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While):
                more, good = self._block(node.body, path)
                found += more
                ok = ok and good
        return found, ok

    def _choice(self, branches: list[list[ast.stmt]], path: str) -> tuple[list[_Found], bool]:
        """Alternatives: fine when one branch resolves; the others' problems are then only guarded."""
        results = [self._block(b, path) for b in branches]
        any_ok = any(good for _, good in results)
        found = []
        for items, _ in results:
            for item in items:
                found.append(_Found(item.site, item.status, item.detail, item.guarded or any_ok))
        return found, any_ok

    def _resolve(self, node: ast.Import | ast.ImportFrom, path: str) -> Iterator[_Found]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "vllm" or alias.name.startswith("vllm."):
                    site = ImportSite(path, node.lineno, alias.name, None)
                    kind = self._vllm.module_kind(alias.name)
                    if kind is None:
                        yield _Found(site, "missing", f"module {alias.name} does not exist in vllm {self._version}")
                    else:
                        yield _Found(site, "ok", kind)
            return
        if node.level or not node.module or not (node.module == "vllm" or node.module.startswith("vllm.")):
            return
        for alias in node.names:
            site = ImportSite(path, node.lineno, node.module, alias.name)
            if alias.name == "*":
                status: Status = "ok" if self._vllm.module_kind(node.module) else "missing"
                yield _Found(site, status, "star import" if status == "ok" else f"module {node.module} does not exist")
                continue
            status, detail = self._vllm.lookup(node.module, alias.name)
            yield _Found(site, status, detail.replace("{version}", self._version))


def _import_time_statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements a module body runs at import (class bodies too), not TYPE_CHECKING blocks."""
    for node in _runtime_statements(body):
        yield node
        if isinstance(node, ast.ClassDef):
            yield from _import_time_statements(node.body)


def _wheel_version(wheel: zipfile.ZipFile, project: str) -> str:
    for path in wheel.namelist():
        if path.endswith(".dist-info/METADATA") and path.split("/")[0].split("-")[0].lower() == project:
            for line in wheel.read(path).decode().splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    raise ValueError(f"{wheel.filename}: no {project} METADATA")


def check(dynamo_wheel: Path, vllm_wheel: Path) -> Report:
    """Check every vLLM import the Dynamo wheel's worker and chat processor run at import time."""
    with zipfile.ZipFile(dynamo_wheel) as dz, zipfile.ZipFile(vllm_wheel) as vz:
        vllm_version = _wheel_version(vz, "vllm")
        report = Report(dynamo=_wheel_version(dz, "ai_dynamo"), vllm=vllm_version)
        vllm = WheelPackage(vz, "vllm")
        sources = DynamoSources(dz, vllm, vllm_version)
        for scope, files in (("worker", sources.worker_files()), ("chat_processor", sources.processor_files())):
            seen: set[tuple[str, int, str, str | None]] = set()
            report.files[scope] = len(files)
            count = 0
            for path in files:
                for item in sources.check_file(path):
                    count += 1
                    key = (item.site.file, item.site.line, item.site.module, item.site.name)
                    if item.status == "ok" or key in seen:
                        continue
                    seen.add(key)
                    report.problems.append(Problem(
                        scope=scope, file=item.site.file, line=item.site.line, module=item.site.module,
                        name=item.site.name, status=item.status, detail=item.detail,
                        fatal=not item.guarded,
                    ))
            report.imports[scope] = count
        return report


def render(report: Report) -> str:
    """The report as text: a verdict line, then one line per problem."""
    counts = ", ".join(f"{scope}: {report.imports[scope]} names in {report.files[scope]} files" for scope in report.files)
    verdict = "FAIL" if report.failures else "ok"
    lines = [f"{verdict}: ai-dynamo {report.dynamo} against vllm {report.vllm} ({counts})"]
    for problem in sorted(report.problems, key=lambda p: (not p.fatal, *_problem_key(p))):
        tag = problem.status if problem.fatal else "guarded"
        lines.append(f"  {tag:8} [{problem.scope}] {problem.describe()}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI: print the report; exit 1 when an import fails."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("dynamo_wheel", type=Path)
    ap.add_argument("vllm_wheel", type=Path)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    report = check(args.dynamo_wheel, args.vllm_wheel)
    print(json.dumps(report.to_json(), indent=1, sort_keys=True) if args.json else render(report))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())

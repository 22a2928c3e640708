"""tests/cliproc.py, the forked `primectl` runs most CLI tests use, answers as a fresh `primectl` process does."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

from tests import cliproc
from tests.conftest import REPO

PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")

pytestmark = pytest.mark.skipif(not cliproc.SCRIPT.exists(), reason="the console script is not installed")


def both(*args: str, env: dict[str, str] | None = None, input: str | None = None
         ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    env = os.environ | (env or {})
    forked = cliproc.run([PRIMECTL, *args], cwd=REPO, env=env, timeout=60, input=input)
    fresh = subprocess.run([PRIMECTL, *args], cwd=REPO, env=env, timeout=60, input=input, capture_output=True,
                           text=True)
    return forked, fresh


@pytest.mark.parametrize("args", [("plan", "recipes/demo.yaml"), ("plan", "recipes/glm53.yaml", "-o", "json"),
                                  ("validate", "tests/invalid/parallel_dep7.yaml"), ("no-such-command",)],
                         ids=["plan", "plan-json", "refused", "usage"])
def test_a_forked_run_prints_and_exits_as_a_fresh_process(args: tuple[str, ...]) -> None:
    forked, fresh = both(*args, env={"COLUMNS": "90"})
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout or forked.stderr


def test_each_run_gets_its_own_environment_cwd_and_stdin(tmp_path: Path) -> None:
    """The width comes from the call's COLUMNS, a relative path from its cwd, a recipe from its stdin."""
    narrow, wide = (cliproc.run([PRIMECTL, "plan", "recipes/demo.yaml"], cwd=REPO, timeout=60,
                                env=os.environ | {"COLUMNS": c}) for c in ("70", "250"))
    assert max(map(len, narrow.stdout.splitlines())) <= 70 < max(map(len, wide.stdout.splitlines()))
    (tmp_path / "r.yaml").write_text((REPO / "recipes" / "demo.yaml").read_text())
    moved = cliproc.run([PRIMECTL, "validate", "r.yaml"], cwd=tmp_path, timeout=60)
    assert moved.returncode == 0 and moved.stdout.startswith("r.yaml: valid"), moved.stderr
    forked, fresh = both("validate", "/dev/stdin", input="name: [unclosed\n")
    assert forked.returncode == fresh.returncode == 2 and forked.stderr == fresh.stderr


def test_a_run_past_its_timeout_is_killed_as_subprocess_run_kills_it() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        cliproc.run([PRIMECTL, "plan", "recipes/bench-4rack.yaml"], cwd=REPO, timeout=0.01)
    assert cliproc.run([PRIMECTL, "plan", "recipes/demo.yaml"], cwd=REPO, timeout=60).returncode == 0


def test_a_call_that_changes_what_python_reads_at_start_runs_a_fresh_process(tmp_path: Path) -> None:
    """PYTHONPATH is read when the interpreter starts: a forked run could not honour it, so none is forked."""
    (tmp_path / "sitecustomize.py").write_text("import sys; sys.stderr.write('fresh interpreter\\n')\n")
    r = cliproc.run([PRIMECTL, "validate", "recipes/demo.yaml"], cwd=REPO, timeout=60,
                    env=os.environ | {"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0 and r.stderr.startswith("fresh interpreter")


# What a module must not read when it is imported, for a fork of the zygote (which imported it once, in its own
# environment, directory and time) to start as a fresh import would.
_READ_AT_RUN_TIME = {"environ", "getenv", "getcwd", "cwd", "home", "expanduser", "expandvars", "argv", "isatty",
                     "get_terminal_size", "time", "monotonic", "now", "today", "uuid4", "random", "getpid",
                     "gethostname", "getuser", "gettempdir"}


def _read_at_import(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of each run-time fact the module's import itself reads: what runs at import is the module's
    and class bodies' statements, decorators and default arguments, not function bodies."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for n in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults):
                if n is not None:
                    visit(n)
            return
        if isinstance(node, ast.Lambda):
            return
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name in _READ_AT_RUN_TIME and not isinstance(getattr(node, "ctx", None), ast.Store):
            found.append((node.lineno, name))
        for child in ast.iter_child_nodes(node):
            if not (isinstance(node, ast.Attribute) and isinstance(child, ast.Name)):  # `time.time`: one read
                visit(child)

    for stmt in tree.body:
        script_only = isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "__name__ == '__main__'"
        if not (script_only or isinstance(stmt, ast.Import | ast.ImportFrom)):
            visit(stmt)
    return found


def test_no_preloaded_module_reads_the_environment_directory_or_clock_when_imported() -> None:
    """The zygote imports primectl's modules once; each run forked from it must see its own environment, working
    directory, arguments and time, which holds only while no module reads them at import."""
    readers = []
    for path in sorted((REPO / "primectl").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        if module.startswith(cliproc.NOT_PRELOADED):
            continue
        readers += [f"{path.relative_to(REPO)}:{line}: {name}" for line, name in _read_at_import(ast.parse(path.read_text()))]
    assert not readers, "read when imported:\n" + "\n".join(readers)


def test_the_guard_finds_a_module_level_read() -> None:
    tree = ast.parse("import os\nWIDTH = os.environ.get('COLUMNS')\ndef f(x=time.time()):\n    return os.getcwd()\n"
                     "class C:\n    home = Path.home()\nif __name__ == '__main__':\n    print(sys.argv)\n")
    assert [n for _, n in _read_at_import(tree)] == ["environ", "time", "home"]

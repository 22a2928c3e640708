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


# What a module must not read or do when it is imported, for a fork of the zygote (which imported it once, in its
# own environment, directory and time) to start as a fresh import would: the environment, cwd, arguments, clock,
# randomness, terminal and process; handlers, hooks, threads and logging set up as a side effect.
_AT_RUN_TIME_ONLY = {"environ", "getenv", "getcwd", "cwd", "home", "expanduser", "expandvars", "which", "resolve",
                     "absolute", "argv", "stdin", "stdout", "stderr", "isatty", "get_terminal_size", "time",
                     "monotonic", "perf_counter", "now", "today", "uuid4", "random", "choice", "randint", "getpid",
                     "gethostname", "getuser", "gettempdir", "signal", "register", "register_at_fork", "Thread",
                     "basicConfig", "Console"}


def _read_at_import(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of each run-time fact the module's import reads or sets up: what runs at import is the module's
    and class bodies' statements, decorators and default arguments, and the bodies of the module's own functions
    they call; names imported under another name count as theirs."""
    found: set[tuple[int, str]] = set()
    defs = {d.name: d for d in tree.body if isinstance(d, ast.FunctionDef | ast.AsyncFunctionDef)}
    aliases = {a.asname: a.name for d in tree.body if isinstance(d, ast.ImportFrom) for a in d.names if a.asname}
    called: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for n in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults):
                if n is not None:
                    visit(n)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, ast.AnnAssign):  # an annotation reads nothing
            for n in (node.target, node.value):
                if n is not None:
                    visit(n)
            return
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defs.keys() - called:
            called.add(node.func.id)  # a helper run at import: its body runs then too
            for stmt in defs[node.func.id].body:
                visit(stmt)
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        name = aliases.get(name, name) if name else None
        if name in _AT_RUN_TIME_ONLY and not isinstance(getattr(node, "ctx", None), ast.Store):
            found.add((node.lineno, name))
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in tree.body:
        script_only = isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "__name__ == '__main__'"
        if not (script_only or isinstance(stmt, ast.Import | ast.ImportFrom)):
            visit(stmt)
    return sorted(found)


# Set up at import, and right for a fork: the hook forgets, in the child, the thread pool of the parent.
_ALLOWED = {("primectl/deploy/fanout.py", "register_at_fork")}


def test_no_preloaded_module_reads_the_environment_directory_or_clock_when_imported() -> None:
    """The zygote imports primectl's modules once; each run forked from it must see its own environment, working
    directory, arguments and time, which holds only while no module reads them (or sets up handlers, hooks or
    threads) when imported. `Path(__file__).resolve()` is the one read allowed: __file__ is absolute."""
    readers = []
    for path in sorted((REPO / "primectl").rglob("*.py")):
        if not cliproc.preloaded(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")):
            continue
        lines = path.read_text().splitlines()
        readers += [f"{path.relative_to(REPO)}:{line}: {name}" for line, name in _read_at_import(ast.parse("\n".join(lines)))
                    if not (name == "resolve" and "Path(__file__).resolve()" in lines[line - 1])
                    and (str(path.relative_to(REPO)), name) not in _ALLOWED]
    assert not readers, "read when imported:\n" + "\n".join(readers)


def test_the_guard_finds_what_a_module_reads_when_imported() -> None:
    tree = ast.parse("import os\nfrom os import environ, getcwd as here\nWIDTH = os.environ.get('COLUMNS')\n"
                     "def f(x=time.time()):\n    return os.getpid()\nclass C:\n    home = Path.home()\n"
                     "def setup():\n    signal.signal(2, None)\nsetup()\nA, B = environ.get('A'), here()\n"
                     "if __name__ == '__main__':\n    print(sys.argv)\n")
    assert _read_at_import(tree) == [(3, "environ"), (4, "time"), (7, "home"), (9, "signal"), (11, "environ"),
                                     (11, "getcwd")]


def test_the_zygote_imports_no_package_it_leaves_out() -> None:
    """Not even their __init__: the guard above does not read them."""
    r = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c",
                        "import sys; sys.argv = ['cliproc']; from tests import cliproc; cliproc.preload_primectl(); "
                        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('primectl'))))"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    modules = r.stdout.split()
    assert "primectl.cli" in modules and "primectl.host.agent" in modules
    assert [m for m in modules if not cliproc.preloaded(m)] == []

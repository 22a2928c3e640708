"""The host package (primectl/host/) runs on hosts with their own python3 and nothing of primectl installed: its
modules import only the standard library, each other and the host layout, all of which are shipped, and a bare
interpreter runs them from the shipped files alone (as the agent's bundle, and as bin/primectl-wait)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from primectl.deploy.shipping import AGENT_ENTRY, host_modules, imports_in, modules_for, zipapp

REPO = Path(__file__).resolve().parent.parent
HOST_SIDE = [*sorted((REPO / "primectl" / "host").glob("*.py")), REPO / "primectl" / "plan" / "layout.py"]


def imported(path: Path) -> set[str]:
    """Every module a file imports, at run time or for the type checker, top-level or in a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            out.add(node.module or "")
    return out


def test_host_modules_import_only_the_standard_library_and_the_shipped_modules() -> None:
    shipped = {p.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for p in host_modules()}
    for path in HOST_SIDE:
        for name in imported(path):
            top = name.partition(".")[0]
            assert top in sys.stdlib_module_names or name in shipped, f"{path.relative_to(REPO)} imports {name}"


def test_every_host_module_is_shipped() -> None:
    assert {str(p.relative_to(REPO)) for p in HOST_SIDE} <= set(host_modules())
    assert host_modules()["primectl/plan/__init__.py"] == b""  # a namespace package here: zipimport needs one


def unpack(where: Path) -> Path:
    """The agent's files under `where`, as a host's cache holds them."""
    for path, data in modules_for(AGENT_ENTRY).items():
        (where / path).parent.mkdir(parents=True, exist_ok=True)
        (where / path).write_bytes(data)
    return where


def bare(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`code` run by an interpreter that sees neither site-packages nor PYTHONPATH (as the loader runs it)."""
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, *args], capture_output=True, text=True,
                          timeout=60)


def test_a_bare_interpreter_has_no_primectl_but_what_is_shipped(tmp_path: Path) -> None:
    assert bare("import primectl").returncode != 0
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from primectl.host.agent import dispatch; "
            "print(dispatch('read', {'workdir': sys.argv[2], 'path': 'x'})['ok'])")
    r = bare(code, str(unpack(tmp_path / "cache")), str(tmp_path / "wd"))
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


def test_an_agent_start_imports_neither_typing_nor_json_nor_re(tmp_path: Path) -> None:
    """What every host agent start costs: typing, json and re would each cost as much as the agent itself."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from primectl.host import agent; "
            "agent.dispatch('inspect', {'workdir': sys.argv[2]}); "
            "print(sorted(m for m in ('typing', 'json', 're', 'subprocess', 'shutil') if m in sys.modules))")
    r = bare(code, str(unpack(tmp_path / "cache")), str(tmp_path / "wd"))
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_the_waiter_runs_as_a_zip_application_of_the_shipped_files(tmp_path: Path) -> None:
    waiter = tmp_path / "primectl-wait"
    waiter.write_bytes(zipapp("primectl.host.slurm_wait"))
    assert zipapp("primectl.host.slurm_wait") == waiter.read_bytes()  # the same files make the same bytes
    r = subprocess.run([sys.executable, "-I", "-S", str(waiter)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage: primectl-wait" in r.stderr
    job = tmp_path / "job"
    (job / "release" / "ready").mkdir(parents=True)
    (job / "release" / "ready" / "a.json").write_text(json.dumps(
        {"kind": "command", "command": ["true"], "timeout_s": 10, "interval_s": 0.1}))
    r = subprocess.run([sys.executable, "-I", "-S", str(waiter), str(job), "a"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert " ready a " in (job / "events").read_text()


def test_after_purge_the_agent_has_every_module_it_imports_later(tmp_path: Path) -> None:
    """`purge` may remove the very copy the agent runs from (the workdir's, where the user's cache cannot be
    written), and a kept session goes on: a module imported only when needed must be loaded by then."""
    late = {node.module for path in HOST_SIDE for top in ast.parse(path.read_text()).body
            if isinstance(top, (ast.FunctionDef, ast.ClassDef))
            for node in ast.walk(top) if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("primectl")}
    assert "primectl.host.haproxy" in late  # imported where a balancer is used
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from primectl.host.agent import dispatch; "
            "dispatch('purge', {'workdir': sys.argv[2]}); print(sorted(set(sys.argv[3:]) - set(sys.modules)))")
    r = bare(code, str(unpack(tmp_path / "cache")), str(tmp_path / "wd"), *sorted(late - {"primectl.host.slurm_wait"}))
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_each_program_gets_the_modules_it_imports_and_no_others() -> None:
    agent, waiter = set(modules_for(AGENT_ENTRY)), set(modules_for("primectl.host.slurm_wait"))
    assert {"primectl/__init__.py", "primectl/host/__init__.py", "primectl/host/haproxy.py",
            "primectl/host/systemd_supervisor.py", "primectl/plan/__init__.py", "primectl/plan/layout.py"} <= agent
    assert "primectl/host/slurm_wait.py" not in agent
    assert waiter == {"primectl/__init__.py", "primectl/host/__init__.py", "primectl/host/json_codec.py",
                      "primectl/host/probes.py", "primectl/host/processes.py", "primectl/host/slurm_wait.py",
                      "primectl/host/wire.py"}


def test_the_quick_import_scan_finds_what_the_parser_finds() -> None:
    """modules_for reads imports with a regular expression (parsing costs every command ~25 ms): on every shipped
    module it must find what ast does."""
    for path, source in host_modules().items():
        exact: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                exact |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                exact |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        assert imports_in(source) == exact, path
    assert imports_in(b"import a.b as c, d\nfrom e import (\n    f,\n    g as h,\n)\n") == {"a.b", "d", "e", "e.f", "e.g"}

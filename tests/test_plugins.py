"""Engines and targets from plugins that live outside the package (issue 23, items 1 and 3).

The two example distributions under examples/ (one module and one entry point each) are installed for
real, with pip, into a directory of their own under pytest's tmp (never into .venv), from copies of their
sources (so pip's build files never land in the checkout), and put on PYTHONPATH of `primectl` run as a
subprocess. With them installed:

- `primectl plugins` lists both with their distribution, beside the built-in ones;
- `engine: sglang` (recipes/demo.yaml with its engine changed and its host tier off: the mocker's SGLang scheduler
  has none) validates, plans and renders for ssh, slurm and kubernetes like `engine: mocker`, each worker's argv
  carrying `--engine-type sglang` and nothing else changed;
- `target: nomad` renders with `primectl render`, and `up` / `status` / `down` refuse it (exit 2);
- an unknown name gets a did-you-mean over the names found, a broken plugin a clear error only where used.

tests/integration/test_plugin_demo.py serves chat through `engine: sglang` on the real demo.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import cliproc
from tests.conftest import REPO, CliResult

EXAMPLES = REPO / "examples"
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
SGLANG = ("primectl-sglang-mocker", "0.1.0")
# The mocker's SGLang scheduler has no host KV tier (Dynamo 1.6.1): what a recipe extending the demo turns off.
NO_TIER = "host_tier:\n  enabled: false\n"
NOMAD = ("primectl-nomad-target", "0.1.0")
BROKEN_MODULE = '''"""A plugin whose module cannot be imported."""
raise ImportError("this plugin needs libnotthere.so.1")
'''
BROKEN_PYPROJECT = '''[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "primectl-broken-plugin"
version = "0.0.1"

[project.entry-points."primectl.engines"]
broken = "primectl_broken_plugin:Engine"

[project.entry-points."primectl.targets"]
broken-target = "primectl_broken_plugin:Target"

[tool.setuptools]
py-modules = ["primectl_broken_plugin"]
'''


def pip_install(sources: list[Path], dest: Path) -> Path:
    """Install these source trees with pip into `dest` (`pip install --target`), offline, from copies."""
    work = dest.parent / f"{dest.name}-src"
    copies = []
    for src in sources:
        copy = work / src.name
        shutil.copytree(src, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        copies.append(str(copy))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index",
                        "--no-deps", "--no-build-isolation", "--target", str(dest), *copies],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"pip install --target {dest} failed (needs setuptools>=70.1 in .venv):\n{r.stderr}"
    shutil.rmtree(work)
    return dest


def install_examples(dest: Path) -> Path:
    """The three example plugins (an engine, a target, a component), installed into `dest`: the directory to put
    on PYTHONPATH."""
    return pip_install([EXAMPLES / "primectl-sglang-mocker", EXAMPLES / "primectl-render-target",
                        EXAMPLES / "primectl-static-files"], dest)


@pytest.fixture(scope="module")
def plugins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_examples(tmp_path_factory.mktemp("plugins") / "site")


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("broken-src") / "primectl-broken-plugin"
    src.mkdir()
    (src / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (src / "primectl_broken_plugin.py").write_text(BROKEN_MODULE)
    return pip_install([src], tmp_path_factory.mktemp("broken") / "site")


def primectl(*args: str | Path, path: list[Path]) -> CliResult:
    """`primectl ARGS` as a subprocess with `path` on PYTHONPATH (what `pip install` of the plugins gives)."""
    pythonpath = [*map(str, path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(pythonpath), "COLUMNS": "400", "NO_COLOR": "1"}
    r = cliproc.run([PRIMECTL, *map(str, args)], cwd=REPO, env=env, timeout=300)
    return CliResult(r.returncode, r.stdout, r.stderr)


def recipe(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"extends: {REPO / 'recipes' / 'demo.yaml'}\n{body}")
    return path


# What engine sglang adds to a worker's launch line (a run script's `  --flag value`, a DGD's `- --flag` / `- value`).
SGLANG_LINE = re.compile(r"(- )?'?(--engine-type|sglang|--sglang-[a-z-]+|lpm|4096)'?( (sglang|lpm|4096))?")


def normalised(text: str) -> list[str]:
    """The lines of a rendered file with hashes and the component's name taken out."""
    text = re.sub(r"[0-9a-f]{8,64}", "HASH", text.replace("dynamo-mocker-sglang", "dynamo-mocker"))
    return [line.removesuffix(" \\") for line in text.splitlines()]  # a run script's continuation marks


def rendered(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): p.read_text(errors="replace") for p in sorted(out.rglob("*")) if p.is_file()}


# --- the registry: entry points, and the in-tree ones declared the same way ----------------------------


def test_the_in_tree_engines_and_targets_are_declared_as_entry_points_equal_to_the_registrys() -> None:
    from primectl import registry

    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert eps["primectl.engines"] == registry.BUILTIN_ENGINES
    assert eps["primectl.targets"] == registry.BUILTIN_TARGETS
    assert eps["primectl.components"] == registry.BUILTIN_COMPONENTS


def test_a_built_in_name_is_looked_up_without_scanning_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from primectl import registry

    real = importlib.metadata.entry_points

    def no_scan(**kw: Any) -> Any:
        assert not str(kw.get("group", "")).startswith("primectl."), "entry points scanned for a built-in name"
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", no_scan)
    registry.entries.cache_clear()
    try:
        assert registry.known("engine", "mocker") and registry.entry("target", "slurm").builtin
        assert type(registry.engine("mocker")).__name__ == "MockerEngine"
    finally:
        registry.entries.cache_clear()


def test_a_plugin_cannot_take_a_built_in_name_and_must_be_called_what_it_is_registered_as(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from primectl import registry

    real = importlib.metadata.entry_points
    fake = [importlib.metadata.EntryPoint("mocker", "elsewhere:Engine", "primectl.engines"),
            importlib.metadata.EntryPoint("alias", "primectl.engines.mocker:MockerEngine", "primectl.engines")]

    def entry_points(**kw: Any) -> Any:
        return fake if kw.get("group") == "primectl.engines" else real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry.entries.cache_clear()
    try:
        found = registry.entries("engine")
        assert list(found) == ["vllm", "mocker", "alias"]
        assert found["mocker"].builtin and found["mocker"].ignored == ("(unknown distribution) ?",)
        assert type(registry.engine("mocker")).__name__ == "MockerEngine"  # the built-in one, not elsewhere:Engine
        with pytest.raises(registry.PluginError, match=r"engine 'alias' names itself 'mocker' \(its `name` attribute\)"):
            registry.engine("alias")
    finally:
        registry.entries.cache_clear()
        registry.load.cache_clear()


def test_help_imports_no_engine_target_or_registry() -> None:
    code = ("import sys; from primectl.cli import app; "
            "print(sorted(m for m in sys.modules if m.startswith(('primectl.registry', 'primectl.engines', "
            "'primectl.targets', 'primectl.recipe', 'importlib.metadata'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_plugins_lists_the_built_in_ones_and_what_each_supports(cli: Callable[..., CliResult]) -> None:
    result = cli("plugins", "-o", "json")
    assert result.exit_code == 0, result.stderr
    items = {(i["kind"], i["name"]): i for i in json.loads(result.stdout)}
    assert list(items) == [("engine", "vllm"), ("engine", "mocker"), ("target", "ssh"), ("target", "kubernetes"),
                           ("target", "slurm"), ("component", "etcd"), ("component", "mooncake-master"),
                           ("component", "dynamo-frontend"), ("component", "haproxy"), ("component", "monitoring")]
    assert all(i["from"] == "primectl (built in)" and i["ok"] for i in items.values())
    assert items["engine", "vllm"]["supports"]["capabilities"]["tool_calls"] is True
    assert items["engine", "mocker"]["supports"]["capabilities"]["tool_calls"] is False
    assert items["engine", "mocker"]["module"] == "primectl.engines.mocker"
    assert {n: items["target", n]["supports"]["deploy"] for n in ("ssh", "kubernetes", "slurm")} == {
        "ssh": True, "kubernetes": False, "slurm": True}
    assert {n: items["target", n]["supports"]["host_commands"] for n in ("ssh", "kubernetes", "slurm")} == {
        "ssh": True, "kubernetes": False, "slurm": False}
    assert {n: items["component", n]["supports"]["stage"] for n in ("etcd", "mooncake-master", "dynamo-frontend",
                                                                   "haproxy")} == {
        "etcd": "control", "mooncake-master": "control", "dynamo-frontend": "edge", "haproxy": "edge"}


# --- the two example plugins, installed ----------------------------------------------------------------


def test_plugins_lists_both_examples_with_their_distribution(plugins: Path) -> None:
    result = primectl("plugins", "-o", "json", path=[plugins])
    assert result.exit_code == 0, result.stderr
    items = {(i["kind"], i["name"]): i for i in json.loads(result.stdout)}
    sglang, nomad = items["engine", "sglang"], items["target", "nomad"]
    assert (sglang["distribution"], sglang["version"], sglang["ref"]) == (*SGLANG, "primectl_sglang_mocker:SglangMockerEngine")
    assert (nomad["distribution"], nomad["version"], nomad["module"]) == (*NOMAD, "primectl_nomad_target")
    assert sglang["ok"] and sglang["supports"]["component"] == "dynamo-mocker-sglang"
    assert nomad["supports"] == {"render": True, "deploy": False, "host_commands": False, "surges": False}
    table = primectl("plugins", path=[plugins])
    assert table.exit_code == 0
    lines = {line.split("│")[2].strip(): line for line in table.stdout.splitlines() if line.count("│") > 3}
    assert "primectl-sglang-mocker 0.1.0" in lines["sglang"] and "render only" in lines["nomad"]
    assert "primectl (built in)" in lines["mocker"] and "render, deploy" in lines["ssh"]


@pytest.mark.parametrize("target", ["ssh", "slurm", "kubernetes"])
def test_engine_sglang_validates_plans_and_renders_like_the_mocker(
        plugins: Path, cli: Callable[..., CliResult], tmp_path: Path, target: str) -> None:
    sglang = recipe(tmp_path, "sglang.yaml", f"engine: sglang\n{NO_TIER}prefill:\n  extra_args: [--sglang-schedule-policy, lpm]\n")
    mocker = recipe(tmp_path, "mocker.yaml", f"engine: mocker\n{NO_TIER}prefill:\n  extra_args: [--sglang-schedule-policy, lpm]\n")
    assert primectl("validate", sglang, path=[plugins]).exit_code == 0
    planned = primectl("plan", sglang, "-o", "json", path=[plugins])
    assert planned.exit_code == 0, planned.stderr
    plan = json.loads(planned.stdout)
    workers = [s for s in plan["services"] if s["role"] in ("prefill", "decode")]
    assert plan["engine"] == "sglang" and len(workers) == 3
    for s in workers:
        argv = s["argv"]
        assert argv[argv.index("--engine-type") + 1] == "sglang" and argv.count("--engine-type") == 1, argv
        assert s["component"] == "dynamo-mocker-sglang"
    prefill = next(s["argv"] for s in workers if s["role"] == "prefill")
    assert prefill[prefill.index("--sglang-chunked-prefill-size") + 1] == "4096"
    assert prefill[-2:] == ["--sglang-schedule-policy", "lpm"]  # the role's own extra_args come last

    out = tmp_path / "sglang-out"
    r = primectl("render", sglang, "--target", target, "-o", out, path=[plugins])
    assert r.exit_code == 0, r.stderr
    base = tmp_path / "mocker-out"
    assert cli("render", mocker, "--target", target, "-o", base).exit_code == 0
    got, want = rendered(out), rendered(base)
    assert sorted(got) == sorted(want), "engine sglang renders other files than engine mocker"
    # Line by line, with hashes (recipe, revision) and the component name taken out, the sglang render is the
    # mocker's plus the SGLang scheduler's flags on each worker's launch line, and nothing else.
    added: list[str] = []
    for p in sorted(set(got) - {"plan.json"}):  # the Slurm job's copy of the plan: checked above, through `plan`
        diff = list(difflib.ndiff(normalised(want[p]), normalised(got[p])))
        assert not [d for d in diff if d.startswith("- ")], (p, [d for d in diff if d[:1] in "-+"])
        added += [d[2:].strip() for d in diff if d.startswith("+ ")]
    assert added and all(SGLANG_LINE.fullmatch(a) for a in added), [a for a in added if not SGLANG_LINE.fullmatch(a)]
    workers = 2 if target == "kubernetes" else 3  # kubernetes: one prefill and one decode component
    assert sum(a.startswith(("--engine-type sglang", "- --engine-type")) for a in added) >= workers


def test_an_sglang_flag_primectl_sets_is_refused_in_extra_args_and_a_bad_policy_named(plugins: Path, tmp_path: Path) -> None:
    bad = recipe(tmp_path, "bad.yaml", "engine: sglang\ndecode:\n  extra_args: [--engine-type, vllm, "
                 "--sglang-schedule-policy, random]\n")  # and the demo's host tier left on
    r = primectl("validate", bad, path=[plugins])
    assert r.exit_code == 2
    text = "\n".join(r.problems())
    assert "decode.extra_args" in text and "--engine-type" in text and "engine (sglang runs the mocker's SGLang" in text
    assert "'random' is not an SGLang schedule policy; allowed: fifo, lpm, fcfs" in text
    assert "host_tier: engine sglang has no host KV tier" in text and "set host_tier.enabled: false" in text


def test_a_render_only_target_renders_and_refuses_to_deploy(plugins: Path, tmp_path: Path) -> None:
    path = recipe(tmp_path, "nomad.yaml", "target: nomad\n")
    assert primectl("validate", path, path=[plugins]).exit_code == 0
    out = tmp_path / "out"
    r = primectl("render", path, "-o", out, path=[plugins])
    assert r.exit_code == 0, r.stderr
    assert "1 files written for target nomad" in r.stdout
    job = json.loads((out / "demo.nomad.json").read_text())["Job"]
    plan = json.loads(primectl("plan", path, "-o", "json", path=[plugins]).stdout)
    tasks = {t["Name"]: t for g in job["TaskGroups"] for t in g["Tasks"]}
    assert [g["Name"] for g in job["TaskGroups"]] == ["local"]
    assert sorted(tasks) == sorted(s["name"] for s in plan["services"])
    for s in plan["services"]:
        t = tasks[s["name"]]
        argv = [a.replace("@release@", "${NOMAD_TASK_DIR}") for a in s["argv"]]
        assert [t["Config"]["command"], *t["Config"]["args"]] == argv
        assert t["Env"] == {k: v.replace("@release@", "${NOMAD_TASK_DIR}") for k, v in s["env"].items()}
    ports = {p["Value"] for p in job["TaskGroups"][0]["Networks"][0]["ReservedPorts"]}
    assert ports == {port for s in plan["services"] for port in s["ports"].values()}

    for args in (["up", path], ["diff", path], ["status", path], ["down", path], ["logs", path, "decode-0"]):
        r = primectl(*args, path=[plugins])
        text = " ".join(r.stderr.split())
        assert r.exit_code == 2, (args, r.stdout, r.stderr)
        assert "target nomad renders only; use `primectl render RECIPE -o DIR`" in text, text
        assert "nothing was changed" in text and "Traceback" not in r.stderr
    assert "then: nomad job run -json DIR/demo.nomad.json" in " ".join(primectl("up", path, path=[plugins]).stderr.split())


def test_an_unknown_name_gets_did_you_mean_over_the_names_found(plugins: Path, tmp_path: Path) -> None:
    r = primectl("validate", recipe(tmp_path, "typo.yaml", "engine: sglan\ntarget: nomda\n"), path=[plugins])
    assert r.exit_code == 2
    text = "\n".join(r.problems())
    assert "engine: 'sglan' is not an engine (did you mean `sglang`?); allowed: vllm, mocker, sglang" in text
    assert "target: 'nomda' is not a target (did you mean `nomad`?); allowed: ssh, kubernetes, slurm, nomad" in text
    r = primectl("render", recipe(tmp_path, "demo.yaml", ""), "--target", "nomda", "-o", tmp_path / "x", path=[plugins])
    assert r.exit_code == 2 and "(did you mean `nomad`?)" in r.stderr


def test_the_schema_lists_what_is_installed(plugins: Path) -> None:
    doc = json.loads(primectl("schema", path=[plugins]).stdout)
    assert doc["properties"]["engine"]["enum"] == ["vllm", "mocker", "sglang"]
    assert doc["properties"]["target"]["enum"] == ["ssh", "kubernetes", "slurm", "nomad"]


# --- a broken plugin -------------------------------------------------------------------------------------


def test_a_broken_plugin_breaks_only_the_recipes_that_use_it(plugins: Path, broken: Path, tmp_path: Path) -> None:
    path = [plugins, broken]
    for name, body in (("mocker.yaml", ""), ("sglang.yaml", f"engine: sglang\n{NO_TIER}"), ("nomad.yaml", "target: nomad\n")):
        r = primectl("validate", recipe(tmp_path, name, body), path=path)
        assert r.exit_code == 0, (name, r.stderr)

    r = primectl("validate", recipe(tmp_path, "broken.yaml", "engine: broken\n"), path=path)
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    [problem] = r.problems()
    assert "broken.yaml:2:1: engine: engine 'broken' cannot be loaded: ImportError: this plugin needs libnotthere.so.1" in problem
    assert ("entry point `broken = primectl_broken_plugin:Engine` in group primectl.engines of distribution "
            "primectl-broken-plugin 0.0.1; fix or uninstall primectl-broken-plugin") in problem

    r = primectl("render", recipe(tmp_path, "demo.yaml", ""), "--target", "broken-target", "-o", tmp_path / "o", path=path)
    assert r.exit_code == 2 and "Traceback" not in r.stderr, r.stderr
    assert "target 'broken-target' cannot be loaded: ImportError" in " ".join(r.stderr.split())

    listed = primectl("plugins", "-o", "json", path=path)
    assert listed.exit_code == 1  # something registered cannot be loaded
    items = {(i["kind"], i["name"]): i for i in json.loads(listed.stdout)}
    assert items["engine", "broken"]["error"] == "ImportError: this plugin needs libnotthere.so.1"
    assert items["engine", "broken"]["distribution"] == "primectl-broken-plugin"
    assert items["engine", "sglang"]["ok"] and items["target", "nomad"]["ok"]

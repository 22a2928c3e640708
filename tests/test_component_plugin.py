"""A service that is not an engine, from a plugin: examples/primectl-static-files (issue 38, item 1).

The example distribution (one module, one entry point in group `primectl.components`) is installed for real with
pip into a directory under pytest's tmp and put on PYTHONPATH of `primectl` run as a subprocess, as in
tests/test_plugins.py. With it installed, a recipe's `static_files:` block is validated with file:line, planned
as a service, rendered with its files into the bundle, and named as not rendered on Kubernetes; without it, the
same key is an unknown key. tests/integration/test_plugin_demo.py starts it for real and smoke-tests it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult
from tests.test_plugins import EXAMPLES, pip_install, primectl, recipe

BLOCK = "static_files:\n  host: local\n  port: 18950\n  files:\n    hello.txt: \"hi there\\n\"\n"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pip_install([EXAMPLES / "primectl-static-files"], tmp_path_factory.mktemp("component") / "site")


def test_plugins_lists_the_component_with_what_it_declares(site: Path) -> None:
    r = primectl("plugins", "-o", "json", path=[site])
    assert r.exit_code == 0, r.stderr
    item = next(i for i in json.loads(r.stdout) if i["kind"] == "component" and i["name"] == "static_files")
    assert (item["distribution"], item["version"], item["ok"]) == ("primectl-static-files", "0.1.0", True)
    assert item["supports"] == {"stage": "edge", "recipe_block": "static_files", "validate": True,
                                "smoke_checks": True, "kubernetes": True}


def test_the_block_plans_a_service_with_its_files_after_the_frontend(site: Path, tmp_path: Path) -> None:
    path = recipe(tmp_path, "files.yaml", BLOCK)
    assert primectl("validate", path, path=[site]).exit_code == 0
    r = primectl("plan", path, "-o", "json", path=[site])
    assert r.exit_code == 0, r.stderr
    services = json.loads(r.stdout)["services"]
    assert services[-1]["name"] == "static-files", [s["name"] for s in services]
    svc = services[-1]
    assert (svc["role"], svc["component"], svc["host"], svc["listens"]) == ("auxiliary", "static_files", "local", [18950])
    assert svc["argv"][1:4] == ["-m", "http.server", "--bind"] and svc["argv"][-1] == "18950"
    assert [(f["path"], f["content"]) for f in svc["files"]] == [("static/hello.txt", "hi there\n")]
    assert svc["ready"]["url"] == "http://127.0.0.1:18950/"


def test_the_block_renders_into_the_bundle_and_is_named_as_left_out_on_kubernetes(site: Path, tmp_path: Path) -> None:
    path = recipe(tmp_path, "files.yaml", BLOCK)
    out = tmp_path / "ssh"
    r = primectl("render", path, "-o", out, path=[site])
    assert r.exit_code == 0, r.stderr
    served = [p for p in out.rglob("hello.txt")]
    assert served and served[0].read_text() == "hi there\n"
    assert any("http.server" in p.read_text() for p in out.rglob("*static-files*") if p.is_file())
    k8s = tmp_path / "k8s"
    r = primectl("render", path, "--target", "kubernetes", "-o", k8s, path=[site])
    assert r.exit_code == 0, r.stderr
    notes = (k8s / "NOTES.txt").read_text()
    assert "service static-files (static-files): the static_files example component has no Kubernetes form" in notes
    assert "http.server" not in "".join(p.read_text() for p in k8s.rglob("*.yaml"))


@pytest.mark.parametrize(("body", "field", "message"), [
    ("static_files:\n  host: local\n  prot: 80\n", "static_files.prot",
     "unknown key `prot` (did you mean `port`?); allowed: files, host, port"),
    ("static_files:\n  host: nowhere\n", "static_files.host", "'nowhere' is not a host of this recipe; allowed: local"),
    ("static_files:\n  host: local\n  port: 80\n", "static_files.port", "greater than or equal to 1024"),
])
def test_a_bad_block_is_refused_with_file_and_line(site: Path, tmp_path: Path, body: str, field: str,
                                                   message: str) -> None:
    path = recipe(tmp_path, "bad.yaml", body)
    r = primectl("validate", path, path=[site])
    assert r.exit_code == 2, r.stdout + r.stderr
    line = body.splitlines().index(next(x for x in body.splitlines() if x.strip().startswith(field.split(".")[-1] + ":")
                                        or (field.endswith("host") and "host:" in x))) + 2  # after `extends:`
    assert any(p.strip().startswith(f"{path}:{line}:") and field in p and message in p for p in r.problems()), r.stderr


def test_without_the_plugin_the_key_is_unknown(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    r = cli("validate", recipe(tmp_path, "files.yaml", BLOCK))
    assert r.exit_code == 2
    assert any(f"{tmp_path / 'files.yaml'}:2:" in p and "unknown key `static_files`" in p for p in r.problems()), r.stderr

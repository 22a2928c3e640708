"""Golden Kubernetes renders: every manifest and NOTES.txt of the reference recipes, byte for byte.

A change to what the kubernetes target writes shows up as a diff under tests/golden/k8s-*/ in
review. After an intended change, rewrite the golden files and commit them with the change:

    PRIMECTL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_k8s_golden.py

The demo's generated model ConfigMap (model.yaml, ~180 KB of tokenizer) is not stored: its
sha256 is, in model.yaml.sha256. None of these tests need the CRD files: the render is the
same with or without them (only the check differs, see tests/test_k8s_target.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primectl.planner.build import plan_recipe
from primectl.targets.kubernetes import KubernetesTarget

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("PRIMECTL_UPDATE_GOLDEN") == "1"
RECIPES = {"glm53": "recipes/glm53.yaml", "demo": "recipes/demo.yaml"}
PINNED_BY_HASH = ("model.yaml",)


def render(name: str) -> dict[str, bytes]:
    """What `primectl render RECIPE --target kubernetes` writes, in-process."""
    return KubernetesTarget().render(plan_recipe(REPO / RECIPES[name], target="kubernetes")[1])


def stored(files: dict[str, bytes]) -> dict[str, bytes]:
    """The files as the golden directory holds them: large generated ones as their sha256."""
    out = {}
    for rel, data in files.items():
        if rel in PINNED_BY_HASH:
            out[f"{rel}.sha256"] = (hashlib.sha256(data).hexdigest() + "\n").encode()
        else:
            out[rel] = data
    return out


def read_golden(name: str) -> dict[str, bytes]:
    root = GOLDEN / f"k8s-{name}"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_golden(name: str, files: dict[str, bytes]) -> None:
    root = GOLDEN / f"k8s-{name}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for rel, data in files.items():
        (root / rel).write_bytes(data)


@pytest.fixture(scope="module", params=sorted(RECIPES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[str, bytes]]:
    return request.param, render(request.param)


def test_k8s_render_matches_golden_files_byte_for_byte(rendered: tuple[str, dict[str, bytes]]) -> None:
    name, files = rendered
    got = stored(files)
    if UPDATE:
        write_golden(name, got)
    want = read_golden(name)
    assert want, f"no golden files for k8s-{name}: run with PRIMECTL_UPDATE_GOLDEN=1"
    assert sorted(got) == sorted(want), "a file was added or removed (PRIMECTL_UPDATE_GOLDEN=1 after review)"
    changed = [p for p in sorted(want) if got[p] != want[p]]
    assert not changed, f"rendered files differ from tests/golden/k8s-{name}: {changed} (PRIMECTL_UPDATE_GOLDEN=1)"


def test_reference_renders_write_the_expected_files(rendered: tuple[str, dict[str, bytes]]) -> None:
    name, files = rendered
    expected = {
        "glm53": ["NOTES.txt", "computedomain.yaml", "configmaps.yaml", "dgd.yaml", "monitoring.yaml", "services.yaml"],
        "demo": ["NOTES.txt", "configmaps.yaml", "dgd.yaml", "model.yaml", "services.yaml"],
    }
    assert sorted(files) == expected[name]


def test_rendering_twice_is_byte_identical(rendered: tuple[str, dict[str, bytes]]) -> None:
    name, first = rendered
    assert render(name) == first


def test_cli_render_writes_the_golden_files(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("render", "recipes/glm53.yaml", "--target", "kubernetes", "-o", tmp_path)
    assert result.exit_code == 0, result.stderr
    written = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == read_golden("glm53")
    assert "6 files written for target kubernetes" in result.stdout


def test_render_in_a_fresh_process_with_another_hash_seed_matches_golden(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("primectl")
    if not exe.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    subprocess.run([str(exe), "render", "recipes/demo.yaml", "--target", "kubernetes", "-o", str(tmp_path)], cwd=REPO,
                   check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "4242"}, timeout=120)
    written = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert stored(written) == read_golden("demo")

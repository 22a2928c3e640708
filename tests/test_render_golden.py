"""Golden bundles: every run script, unit, config and manifest of the reference recipes, byte for byte.

A change to a launch line shows up as a diff under tests/golden/ in review. After an intended
change, rewrite the golden files and commit them with the change:

    PRIMECTL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render_golden.py

The demo's generated model/ files are large and produced by the tokenizer trainer, and probes/ and bridges/
hold copies of primectl's own modules (the worker watch, the health loop, the engine bridges): they are not
stored; the golden manifest pins their sha256 instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primectl.plan.model import Plan
from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe
from primectl.render.bundle import MANIFEST, Bundle, render_host, render_plan

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
UPDATE = os.environ.get("PRIMECTL_UPDATE_GOLDEN") == "1"
NOT_STORED = ("model/", "probes/", "bridges/")  # probes/, bridges/: copies of primectl modules (the manifest pins their sha256)
RECIPES = {"glm53": "glm53.yaml", "demo": "demo.yaml", "glm53-tp8-dcp4": "glm53-tp8-dcp4.yaml"}


def render(recipe_file: str) -> tuple[Plan, dict[str, Bundle]]:
    """What `primectl render` produces, in-process."""
    plan = build_plan(load_recipe(REPO / "recipes" / recipe_file).recipe)
    return plan, render_plan(plan)


def flat(bundles: dict[str, Bundle]) -> dict[str, bytes]:
    """host/path -> bytes, for every stored file."""
    return {
        f"{host}/{path}": data
        for host, bundle in bundles.items()
        for path, data in bundle.files.items()
        if not path.startswith(NOT_STORED)
    }


def stored_files(out: Path) -> dict[str, bytes]:
    """What `primectl render --out out` wrote, host/path -> bytes, as the golden files store it."""
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    return {k: v for k, v in written.items() if not k.split("/", 1)[-1].startswith(NOT_STORED)}


def read_golden(name: str) -> dict[str, bytes]:
    root = GOLDEN / name
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_golden(name: str, files: dict[str, bytes]) -> None:
    root = GOLDEN / name
    shutil.rmtree(root, ignore_errors=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@pytest.fixture(scope="module", params=sorted(RECIPES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, Plan, dict[str, Bundle]]:
    plan, bundles = render(RECIPES[request.param])
    return request.param, plan, bundles


def test_bundles_match_golden_files_byte_for_byte(rendered: tuple[str, Plan, dict[str, Bundle]]) -> None:
    name, _, bundles = rendered
    got = flat(bundles)
    if UPDATE:
        write_golden(name, got)
    want = read_golden(name)
    assert want, f"no golden files for {name}: run with PRIMECTL_UPDATE_GOLDEN=1"
    assert sorted(got) == sorted(want), "a file was added or removed (PRIMECTL_UPDATE_GOLDEN=1 after review)"
    changed = [p for p in sorted(want) if got[p] != want[p]]
    assert not changed, f"rendered files differ from tests/golden/{name}: {changed[:10]} (PRIMECTL_UPDATE_GOLDEN=1)"


def test_manifest_pins_every_file_including_the_unstored_model(
    rendered: tuple[str, Plan, dict[str, Bundle]],
) -> None:
    _, _, bundles = rendered
    for bundle in bundles.values():
        manifest = json.loads(bundle.files[MANIFEST])
        listed = manifest["files"]
        assert sorted(listed) == sorted(p for p in bundle.files if p != MANIFEST)
        for path, digest in listed.items():
            assert hashlib.sha256(bundle.files[path]).hexdigest() == digest, path
        assert manifest["revision"] == bundle.revision


def test_demo_bundle_carries_the_generated_model_pinned_by_the_golden_manifest() -> None:
    _, bundles = render("demo.yaml")
    golden_manifest = json.loads((GOLDEN / "demo" / "local" / MANIFEST).read_bytes())
    model = {p: d for p, d in golden_manifest["files"].items() if p.startswith("model/")}
    assert {"model/config.json", "model/tokenizer.json", "model/tokenizer_config.json"} <= set(model)
    for path, digest in model.items():
        assert hashlib.sha256(bundles["local"].files[path]).hexdigest() == digest, path


def test_rendering_twice_is_byte_identical(rendered: tuple[str, Plan, dict[str, Bundle]]) -> None:
    name, _, first = rendered
    _, second = render(RECIPES[name])
    assert {h: b.files for h, b in first.items()} == {h: b.files for h, b in second.items()}
    assert {h: b.revision for h, b in first.items()} == {h: b.revision for h, b in second.items()}


def test_cli_render_writes_the_golden_files(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("render", "recipes/glm53.yaml", "--out", tmp_path)
    assert result.exit_code == 0, result.stderr
    assert stored_files(tmp_path) == read_golden("glm53")
    assert os.access(tmp_path / "tray07" / "bin" / "decode-0.sh", os.X_OK)


def test_render_in_fresh_processes_with_other_hash_seeds_matches_golden(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("primectl")
    if not exe.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    for seed in ("1", "4242"):
        out = tmp_path / seed
        subprocess.run([str(exe), "render", "recipes/glm53.yaml", "--out", str(out)], cwd=REPO, check=True,
                       capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60)
        assert stored_files(out) == read_golden("glm53"), f"PYTHONHASHSEED={seed}"


# --- revisions follow content --------------------------------------------------------------------

def _manifests(bundles: dict[str, Bundle]) -> dict[str, dict[str, Any]]:
    return {h: b.manifest for h, b in bundles.items()}


def test_changing_one_decode_worker_changes_only_its_host_revision_and_service_hash() -> None:
    plan, before = render("glm53.yaml")
    svc = plan.service("decode-3")
    edited = svc.model_copy(update={
        "argv": [*svc.argv, "--enforce-eager"], "env": {**svc.env, "NCCL_DEBUG": "INFO"},
    })
    plan2 = plan.model_copy(update={"services": [edited if s.name == "decode-3" else s for s in plan.services]})
    host = plan.host(svc.host)
    after = render_host(plan2, host)
    others = {h: render_host(plan2, plan2.host(h)).revision for h in before if h != svc.host}
    assert others == {h: b.revision for h, b in before.items() if h != svc.host}
    assert after.revision != before[svc.host].revision
    old, new = before[svc.host].manifest["services"], after.manifest["services"]
    assert isinstance(old, dict) and isinstance(new, dict)
    assert [n for n in new if new[n]["hash"] != old[n]["hash"]] == ["decode-3"]
    assert edited.hashes()["hash"] != svc.hashes()["hash"]


def test_changing_decode_env_in_the_recipe_changes_exactly_the_decode_hosts(tmp_path: Path) -> None:
    _, before = render("glm53.yaml")
    variant = tmp_path / "glm53-env.yaml"
    variant.write_text(f"extends: {REPO / 'recipes' / 'glm53.yaml'}\ndecode:\n  env: {{NCCL_DEBUG: INFO}}\n")
    recipe = load_recipe(variant).recipe
    plan = build_plan(recipe)
    after = render_plan(plan)
    changed = sorted(h for h in before if after[h].revision != before[h].revision)
    assert changed == [f"tray{i:02d}" for i in range(7, 19)]
    decode = {s.name for s in plan.services if s.role == "decode"}
    for h in changed:
        services = after[h].manifest["services"]
        old = before[h].manifest["services"]
        assert isinstance(services, dict) and isinstance(old, dict)
        # the decode workers restart; the tray's exporters and health loop do not
        assert {n for n in services if services[n]["hash"] != old[n]["hash"]} == decode & set(services)

"""provision and doctor on a `connection: local` host: reuse of a matching runtime, drift reports."""

import hashlib
import os
import subprocess
from pathlib import Path

import yaml

from tests import cliproc

REPO = Path(__file__).resolve().parents[1]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")


def recipe(tmp_path: Path, **software: str) -> Path:
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    doc["name"] = "provision-test"
    doc["hosts"][0]["workdir"] = str(tmp_path / "work")
    if software:
        doc["software"] = software
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return cliproc.run([PRIMECTL, *args], cwd=REPO, env=os.environ | {"COLUMNS": "200"}, timeout=60)


def test_provision_reuses_a_runtime_whose_stamp_matches_the_lock(tmp_path):
    path = recipe(tmp_path)
    plan = yaml.safe_load(run("plan", str(path), "--output", "json").stdout)
    venv = tmp_path / "work" / "runtime" / plan["runtime_key"]
    venv.mkdir(parents=True)
    lock = (REPO / "scripts" / "runtime-requirements-cpu.txt").read_bytes()
    (venv / ".primectl-runtime.stamp").write_text(hashlib.sha256(lock).hexdigest() + " py3.11\n")
    (venv / "pip-freeze.txt").write_bytes(lock)
    r = run("provision", str(path))
    assert r.returncode == 0, r.stderr
    assert f"runtime reused at {venv}" in r.stderr
    doctor = run("doctor", str(path))
    assert doctor.returncode == 0 and "ok (4 pins match)" in doctor.stdout


def test_doctor_reports_drift_and_a_missing_runtime(tmp_path):
    path = recipe(tmp_path)
    missing = run("doctor", str(path))
    assert missing.returncode == 1 and "no runtime at" in missing.stdout and "primectl provision" in missing.stdout
    plan = yaml.safe_load(run("plan", str(path), "--output", "json").stdout)
    venv = tmp_path / "work" / "runtime" / plan["runtime_key"]
    venv.mkdir(parents=True)
    (venv / "pip-freeze.txt").write_text("ai-dynamo==1.6.0\nai-dynamo-runtime==1.6.1\n")
    drift = run("doctor", str(path))
    assert drift.returncode == 1
    assert "ai-dynamo pinned 1.6.1, installed 1.6.0" in drift.stdout
    assert "mooncake-transfer-engine pinned 0.3.13.post1, installed missing" in drift.stdout


def test_doctor_asks_a_user_managed_interpreter(tmp_path):
    """software.python points at this test's own interpreter, which has none of the runtime pins."""
    path = recipe(tmp_path, python=str(REPO / ".venv" / "bin" / "python"))
    r = run("doctor", str(path))
    assert r.returncode == 1 and "ai-dynamo pinned 1.6.1, installed missing" in r.stdout

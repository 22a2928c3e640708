"""Slurm's shared runtime goes through the same install routine as an SSH host's (deploy.provision.install_runtime):
staged beside the venv on the shared filesystem, wheels under <job_dir>/wheelhouse, run by srun on one node."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.deploy.provision import RUNTIME_STAMP, lock_file
from primectl.errors import DeployError
from primectl.planner.build import plan_recipe
from primectl.targets.slurm import SlurmRollout
from primectl.targets.slurm_cli import JobView, SlurmClient

REPO = Path(__file__).resolve().parent.parent


class Srun(SlurmClient):
    """No job runs; `srun` is recorded and answers `code`."""

    def __init__(self, code: int = 0) -> None:
        super().__init__(env={})
        self.code = code
        self.ran: list[tuple[str, ...]] = []

    def active_jobs(self, name: str) -> list[tuple[str, str]]:
        return []

    def job(self, job_id: str) -> JobView:
        return JobView(job_id, [])

    def run(self, *argv: str, check: bool = True, timeout: float = 60, cwd: str | None = None,
            **kw: Any) -> subprocess.CompletedProcess[str]:
        self.ran.append(argv)
        return subprocess.CompletedProcess(list(argv), self.code, "pip said this\n", "")


def rollout(tmp_path: Path, client: Srun, said: list[str]) -> SlurmRollout:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"extends": str(REPO / "recipes" / "demo-slurm.yaml"),
                                    "slurm": {"job_dir": str(tmp_path / "jobs"), "partition": "debug"}}))
    return SlurmRollout(plan_recipe(path)[1], client, said.append)


def test_the_shared_runtime_is_staged_and_installed_by_srun_then_reused(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel")
    said: list[str] = []
    client = Srun()
    run = rollout(tmp_path, client, said)
    rt = next(iter(run.plan.serving.runtime.values()))
    run.provision(wheels)
    stage = Path(rt.dir + ".install")
    lock = lock_file(rt)
    assert (stage / "install-runtime.sh").read_bytes() == (REPO / "scripts" / "install-runtime.sh").read_bytes()
    assert (stage / lock.name).read_bytes() == lock.read_bytes()
    wh = tmp_path / "jobs" / "wheelhouse"
    assert (wh / "demo-1.0-py3-none-any.whl").read_bytes() == b"wheel"
    assert client.ran == [("srun", "--nodes=1", "--ntasks=1", "--job-name=primectl-demo-slurm-provision",
                           "--partition=debug", "env", "PIP_NO_INDEX=1", f"PIP_FIND_LINKS={wh}",
                           "bash", f"{stage}/install-runtime.sh", rt.dir, *rt.install_flags)]
    assert any(s.startswith(f"installing runtime {rt.key} ({rt.flavour}, lock {lock.name}, ")
               and s.endswith(f"at {rt.dir} on one node (srun)") for s in said), said
    Path(rt.dir).mkdir()  # what install-runtime.sh leaves: the venv and its stamp
    Path(rt.dir, RUNTIME_STAMP).write_text(hashlib.sha256(lock.read_bytes()).hexdigest() + " py3.11\n")
    run.provision(wheels)
    assert len(client.ran) == 1 and said[-1] == f"runtime {rt.key} reused at {rt.dir}"


def test_a_failed_install_names_its_exit_status_and_output(tmp_path: Path) -> None:
    run = rollout(tmp_path, Srun(code=3), [])
    with pytest.raises(DeployError, match=r"^runtime install failed \(exit 3\):\npip said this"):
        run.provision(None)

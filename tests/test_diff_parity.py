"""SSH and Slurm say the same thing about the same change: one change type, one diff (deploy/changes.py).

The SSH side runs the real host agent in-process (deploy/fake.py); the Slurm side writes its deployment
directory with the rollout's own push and record, against a stand-in for squeue/scontrol that says the
recorded job runs. The targets differ only where their rollouts do: a Slurm job is replaced whole, so
every service it does not otherwise change restarts with it; and SSH's plan has a balancer in front of the
frontend, which a Slurm job has not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.deploy.changes import Change
from primectl.deploy.cluster import ConnectionPolicy
from primectl.deploy.fake import FakeWorld
from primectl.pipeline import UpOptions, diff, up
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.targets.slurm import SlurmRollout
from primectl.targets.slurm_cli import JobView, SlurmClient
from primectl.targets.slurm_job import JOB_SCRIPT
from tests.test_rollout_fake import fake_recipe

JOB = "7"
REPLACED = "the job is replaced (every service restarts in the new job)"


class RunningJob(SlurmClient):
    """squeue/scontrol as they answer while job 7 (once recorded) runs; nothing else is asked of them here."""

    def __init__(self) -> None:
        super().__init__(env={})
        self.running = False

    def active_jobs(self, name: str) -> list[tuple[str, str]]:
        return [(JOB, "RUNNING")] if self.running else []

    def job(self, job_id: str) -> JobView:
        return JobView(job_id, [{"JobState": "RUNNING"}] if self.running and job_id == JOB else [])


class Both:
    """One recipe deployed twice: over (fake) SSH hosts and as a (recorded) Slurm job."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.world = FakeWorld()
        self.slurm = RunningJob()
        self.base: dict[str, Any] = fake_recipe(tmp, "parity")

    def plans(self, **changes: Any) -> tuple[Plan, Plan]:
        doc = json.loads(json.dumps(self.base))
        for key, value in changes.items():
            doc[key] = {**doc[key], **value} if isinstance(value, dict) and isinstance(doc.get(key), dict) else value
        out = []
        for target in ("ssh", "slurm"):
            path = self.tmp / f"{target}.yaml"
            extra = {"target": "slurm", "slurm": {"job_dir": str(self.tmp / "jobs")}} if target == "slurm" else {}
            path.write_text(yaml.safe_dump(doc | extra))
            out.append(plan_recipe(path)[1])
        return out[0], out[1]

    @property
    def connection(self) -> ConnectionPolicy:
        return ConnectionPolicy(connector=self.world.connector())

    def deploy(self, **changes: Any) -> None:
        """`up` over SSH; for Slurm, what `up` leaves behind once job 7 serves (release and state.json)."""
        ssh, slurm = self.plans(**changes)
        up(ssh, UpOptions(connection=self.connection, preflight=False, smoke=False), lambda _: None)
        run = SlurmRollout(slurm, self.slurm, lambda _: None)
        run.diff("")
        run.push()
        run.job = JOB
        run.record()
        self.slurm.running = True

    def diffs(self, **changes: Any) -> tuple[list[Change], list[Change]]:
        """What `primectl diff` computes for each target (run-script diffs included)."""
        ssh, slurm = self.plans(**changes)
        lines, _ = diff(ssh, self.connection, lambda _: None)
        return lines, SlurmRollout(slurm, self.slurm, lambda _: None).diff(None, detail=True)


# The SSH target keeps a balancer in front of even one frontend (a frontend change surges a twin behind it); a
# Slurm job runs the frontend on the endpoint's port itself.
SSH_ONLY = {"balancer"}


def rows(lines: list[Change]) -> list[tuple[str, str, str, str]]:
    return [(c.host, c.service, c.action, c.reason) for c in lines if c.service not in (JOB_SCRIPT, *SSH_ONLY)]


def replaced(lines: list[Change]) -> list[tuple[str, str, str, str]]:
    """SSH's lines as a replaced Slurm job has them: what else stays (or only changes expectations) restarts."""
    return [(h, s, "restart", REPLACED) if a in ("keep", "update") else (h, s, a, r) for h, s, a, r in rows(lines)]


def hunks(detail: str) -> list[str]:
    """The changed lines of a unified diff (its file labels name the host on SSH, not on Slurm)."""
    return [line for line in detail.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.fixture
def both(tmp_path: Path) -> Both:
    return Both(tmp_path)


def test_a_first_deploy_adds_every_service_on_both_targets(both: Both) -> None:
    ssh, slurm = both.diffs()
    assert all(type(c) is Change for c in ssh + slurm)
    assert rows(ssh) == rows(slurm) and {c.action for c in ssh} == {"add"}


def test_an_env_change_is_the_same_change_line_and_script_diff_on_both_targets(both: Both) -> None:
    both.deploy()
    ssh, slurm = both.diffs(decode={"env": {"X": "1"}})
    assert all(type(c) is Change for c in ssh + slurm)
    assert replaced(ssh) == rows(slurm)
    changed = {c.service: c for c in ssh if c.action == "change"}
    assert sorted(changed) == ["decode-0", "decode-1"] and {c.reason for c in changed.values()} == {"env changed"}
    for c in slurm:
        if c.action == "change":
            assert hunks(c.detail) == hunks(changed[c.service].detail) == ["+export X=1"]


def test_a_readiness_change_updates_expectations_without_a_restart_on_both_targets(both: Both) -> None:
    both.deploy()
    ssh, slurm = both.diffs(decode={"startup_timeout_s": 5})
    assert rows(ssh) == rows(slurm)
    assert {(c.service, c.action) for c in ssh if c.action != "keep"} == {("decode-0", "update"), ("decode-1", "update")}
    assert {c.reason for c in slurm if c.action == "update"} == {"ready changed (no restart)"}


def test_scaling_down_removes_the_same_worker_on_both_targets(both: Both) -> None:
    both.deploy()
    ssh, slurm = both.diffs(decode={"workers": 1})
    assert replaced(ssh) == rows(slurm)
    assert ("h3", "decode-1", "remove", "no longer in the plan") in rows(slurm)

"""Each target builds the options its commands connect with (issue 38, item 5 in part): the CLI builds no SSH
policy for a target that reaches no host over SSH."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from primectl.deploy.cluster import ConnectionPolicy
from primectl.planner.build import plan_recipe
from primectl.targets.base import connection_options, get
from tests.conftest import REPO, CliResult


def test_the_ssh_target_builds_its_ssh_policy_and_slurm_and_kubernetes_build_none() -> None:
    for recipe, want in (("demo.yaml", ConnectionPolicy), ("demo-slurm.yaml", type(None))):
        plan = plan_recipe(REPO / "recipes" / recipe)[1]
        got = connection_options(get(plan.target.kind), plan, accept_new_host_keys=True)
        assert isinstance(got, want), (recipe, got)
    plan = plan_recipe(REPO / "recipes" / "glm53.yaml", target="kubernetes")[1]
    assert connection_options(get("kubernetes"), plan, accept_new_host_keys=False) is None
    policy = connection_options(get("ssh"), plan_recipe(REPO / "recipes" / "demo.yaml")[1], accept_new_host_keys=True)
    assert isinstance(policy, ConnectionPolicy) and policy.accept_new_host_keys


def test_a_bad_ssh_setting_is_refused_for_ssh_and_ignored_by_slurm(
        cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIMECTL_SSH_CLIENT", "bogus")
    r = cli("status", REPO / "recipes" / "demo.yaml")
    assert r.exit_code == 2 and "PRIMECTL_SSH_CLIENT='bogus': give one of libssh2, paramiko" in r.stderr
    r = cli("status", REPO / "recipes" / "demo-slurm.yaml")
    assert "PRIMECTL_SSH_CLIENT" not in r.stderr

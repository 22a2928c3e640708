"""A target's own host fields live with the target (issue 38, item 5): the Plan's hosts are generic, the SSH target
keeps how it logs in to each host under the host's `access` and its known_hosts file under the plan's target
options, and what an older primectl recorded (state.json's roster, a release's plan.json) reads back the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primectl.deploy.access import SSHAccess, access, record
from primectl.plan.model import HostPlan, Plan
from primectl.planner.build import plan_recipe
from primectl.targets.base import connection_options, get
from tests.conftest import REPO, CliResult

GENERIC = {"name", "address", "workdir", "gpus", "labels", "access"}

# Two hosts of recipes/bench-4rack.yaml as the roster in state.json held them before `access` existed (written by
# primectl at f95f7b0: HostPlan.model_dump(mode="json")), a head node and a tray reached through it.
OLDER_ROSTER = [
    {"name": "head", "address": "10.20.0.10", "port": 22, "user": "root", "identity_file": None, "connection": "ssh",
     "workdir": "/var/lib/primectl", "gpus": 0, "labels": {"role": "head"}},
    {"name": "r01-tray01", "address": "10.20.1.1", "port": 22, "user": "root", "identity_file": None,
     "connection": "ssh", "workdir": "/var/lib/primectl", "gpus": 4,
     "labels": {"rack": "r01", "tray": "01", "nvlink_domain": "r01-nvl72"},
     "via": {"name": "head", "address": "10.20.0.10", "port": 22, "user": "root", "identity_file": None,
             "connection": "ssh", "workdir": "/var/lib/primectl", "gpus": 0, "labels": {"role": "head"}},
     "via_identity_file": None},
]


def _via_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "via.yaml"
    recipe.write_text(f"""extends: {REPO / "recipes" / "demo-multihost.yaml"}
name: via-demo
hosts:
  - {{name: h1, address: 127.0.0.2, identity_file: /keys/id, workdir: /tmp/pc-via/h1}}
  - {{name: h2, address: 127.0.0.3, port: 2222, user: svc, workdir: /tmp/pc-via/h2}}
  - {{name: h3, address: 127.0.0.4, via: h1, via_identity_file: /root/.ssh/tray, workdir: /tmp/pc-via/h3}}
known_hosts: /etc/primectl/known_hosts
""")
    return recipe


def test_plan_json_keeps_the_ssh_login_of_each_host_under_its_access(
        cli: Callable[..., CliResult], tmp_path: Path) -> None:
    r = cli("plan", _via_recipe(tmp_path), "-o", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    hosts = {h["name"]: h for h in doc["hosts"]}
    assert all(set(h) == GENERIC for h in hosts.values()), hosts
    assert hosts["h2"]["access"] == {"connection": "ssh", "port": 2222, "user": "svc", "identity_file": None}
    h3 = hosts["h3"]["access"]
    assert h3["via"] == hosts["h1"] and h3["via_identity_file"] == "/root/.ssh/tray"
    assert "known_hosts" not in doc
    assert doc["target"] == {"kind": "ssh", "options": {"known_hosts": "/etc/primectl/known_hosts"}}


def test_the_ssh_policy_checks_host_keys_against_the_recipes_known_hosts(tmp_path: Path) -> None:
    plan = plan_recipe(_via_recipe(tmp_path))[1]
    policy: Any = connection_options(get("ssh"), plan, accept_new_host_keys=False)
    assert policy.known_hosts == "/etc/primectl/known_hosts"
    tray = access(plan.host("h3"))
    assert tray.via is not None and access(tray.via).identity_file == "/keys/id"


def test_hosts_planned_for_slurm_and_kubernetes_carry_no_ssh_fields() -> None:
    for plan in (plan_recipe(REPO / "recipes" / "demo-slurm.yaml")[1],
                 plan_recipe(REPO / "recipes" / "demo.yaml", target="kubernetes")[1]):
        assert all(h.access == {} for h in plan.hosts), plan.target.kind
        assert "known_hosts" not in plan.target.options


def test_a_roster_an_older_primectl_recorded_reads_back_and_is_recorded_as_it_was() -> None:
    hosts = [HostPlan.model_validate(h) for h in OLDER_ROSTER]
    assert access(hosts[0]) == SSHAccess(connection="ssh", port=22, user="root", identity_file=None)
    tray = access(hosts[1])
    assert tray.via is not None and tray.via.name == "head" and access(tray.via).connection == "ssh"
    # a newer primectl records them in the same bytes, so an older one still finds the hosts it dropped
    assert json.dumps([record(h) for h in hosts]) == json.dumps(OLDER_ROSTER)
    planned = plan_recipe(REPO / "recipes" / "bench-4rack.yaml")[1]
    assert json.dumps([record(planned.host(h["name"])) for h in OLDER_ROSTER]) == json.dumps(OLDER_ROSTER)


def test_a_plan_json_an_older_primectl_wrote_reads_back_as_the_same_plan() -> None:
    """A Slurm release's plan.json (read back to roll back to it), or any plan an older primectl dumped: its hosts
    carried the SSH fields beside their own and the plan its known_hosts file."""
    plan = plan_recipe(REPO / "recipes" / "demo-multihost.yaml")[1]
    doc = plan.model_dump(mode="json")
    older = {**{k: v for k, v in doc.items() if k != "target"}, "target": {"kind": "ssh", "options": {}},
             "known_hosts": doc["target"]["options"]["known_hosts"],
             "hosts": [{**{k: v for k, v in h.items() if k != "access"}, **h["access"]} for h in doc["hosts"]]}
    assert Plan.model_validate(older) == plan
    slurm = plan_recipe(REPO / "recipes" / "demo-slurm.yaml")[1]
    doc = slurm.model_dump(mode="json")
    login = {"port": 22, "user": "root", "identity_file": None, "connection": "ssh"}
    older = {**doc, "known_hosts": None,
             "hosts": [{**{k: v for k, v in h.items() if k != "access"}, **login} for h in doc["hosts"]]}
    back = Plan.model_validate(older)
    assert back.target == slurm.target  # an unset known_hosts is dropped: the Slurm block stays as it was
    assert back.model_copy(update={"hosts": slurm.hosts}) == slurm

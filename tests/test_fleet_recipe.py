"""Fleet recipes (`kind: fleet`, issue 39) are validated like every recipe: each problem with its file, line and
field, exit 2, nothing touched; a good one plans its deployments and the gateway tier."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, CliResult

FLEET = """kind: fleet
name: f
deployments:
  - recipe: {a}
  - recipe: {b}
    role: spill
hosts:
  - name: local
    address: 127.0.0.1
    connection: local
    workdir: /tmp/primectl-fleet-test
gateway:
  host: local
  port: 8300
  ports: {{replica: 8310, etcd_client: 8379, etcd_peer: 8380}}
"""
SITE_A = REPO / "recipes" / "demo-site-a.yaml"
SITE_B = REPO / "recipes" / "demo-site-b.yaml"


def fleet(tmp_path: Path, text: str | None = None, **edits: str) -> Path:
    body = (text or FLEET).format(a=SITE_A, b=SITE_B)
    for old, new in edits.items():
        assert old.replace("_", " ") in body or old in body
        body = body.replace(old, new)
    path = tmp_path / "fleet.yaml"
    path.write_text(body)
    return path


def test_the_demo_fleet_plans_two_deployments_and_the_gateway_tier(cli: Callable[..., CliResult]) -> None:
    r = cli("plan", REPO / "recipes" / "demo-fleet.yaml", "-o", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(m["name"], m["role"], m["capacity"]) for m in doc["members"]] == [
        ("demo-site-a", "primary", 128), ("demo-site-b", "primary", 128)]
    assert doc["endpoint"] == "http://127.0.0.1:8300" and doc["served_model"] == "demo"
    services = {s["name"]: s for s in doc["gateway"]["services"]}
    assert list(services)[:4] == ["gateway-etcd", "gateway-0", "gateway-1", "edge"]  # then its monitoring
    assert services["edge"]["depends_on"] == ["gateway-0", "gateway-1"]
    assert services["gateway-0"]["drain"]["how"] == "balancer"
    config = json.loads(next(f["content"] for f in services["gateway-1"]["files"] if f["path"].endswith(".json")))
    assert [d["url"] for d in config["deployments"]] == ["http://10.88.1.2:8200", "http://10.88.2.2:8210"]
    assert config["listen"] == {"host": "127.0.0.1", "port": 8311} and config["etcd"] == ["http://127.0.0.1:8379"]
    assert cli("validate", REPO / "recipes" / "demo-fleet.yaml").stdout.strip().endswith(
        "valid (fleet of 2 deployments, 8 gateway services)")


@pytest.mark.parametrize(("edit", "line", "field", "message"), [
    ({"  port: 8300": "  prot: 8300"}, 14, "gateway.prot", "unknown key `prot` (did you mean `port`?)"),
    ({"  host: local": "  host: elsewhere"}, 13, "gateway.host", "'elsewhere' is not one of `hosts:`; allowed: local"),
    ({"    role: spill": "    role: backup"}, 6, "deployments[1].role", "'backup' is not allowed; allowed: primary, spill"),
    ({"replica: 8310": "replica: 8379"}, 15, "gateway.ports",
     "port 8379 on 127.0.0.1 is used by both f-gateway/gateway-etcd and f-gateway/gateway-0"),
])
def test_a_bad_fleet_is_refused_at_its_line(cli: Callable[..., CliResult], tmp_path: Path, edit: dict[str, str],
                                            line: int, field: str, message: str) -> None:
    path = fleet(tmp_path, **edit)
    r = cli("up", path)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "nothing was changed" in r.stderr
    assert any(p.strip().startswith(f"{path}:{line}:") and f" {field}: " in p and message in p for p in r.problems()), (
        r.stderr)


def test_a_missing_deployment_recipe_and_one_with_its_own_problem_are_both_named(
        cli: Callable[..., CliResult], tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(f"extends: {SITE_B}\ndecode:\n  workers: 0\n")
    path = fleet(tmp_path, FLEET.replace("{a}", str(tmp_path / "nowhere.yaml")).replace("{b}", str(broken)))
    r = cli("validate", path)
    assert r.exit_code == 2
    problems = r.problems()
    assert any(f"{path}:4:" in p and "deployments[0].recipe: no such recipe file" in p for p in problems), problems
    assert any(f"{broken}:3:" in p and "decode.workers" in p for p in problems), problems


def test_deployments_that_serve_different_models_are_refused(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(f"extends: {SITE_B}\nmodel:\n  served_name: other\n")
    path = fleet(tmp_path, FLEET.replace("{b}", str(other)))
    r = cli("validate", path)
    assert r.exit_code == 2
    assert any("deployments: the deployments serve different models (demo, other)" in p for p in r.problems()), r.stderr


def test_a_fleet_with_no_primary_taking_traffic_is_refused(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    path = fleet(tmp_path, FLEET.replace("  - recipe: {a}\n", "  - recipe: {a}\n    weight: 0\n"))
    r = cli("validate", path)
    assert r.exit_code == 2
    assert any("no primary deployment with a weight above 0 takes traffic" in p for p in r.problems()), r.stderr


def test_keys_and_usage_refuse_a_deployment_recipe(cli: Callable[..., CliResult]) -> None:
    r = cli("keys", "create", REPO / "recipes" / "demo.yaml", "--team", "x")
    assert r.exit_code == 2 and "keys and usage belong to a fleet (`kind: fleet`)" in r.stderr


def test_render_writes_each_deployment_and_the_gateway_or_says_it_left_the_gateway_out(
        cli: Callable[..., CliResult], tmp_path: Path) -> None:
    fleet_file = REPO / "recipes" / "demo-fleet.yaml"
    ssh = tmp_path / "ssh"
    r = cli("render", fleet_file, "-o", ssh)
    assert r.exit_code == 0, r.stderr
    assert sorted(p.name for p in ssh.iterdir()) == ["demo-fleet-gateway", "demo-site-a", "demo-site-b"]
    gateway = ssh / "demo-fleet-gateway" / "local"
    config = json.loads((gateway / "config" / "gateway-0.json").read_text())
    assert config["prefix"] == "/primectl/fleet/demo-fleet" and config["breaker"] == {"failures": 3, "cooldown_s": 5.0}
    edge = (gateway / "config" / "balancer.haproxy.cfg").read_text()
    assert "the gateway replicas of fleet demo-fleet" in edge and "server gateway-1 127.0.0.1:8311 check" in edge
    k8s = tmp_path / "k8s"
    r = cli("render", fleet_file, "-o", k8s, "--target", "kubernetes")
    assert r.exit_code == 0, r.stderr
    assert (k8s / "demo-site-a" / "demo-site-a.yaml").is_file() or any((k8s / "demo-site-a").glob("*.yaml"))
    assert "the gateway tier (its etcd, 2 replicas and HAProxy) is rendered for target ssh only" in (
        k8s / "NOTES.txt").read_text()


ETCD3 = FLEET.replace("""    workdir: /tmp/primectl-fleet-test
""", """    workdir: /tmp/primectl-fleet-test
  - {{name: e0, address: 127.0.0.2, connection: local, workdir: /tmp/primectl-fleet-e0}}
  - {{name: e1, address: 127.0.0.3, connection: local, workdir: /tmp/primectl-fleet-e1}}
  - {{name: e2, address: 127.0.0.4, connection: local, workdir: /tmp/primectl-fleet-e2}}
""").replace("  host: local\n", "  host: local\n  etcd_hosts: [e0, e1, e2]\n")
MEMBERS = ["gateway-etcd-0", "gateway-etcd-1", "gateway-etcd-2"]


def test_three_etcd_hosts_plan_one_cluster_that_every_replica_and_the_controller_know(
        cli: Callable[..., CliResult], tmp_path: Path) -> None:
    r = cli("plan", fleet(tmp_path, ETCD3), "-o", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    clients = ["http://127.0.0.2:8379", "http://127.0.0.3:8379", "http://127.0.0.4:8379"]
    assert doc["etcd"] == clients
    services = {s["name"]: s for s in doc["gateway"]["services"]}
    assert list(services) == [*MEMBERS, "gateway-0", "gateway-1", "edge"]
    assert [(services[m]["host"], services[m]["ready"]["url"]) for m in MEMBERS] == [
        ("e0", "http://127.0.0.2:8379/health"), ("e1", "http://127.0.0.3:8379/health"),
        ("e2", "http://127.0.0.4:8379/health")]
    assert services["gateway-1"]["depends_on"] == MEMBERS and services["gateway-1"]["host"] == "local"
    argv = " ".join(services["gateway-etcd-1"]["argv"])
    assert argv == (
        "/usr/bin/etcd --name f-gateway-etcd-1 --data-dir /tmp/primectl-fleet-e1/data/gateway-etcd-1 "
        "--listen-client-urls http://127.0.0.3:8379 --advertise-client-urls http://127.0.0.3:8379 "
        "--listen-peer-urls http://127.0.0.3:8380 --initial-advertise-peer-urls http://127.0.0.3:8380 "
        "--initial-cluster f-gateway-etcd-0=http://127.0.0.2:8380,f-gateway-etcd-1=http://127.0.0.3:8380,"
        "f-gateway-etcd-2=http://127.0.0.4:8380 --initial-cluster-token f-gateway-etcd --initial-cluster-state new "
        "--heartbeat-interval 100 --election-timeout 1000 --experimental-watch-progress-notify-interval 2s")
    for replica in ("gateway-0", "gateway-1"):
        config = json.loads(next(f["content"] for f in services[replica]["files"] if f["path"].endswith(".json")))
        assert config["etcd"] == clients and config["etcd_progress_s"] == 2


def test_a_change_of_the_etcd_members_restarts_them_one_at_a_time(tmp_path: Path) -> None:
    from primectl.deploy.changes import Change
    from primectl.fleet.plan import plan_fleet
    from primectl.rollout.expected import expected_loss
    from primectl.rollout.strategy import observe, wave_rollout

    plan = plan_fleet(fleet(tmp_path, ETCD3)).gateway
    changes = [Change(plan.service(n).host, n, "change", "its command line changes") for n in MEMBERS]
    seen = observe(plan, {}, running=MEMBERS)
    [wave] = [w for w in plan.start_waves() if MEMBERS[0] in w]
    step = wave_rollout(plan, changes, seen, wave)
    assert step.at_once == [] and [roll.batches for roll in step.rolls] == [[[m] for m in MEMBERS]]
    assert expected_loss(plan, changes, seen) == [
        "control: 3 batch(es) of at most 1 instance(s): drain (up to 0s) -> restart -> ready; expected loss 0"]


@pytest.mark.parametrize(("edit", "line", "field", "message"), [
    ({"[e0, e1, e2]": "[e0, e1, nowhere]"}, 17, "gateway.etcd_hosts[2]",
     "'nowhere' is not one of `hosts:`; allowed: local, e0, e1, e2"),
    ({"[e0, e1, e2]": "[e0, e1]"}, 17, "gateway.etcd_hosts",
     "2 etcd hosts: use an odd number (1, 3, 5 or 7); a majority of them must be up"),
    ({"[e0, e1, e2]": "[e0, e1, e0]"}, 17, "gateway.etcd_hosts[2]", "'e0' is named twice: one etcd member per host"),
    ({"[e0, e1, e2]": "[e0, e1, local]", "address: 127.0.0.1": "address: 127.0.0.2"}, 17, "gateway.etcd_hosts[2]",
     "'local' is at 127.0.0.2, as 'e0' is: one etcd member per address"),
    ({"[e0, e1, e2]": "[e0, e1, e2, e0, e1, e2, e0, e1, e2]"}, 17, "gateway.etcd_hosts",
     "at most 7 items"),
])
def test_bad_etcd_hosts_are_refused_at_their_line(cli: Callable[..., CliResult], tmp_path: Path,
                                                 edit: dict[str, str], line: int, field: str, message: str) -> None:
    body = ETCD3
    for old, new in edit.items():
        assert old in body
        body = body.replace(old, new)
    path = fleet(tmp_path, body)
    r = cli("up", path)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "nothing was changed" in r.stderr
    assert any(p.strip().startswith(f"{path}:{line}:") and f" {field}: " in p and message in p for p in r.problems()), (
        r.stderr)

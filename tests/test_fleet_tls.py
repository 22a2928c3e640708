"""TLS on the fleet's edge (issue 39): a bad certificate or key is refused at its line (exit 2, nothing touched);
a good pair makes the endpoint https, HAProxy terminates TLS with it (its own `haproxy -c` loads the rendered
files), and the key reaches the gateway host's bundle alone, mode 0600, never the plan."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.certs import make_pair, new_key_pem
from tests.conftest import REPO, CliResult

FLEET = f"""kind: fleet
name: f
deployments:
  - recipe: {REPO / "recipes" / "demo-site-a.yaml"}
hosts:
  - name: local
    address: 127.0.0.1
    connection: local
    workdir: /tmp/primectl-fleet-tls-test
gateway:
  host: local
  port: 8300
  ports: {{replica: 8310, etcd_client: 8379, etcd_peer: 8380}}
  tls:
    cert: certs/edge.crt
    key: certs/edge.key
"""
CERT_LINE, KEY_LINE = 15, 16


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    make_pair(tmp_path / "certs")
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    return path


def test_the_tls_fields_are_read_relative_to_the_fleet_recipe(cli: Callable[..., CliResult], fleet: Path) -> None:
    r = cli("plan", fleet, "-o", "json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["endpoint"] == "https://127.0.0.1:8300" and doc["gateway"]["endpoint"] == doc["endpoint"]


def _break_cert_not_pem(certs: Path) -> None:
    (certs / "edge.crt").write_text("not a certificate\n")


def _break_cert_with_key(certs: Path) -> None:
    (certs / "edge.crt").write_bytes((certs / "edge.crt").read_bytes() + (certs / "edge.key").read_bytes())


def _break_key_other(certs: Path) -> None:
    (certs / "edge.key").write_bytes(new_key_pem())


def _break_key_not_pem(certs: Path) -> None:
    (certs / "edge.key").write_text("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")


def _break_key_missing(certs: Path) -> None:
    (certs / "edge.key").unlink()


def _break_cert_dir(certs: Path) -> None:
    (certs / "edge.crt").unlink()
    (certs / "edge.crt").mkdir()


@pytest.mark.parametrize(("breaks", "line", "field", "message"), [
    (_break_key_missing, KEY_LINE, "gateway.tls.key", "no such file: "),
    (_break_cert_dir, CERT_LINE, "gateway.tls.cert", "edge.crt is not a file"),
    (_break_cert_not_pem, CERT_LINE, "gateway.tls.cert", "is not a PEM certificate"),
    (_break_cert_with_key, CERT_LINE, "gateway.tls.cert", "holds a private key too"),
    (_break_key_other, KEY_LINE, "gateway.tls.key", "is not the private key of the certificate in"),
    (_break_key_not_pem, KEY_LINE, "gateway.tls.key", "holds no readable unencrypted private key"),
])
def test_a_bad_certificate_or_key_is_refused_at_its_line(cli: Callable[..., CliResult], fleet: Path,
                                                         breaks: Callable[[Path], None], line: int, field: str,
                                                         message: str) -> None:
    breaks(fleet.parent / "certs")
    r = cli("up", fleet)
    assert r.exit_code == 2, r.stdout + r.stderr
    assert "nothing was changed" in r.stderr
    assert any(p.strip().startswith(f"{fleet}:{line}:") and f" {field}: " in p and message in p for p in r.problems()), (
        r.stderr)


def test_the_key_is_in_no_plan_and_ships_alone_mode_0600(cli: Callable[..., CliResult], fleet: Path,
                                                         tmp_path: Path) -> None:
    key = (tmp_path / "certs" / "edge.key").read_bytes()
    body = key.decode().split("-----")[2].strip().splitlines()[0]  # a line of the key's base64
    plan = cli("plan", fleet, "-o", "json")
    assert plan.exit_code == 0, plan.stderr
    assert body not in plan.stdout and "PRIVATE KEY" not in plan.stdout
    edge = next(s for s in json.loads(plan.stdout)["gateway"]["services"] if s["name"] == "edge")
    shipped = {f["path"]: f for f in edge["files"]}
    assert shipped["config/balancer-tls.pem.key"]["content"].startswith("sha256:")
    assert shipped["config/balancer-tls.pem"]["content"] == (tmp_path / "certs" / "edge.crt").read_text()

    out = tmp_path / "out"
    r = cli("render", fleet, "-o", out)
    assert r.exit_code == 0, r.stderr
    host = out / "f-gateway" / "local"
    shipped_key = host / "config" / "balancer-tls.pem.key"
    assert shipped_key.read_bytes() == key and shipped_key.stat().st_mode & 0o777 == 0o600
    holding = [p for p in out.rglob("*") if p.is_file() and body.encode() in p.read_bytes()]
    assert holding == [shipped_key], holding


def test_haproxy_loads_the_rendered_edge_with_its_certificate_and_key(cli: Callable[..., CliResult], fleet: Path,
                                                                       tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert cli("render", fleet, "-o", out).exit_code == 0
    host = out / "f-gateway" / "local"
    config = (host / "config" / "balancer.haproxy.cfg").read_text()
    binds = re.findall(r"^\s*bind .*$", config, re.M)
    assert binds[0].strip() == "bind 127.0.0.1:8300 ssl crt /tmp/primectl-fleet-tls-test/current/config/balancer-tls.pem"
    # the host's `current` is this rendered release; the admin socket and state file go to a scratch directory
    local = config.replace("/tmp/primectl-fleet-tls-test/current/", f"{host}/").replace(
        "/tmp/primectl-fleet-tls-test/run/", f"{tmp_path}/")
    (tmp_path / "check.cfg").write_text(local)
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    ok = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "check.cfg")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (host / "config" / "balancer-tls.pem.key").write_bytes(new_key_pem())
    bad = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "check.cfg")], capture_output=True, text=True)
    assert bad.returncode != 0 and "balancer-tls.pem" in bad.stdout + bad.stderr


def test_a_key_replaced_after_the_plan_is_not_shipped(fleet: Path, tmp_path: Path) -> None:
    from primectl.fleet.plan import plan_fleet
    from primectl.render.bundle import render_plan

    gateway = plan_fleet(fleet).gateway
    (tmp_path / "certs" / "edge.key").write_bytes(new_key_pem())
    with pytest.raises(ValueError, match="changed after the plan was made"):
        render_plan(gateway)


def test_a_plain_edge_keeps_its_http_endpoint_and_files(cli: Callable[..., CliResult]) -> None:
    r = cli("plan", REPO / "recipes" / "demo-fleet.yaml", "-o", "json")
    doc = json.loads(r.stdout)
    edge = next(s for s in doc["gateway"]["services"] if s["name"] == "edge")
    assert doc["endpoint"] == "http://127.0.0.1:8300" and [f["path"] for f in edge["files"]] == [
        "config/balancer.haproxy.cfg"]
    assert all("source" not in f for s in doc["gateway"]["services"] for f in s["files"])
    assert doc["gateway"]["gate"] == edge["ready"] and edge["ready"]["url"] == "http://127.0.0.1:8300/-/ready"
    assert "ssl crt" not in edge["files"][0]["content"]

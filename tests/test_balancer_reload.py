"""Reloading a real HAProxy 2.6 in place, as the host agent does when only the frontend replica set changes
(`reload_in_place`): the master (`-W`) re-executes on SIGUSR2 and a new worker takes over; a configuration that
does not load is refused before the signal, and the balancer keeps serving with the old one.

Binds 127.0.0.1 only (make test runs the suite inside `unshare --net`).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from primectl.host.haproxy import (
    back_into_balancer,
    balancer_command,
    balancer_server,
    balancer_servers,
    balancer_worker_pid,
    drain_from_balancer,
    reload_in_place,
)
from primectl.host.wire import DrainSpec, ReloadSpec
from tests.exposition import free_port

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(not Path(HAPROXY).exists(), reason="haproxy is not installed (make system)")


def _config(sock: Path, state: Path, port: int, servers: list[str], extra: str = "", check: str = "") -> str:
    lines = [
        "global", f"    stats socket {sock} mode 600 level admin expose-fd listeners", f"    server-state-file {state}",
        "defaults", "    mode http", "    timeout connect 2s", "    timeout client 30s", "    timeout server 30s",
        "    load-server-state-from-file global",
        "frontend openai", f"    bind 127.0.0.1:{port}", "    default_backend frontends",
        "backend frontends",
        *(["    option httpchk GET /", "    default-server inter 100ms fall 1 rise 1"] if check else []),
        *[f"    server {name} 127.0.0.1:{free_port()}{check}" for name in servers],
        extra,
    ]
    return "\n".join(lines) + "\n"


def _start(cfg: Path, sock: Path) -> subprocess.Popen[bytes]:
    """HAProxy on `cfg`, once its admin socket answers: the file appears at bind, before the worker listens on it
    (a connection in between is refused; seen in a CI run on two busy cores)."""
    proc = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            balancer_command(str(sock), "show info")
            return proc
        except OSError:
            time.sleep(0.05)
    _stop(proc)
    raise AssertionError("haproxy did not answer on its admin socket within 10 s")


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def balancer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, ReloadSpec]]:
    """HAProxy in master-worker mode with one server, and the reload spec the agent would get for it."""
    cfg, sock, state = tmp_path / "balancer.cfg", tmp_path / "balancer.sock", tmp_path / "balancer.state"
    port = free_port()
    cfg.write_text(_config(sock, state, port, ["frontend-0"]))
    proc = _start(cfg, sock)
    try:
        spec: ReloadSpec = {"signal": "SIGUSR2", "socket": str(sock), "backend": "frontends", "state_file": str(state),
                            "check": [HAPROXY, "-c", "-q", "-f", str(cfg)], "timeout_s": 10,
                            "servers": ["frontend-0", "frontend-1"]}
        yield proc, cfg, spec
    finally:
        _stop(proc)


def test_a_new_replica_set_is_taken_over_by_a_new_worker_of_the_same_master(balancer) -> None:  # type: ignore[no-untyped-def]
    proc, cfg, spec = balancer
    sock = str(spec["socket"])
    worker = balancer_worker_pid(sock)
    port = int(cfg.read_text().split("bind 127.0.0.1:")[1].split()[0])
    cfg.write_text(_config(Path(sock), Path(str(spec["state_file"])), port, ["frontend-0", "frontend-1"]))
    assert reload_in_place(proc.pid, spec) is None
    assert balancer_servers(sock, "frontends") == ["frontend-0", "frontend-1"]
    assert balancer_worker_pid(sock) not in ("", worker), "the old worker still answers"
    assert proc.poll() is None, "the master itself must keep running (it is what the supervisor watches)"
    assert not Path(str(spec["state_file"])).exists(), "the saved states are read once, not at every later start"


def test_a_configuration_that_does_not_load_is_refused_and_the_old_one_keeps_serving(balancer) -> None:  # type: ignore[no-untyped-def]
    proc, cfg, spec = balancer
    sock = str(spec["socket"])
    worker = balancer_worker_pid(sock)
    good = cfg.read_text()
    cfg.write_text(good.replace("backend frontends", "backend frontends\n    balance no-such-algorithm"))
    error = reload_in_place(proc.pid, spec)
    assert error and "does not load" in error and "still running the old one" in error, error
    assert balancer_worker_pid(sock) == worker and balancer_servers(sock, "frontends") == ["frontend-0"]
    assert proc.poll() is None


def test_a_replica_back_on_a_new_port_is_health_checked_and_served_there(tmp_path: Path) -> None:
    """`ports.frontend_replica` changed: the replica was drained, restarted on its new port, and comes back; the
    balancer must reach it there, not at the port its configuration still names until its reload."""
    cfg, sock, state = tmp_path / "balancer.cfg", tmp_path / "balancer.sock", tmp_path / "balancer.state"
    port, new = free_port(), free_port()
    cfg.write_text(_config(sock, state, port, ["frontend-0"], check=" check"))
    replica = subprocess.Popen([sys.executable, "-m", "http.server", str(new), "--bind", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    proc = _start(cfg, sock)
    try:
        drain: DrainSpec = {"how": "balancer", "socket": str(sock), "server": "frontends/frontend-0",
                            "address": f"127.0.0.1:{new}", "timeout_s": 5}
        assert drain_from_balancer(drain)["cut"] == 0
        assert balancer_server(str(sock), "frontends/frontend-0")["addr"] != f"127.0.0.1:{new}"
        assert back_into_balancer(drain, timeout=15) is None
        row = balancer_server(str(sock), "frontends/frontend-0")
        assert row["addr"] == f"127.0.0.1:{new}" and row["status"].startswith("UP"), row
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
            assert resp.status == 200, "the balancer did not serve through the moved replica"
        # a host named by name is resolved as the balancer's configuration was: the same server, nothing to move
        assert back_into_balancer({**drain, "address": f"localhost:{new}"}, timeout=5) is None
        # an address the balancer cannot take is an error that names the server, not a silent success
        bad: DrainSpec = {**drain, "address": "not-an-address:1"}
        error = back_into_balancer(bad, timeout=3)
        assert error and "frontends/frontend-0" in error and "not-an-address:1" in error, error
    finally:
        _stop(proc)
        _stop(replica)


def test_a_replica_started_while_its_stopped_balancer_left_its_socket_behind_needs_nothing_from_it(
        tmp_path: Path) -> None:
    """`down` then `up`: HAProxy was stopped (SIGKILL leaves its admin socket on disk) and the frontend replicas start
    a wave before it. A replica's way back into rotation finds a socket that refuses: no balancer runs, so there is
    nothing to put back (the balancer starts with its servers UP), not an error that fails the `up`."""
    cfg, sock, state = tmp_path / "balancer.cfg", tmp_path / "balancer.sock", tmp_path / "balancer.state"
    cfg.write_text(_config(sock, state, free_port(), ["frontend-0"]))
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 10
    while not sock.exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.kill()  # one process without -W: nothing of it is left to answer
    proc.wait()
    assert sock.exists()
    with pytest.raises(ConnectionRefusedError), socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
    drain: DrainSpec = {"how": "balancer", "socket": str(sock), "server": "frontends/frontend-0",
                        "address": "127.0.0.1:1", "timeout_s": 5}
    assert back_into_balancer(drain, timeout=3) is None
    assert drain_from_balancer(drain)["cut"] == 0


def test_a_deep_workdir_still_gets_an_admin_socket_haproxy_accepts(tmp_path: Path) -> None:
    """A Unix socket's path holds at most 108 bytes, and HAProxy binds `<path>.<pid>.tmp` first: under a deep
    workdir its configuration was refused ('stats socket' : socket path ... [...]) and the balancer never started.
    Such a workdir's socket moves to a short path in /tmp; the rendered configuration passes `haproxy -c`."""
    from primectl.planner.build import plan_recipe
    from primectl.render.bundle import render_plan

    deep = tmp_path / ("deployments-of-the-research-team-" * 3) / "demo"
    recipe = tmp_path / "deep.yaml"
    recipe.write_text(f"extends: {Path(__file__).resolve().parents[1] / 'recipes' / 'demo.yaml'}\n"
                      f"hosts:\n  - name: local\n    address: 127.0.0.1\n    connection: local\n    workdir: {deep}\n")
    plan = plan_recipe(recipe)[1]
    sock = plan.service("frontend").drain.socket if plan.service("frontend").drain else None
    assert sock and len(sock) <= 90 and sock.startswith("/tmp/primectl-"), sock
    cfg = tmp_path / "balancer.cfg"
    cfg.write_bytes(render_plan(plan)["local"].files["config/balancer.haproxy.cfg"])
    check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"stats socket {sock} " in cfg.read_text()

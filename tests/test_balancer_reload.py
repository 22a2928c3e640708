"""Reloading a real HAProxy 2.6 in place, as the host agent does when only the frontend replica set changes
(`reload_in_place`): the master (`-W`) re-executes on SIGUSR2 and a new worker takes over; a configuration that
does not load is refused before the signal, and the balancer keeps serving with the old one.

Binds 127.0.0.1 only (make test runs the suite inside `unshare --net`).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from primectl.deploy.protocol import ReloadSpec, balancer_servers, balancer_worker_pid, reload_in_place

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(not Path(HAPROXY).exists(), reason="haproxy is not installed (make system)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(sock: Path, state: Path, port: int, servers: list[str], extra: str = "") -> str:
    lines = [
        "global", f"    stats socket {sock} mode 600 level admin expose-fd listeners", f"    server-state-file {state}",
        "defaults", "    mode http", "    timeout connect 2s", "    timeout client 30s", "    timeout server 30s",
        "    load-server-state-from-file global",
        "frontend openai", f"    bind 127.0.0.1:{port}", "    default_backend frontends",
        "backend frontends",
        *[f"    server {name} 127.0.0.1:{_free_port()}" for name in servers],
        extra,
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def balancer(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, ReloadSpec]]:
    """HAProxy in master-worker mode with one server, and the reload spec the agent would get for it."""
    cfg, sock, state = tmp_path / "balancer.cfg", tmp_path / "balancer.sock", tmp_path / "balancer.state"
    port = _free_port()
    cfg.write_text(_config(sock, state, port, ["frontend-0"]))
    proc = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 10
        while not sock.exists() and time.time() < deadline:
            time.sleep(0.05)
        assert sock.exists(), "haproxy did not open its admin socket"
        spec: ReloadSpec = {"signal": "SIGUSR2", "socket": str(sock), "backend": "frontends", "state_file": str(state),
                            "check": [HAPROXY, "-c", "-q", "-f", str(cfg)], "timeout_s": 10,
                            "servers": ["frontend-0", "frontend-1"]}
        yield proc, cfg, spec
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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

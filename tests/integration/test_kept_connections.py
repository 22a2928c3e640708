"""PRIMECTL_KEEP_CONNECTIONS on real sshd hosts: one SSH connection and one host agent per host serve several
commands, `disconnect` ends them, and a keeper or link that died is replaced without the operator noticing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PRIMECTL, Deployment, serving_agents
from tests.integration.sshhosts import SSHHosts, pid_alive


def _keeper() -> int | None:
    """The keeper's pid, as its socket's peer credentials give it (None: none runs)."""
    from primectl.deploy.keeper import keeper_pid

    return keeper_pid()


def _disconnect(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`primectl disconnect`, the way an operator runs it."""
    return subprocess.run([PRIMECTL, "disconnect"], capture_output=True, text=True, timeout=60, env=os.environ | env)


def test_kept_connections_serve_later_commands_and_disconnect_ends_them_fake_engine(
        deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dep = deployment
    env = {"PRIMECTL_KEEP_CONNECTIONS": "120", "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])  # where this test looks for the keeper too
    try:
        dep.up_ok(env=env)
        keeper = _keeper()
        assert keeper is not None and pid_alive(keeper), "no connection keeper after `up`"
        agents = serving_agents(dep)
        assert all(len(p) == 1 for p in agents.values()), agents  # one agent per host, still serving
        r = dep.cli("status", "-o", "json", env=env)
        code, doc = r.returncode, json.loads(r.stdout)
        assert code == 0 and doc["healthy"], r.stdout + r.stderr
        diff = dep.cli("diff", env=env)
        assert diff.returncode == 0 and "no changes" in diff.stdout, diff.stdout + diff.stderr
        assert serving_agents(dep) == agents, "a later command connected again instead of using the kept connection"
        assert _keeper() == keeper

        # a host's link that dropped (its sessions killed) is opened again by the next command
        (h2_agent,) = agents["h2"]
        os.kill(h2_agent, signal.SIGKILL)
        r = dep.cli("status", "-o", "json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["healthy"], r.stdout + r.stderr
        now = serving_agents(dep)
        assert now["h1"] == agents["h1"] and now["h2"] and now["h2"] != agents["h2"], (agents, now)

        # a keeper that died is replaced by the next command
        os.kill(keeper, signal.SIGKILL)
        r = dep.cli("status", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        second = _keeper()
        assert second is not None and second != keeper

        off = _disconnect(env)
        assert off.returncode == 0 and f"stopped the connection keeper (pid {second})" in off.stdout, off.stdout
        deadline = time.monotonic() + 10
        while pid_alive(second) or any(serving_agents(dep).values()):
            assert time.monotonic() < deadline, f"keeper or agents still run after `disconnect`: {serving_agents(dep)}"
            time.sleep(0.05)
        again = _disconnect(env)
        assert again.returncode == 0 and "no connection keeper runs" in again.stdout, again.stdout
    finally:
        pid = _keeper()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)


def test_a_bad_keep_connections_value_is_refused_before_any_host_is_touched(deployment: Deployment,
                                                                             tmp_path: Path) -> None:
    env = {"PRIMECTL_KEEP_CONNECTIONS": "soon", "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    r = deployment.up(env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "PRIMECTL_KEEP_CONNECTIONS='soon'" in r.stderr + r.stdout
    assert not deployment.workdir("h1").exists(), "a host was changed despite the bad setting"


def test_a_bad_ssh_client_is_refused_before_any_host_is_touched(deployment: Deployment) -> None:
    r = deployment.up(env={"PRIMECTL_SSH_CLIENT": "openssh"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "PRIMECTL_SSH_CLIENT='openssh': give one of libssh2, paramiko" in r.stderr + r.stdout
    assert not deployment.workdir("h1").exists(), "a host was changed despite the bad setting"


def test_paramiko_serves_every_command_when_asked_fake_engine(deployment: Deployment,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from primectl.deploy import libssh2_transport
    from primectl.deploy.cluster import ConnectionPolicy
    from primectl.pipeline import UpOptions, up
    from primectl.planner.build import plan_recipe

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a libssh2 connection was made despite PRIMECTL_SSH_CLIENT=paramiko")

    monkeypatch.setattr(libssh2_transport.Libssh2Transport, "__init__", refuse)
    monkeypatch.setenv("PRIMECTL_SSH_CLIENT", "paramiko")
    plan = plan_recipe(deployment.path)[1]
    said: list[str] = []
    result = up(plan, UpOptions(connection=ConnectionPolicy(known_hosts=plan.known_hosts), preflight=False,
                                smoke=False), said.append)
    assert len(result.started) == len(plan.services), "\n".join(said)
    r = deployment.cli("status", "-o", "json", env={"PRIMECTL_SSH_CLIENT": "paramiko"})
    assert r.returncode == 0 and json.loads(r.stdout)["healthy"] is True, r.stdout + r.stderr
    again = deployment.up_ok(env={"PRIMECTL_SSH_CLIENT": "paramiko"})
    assert "no changes" in again.stderr, again.stderr


def test_a_kept_connection_no_command_uses_is_closed_but_one_in_use_is_not(ssh_hosts: SSHHosts,
                                                                          tmp_path: Path) -> None:
    """A sweep moves from deployment to deployment, each with its own workdir: the keeper closes the connections
    (and agents) no command has used for its idle time, and never one a request is still using."""
    from primectl.deploy.keeper import Keeper
    from primectl.plan.model import HostPlan

    h1, h2 = ssh_hosts.hosts[0], ssh_hosts.hosts[1]
    known = str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h1, h2]))

    def request(h: Any, wd: Path) -> dict[str, Any]:
        host = HostPlan(name=h.name, address=h.address, port=h.port, user="root", gpus=0, connection="ssh",
                        identity_file=str(ssh_hosts.client_key), workdir=str(wd))
        return {"host": host.model_dump(mode="json"), "known_hosts": known, "accept_new": False}

    keeper = Keeper(idle_s=0.8)
    old, busy = request(h1, tmp_path / "old"), request(h2, tmp_path / "busy")
    try:
        done = keeper.answer(old | {"op": "read", "args": {"workdir": str(tmp_path / "old"), "path": "x"}},
                             lambda p: None)
        assert done["result"]["ok"], done
        agent = next(iter(keeper.conns.values()))
        assert keeper.evict_unused(time.monotonic()) == []  # just used
        slow = {"op": "wait", "timeout": 30, "args": {"workdir": str(tmp_path / "busy"), "waits": [
            {"name": "slow", "probe": {"kind": "command", "command": ["sleep", "2"], "timeout_s": 30}}]}}
        answers: list[dict[str, Any]] = []
        worker = threading.Thread(target=lambda: answers.append(keeper.answer(busy | slow, lambda p: None)))
        worker.start()
        time.sleep(1.0)  # the first connection unused for longer than idle_s; the second one mid-request
        evicted = keeper.evict_unused(time.monotonic() + 0.5)
        assert len(evicted) == 1 and json.loads(evicted[0])[:2] == [h1.address, h1.port], evicted
        assert not agent.alive()
        worker.join(30)
        assert answers and answers[0]["result"]["ok"], answers
        assert keeper.evict_unused(time.monotonic()) == []  # the busy one was just used
    finally:
        for t in keeper.conns.values():
            t.close()


def test_a_commands_stream_carries_all_its_operations_on_a_host_and_holds_the_connection_until_closed(
        ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    """One Unix connection per host and command: its operations (one past its time limit among them) go over it,
    the host's SSH connection is never closed as unused while the command holds the stream, and it can be once
    the command has closed it."""
    import socket

    from primectl.deploy.keeper import Keeper, KeptTransport
    from primectl.plan.model import HostPlan

    h1 = ssh_hosts.hosts[0]
    known = str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h1]))
    wd = tmp_path / "wd"
    host = HostPlan(name=h1.name, address=h1.address, port=h1.port, user="root", gpus=0, connection="ssh",
                    identity_file=str(ssh_hosts.client_key), workdir=str(wd))
    keeper = Keeper(idle_s=0.5)
    path = tmp_path / "keeper.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    streams: list[socket.socket] = []

    def serve() -> None:  # serve()'s loop, without its idle exit
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            streams.append(conn)
            threading.Thread(target=keeper.handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    t = None
    try:
        t = KeptTransport(host, known_hosts=known, accept_new_host_keys=False, path=str(path))
        read = {"workdir": str(wd), "path": "nothing-here"}
        assert t.agent("read", read, 30)["ok"]
        slow = {"workdir": str(wd), "waits": [
            {"name": "slow", "probe": {"kind": "command", "command": ["sleep", "3"], "timeout_s": 30}}]}
        late = t.agent("wait", slow, 1)
        assert late["ok"] is False and late["code"] == 4, late
        assert t.agent("read", read, 30)["ok"], "the operation after one past its limit failed"
        assert len(streams) == 1, f"{len(streams)} connections to the keeper for one host's operations"
        assert keeper.evict_unused(time.monotonic() + 60) == [], "closed the connection of a command still running"
        t.close()
        deadline = time.monotonic() + 5
        while keeper.inflight.get(next(iter(keeper.conns))):
            assert time.monotonic() < deadline, "the keeper still holds the connection of a closed stream"
            time.sleep(0.02)
        assert len(keeper.evict_unused(time.monotonic() + 60)) == 1
    finally:
        if t is not None:
            t.close()
        listener.close()
        for c in keeper.conns.values():
            c.close()

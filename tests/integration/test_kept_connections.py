"""PRIMECTL_KEEP_CONNECTIONS on real sshd hosts: one SSH connection and one host agent per host serve several
commands, `disconnect` ends them, and a keeper or link that died is replaced without the operator noticing."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import cliproc
from tests.integration.conftest import PRIMECTL, Deployment, host_plan, serving_agents
from tests.integration.sshhosts import SSHHosts, pid_alive


def _keeper() -> int | None:
    """The keeper's pid, as its socket's peer credentials give it (None: none runs)."""
    from primectl.deploy.keeper import keeper_pid

    return keeper_pid()


def _disconnect(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`primectl disconnect`, the way an operator runs it."""
    return cliproc.run([PRIMECTL, "disconnect"], timeout=60, env=os.environ | env)


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
        logs = dep.cli("logs", "decode-0", env=env)  # shell commands connect directly, beside the kept agents
        assert logs.returncode == 0 and "fake runtime: -m dynamo.mocker" in logs.stdout, logs.stdout + logs.stderr
        assert serving_agents(dep) == agents

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
    from primectl.deploy.access import ssh_options
    from primectl.deploy.cluster import ConnectionPolicy
    from primectl.pipeline import UpOptions, up
    from primectl.planner.build import plan_recipe

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a libssh2 connection was made despite PRIMECTL_SSH_CLIENT=paramiko")

    monkeypatch.setattr(libssh2_transport.Libssh2Transport, "__init__", refuse)
    monkeypatch.setenv("PRIMECTL_SSH_CLIENT", "paramiko")
    plan = plan_recipe(deployment.path)[1]
    said: list[str] = []
    result = up(plan, UpOptions(connection=ConnectionPolicy(known_hosts=ssh_options(plan).known_hosts), preflight=False,
                                smoke=False), said.append)
    assert len(result.started) == len(plan.services), "\n".join(said)
    r = deployment.cli("status", "-o", "json", env={"PRIMECTL_SSH_CLIENT": "paramiko"})
    assert r.returncode == 0 and json.loads(r.stdout)["healthy"] is True, r.stdout + r.stderr
    again = deployment.up_ok(env={"PRIMECTL_SSH_CLIENT": "paramiko"})
    assert "no changes" in again.stderr, again.stderr


class InProcessKeeper:
    """A Keeper served on a Unix socket from threads of the test (serve()'s loop, without its idle exit), so that a
    test can look at its state and end it as a dying keeper ends: its listener and every stream closed."""

    def __init__(self, path: Path, idle_s: float):
        import socket

        from primectl.deploy.keeper import Keeper

        self.keeper = Keeper(idle_s=idle_s)
        self.path = str(path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(8)
        self.streams: list[Any] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.streams.append(conn)
            threading.Thread(target=self.keeper.handle, args=(conn,), daemon=True).start()

    def die(self) -> None:
        import socket

        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.streams:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.die()
        with self.keeper.lock:  # a handler still answering may drop its connection meanwhile
            held = list(self.keeper.conns.values())
        for c in held:
            c.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[InProcessKeeper]:
    keeper = InProcessKeeper(tmp_path / "keeper.sock", idle_s=0.8)
    try:
        yield keeper
    finally:
        keeper.close()


def _host(ssh_hosts: SSHHosts, i: int, wd: Path) -> Any:
    return host_plan(ssh_hosts.hosts[i], ssh_hosts.client_key, wd)


def _kept(ssh_hosts: SSHHosts, served: InProcessKeeper, host: Any) -> Any:
    """A command's KeptTransport to `host` through the in-process keeper, every test host's key known."""
    from primectl.deploy.keeper import KeptTransport

    known = ssh_hosts.known_hosts(Path(served.path).parent / "known_hosts")
    return KeptTransport(host, known_hosts=str(known), accept_new_host_keys=False, path=served.path)


def _slow(wd: Path, seconds: int, timeout_s: int) -> dict[str, Any]:
    """A `wait` whose probe takes `seconds`."""
    return {"workdir": str(wd), "waits": [
        {"name": "slow", "probe": {"kind": "command", "command": ["sleep", str(seconds)], "timeout_s": timeout_s}}]}


def test_a_kept_connection_no_command_uses_is_closed_but_one_in_use_is_not(ssh_hosts: SSHHosts, tmp_path: Path,
                                                                          served: InProcessKeeper) -> None:
    """A sweep moves from deployment to deployment, each with its own workdir: the keeper closes the connections
    (and agents) no command has used for its idle time, and never one a request is still using."""
    h1 = ssh_hosts.hosts[0]
    keeper = served.keeper
    old = _kept(ssh_hosts, served, _host(ssh_hosts, 0, tmp_path / "old"))
    done = old.agent("read", {"workdir": str(tmp_path / "old"), "path": "x"}, 30)
    assert done["ok"], done
    old.close()
    agent = next(iter(keeper.conns.values()))
    assert keeper.evict_unused(time.monotonic()) == []  # just used
    busy = _kept(ssh_hosts, served, _host(ssh_hosts, 1, tmp_path / "busy"))
    answers: list[dict[str, Any]] = []
    worker = threading.Thread(target=lambda: answers.append(busy.agent("wait", _slow(tmp_path / "busy", 2, 30), 30)))
    worker.start()
    time.sleep(1.0)  # the first connection unused for longer than idle_s; the second one mid-request
    evicted = keeper.evict_unused(time.monotonic() + 0.5)
    assert len(evicted) == 1 and json.loads(evicted[0])[:2] == [h1.address, h1.port], evicted
    assert not agent.alive()
    worker.join(30)
    assert answers and answers[0]["ok"], answers
    assert keeper.evict_unused(time.monotonic()) == []  # the busy one was just used
    busy.close()


def test_a_commands_stream_carries_all_its_operations_on_a_host_and_holds_the_connection_until_closed(
        ssh_hosts: SSHHosts, tmp_path: Path, served: InProcessKeeper) -> None:
    """One Unix connection per host and command: its operations (one past its time limit among them) go over it,
    the host's SSH connection is never closed as unused while the command holds the stream, and it can be once
    the command has closed it."""
    wd = tmp_path / "wd"
    keeper = served.keeper
    t = _kept(ssh_hosts, served, _host(ssh_hosts, 0, wd))
    read = {"workdir": str(wd), "path": "nothing-here"}
    assert t.agent("read", read, 30)["ok"]
    late = t.agent("wait", _slow(wd, 3, 30), 1)
    assert late["ok"] is False and late["code"] == 4, late
    assert t.agent("read", read, 30)["ok"], "the operation after one past its limit failed"
    assert len(served.streams) == 1, f"{len(served.streams)} connections to the keeper for one host's operations"
    assert keeper.evict_unused(time.monotonic() + 60) == [], "closed the connection of a command still running"
    t.close()
    deadline = time.monotonic() + 5
    while keeper.inflight.get(next(iter(keeper.conns))):
        assert time.monotonic() < deadline, "the keeper still holds the connection of a closed stream"
        time.sleep(0.02)
    assert len(keeper.evict_unused(time.monotonic() + 60)) == 1


def test_a_keeper_gone_between_operations_makes_the_next_one_unreachable_not_a_crash(
        ssh_hosts: SSHHosts, tmp_path: Path, served: InProcessKeeper) -> None:
    """The keeper stops (`disconnect`, killed) while a command holds its streams: the command's next operation
    on the host fails as an unreachable host does (the command rolls back, names the host), not with a broken
    pipe."""
    from primectl.deploy.transport import HostUnreachable

    wd = tmp_path / "wd"
    t = _kept(ssh_hosts, served, _host(ssh_hosts, 0, wd))
    assert t.agent("read", {"workdir": str(wd), "path": "x"}, 30)["ok"]
    served.die()
    with pytest.raises(HostUnreachable, match="h1: the connection keeper went away"):
        t.agent("read", {"workdir": str(wd), "path": "x"}, 30)
    t.close()


def test_closing_a_kept_transport_ends_an_operation_blocked_on_it_at_once(
        ssh_hosts: SSHHosts, tmp_path: Path, served: InProcessKeeper) -> None:
    """Ctrl-C during a long wait: the command closes its connections while another thread still waits on one;
    the close returns at once and so does the wait, and nothing is asked on that stream again."""
    from primectl.deploy.transport import HostUnreachable

    wd = tmp_path / "wd"
    t = _kept(ssh_hosts, served, _host(ssh_hosts, 0, wd))
    ended: list[BaseException | dict[str, Any]] = []

    def wait() -> None:
        try:
            ended.append(t.agent("wait", _slow(wd, 4, 6), 30))
        except BaseException as exc:
            ended.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    t.close()
    waiter.join(5)
    assert time.monotonic() - t0 < 2, f"close() and the wait took {time.monotonic() - t0:.1f}s to end"
    assert ended and isinstance(ended[0], HostUnreachable), ended
    with pytest.raises(HostUnreachable, match="its connection was closed"):
        t.agent("read", {"workdir": str(wd), "path": "x"}, 30)


def test_a_host_the_keeper_cannot_reach_leaves_no_stream_held(ssh_hosts: SSHHosts, tmp_path: Path,
                                                              served: InProcessKeeper) -> None:
    """A host that does not answer fails the command's connect as a direct one does, and the keeper's side of
    that stream ends with it (else the keeper would count it as a command still running, and never go idle)."""
    from primectl.deploy.access import SSHAccess
    from primectl.deploy.transport import HostUnreachable
    from primectl.plan.model import HostPlan

    reach = SSHAccess(connection="ssh", port=22, user="root", identity_file=str(ssh_hosts.client_key))
    nobody = HostPlan(name="gone", address="127.0.0.250", gpus=0, workdir=str(tmp_path / "wd"), access=reach.plain())
    with pytest.raises(HostUnreachable, match="gone") as caught:  # a command keeps it, to report the host
        _kept(ssh_hosts, served, nobody)
    deadline = time.monotonic() + 5
    while served.keeper.busy and caught.value:
        assert time.monotonic() < deadline, "the keeper still serves the stream of a host it could not reach"
        time.sleep(0.02)

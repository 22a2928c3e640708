"""Hosts reached through a head node (`via:`), over real SSH: the controller connects to h1 only, and h1's own
OpenSSH client reaches h2 and h3, which still must have the keys primectl's known_hosts holds.

Dynamo components are the FAKE engine runtime (tests/fakes/fake_python): tests that start them say `fake_engine`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import paramiko
import pytest

from primectl.deploy import libssh2_transport, via
from primectl.deploy.access import SSHAccess, ssh_options
from primectl.deploy.cluster import ConnectionPolicy
from primectl.pipeline import UpOptions, up
from primectl.plan.model import HostPlan
from primectl.planner.build import plan_recipe
from tests import cliproc

from .conftest import PRIMECTL, Deployment, serving_agents
from .sshhosts import SSHHosts

pytestmark = pytest.mark.integration


def behind_h1(deployment: Deployment) -> dict[str, Any]:
    """The recipe's hosts with h2 and h3 reached through h1, which logs in to them with the test client key."""
    hosts = [dict(h) for h in deployment.base["hosts"]]
    for h in hosts[1:]:
        h |= {"via": "h1", "via_identity_file": str(deployment.cluster.client_key)}
    return {"hosts": hosts}


def test_hosts_behind_a_head_node_are_deployed_through_it_fake_engine(deployment: Deployment,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = deployment.write(behind_h1(deployment))
    reached: list[str] = []
    connect = paramiko.SSHClient.connect

    def spy(self: paramiko.SSHClient, hostname: str, *args: Any, **kwargs: Any) -> None:
        reached.append(hostname)  # the connection is still made: this only records where to
        connect(self, hostname, *args, **kwargs)

    monkeypatch.setattr(paramiko.SSHClient, "connect", spy)
    direct = libssh2_transport.Libssh2Transport.__init__

    def spy_direct(self: libssh2_transport.Libssh2Transport, host: HostPlan, **kwargs: Any) -> None:
        reached.append(host.address)  # h1's own agent calls go on libssh2
        direct(self, host, **kwargs)

    monkeypatch.setattr(libssh2_transport.Libssh2Transport, "__init__", spy_direct)
    # one host per connection to the head here, as 8 are on a rack (sshd's MaxSessions is 10 by default)
    monkeypatch.setattr(via, "HOSTS_PER_LINK", 1)
    plan = plan_recipe(path)[1]
    said: list[str] = []
    result = up(plan, UpOptions(connection=ConnectionPolicy(known_hosts=ssh_options(plan).known_hosts), preflight=False,
                                smoke=False), said.append)
    assert len(result.started) == len(plan.services), "\n".join(said)
    h1 = deployment.hosts["h1"].address
    assert reached == [h1] * 3, f"the controller connected to {reached}; h1 ({h1}) itself and a link each for h2, h3"
    pids = deployment.pids()
    assert {"prefill-0", "decode-0", "decode-1"} <= set(pids)  # on h2 and h3, started through h1

    code, doc = deployment.status_json()
    assert code == 0 and doc["healthy"] is True, doc
    again = deployment.up_ok()
    assert "no changes" in again.stderr, again.stderr
    assert deployment.pids() == pids
    logs = deployment.cli("logs", "decode-0")
    assert logs.returncode == 0 and "fake runtime: -m dynamo.mocker" in logs.stdout, logs.stdout + logs.stderr


def test_a_host_the_head_node_cannot_reach_changes_nothing_fake_engine(deployment: Deployment) -> None:
    deployment.write(behind_h1(deployment))
    deployment.up_ok()
    before = deployment.snapshot()
    deployment.write(behind_h1(deployment) | {"decode": {"env": {"DECODE_TUNING": "b"}}})
    deployment.hosts["h3"].stop()

    r = deployment.up()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "connecting failed on 1 host(s); nothing was changed" in r.stderr, r.stderr
    assert "h3 (127.0.0.4:22) through h1: ssh: connect to host 127.0.0.4 port 22: Connection refused" in r.stderr
    assert deployment.snapshot() == before


def test_a_host_key_primectl_lacks_or_that_changed_is_refused_through_the_head_node(deployment: Deployment) -> None:
    hosts = deployment.hosts
    deployment.write(behind_h1(deployment))
    known = deployment.known_hosts.read_text()
    try:
        deployment.known_hosts.write_text(hosts["h1"].known_hosts_line() + hosts["h2"].known_hosts_line())
        for extra in ((), ("--accept-new-host-keys",)):
            r = deployment.up(*extra)
            assert r.returncode == 1, r.stdout + r.stderr
            assert "h3 (127.0.0.4:22): unknown host key (not in" in r.stderr, r.stderr
        assert "primectl cannot learn a key" in r.stderr  # with --accept-new-host-keys: what to do instead
        assert not deployment.workdir("h3").exists()
        assert not {"releases", "current", "state.json"} & {p.name for p in deployment.workdir("h2").iterdir()}

        # h3 answers with a key other than the one known_hosts names for it (h2's): the head node's ssh refuses it
        impostor = hosts["h2"].known_hosts_line().replace(hosts["h2"].address, hosts["h3"].address, 1)
        deployment.known_hosts.write_text(hosts["h1"].known_hosts_line() + hosts["h2"].known_hosts_line() + impostor)
        r = deployment.up()
        assert r.returncode == 1, r.stdout + r.stderr
        assert "h3 (127.0.0.4:22) through h1" in r.stderr and "Host key verification failed" in r.stderr, r.stderr
        assert not deployment.workdir("h3").exists()
        assert not {"releases", "current", "state.json"} & {p.name for p in deployment.workdir("h2").iterdir()}
    finally:
        deployment.known_hosts.write_text(known)


def test_a_connection_keeper_holds_the_hosts_behind_a_head_node_too_fake_engine(deployment: Deployment,
                                                                              tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """With PRIMECTL_KEEP_CONNECTIONS, the agents reached through h1 outlive `up` and serve `status` and a
    zero-change `up`: no new session, so no handshake of the head node's ssh client, per command."""
    env = {"PRIMECTL_KEEP_CONNECTIONS": "120", "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])  # where keeper_pid() looks
    deployment.write(behind_h1(deployment))
    try:
        deployment.up_ok(env=env)
        agents = serving_agents(deployment)
        assert all(len(pids) == 1 for pids in agents.values()), agents  # h2 and h3 too, through h1
        r = deployment.cli("status", "-o", "json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["healthy"], r.stdout + r.stderr
        again = deployment.up_ok(env=env)
        assert "no changes" in again.stderr, again.stderr
        assert serving_agents(deployment) == agents, "a later command reached a host again instead of its kept session"
    finally:
        off = cliproc.run([PRIMECTL, "disconnect"], timeout=60, env=os.environ | env)
        assert off.returncode == 0, off.stdout + off.stderr
    deadline = time.monotonic() + 10
    while any(serving_agents(deployment).values()):
        assert time.monotonic() < deadline, f"agents still serve after `disconnect`: {serving_agents(deployment)}"
        time.sleep(0.05)


def _head(h: Any, name: str, key: str, via: HostPlan | None = None, workdir: str = "/tmp") -> HostPlan:
    reach = SSHAccess(connection="ssh", port=h.port, user="root", identity_file=key, via=via,
                      via_identity_file=key if via else None)
    return HostPlan(name=name, address=h.address, workdir=workdir, gpus=0, access=reach.plain())


def test_head_connections_are_told_apart_by_address_not_by_name(ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    """The keeper serves every recipe: two recipes' heads called `head` at different addresses must not share a
    connection, and a head found down is tried again once the commands that found it so are done."""
    h1, h2 = ssh_hosts.hosts[0], ssh_hosts.hosts[1]
    key = str(ssh_hosts.client_key)
    known = str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h1, h2]))
    g = via.HeadLinks(known, False)
    a, b = g.acquire(_head(h1, "head", key)), g.acquire(_head(h2, "head", key))
    try:
        assert a is not b
        assert a.transport.client.get_transport().getpeername()[0] == h1.address
        assert b.transport.client.get_transport().getpeername()[0] == h2.address
    finally:
        g.release(_head(h1, "head", key), a)
        g.release(_head(h2, "head", key), b)

    h2.stop()
    try:
        with pytest.raises(via.HostUnreachable):
            g.acquire(_head(h2, "head", key))
    finally:
        h2.start()
    with pytest.raises(via.HostUnreachable):  # remembered: the hosts behind a dead head fail at once
        g.acquire(_head(h2, "head", key))
    g.forget_failures()  # what the keeper does once no command is running
    link = g.acquire(_head(h2, "head", key))
    g.release(_head(h2, "head", key), link)


def test_a_host_closed_while_its_agent_was_about_to_start_gives_its_session_back(ssh_hosts: SSHHosts,
                                                                                 tmp_path: Path) -> None:
    """The keeper may close a host's transport that another command is about to use: no agent session may start
    on it then, or its slot on the head's connection would never be given back."""
    h1, h2 = ssh_hosts.hosts[0], ssh_hosts.hosts[1]
    key = str(ssh_hosts.client_key)
    known = str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h1, h2]))
    g = via.HeadLinks(known, False)
    head = _head(h1, "h1", key)
    tray = _head(h2, "h2", key, via=head, workdir=str(tmp_path / "wd"))
    keep = via.ViaTransport(_head(h2, "h2b", key, via=head), g)
    t = via.ViaTransport(tray, g)
    try:
        t.close()
        with pytest.raises(via.HostUnreachable, match="was closed"):
            t.agent("read", {"workdir": tray.workdir, "path": "none"}, 30)
        assert keep.link is t.link and t.link.hosts == 1
        assert all(t.link.sessions.acquire(blocking=False) for _ in range(via.SESSIONS_PER_LINK))
        for _ in range(via.SESSIONS_PER_LINK):
            t.link.sessions.release()
    finally:
        keep.close()

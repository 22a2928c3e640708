"""One of primectl's SSH connections to a real sshd host, closed: its host agent and its reader thread end at
once. close() does not close the agent's session on its own (the connection's end ends it), and the reader
blocks in recv while idle, with no timeout to wake it (paramiko's wakes ten times a second): neither may delay
the end."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from primectl.deploy.transport import SSHTransport
from primectl.plan.model import HostPlan
from tests.integration.sshhosts import SSHHost, SSHHosts, pid_alive

pytestmark = pytest.mark.integration


def _serving_agents(workdir: Path) -> set[int]:
    """The pids of host agents serving a connection (`serve`) with their cache under `workdir`."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and str(workdir / "agent").encode() in argv and pid_alive(int(entry)):
            found.add(int(entry))
    return found


def test_closing_a_connection_ends_its_agent_and_its_reader_at_once(ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    h = ssh_hosts.hosts[0]
    host = HostPlan(name=h.name, address=h.address, port=h.port, user="root", identity_file=str(ssh_hosts.client_key),
                    connection="ssh", workdir=str(tmp_path / "wd"), gpus=0)
    known = ssh_hosts.known_hosts(tmp_path / "known_hosts", [h])
    transport = SSHTransport(host, known_hosts=str(known), accept_new_host_keys=False)
    reader = transport.client.get_transport()
    assert transport.agent("read", {"workdir": host.workdir, "supervisor": "process", "path": "none"}, 30)["ok"]
    agents = _serving_agents(tmp_path / "wd")
    assert len(agents) == 1, agents
    time.sleep(0.3)  # the reader is idle, blocked in recv
    t0 = time.monotonic()
    transport.close()
    deadline = t0 + 1.0
    while (reader.is_alive() or any(pid_alive(p) for p in agents)) and time.monotonic() < deadline:
        time.sleep(0.02)
    took = time.monotonic() - t0
    assert not reader.is_alive(), f"the reader thread was still running {took:.2f}s after close"
    assert not any(pid_alive(p) for p in agents), f"the host agent was still serving {took:.2f}s after close"


def _host_plan(name: str, address: str, port: int, key: Path, workdir: Path) -> HostPlan:
    return HostPlan(name=name, address=address, port=port, user="root", identity_file=str(key), connection="ssh",
                    workdir=str(workdir), gpus=0)


def test_a_connection_uses_aes_gcm_where_the_host_offers_it(ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    h = ssh_hosts.hosts[0]
    host = _host_plan(h.name, h.address, h.port, ssh_hosts.client_key, tmp_path / "wd")
    transport = SSHTransport(host, known_hosts=str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h])),
                             accept_new_host_keys=False)
    try:
        link = transport.client.get_transport()
        assert (link.local_cipher, link.remote_cipher) == ("aes128-gcm@openssh.com", "aes128-gcm@openssh.com")
        assert transport.agent("read", {"workdir": host.workdir, "supervisor": "process", "path": "none"}, 30)["ok"]
    finally:
        transport.close()


def test_a_host_that_offers_only_aes_ctr_is_still_reached(ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    first = ssh_hosts.hosts[0]
    old = SSHHost("ctr-only", "127.0.0.40", first.port, tmp_path / "ctr-only", first.authorized_keys)
    old.config.write_text(old.config.read_text() + "Ciphers aes128-ctr,aes256-ctr\n")  # as OpenSSH < 6.2 offers
    old.start()
    try:
        host = _host_plan(old.name, old.address, old.port, ssh_hosts.client_key, tmp_path / "wd")
        transport = SSHTransport(host, known_hosts=str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [old])),
                                 accept_new_host_keys=False)
        try:
            assert transport.client.get_transport().remote_cipher == "aes128-ctr"
            assert transport.agent("read", {"workdir": host.workdir, "supervisor": "process", "path": "none"}, 30)["ok"]
        finally:
            transport.close()
    finally:
        old.stop()

"""primectl's SSH connections to real sshd hosts, on both clients: libssh2 (agent calls to directly reached
hosts, the default) and paramiko (head nodes, shell commands and uploads, and PRIMECTL_SSH_CLIENT=paramiko).

Closed, a connection's host agent (and paramiko's reader thread) end at once: close() does not close the agent's
session on its own (the connection's end ends it), and paramiko's reader blocks in recv while idle, with no
timeout to wake it (paramiko's own wakes ten times a second): neither may delay the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from ssh2.session import LIBSSH2_METHOD_CRYPT_CS

from primectl.deploy import connect
from primectl.deploy.libssh2_transport import Libssh2Transport
from primectl.deploy.transport import HostUnreachable, SSHTransport
from primectl.plan.model import HostPlan
from tests.integration.conftest import agents_serving, host_plan
from tests.integration.sshhosts import SSHHost, SSHHosts, pid_alive

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

CLIENTS = [SSHTransport, Libssh2Transport]
READ = ("read", {"supervisor": "process", "path": "none"})


def _read(transport: Any, host: HostPlan) -> bool:
    op, args = READ
    return bool(transport.agent(op, args | {"workdir": host.workdir}, 30)["ok"])


def _cipher(transport: Any) -> str:
    if isinstance(transport, SSHTransport):
        return str(transport.client.get_transport().remote_cipher)
    return str(transport._session.methods(LIBSSH2_METHOD_CRYPT_CS))


@pytest.mark.parametrize("client", CLIENTS, ids=["paramiko", "libssh2"])
def test_closing_a_connection_ends_its_agent_at_once(ssh_hosts: SSHHosts, tmp_path: Path, client: Any) -> None:
    h = ssh_hosts.hosts[0]
    host = host_plan(h, ssh_hosts.client_key, tmp_path / "wd")
    known = ssh_hosts.known_hosts(tmp_path / "known_hosts", [h])
    transport = client(host, known_hosts=str(known), accept_new_host_keys=False)
    reader = transport.client.get_transport() if client is SSHTransport else None
    assert _read(transport, host)
    agents = agents_serving(tmp_path / "wd")
    assert len(agents) == 1, agents
    time.sleep(0.3)  # paramiko's reader is idle, blocked in recv
    t0 = time.monotonic()
    transport.close()
    deadline = t0 + 1.0
    while ((reader and reader.is_alive()) or any(pid_alive(p) for p in agents)) and time.monotonic() < deadline:
        time.sleep(0.02)
    took = time.monotonic() - t0
    assert not (reader and reader.is_alive()), f"the reader thread was still running {took:.2f}s after close"
    assert not any(pid_alive(p) for p in agents), f"the host agent was still serving {took:.2f}s after close"
    with pytest.raises(HostUnreachable):
        transport.agent(READ[0], READ[1] | {"workdir": host.workdir}, 30)


@pytest.mark.parametrize("client", CLIENTS, ids=["paramiko", "libssh2"])
def test_a_connection_uses_aes_gcm_where_the_host_offers_it(ssh_hosts: SSHHosts, tmp_path: Path, client: Any) -> None:
    h = ssh_hosts.hosts[0]
    host = host_plan(h, ssh_hosts.client_key, tmp_path / "wd")
    transport = client(host, known_hosts=str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h])),
                       accept_new_host_keys=False)
    try:
        assert _cipher(transport) == "aes128-gcm@openssh.com"
        assert _read(transport, host)
    finally:
        transport.close()


@pytest.mark.parametrize("client", CLIENTS, ids=["paramiko", "libssh2"])
def test_a_host_that_offers_only_aes_ctr_is_still_reached(ssh_hosts: SSHHosts, tmp_path: Path, client: Any) -> None:
    first = ssh_hosts.hosts[0]
    octet = 40 + CLIENTS.index(client)  # the two clients' hosts may start side by side
    old = SSHHost("ctr-only", f"127.0.0.{octet}", first.port, tmp_path / "ctr-only", first.authorized_keys)
    old.config.write_text(old.config.read_text() + "Ciphers aes128-ctr,aes256-ctr\n")  # as OpenSSH < 6.2 offers
    old.start()
    try:
        host = host_plan(old, ssh_hosts.client_key, tmp_path / "wd")
        transport = client(host, known_hosts=str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [old])),
                           accept_new_host_keys=False)
        try:
            assert _cipher(transport).endswith("-ctr")
            assert _read(transport, host)
        finally:
            transport.close()
    finally:
        old.stop()


@pytest.mark.parametrize("client", CLIENTS, ids=["paramiko", "libssh2"])
def test_a_call_past_its_limit_times_out_and_the_next_one_gets_a_new_agent(ssh_hosts: SSHHosts, tmp_path: Path,
                                                                            client: Any) -> None:
    h = ssh_hosts.hosts[0]
    host = host_plan(h, ssh_hosts.client_key, tmp_path / "wd")
    transport = client(host, known_hosts=str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h])),
                       accept_new_host_keys=False)
    try:
        assert _read(transport, host)
        first = agents_serving(tmp_path / "wd")
        # nothing listens on port 9: the wait would go on for 20 s, the call's limit is 1 s
        waits = [{"name": "engine", "probe": {"kind": "tcp", "host": "127.0.0.1", "port": 9, "timeout_s": 20}}]
        t0 = time.monotonic()
        out = transport.agent("wait", {"workdir": host.workdir, "supervisor": "process", "waits": waits}, 2)
        assert out["ok"] is False and out["code"] == 4 and "within 2s" in out["error"], out
        # the busy agent's session is closed without waiting for it (sshd answers once the agent has exited)
        assert time.monotonic() - t0 < 3.2
        assert _read(transport, host)  # the timed-out agent finishes its wait on its own; a new one serves
        assert agents_serving(tmp_path / "wd") - first, "the timed-out agent's session was reused"
    finally:
        transport.close()


def test_without_an_identity_file_libssh2_logs_in_with_ssh_agent_or_the_users_own_key(
        ssh_hosts: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = ssh_hosts.hosts[0]
    host = host_plan(h, None, tmp_path / "wd")
    known = str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h]))
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with pytest.raises(HostUnreachable, match="Authentication failed"):
        Libssh2Transport(host, known_hosts=known, accept_new_host_keys=False)

    # a real ssh-agent holding the client key
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.02)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(ssh_hosts.client_key)], env=env, check=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        transport = Libssh2Transport(host, known_hosts=known, accept_new_host_keys=False)
        try:
            assert _read(transport, host)
        finally:
            transport.close()
    finally:
        agent.kill()
        agent.wait()

    monkeypatch.delenv("SSH_AUTH_SOCK")
    (home / ".ssh" / "id_ed25519").write_bytes(ssh_hosts.client_key.read_bytes())
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    transport = Libssh2Transport(host, known_hosts=known, accept_new_host_keys=False)
    try:
        assert _read(transport, host)
    finally:
        transport.close()


def test_agent_calls_go_on_libssh2_and_shell_commands_and_uploads_on_paramiko(
        ssh_hosts: SSHHosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = ssh_hosts.hosts[0]
    host = host_plan(h, ssh_hosts.client_key, tmp_path / "wd")
    known = str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h]))
    transport = connect.open_ssh(host, known_hosts=known, accept_new_host_keys=False)
    try:
        assert isinstance(transport, Libssh2Transport) and _read(transport, host)
        target = tmp_path / "up" / "loaded" / "file.txt"
        transport.put(b"hello\n", str(target), 0o600)
        code, out, _ = transport.run(f"cat {target}; stat -c %a {target}")
        assert (code, out) == (0, "hello\n600\n")
    finally:
        transport.close()
    assert isinstance(connect.open_ssh(host, known_hosts=known, accept_new_host_keys=False, shell=True), SSHTransport)
    monkeypatch.setenv(connect.SSH_CLIENT_ENV, "paramiko")
    transport = connect.open_ssh(host, known_hosts=known, accept_new_host_keys=False)
    try:
        assert isinstance(transport, SSHTransport) and _read(transport, host)
    finally:
        transport.close()


@pytest.mark.parametrize("client", CLIENTS, ids=["paramiko", "libssh2"])
def test_a_host_presenting_a_key_of_another_type_is_refused_as_changed(ssh_hosts: SSHHosts, tmp_path: Path,
                                                                       client: Any) -> None:
    """known_hosts lists an ECDSA key for the host; it presents its ed25519 key (as a man in the middle with
    another key type would): refused, with or without --accept-new-host-keys, and known_hosts is left alone."""
    h = ssh_hosts.hosts[0]
    other = tmp_path / "other_ecdsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(other)], check=True)
    kind, b64 = (tmp_path / "other_ecdsa.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"{h.address} {kind} {b64}\n")
    host = host_plan(h, ssh_hosts.client_key, tmp_path / "wd")
    for accept_new in (False, True):
        with pytest.raises(HostUnreachable, match="host key CHANGED"):
            client(host, known_hosts=str(known), accept_new_host_keys=accept_new)
    assert known.read_text() == f"{h.address} {kind} {b64}\n"


CTRL_C = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    sys.path.insert(0, sys.argv[2])
    from primectl.deploy.libssh2_transport import Libssh2Transport
    from primectl.plan.model import HostPlan

    spec = json.loads(sys.argv[1])
    host = HostPlan(**spec["host"])
    link = Libssh2Transport(host, known_hosts=spec["known_hosts"], accept_new_host_keys=False)
    args = {"workdir": host.workdir, "supervisor": "process"}
    out = {"before": link.agent("read", args | {"path": "none"}, 30)["ok"]}
    # nothing listens on port 9: the probe goes on for 3 s, and no progress line comes meanwhile
    waits = [{"name": "engine", "probe": {"kind": "tcp", "host": "127.0.0.1", "port": 9, "timeout_s": 3}}]
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        link.agent("wait", args | {"waits": waits, "progress_s": 60}, 30)
        out["interrupted_after_s"] = None
    except KeyboardInterrupt:
        out["interrupted_after_s"] = time.monotonic() - t0
    after = link.agent("read", args | {"path": "none"}, 30)  # waits for the interrupted call to end
    out["after"] = after
    link.close()
    print(json.dumps(out))
""")


def test_ctrl_c_reaches_a_main_thread_call_at_once_and_the_next_call_gets_its_own_answer(
        ssh_hosts: SSHHosts, tmp_path: Path) -> None:
    h = ssh_hosts.hosts[0]
    host = host_plan(h, ssh_hosts.client_key, tmp_path / "wd")
    spec = {"host": host.model_dump(mode="json"),
            "known_hosts": str(ssh_hosts.known_hosts(tmp_path / "known_hosts", [h]))}
    r = subprocess.run([sys.executable, "-c", CTRL_C, json.dumps(spec), str(REPO)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["before"] is True
    assert out["interrupted_after_s"] is not None and out["interrupted_after_s"] < 2, out
    assert out["after"]["ok"] is True and out["after"].get("text") == "", out  # the read's answer, not the wait's

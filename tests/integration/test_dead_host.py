"""A host that stops answering without closing its connection (its power or its link gone: no FIN, no RST) is
reported unreachable once the kernel has had no answer for the dead-peer time, not after the call's own limit
(a service's start-up budget), even while the controller only reads, with nothing of its own unanswered (the
kernel's keepalive probes find the silence then). The host is a real sshd in a network namespace of this
test's own, joined to the controller's (another one of its own) by a veth pair; then everything the host
sends is dropped on its side (`tc qdisc ... pfifo limit 0`). The dead-peer time is cut to 3 s there so the
test takes seconds (primectl's own is 60 s)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# Runs in `unshare --net`: the links it makes and the packets it drops are its own.
SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from primectl.deploy import transport
    from primectl.deploy.via import ViaTransport, head_links
    from primectl.deploy.libssh2_transport import Libssh2Transport
    from primectl.deploy.transport import HostUnreachable, SSHTransport
    from primectl.plan.model import HostPlan
    from primectl.deploy.access import SSHAccess
    from tests.integration import sshhosts

    def run(*argv):
        subprocess.run(argv, check=True)

    transport.KEEPALIVE_IDLE_S, transport.KEEPALIVE_INTERVAL_S, transport.KEEPALIVE_PROBES = 1, 1, 2
    transport.DEAD_PEER_S = 3
    base = Path(sys.argv[1])
    # the host's own namespace, held by a sleeper, joined to this one by a veth pair
    holder = subprocess.Popen(["unshare", "--net", "--", "sleep", "300"])
    cluster = None
    out = {}
    try:
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/net") == ours:  # until unshare has made its namespace
            if time.monotonic() > deadline:
                raise RuntimeError("unshare did not make a namespace within 10 s")
            time.sleep(0.01)
        inside = ["nsenter", "-t", str(holder.pid), "-n", "--"]
        run("ip", "link", "set", "lo", "up")
        run("ip", "link", "add", "ctl0", "type", "veth", "peer", "name", "host0", "netns", str(holder.pid))
        run("ip", "addr", "add", "10.213.0.1/24", "dev", "ctl0")
        run("ip", "link", "set", "ctl0", "up")
        for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", "10.213.0.2/24", "dev", "host0"],
                     ["ip", "link", "set", "host0", "up"]):
            run(*inside, *argv)
        wrapper = base / "sshd-in-host-netns"
        wrapper.write_text("#!/bin/sh\\nexec " + " ".join(inside) + " " + sshhosts.SSHD + ' "$@"\\n')
        wrapper.chmod(0o755)
        sshhosts.SSHD = str(wrapper)
        key, authorized = sshhosts.client_keys(base)
        h = sshhosts.SSHHost("h1", "10.213.0.2", 22, base / "h1", authorized)
        # "via": h1 is a head node; the host is t1, reached through it (in h1's namespace, its link stays up)
        t = sshhosts.SSHHost("t1", "10.213.0.2", 2222, base / "t1", authorized)
        cluster = sshhosts.SSHHosts(base, [h, t], key)
        h.start()
        host = HostPlan(name=h.name, address=h.address, workdir=str(base / "wd"), gpus=0,
                        access=SSHAccess(connection="ssh", port=h.port, user="root", identity_file=str(key)).plain())
        known_hosts = str(cluster.known_hosts(base / "known_hosts"))
        if sys.argv[3] == "via":
            t.start()
            reach = SSHAccess(connection="ssh", port=t.port, user="root", identity_file=None, via=host,
                              via_identity_file=str(key))
            host = HostPlan(name=t.name, address=t.address, workdir=str(base / "wd"), gpus=0, access=reach.plain())
            link = ViaTransport(host, head_links(known_hosts, False))
        else:
            client = {"paramiko": SSHTransport, "libssh2": Libssh2Transport}[sys.argv[3]]
            link = client(host, known_hosts=known_hosts, accept_new_host_keys=False)
        args = {"workdir": host.workdir, "supervisor": "process"}
        out["before"] = link.agent("read", args | {"path": "none"}, 30)["ok"]
        started = []

        def silence(progress):
            # on the wait's first progress line, with nothing of ours unanswered: the host stops answering.
            # Everything it sends is dropped on its side (a queue that holds nothing), while this side, idle,
            # reads on, as it would from a host that lost its power.
            if not started:
                run(*inside, "tc", "qdisc", "add", "dev", "host0", "root", "pfifo", "limit", "0")
                started.append(time.monotonic())

        # limits well under the test's own, so a connection that is never given up comes back as a result
        waits = [{"name": "engine", "probe": {"kind": "tcp", "host": "127.0.0.1", "port": 9, "timeout_s": 20}}]
        try:
            out["result"] = link.agent("wait", args | {"waits": waits, "progress_s": 5}, 25, silence)
        except HostUnreachable as exc:
            out["error"] = str(exc)
        out["after_s"] = time.monotonic() - started[0] if started else None
        link.close()
    finally:
        if cluster is not None:  # the host's sessions and agents too: nothing reaches them to end them
            sshhosts.kill_leftovers(cluster.base)
            for each in cluster.hosts:
                each.kill_hard()
        holder.kill()
        holder.wait()
    print(json.dumps(out))
""")


@pytest.mark.parametrize("client", ["paramiko", "libssh2", "via"])
def test_a_host_that_goes_silent_is_reported_unreachable_after_the_dead_peer_time(tmp_path: Path, client: str) -> None:
    """Reached directly (on either client), the host is named; reached through a head node that goes silent,
    the head is."""
    r = subprocess.run(["unshare", "--net", "--", sys.executable, "-c", SCRIPT, str(tmp_path), str(REPO), client],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["before"] is True
    assert "result" not in out, out  # the call was given up on before its own 25 s limit
    if client == "via":
        assert ("t1: connection lost: no answer from its head node h1 for 3s (the head node, or the network to it, "
                "is down)") in out["error"], out
    else:
        assert "h1: connection lost: no answer for 3s (the host, or the network to it, is down" in out["error"], out
    assert 2.5 < out["after_s"] < 15, out

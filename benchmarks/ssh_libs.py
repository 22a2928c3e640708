"""SSH library benchmark: the controller's CPU to reach a host and run one command, and per round trip on an
open session: paramiko/Fabric vs asyncssh, libssh2 (ssh2-python) and the OpenSSH client.

Starts N real OpenSSH servers on loopback (tests/integration/sshhosts.py) and, per
library, connects to each (host key checked against known_hosts, ed25519 key auth),
runs `true`, reads its exit status and closes: first one host at a time (the CPU
per host is clean there), then all hosts at once (threads for paramiko/Fabric/libssh2, one
event loop for asyncssh). CPU is this process's getrusage (user + system), so the
sshd side does not count. Prints ms of controller CPU per host and the ratio. paramiko is set up as primectl's
SSHTransport sets it up (its own known_hosts entries only, MACs checked in C, AES-GCM first); Fabric adds its
Connection and `run` (what primectl uses for shell commands) on top of that. The OpenSSH client (`ssh`, a child
process: its CPU counts as the controller's once it is reaped) runs with its default key exchange (`openssh`:
sntrup761x25519, ~100 ms of CPU) and with curve25519 (`ssh-x25519`, what paramiko negotiates); `ssh-mux5` is
one ControlMaster connection plus 5 commands multiplexed over it (what one primectl command makes per host).
Then the CPU of one 301-byte line and its echo on an open session (`cat`): what each agent call costs once
connected. Last, connections held open and idle: paramiko as it comes spends ~0.6 ms of CPU per host and
second (its reader wakes ten times a second); primectl's SSHTransport, whose socket blocks until data comes, ~0.003.
Measured here (2 cores, 18 hosts, parallel; 2026-12-06): libssh2 1.5-1.7 ms, paramiko 4.2-4.4, asyncssh 5.6-5.9,
Fabric 7.1-8.2, ssh-x25519 18.6, ssh-mux5 54; a round trip 0.032 ms with libssh2, 0.112 with paramiko.

    unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/ssh_libs.py --hosts 18'

asyncssh is not a primectl dependency: install it where this python finds it (e.g. `pip install --target
/tmp/pylib asyncssh` and PYTHONPATH=/tmp/pylib); without it, its row is left out. ssh2-python (libssh2) is one:
primectl's agent calls to directly reached hosts use it (primectl/deploy/libssh2_transport.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from primectl.deploy.libssh2_transport import libssh2_available  # noqa: E402
from tests.integration.sshhosts import kill_leftovers, netns_problem, start_hosts, stop_on_sigterm  # noqa: E402


def cpu() -> float:
    """This process's CPU plus that of the children it has waited for (the `ssh` clients of the OpenSSH rows)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        r = resource.getrusage(who)
        total += r.ru_utime + r.ru_stime
    return total


def ssh_argv(h: Any, key: str, known_hosts: str, *extra: str) -> list[str]:
    """The OpenSSH client as primectl would run it: its own known_hosts, strict host keys, key auth only."""
    return ["ssh", "-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
            "-i", key, "-p", str(h.port), "-l", "root", *extra, h.address]


def openssh_one(h: Any, key: str, known_hosts: str, *extra: str) -> None:
    r = subprocess.run([*ssh_argv(h, key, known_hosts, *extra), "true"], capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr


# OpenSSH 9.2's default key exchange is sntrup761x25519 (post-quantum), ~100 ms of client CPU; paramiko
# has no such exchange and uses curve25519, so this row compares like with like.
CURVE25519 = ("-o", "KexAlgorithms=curve25519-sha256")


def openssh_curve(h: Any, key: str, known_hosts: str) -> None:
    openssh_one(h, key, known_hosts, *CURVE25519)


def openssh_mux(h: Any, key: str, known_hosts: str, commands: int = 5) -> None:
    """One master connection (a child in the foreground, so its CPU is counted when it is reaped), then
    `commands` execs multiplexed over it: what a command of primectl's makes on one host."""
    with tempfile.TemporaryDirectory(prefix="mux-") as d:
        sock = f"{d}/s"
        master = subprocess.Popen([*ssh_argv(h, key, known_hosts, *CURVE25519, "-M", "-N", "-S", sock,
                                             "-o", "ControlPersist=no")],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(sock):
                if master.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ssh master did not start: {master.stderr.read().decode() if master.stderr else ''}")
                time.sleep(0.002)
            for _ in range(commands):
                r = subprocess.run([*ssh_argv(h, key, known_hosts, "-S", sock), "true"], capture_output=True, timeout=30)
                assert r.returncode == 0, r.stderr
        finally:
            master.terminate()
            try:  # a master that sits on SIGTERM (seen once in a run of 18 in parallel) must not hang the benchmark
                master.wait(timeout=10)
            except subprocess.TimeoutExpired:
                master.kill()
                master.wait()


def paramiko_client(h: Any, key: str, known_hosts: str) -> Any:
    """A logged-in paramiko SSHClient, set up as primectl's SSHTransport sets paramiko up: this host's known_hosts
    entries only, an unknown key refused."""
    import paramiko

    from primectl.deploy.known_hosts import host_keys_for
    from primectl.deploy.paramiko_patches import tune_paramiko

    tune_paramiko()
    c = paramiko.SSHClient()
    c._host_keys = host_keys_for(known_hosts, h.address, h.port)
    c.set_missing_host_key_policy(paramiko.RejectPolicy())
    c.connect(h.address, port=h.port, username="root", key_filename=key, look_for_keys=False, allow_agent=False,
              timeout=10)
    return c


def paramiko_one(h: Any, key: str, known_hosts: str) -> None:
    c = paramiko_client(h, key, known_hosts)
    chan = c.get_transport().open_session()
    chan.exec_command("true")
    assert chan.recv_exit_status() == 0
    c.close()


def fabric_one(h: Any, key: str, known_hosts: str) -> None:
    import paramiko
    from fabric import Connection

    from primectl.deploy.known_hosts import host_keys_for
    from primectl.deploy.paramiko_patches import tune_paramiko

    tune_paramiko()
    c = Connection(h.address, user="root", port=h.port, connect_timeout=10,
                   connect_kwargs={"key_filename": key, "look_for_keys": False, "allow_agent": False})
    c.client._host_keys = host_keys_for(known_hosts, h.address, h.port)
    c.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    r = c.run("true", hide=True, warn=True, in_stream=False)
    assert r.exited == 0
    c.close()


async def asyncssh_one(h: Any, key: str, known_hosts: str) -> None:
    import asyncssh

    async with asyncssh.connect(h.address, port=h.port, username="root", client_keys=[key],
                                known_hosts=known_hosts, agent_path=None, config=None) as c:
        r = await c.run("true")
        assert r.exit_status == 0


def libssh2_session(h: Any, key: str, known_hosts: str) -> tuple[Any, Any]:
    """A logged-in ssh2-python session and its socket: libssh2 (C) under a thin binding, the host key checked
    against known_hosts by libssh2."""
    import socket

    from ssh2 import knownhost
    from ssh2.session import Session

    sock = socket.create_connection((h.address, h.port), timeout=10)
    try:
        s = Session()
        s.handshake(sock)
        known = s.knownhost_init()
        known.readfile(known_hosts)
        host_key, _ = s.hostkey()
        known.checkp(h.address.encode(), h.port, host_key,
                     knownhost.LIBSSH2_KNOWNHOST_TYPE_PLAIN | knownhost.LIBSSH2_KNOWNHOST_KEYENC_RAW)  # raises if not
        s.userauth_publickey_fromfile("root", key)
    except BaseException:
        sock.close()
        raise
    return sock, s


def libssh2_one(h: Any, key: str, known_hosts: str) -> None:
    sock, s = libssh2_session(h, key, known_hosts)
    chan = s.open_session()
    chan.execute("true")
    chan.wait_eof()
    chan.close()
    chan.wait_closed()
    assert chan.get_exit_status() == 0
    s.disconnect()
    del chan, s  # libssh2 frees them on the descriptor: never after it is closed (and maybe reused)
    sock.close()


ROUND_TRIPS = 30  # line round trips per connection in `round_trip_cost`: what agent calls exchange
LINE = b"x" * 300 + b"\n"


def round_trip_cost(hosts: list[Any], key: str, kh: str) -> dict[str, float]:
    """Controller CPU per line round trip on an open session (`cat` echoes each line back): what each agent call
    costs once connected. paramiko as primectl's SSHTransport sets it up (tuned, socket blocking once logged
    in); libssh2 where installed. Connections are opened first and not counted."""
    def via_paramiko(h: Any) -> tuple[Callable[[], None], Callable[[], None]]:
        c = paramiko_client(h, key, kh)
        c.get_transport().sock.settimeout(None)
        chan = c.get_transport().open_session()
        chan.exec_command("cat")
        out = chan.makefile("rb")

        def once() -> None:
            chan.sendall(LINE)
            assert out.readline() == LINE

        return once, c.close

    def via_libssh2(h: Any) -> tuple[Callable[[], None], Callable[[], None]]:
        sock, s = libssh2_session(h, key, kh)
        chan = s.open_session()
        chan.execute("cat")

        def once() -> None:
            chan.write(LINE)
            got = b""
            while len(got) < len(LINE):
                got += chan.read()[1]
            assert got == LINE

        def close() -> None:
            # Shut down, not closed: `chan` and `s` live on in `held`, and libssh2 writes a channel's close to
            # its descriptor when it frees it. A closed descriptor may by then be another connection's (it was:
            # the paramiko client opened next saw that packet before its banner); the session closes the
            # socket when it is freed.
            s.disconnect()
            sock.shutdown(socket.SHUT_RDWR)

        return once, close

    kinds = [("paramiko", via_paramiko)] + ([("libssh2", via_libssh2)] if libssh2_available() else [])
    out = {}
    for label, open_one in kinds:
        held = [open_one(h) for h in hosts]
        c0 = cpu()
        for once, _ in held:
            for _ in range(ROUND_TRIPS):
                once()
        spent = cpu() - c0
        for _, close in held:
            close()
        out[label] = spent / len(hosts) / ROUND_TRIPS * 1000
        print(f"  round trip, {label:9}: {out[label]:6.3f} ms controller CPU per {len(LINE)}-byte line and its echo")
    return out


def idle_cost(hosts: list[Any], key: str, kh: str, seconds: float = 2.0) -> None:
    """Controller CPU per host and second while connections are held open and idle (`up` holds one per host for
    the whole command; PRIMECTL_KEEP_CONNECTIONS's keeper holds them between commands): paramiko as it comes
    (its reader thread wakes every 0.1 s) and primectl's SSHTransport (it blocks until data comes)."""
    from primectl.deploy.access import SSHAccess
    from primectl.deploy.transport import SSHTransport
    from primectl.plan.model import HostPlan

    def plain(h: Any) -> Any:  # its socket keeps paramiko's timeout: its reader wakes every 0.1 s
        return paramiko_client(h, key, kh)

    def primectl(h: Any) -> Any:
        reach = SSHAccess(connection="ssh", port=h.port, user="root", identity_file=key)
        return SSHTransport(HostPlan(name=h.name, address=h.address, workdir="/tmp", gpus=0, access=reach.plain()),
                            known_hosts=kh, accept_new_host_keys=False)

    for label, open_one in (("paramiko as is", plain), ("primectl SSHTransport", primectl)):
        held = [open_one(h) for h in hosts]
        time.sleep(0.3)
        c0 = cpu()
        time.sleep(seconds)
        spent = cpu() - c0
        for c in held:
            c.close()
        print(f"  idle, {label:22}: {spent / len(hosts) / seconds * 1000:6.3f} ms controller CPU per host and second "
              f"held open")


def measure(name: str, hosts: list[Any], key: str, kh: str, one: Callable[..., Any], is_async: bool
            ) -> dict[str, float]:
    n = len(hosts)
    if is_async:
        def seq() -> None:
            async def go() -> None:
                for h in hosts:
                    await one(h, key, kh)
            asyncio.run(go())

        def par() -> None:
            async def go() -> None:
                await asyncio.gather(*(one(h, key, kh) for h in hosts))
            asyncio.run(go())
    else:
        def seq() -> None:
            for h in hosts:
                one(h, key, kh)

        def par() -> None:
            with ThreadPoolExecutor(min(32, n)) as pool:
                list(pool.map(lambda h: one(h, key, kh), hosts))
    out = {}
    for label, fn in (("sequential", seq), ("parallel", par)):
        best_cpu, best_wall = float("inf"), float("inf")
        for _ in range(3):
            c0, t0 = cpu(), time.perf_counter()
            fn()
            best_cpu = min(best_cpu, cpu() - c0)
            best_wall = min(best_wall, time.perf_counter() - t0)
        out[label] = best_cpu / n * 1000
        print(f"  {name:9} {label:10}: {best_cpu / n * 1000:6.2f} ms controller CPU per host "
              f"(wall {best_wall:.2f}s for {n} hosts), best of 3")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=18)
    opts = ap.parse_args()
    problem = netns_problem("unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/ssh_libs.py'")
    if problem:
        print(f"ssh_libs: refusing to start sshd: {problem}", file=sys.stderr)
        return 2
    stop_on_sigterm()
    libs: list[tuple[str, Callable[..., Any], bool]] = [("paramiko", paramiko_one, False), ("fabric", fabric_one, False),
                                                         ("openssh", openssh_one, False),
                                                         ("ssh-x25519", openssh_curve, False),
                                                         ("ssh-mux5", openssh_mux, False)]
    try:
        import asyncssh  # noqa: F401

        libs.append(("asyncssh", asyncssh_one, True))
    except ImportError:
        print("asyncssh is not installed: not measured", file=sys.stderr)
    if libssh2_available():
        libs.append(("libssh2", libssh2_one, False))
    else:
        print("ssh2-python (libssh2) is not installed: not measured", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="primectl-sshlibs-") as tmp:
        cluster = start_hosts(Path(tmp) / "hosts", opts.hosts)
        kh = str(cluster.base / "known_hosts")
        cluster.known_hosts(Path(kh))
        key = str(cluster.client_key)
        print(f"{opts.hosts} sshd hosts; connect + host-key check + key auth + exec `true` + close, per host "
              f"({os.cpu_count()} cores)")
        results = {}
        try:
            for name, one, is_async in libs:
                one(cluster.hosts[0], key, kh) if not is_async else asyncio.run(one(cluster.hosts[0], key, kh))  # warm
                results[name] = measure(name, cluster.hosts, key, kh, one, is_async)
            trips = round_trip_cost(cluster.hosts, key, kh)
            idle_cost(cluster.hosts, key, kh)
        finally:
            kill_leftovers(cluster.base)
            cluster.stop()
    if "asyncssh" in results:
        for label in ("sequential", "parallel"):
            ratio = results["paramiko"][label] / results["asyncssh"][label]
            winner = "asyncssh" if ratio > 1 else "paramiko"
            print(f"paramiko/asyncssh controller CPU per host, {label}: {ratio:.2f}x ({winner} is cheaper)")
    if "libssh2" in results:
        for label in ("sequential", "parallel"):
            print(f"paramiko/libssh2 controller CPU per host, {label}: "
                  f"{results['paramiko'][label] / results['libssh2'][label]:.2f}x")
        print(f"paramiko/libssh2 controller CPU per round trip: {trips['paramiko'] / trips['libssh2']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

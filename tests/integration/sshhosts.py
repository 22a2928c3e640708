"""Real OpenSSH "hosts" on loopback addresses, for the apply-layer integration tests and benchmarks.

Each host is a foreground `sshd -D -e` (`-r` too where it has it) bound to its own address (127.0.0.2,
127.0.0.3, ...) with a throw-away host key, root login with one throw-away
client key, and its own directory for workdirs. Everything is started and
stopped by PID: nothing here ever kills a process by name.

These helpers are meant to run inside a private network namespace with only
loopback (`unshare --net -- sh -c 'ip link set lo up && ...'`), so binding port
22 on 127.0.0.x touches nothing outside; see `isolated_netns`.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

SSHD = "/usr/sbin/sshd"
ALLOW_HOST_NET = "PRIMECTL_ALLOW_HOST_NET"
RUN_HINT = "unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest tests/integration -q'"


# Links this test session made in its own namespace (the nspawn hosts' bridge: nspawnhosts.make_bridge).
SESSION_LINKS: set[str] = set()


def isolated_netns() -> bool:
    """True in a private namespace from `unshare --net`: loopback is the only link, apart from the links this
    test session made there itself (a bridge in SESSION_LINKS and the veths of the containers on it)."""
    return not foreign_links()


def foreign_links() -> list[str]:
    """The network links here other than loopback and those this test session made ([] when isolated)."""
    try:
        out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ["(cannot run `ip -o link`)"]
    foreign = []
    for line in out.splitlines():
        if ":" not in line:
            continue
        name = line.split(":")[1].strip().split("@")[0]
        words = line.split()
        master = words[words.index("master") + 1] if "master" in words else None  # a container's veth on our bridge
        if name != "lo" and name not in SESSION_LINKS and master not in SESSION_LINKS:
            foreign.append(name)
    return foreign


def stop_on_sigterm() -> None:
    """Turn SIGTERM (`timeout`, a CI runner giving up) into SystemExit, so the `finally` that stops the sshd hosts
    runs; by default it ends the process at once and the hosts outlive it."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def netns_problem(run_hint: str = RUN_HINT) -> str | None:
    """Why sshd hosts must not be started here (with how to run `run_hint` instead), or None when it is safe."""
    if os.environ.get(ALLOW_HOST_NET) == "1" or isolated_netns():
        return None
    return ("not in an isolated network namespace (`ip -o link` shows more than `lo`); this starts "
            "sshd and etcd on loopback addresses. Run it as\n  " + run_hint +
            f"\nor set {ALLOW_HOST_NET}=1 to run on the host network anyway")


def keygen(path: Path, comment: str) -> None:
    """A passphrase-less ed25519 key pair at path / path.pub."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


def client_keys(base: Path) -> tuple[Path, Path]:
    """The test client's key under base (made once) and an authorized_keys file holding it, for the hosts."""
    base.mkdir(parents=True, exist_ok=True)
    client_key = base / "client_ed25519"
    if not client_key.exists():
        keygen(client_key, "primectl-tests")
    authorized = base / "authorized_keys"
    shutil.copyfile(f"{client_key}.pub", authorized)
    return client_key, authorized


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (by parent pid), children before grandchildren."""
    kids = _children()
    out: list[int] = []
    todo = list(kids.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += kids.get(p, [])
    return out


def pid_alive(pid: int) -> bool:
    """The pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] not in ("Z", "X")


T = TypeVar("T")


def wait_for(fetch: Callable[[], T], accept: Callable[[T], bool], timeout: float, what: str, interval: float = 0.1) -> T:
    """fetch() until accept(value), within timeout (else an assertion naming `what`); the accepted value."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if accept(value):
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout}s (last: {value!r})"
        time.sleep(interval)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until the pids are gone; the ones still alive after timeout."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in pids if pid_alive(p)]
        if not pids:
            return []
        time.sleep(0.02)
    return [p for p in pids if pid_alive(p)]


def reap(proc: subprocess.Popen[bytes], timeout: float = 5) -> None:
    """Wait for a process primectl's tests started to exit; SIGKILL it (by its pid) after `timeout`."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Signal each pid, ignoring ones already gone."""
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class SSHHost:
    """One sshd standing in for a machine."""

    name: str
    address: str
    port: int
    root: Path
    authorized_keys: Path
    proc: subprocess.Popen[bytes] | None = None
    enter: list[str] = field(default_factory=list)  # argv that runs sshd elsewhere (nsenter into a namespace)
    host_key: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.host_key = self.root / "ssh_host_ed25519_key"
        if not self.host_key.exists():
            keygen(self.host_key, f"{self.name}-host")
        self.config = self.root / "sshd_config"
        self.config.write_text(
            f"ListenAddress {self.address}:{self.port}\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            "PermitRootLogin yes\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            f"AuthorizedKeysFile {self.authorized_keys}\n"
            "Subsystem sftp internal-sftp\n"
            "UseDNS no\n"
            "MaxStartups 200:30:400\n"
            "MaxSessions 50\n"
            "LogLevel ERROR\n"
            # A clean login environment: HOME is this host's own directory, so the control machine's
            # ~/.bashrc (which bash sources for ssh commands) does not leak onto every "host".
            f"SetEnv HOME={self.root}\n"
        )

    @property
    def pid(self) -> int | None:
        """The listening sshd's pid while it runs."""
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def workdir(self, deployment: str) -> Path:
        """This host's workdir for one deployment (each test uses its own)."""
        return self.root / "wd" / deployment

    def known_hosts_line(self) -> str:
        """`address key` as OpenSSH / paramiko read it (bracketed with the port when it is not 22)."""
        kind, b64 = (self.root / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        who = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{who} {kind} {b64}\n"

    def start(self, timeout: float = 10) -> None:
        """Start sshd in the foreground (as our child) and wait until it accepts connections."""
        if self.pid:
            return
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        log = open(self.root / "sshd.log", "ab")
        self.proc = subprocess.Popen([*self.enter, SSHD, *sshd_flags(), "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd for {self.name} exited {self.proc.returncode}: "
                                   f"{(self.root / 'sshd.log').read_text()[-2000:]}")
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex((self.address, self.port)) == 0:
                    return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sshd for {self.name} did not listen on {self.address}:{self.port} within {timeout}s")

    def stop(self) -> None:
        """Stop the listener, by pid; sessions already open stay (like `systemctl stop ssh`)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            reap(self.proc)
        self.proc = None

    def kill_hard(self) -> list[int]:
        """SIGKILL the listener and every process below it (open sessions, shells, agents), by pid.

        Services primectl started have left the tree (new session, reparented), so they survive,
        as they would when a host's sshd dies.
        """
        if self.proc is None:
            return []
        pids = descendants(self.proc.pid)
        kill_pids([self.proc.pid, *pids])
        self.proc.wait(5)
        self.proc = None
        wait_gone(pids, 5)
        return pids


@dataclass
class SSHHosts:
    """N sshd hosts sharing one client key."""

    base: Path
    hosts: list[SSHHost]
    client_key: Path

    def known_hosts(self, path: Path, hosts: Iterable[SSHHost] | None = None) -> Path:
        """Write a known_hosts file for the given hosts (all by default)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(h.known_hosts_line() for h in (self.hosts if hosts is None else hosts)))
        return path

    def start(self) -> None:
        """Start every sshd (already-running ones are left alone)."""
        for h in self.hosts:
            h.start()

    def stop(self) -> None:
        """Stop every sshd by pid."""
        for h in self.hosts:
            h.stop()

    def __enter__(self) -> SSHHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@functools.cache
def sshd_flags() -> list[str]:
    """`-r` where this sshd has it: it then serves each connection in a fork of itself instead of executing
    itself again, which cost each connection ~10 ms of CPU here (25 -> 16 ms). The simulated hosts share the
    machine's two cores with the controller under test, so that was CPU taken from it. OpenSSH 9.8 moved
    per-connection work into a separate sshd-session binary; the flag is passed to older versions only."""
    version = subprocess.run([SSHD, "-V"], capture_output=True, text=True).stderr
    found = re.search(r"OpenSSH_(\d+)\.(\d+)", version)
    return ["-r"] if found and (int(found[1]), int(found[2])) < (9, 8) else []


def start_hosts(base: Path, n: int, *, first_octet: int = 2, port: int | None = None) -> SSHHosts:
    """Create and start n sshd hosts h1..hn on 127.0.0.<first_octet>... under base."""
    if not Path(SSHD).exists():
        raise RuntimeError(f"{SSHD} is missing: run scripts/install-system.sh (apt-get install -y openssh-server)")
    if port is None:
        port = 22 if isolated_netns() else 2222
    client_key, authorized = client_keys(base)
    hosts = [SSHHost(f"h{i + 1}", f"127.0.0.{first_octet + i}", port, base / f"h{i + 1}", authorized)
             for i in range(n)]
    cluster = SSHHosts(base, hosts, client_key)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def processes_under(path: str | Path) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose cwd is path or below it (services run in their workdir)."""
    path = str(Path(path).resolve())
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if (cwd == path or cwd.startswith(path + "/")) and pid_alive(int(entry)):
            out.append((int(entry), cmd))
    return out


def recorded_pids(workdir: str | Path) -> dict[str, int]:
    """service -> pid from a workdir's run/*.pid files ("pid starttime")."""
    out = {}
    run = Path(workdir) / "run"
    if run.is_dir():
        for f in sorted(run.glob("*.pid")):
            try:
                out[f.stem] = int(f.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return out


def kill_leftovers(root: str | Path) -> list[tuple[int, str]]:
    """Safety net: SIGKILL processes recorded in run/*.pid files or running in a workdir under root."""
    root = Path(root)
    victims: dict[int, str] = {}
    for pidfile in root.glob("**/run/*.pid"):
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if pid_alive(pid):
            victims[pid] = str(pidfile)
    for pid, cmd in processes_under(root):
        victims.setdefault(pid, cmd)
    for pid in victims:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    kill_pids(victims)
    wait_gone(victims, 5)
    return sorted(victims.items())

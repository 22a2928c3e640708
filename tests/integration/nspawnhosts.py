"""Test hosts that look like real machines: systemd-nspawn containers with systemd as PID 1.

Each host boots the cached Debian root file system from scripts/make-rootfs.sh through its own
overlay (or a copy of it), with its own hostname, machine-id, ssh host key, network namespace and
address on a bridge in the test's network namespace, sshd taking one throw-away client key for
root, and optional bind mounts (a runtime venv and the Python it links to) so services inside can
run Dynamo/Mooncake without installing anything. They are what `supervisor: systemd` is tested
against: primectl reaches them over SSH like any other host and drives their systemd.

How a host runs (all by pid, never by name):
  unshare --mount --propagation private -- sh -c '<join own cgroup> && mount -t overlay ... ROOT &&
      exec systemd-nspawn -b -D ROOT -M MACHINE --register=no --keep-unit --console=pipe
                          --network-bridge=BRIDGE [--bind-ro=...]'
The overlay lives only in that private mount namespace, so the kernel unmounts it when the host
stops, however it stops. Each nspawn runs in a cgroup of its own
(/sys/fs/cgroup/{systemd,unified}/primectl-nspawn/MACHINE): without one, every container of the
machine would share /payload and /supervisor at the hierarchy root. That cgroup is also the
safety net: after a stop, any process still in it is SIGKILLed and reported.

Addressing (inside the test's network namespace only): the bridge has .1 of the subnet
(10.77.0.1/24 by default) and host i has .(first+i) (10.77.0.2, .3, ...), set by
systemd-networkd inside the host from /etc/systemd/network/10-host0.network, so it comes back
by itself after a reboot. Every host's /etc/hosts names all the hosts.

Run inside a private network namespace: unshare --net -- sh -c 'ip link set lo up && exec ...'.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .sshhosts import SESSION_LINKS, client_keys, isolated_netns, keygen, pid_alive, wait_gone

REPO = Path(__file__).resolve().parents[2]
MAKE_ROOTFS = REPO / "scripts" / "make-rootfs.sh"
NSPAWN = "/usr/bin/systemd-nspawn"
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))
CGROUP_PARENT = "primectl-nspawn"
EXIT_REBOOT = 133  # systemd-nspawn's exit status when the container asked for a reboot
RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest "
            "tests/integration/test_nspawn_hosts.py -q'")
Layer = Literal["overlay", "copy", "auto"]


@dataclass(frozen=True)
class BindMount:
    """A host path made visible inside every container (same path inside unless target is given)."""

    source: Path
    target: Path | None = None
    read_only: bool = True

    def nspawn_arg(self) -> str:
        """The --bind/--bind-ro argument systemd-nspawn takes."""
        flag = "--bind-ro" if self.read_only else "--bind"
        target = self.target or self.source
        return f"{flag}={self.source}:{target}"


def runtime_binds(venv: Path) -> list[BindMount]:
    """Read-only binds for a venv and the interpreter it was made from (pyvenv.cfg's `home`), e.g. /work/main/.runtime."""
    binds = [BindMount(venv)]
    cfg = venv / "pyvenv.cfg"
    home = next((line.split("=", 1)[1].strip() for line in cfg.read_text().splitlines()
                 if line.split("=", 1)[0].strip() == "home"), None) if cfg.exists() else None
    if home:
        prefix = Path(home).resolve().parent  # .../versions/3.11.7 (bin/, lib/ below it)
        binds.append(BindMount(prefix))
    return binds


def build_rootfs(cache_dir: Path | None = None, timeout: float = 900, *, build: bool = True) -> Path:
    """The cached root file system from scripts/make-rootfs.sh (built first when missing and build; 0.1 s when cached).

    Building downloads from the Debian mirror, which a test's private network namespace cannot reach:
    build it before entering one (`make rootfs`, or scripts/make-rootfs.sh).
    """
    argv = ["bash", str(MAKE_ROOTFS), *(["--cache-dir", str(cache_dir)] if cache_dir else [])]
    if not build:
        argv.append("--check")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        hint = "" if build else " (run `make rootfs` or scripts/make-rootfs.sh outside the test's network namespace)"
        raise RuntimeError(f"make-rootfs.sh failed ({r.returncode}){hint}:\n{r.stderr[-3000:]}")
    return Path(r.stdout.strip().splitlines()[-1])


def nspawn_problem() -> str | None:
    """Why nspawn hosts cannot be started here (with what to do), or None."""
    if not isolated_netns():  # no override: the bridge and 10.77.0.x must never appear on a real network
        return ("not in an isolated network namespace (`ip -o link` shows more than `lo`); nspawn hosts add a "
                f"bridge and private addresses. Run it as\n  {RUN_HINT}")
    if os.geteuid() != 0:
        return "nspawn hosts need root"
    missing = [p for p in (NSPAWN, "/usr/sbin/debootstrap", "/usr/bin/nsenter", "/usr/bin/ssh-keygen") if not os.path.exists(p)]
    if missing:
        return f"missing {', '.join(missing)}: run scripts/install-system.sh (systemd-container, debootstrap)"
    if not all(r.is_dir() for r in CGROUP_ROOTS):
        return f"expected the hybrid cgroup layout ({', '.join(map(str, CGROUP_ROOTS))})"
    return None


def _ns_pid1(nspawn_pid: int) -> int | None:
    """The container's PID 1 as the host sees it: the descendant of nspawn that is pid 1 in its own pid namespace."""
    todo = [nspawn_pid]
    while todo:
        pid = todo.pop(0)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                status = Path(f"/proc/{child}/status").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if len(nspid) > 1 and nspid[-1] == "1":
                return child
            todo.append(child)
    return None


def _cgroup_dirs(machine: str) -> list[Path]:
    return [root / CGROUP_PARENT / machine for root in CGROUP_ROOTS]


def cgroup_pids(machine: str) -> list[int]:
    """Every process in a host's cgroups (nspawn, the container's systemd and everything it started)."""
    pids: set[int] = set()
    for top in _cgroup_dirs(machine):
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            try:
                pids |= {int(p) for p in procs.read_text().split()}
            except OSError:
                continue
    return sorted(pids)


def _remove_cgroups(machine: str) -> list[str]:
    """rmdir a host's cgroup trees bottom-up (and the shared parent when it is empty); what could not go."""
    stuck = []
    for top in _cgroup_dirs(machine):
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [top]:
            try:
                d.rmdir()
            except OSError as exc:
                stuck.append(f"{d}: {exc.strerror}")
        try:
            top.parent.rmdir()  # other runs' hosts may still use it: then it stays
        except OSError:
            pass
    return stuck


def remove_stale_cgroups(min_age_s: float = 120) -> list[str]:
    """Remove empty host cgroups (of any run) older than min_age_s: what a test process killed mid-run left."""
    removed = []
    for root in CGROUP_ROOTS:
        parent = root / CGROUP_PARENT
        if not parent.is_dir():
            continue
        for top in parent.iterdir():
            if not top.is_dir() or time.time() - top.stat().st_mtime < min_age_s:
                continue
            if any(procs.read_text().strip() for procs in top.rglob("cgroup.procs")):
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [top]:
                try:
                    d.rmdir()
                except OSError:
                    break
            else:
                removed.append(str(top))
        try:
            parent.rmdir()
        except OSError:
            pass
    return removed


def _mkdirs_like(lower: Path, upper: Path, rel: str) -> Path:
    """Create upper/rel with each component's mode and owner taken from lower/rel.

    An overlay shows an upper directory's own attributes, so an upper `root/` made with the
    default 0755 would turn the merged /root from 0700 into 0755 (and sshd's StrictModes cares).
    """
    path_lower, path_upper = lower, upper
    for part in Path(rel).parts:
        path_lower, path_upper = path_lower / part, path_upper / part
        if not path_upper.exists():
            path_upper.mkdir()
            if path_lower.is_dir():
                st = path_lower.stat()
                os.chown(path_upper, st.st_uid, st.st_gid)
                os.chmod(path_upper, st.st_mode & 0o7777)
    return path_upper


@dataclass
class NspawnHost:
    """One container standing in for a machine (a GPU tray): its own systemd, sshd, hostname and address."""

    name: str
    address: str
    prefix_len: int
    dir: Path
    rootfs: Path
    machine: str
    bridge: str
    authorized_keys: Path
    binds: Sequence[BindMount] = ()
    layer: Layer = "auto"
    etc_hosts: str = ""
    port: int = 22
    workdir_base: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    boots: int = 0
    last_exit: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    used_layer: str = ""
    _boot_t0: float = 0.0

    # -- where things are ---------------------------------------------------------------------------
    @property
    def upper(self) -> Path:
        """The host's own layer: the overlay's upper dir (changes only) or the whole copied root."""
        return self.dir / ("upper" if self.used_layer == "overlay" else "root")

    @property
    def host_key(self) -> Path:
        """The host's throw-away ssh host key (private; `.pub` beside it), also copied into its /etc/ssh."""
        return self.dir / "ssh_host_ed25519_key"

    @property
    def pid(self) -> int | None:
        """systemd-nspawn's pid while it runs."""
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    @property
    def init_pid(self) -> int | None:
        """The container's PID 1 (its systemd) as seen from here, while it runs."""
        return _ns_pid1(self.pid) if self.pid else None

    def path(self, inside: str | os.PathLike[str]) -> Path:
        """A path inside the host, as a path here: through /proc/PID1/root while it runs, else in its own layer
        (for an overlay that holds only what the host changed; the rest is in rootfs)."""
        rel = str(inside).lstrip("/")
        init = self.init_pid
        return Path(f"/proc/{init}/root") / rel if init else self.upper / rel

    @property
    def workdir_root(self) -> Path:
        """Where this host's workdirs live: by default DIR/wd, bind-mounted read-write at the same path inside,
        so a workdir path means the same file here and on the host (as with sshhosts.SSHHost); else
        workdir_base, a directory of the host's own file system (reach it here through `path()`).
        """
        return self.dir / "wd" if self.workdir_base is None else Path(self.workdir_base)

    def workdir(self, deployment: str) -> Path:
        """This host's workdir for one deployment (what a recipe names)."""
        return self.workdir_root / deployment

    def known_hosts_line(self) -> str:
        """`address key` as OpenSSH / paramiko read it."""
        kind, b64 = Path(f"{self.host_key}.pub").read_text().split()[:2]
        who = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{who} {kind} {b64}\n"

    # -- first boot: the machine's identity ------------------------------------------------------------
    def _prepare(self) -> None:
        """Create the host's layer once (identity files); later boots reuse it as it was left."""
        self.dir.mkdir(parents=True, exist_ok=True)
        marker = self.dir / "layer"
        if marker.exists():
            self.used_layer = marker.read_text().strip()
            return
        t0 = time.monotonic()
        self.used_layer = self._make_layer()
        root = self.upper
        keygen(self.host_key, f"{self.name}-host")
        files: dict[str, tuple[str | bytes, int]] = {
            "etc/hostname": (f"{self.name}\n", 0o644),
            "etc/machine-id": (uuid.uuid4().hex + "\n", 0o444),
            "etc/hosts": (f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{self.etc_hosts}", 0o644),
            "etc/ssh/ssh_host_ed25519_key": (self.host_key.read_bytes(), 0o600),
            "etc/ssh/ssh_host_ed25519_key.pub": (Path(f"{self.host_key}.pub").read_bytes(), 0o644),
            "root/.ssh/authorized_keys": (self.authorized_keys.read_bytes(), 0o600),
            "etc/systemd/network/10-host0.network": (
                "[Match]\nName=host0\n\n[Network]\n"
                f"Address={self.address}/{self.prefix_len}\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n", 0o644),
        }
        for rel, (content, mode) in files.items():
            parent = _mkdirs_like(self.rootfs, root, str(Path(rel).parent))
            if rel.startswith("root/.ssh"):
                os.chmod(parent, 0o700)
            target = root / rel
            data = content.encode() if isinstance(content, str) else content
            target.write_bytes(data)
            os.chmod(target, mode)
        if self.workdir_base is None:
            self.workdir_root.mkdir(exist_ok=True)
        else:
            _mkdirs_like(self.rootfs, root, self.workdir_base.lstrip("/"))
        marker.write_text(self.used_layer + "\n")
        self.timings["prepare_s"] = time.monotonic() - t0

    def _make_layer(self) -> str:
        if self.layer in ("overlay", "auto"):
            (self.dir / "upper").mkdir(exist_ok=True)
            (self.dir / "work").mkdir(exist_ok=True)
            (self.dir / "root").mkdir(exist_ok=True)
            probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "mount", "-t", "overlay",
                                    "overlay", "-o", self._overlay_opts(), str(self.dir / "root")],
                                   capture_output=True, text=True)
            if probe.returncode == 0:
                return "overlay"
            if self.layer == "overlay":
                raise RuntimeError(f"overlay mount failed for {self.name}: {probe.stderr.strip()}")
            shutil.rmtree(self.dir / "upper")
            shutil.rmtree(self.dir / "work")
            (self.dir / "root").rmdir()
        subprocess.run(["cp", "-a", "--reflink=auto", str(self.rootfs), str(self.dir / "root")], check=True)
        return "copy"

    def _overlay_opts(self) -> str:
        return f"lowerdir={self.rootfs},upperdir={self.dir / 'upper'},workdir={self.dir / 'work'}"

    # -- power -------------------------------------------------------------------------------------------
    def _argv(self) -> list[str]:
        root = self.dir / "root"
        join_cgroups = " && ".join(f"mkdir -p {d} && echo $$ > {d}/cgroup.procs" for d in _cgroup_dirs(self.machine))
        mount = f"mount -t overlay overlay -o {self._overlay_opts()} {root} && " if self.used_layer == "overlay" else ""
        nspawn = [NSPAWN, "-b", "-D", str(root), "-M", self.machine, f"--hostname={self.name}", "--register=no",
                  "--keep-unit", "--console=pipe", f"--network-bridge={self.bridge}",
                  *(b.nspawn_arg() for b in self.binds),
                  *([BindMount(self.workdir_root, read_only=False).nspawn_arg()] if self.workdir_base is None else [])]
        script = f"{join_cgroups} && {mount}exec {' '.join(nspawn)}"
        # --pdeathsig: should the test process die, nspawn gets SIGTERM and the host halts cleanly.
        return ["setpriv", "--pdeathsig", "TERM", "--", "unshare", "--mount", "--propagation", "private", "--",
                "sh", "-c", script]

    def start(self) -> None:
        """Power on (boot systemd in the background); `wait_running` waits for it."""
        if self.pid:
            return
        self._prepare()
        self.boots += 1
        console = open(self.dir / "console.log", "ab")
        console.write(f"--- boot {self.boots} ---\n".encode())
        console.flush()
        self._boot_t0 = time.monotonic()
        self.proc = subprocess.Popen(self._argv(), stdin=subprocess.DEVNULL, stdout=console, stderr=console,
                                     start_new_session=True)
        console.close()

    def wait_running(self, timeout: float = 60) -> float:
        """Wait until `systemctl is-system-running` says running and sshd accepts on the address; seconds since start."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = self.proc.returncode if self.proc else None
                raise RuntimeError(f"{self.name}: systemd-nspawn exited {code} while booting:\n{self.console_tail()}")
            init = self.init_pid  # read once: while systemd starts, PID 1 can be absent for a moment
            if init:
                state = self._nsenter(init, ("systemctl", "is-system-running"), timeout=10).stdout.strip()
                if state == "running" and self._ssh_open():
                    elapsed = time.monotonic() - self._boot_t0
                    self.timings.setdefault("boot_s", elapsed)
                    self.timings["last_boot_s"] = elapsed
                    return elapsed
                if state == "degraded":
                    failed = self.run("systemctl", "--failed", "--no-legend", "--plain", check=False).stdout
                    raise RuntimeError(f"{self.name} booted degraded; failed units:\n{failed}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not running within {timeout}s (state {state!r}):\n{self.console_tail()}")

    def _ssh_open(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((self.address, self.port)) == 0

    def boot(self, timeout: float = 60) -> float:
        """start + wait_running; seconds to running."""
        self.start()
        return self.wait_running(timeout)

    def _wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.last_exit = code
        return code

    def _after_exit(self) -> list[tuple[int, str]]:
        """Safety net once nspawn is gone: SIGKILL anything left in the host's cgroups, remove them."""
        self.proc = None
        left = []
        for pid in cgroup_pids(self.machine):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            left.append((pid, cmd))
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_gone([p for p, _ in left], 5)
        _remove_cgroups(self.machine)
        propagate = Path("/run/systemd/nspawn/propagate") / self.machine
        try:
            propagate.rmdir()
        except OSError:
            pass
        return left

    def stop(self, timeout: float = 30, *, signalled: bool = False) -> list[tuple[int, str]]:
        """Clean shutdown: SIGTERM to nspawn (the container halts), SIGKILL after timeout; leftovers killed by the net.

        signalled: SIGTERM was already sent (a second SIGTERM would make nspawn kill the container at once).
        """
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            t0 = time.monotonic()
            if not signalled:
                self.proc.send_signal(signal.SIGTERM)
            if self._wait_exit(timeout) is None:
                self.timings["last_stop_s"] = time.monotonic() - t0
                return self.power_cut()
            self.timings["last_stop_s"] = time.monotonic() - t0
        else:
            self.last_exit = self.proc.returncode
        return self._after_exit()

    def power_cut(self) -> list[tuple[int, str]]:
        """Hard power-off: SIGKILL the container's PID 1 (the kernel then kills its whole pid namespace) and nspawn.

        SIGKILL to systemd-nspawn alone is no power-off: the container's systemd and every service
        keep running, reparented (measured); only the cgroup safety net would find them.
        """
        if self.proc is None:
            return []
        init = self.init_pid
        if init:
            os.kill(init, signal.SIGKILL)
            self._wait_exit(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self._wait_exit(10)
        return self._after_exit()

    def reboot(self, timeout: float = 60, request: Callable[[], object] | None = None) -> float:
        """Reboot: `systemctl reboot` inside (or `request()`, e.g. the same over SSH); nspawn exits 133; boot
        again on the same layer, so what is on disk survives. Seconds until running again.
        """
        assert self.proc is not None and self.pid, f"{self.name} is not running"
        t0 = time.monotonic()
        if request is None:
            self.run("systemctl", "reboot", check=False)
        else:
            request()
        code = self._wait_exit(timeout)
        if code != EXIT_REBOOT:
            raise RuntimeError(f"{self.name}: systemd-nspawn exited {code} after `systemctl reboot`, not {EXIT_REBOOT}")
        left = self._after_exit()
        if left:
            raise RuntimeError(f"{self.name}: processes survived the reboot: {left}")
        self.start()
        self.wait_running(timeout)
        elapsed = time.monotonic() - t0
        self.timings["last_reboot_s"] = elapsed
        return elapsed

    # -- commands inside (not over SSH: for the test's own checks) -----------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 30, input: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run a command inside the host (nsenter into all of PID 1's namespaces)."""
        init = self.init_pid
        if not init:
            raise RuntimeError(f"{self.name} is not running")
        r = self._nsenter(init, argv, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    @staticmethod
    def _nsenter(init: int, argv: tuple[str, ...], *, timeout: float, input: str | None = None
                 ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["nsenter", "-t", str(init), "-a", "--", *argv], capture_output=True, text=True,
                              timeout=timeout, input=input)

    def console_tail(self, chars: int = 3000) -> str:
        """The end of nspawn's console output (nspawn's own messages and the container's boot)."""
        try:
            return (self.dir / "console.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class NspawnHosts:
    """N container hosts on one bridge, sharing one client key."""

    base: Path
    hosts: list[NspawnHost]
    client_key: Path
    bridge: str
    bridge_address: str
    timings: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, name: str) -> NspawnHost:
        return next(h for h in self.hosts if h.name == name)

    def known_hosts(self, path: Path, hosts: Iterable[NspawnHost] | None = None) -> Path:
        """Write a known_hosts file for the given hosts (all by default)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(h.known_hosts_line() for h in (self.hosts if hosts is None else hosts)))
        return path

    def start(self, timeout: float = 90) -> float:
        """Power on every host that is off, all at once, and wait until all run; seconds it took."""
        t0 = time.monotonic()
        for h in self.hosts:
            h.start()
        for h in self.hosts:
            h.wait_running(timeout)
        return time.monotonic() - t0

    def stop(self) -> list[tuple[int, str]]:
        """Shut every host down (SIGTERM to each nspawn at once, then wait); what the safety net had to kill."""
        t0 = time.monotonic()
        running = {h.name for h in self.hosts if h.pid}
        for h in self.hosts:
            if h.proc is not None and h.name in running:
                h.proc.send_signal(signal.SIGTERM)
        left = []
        for h in self.hosts:
            left += h.stop(signalled=h.name in running)
        self.timings["stop_s"] = time.monotonic() - t0
        return left

    def close(self) -> list[tuple[int, str]]:
        """Stop every host and remove the bridge; everything the safety net found still running."""
        left = self.stop()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        SESSION_LINKS.discard(self.bridge)
        return left

    def __enter__(self) -> NspawnHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_bridge(name: str, address: str, prefix_len: int) -> None:
    """A Linux bridge with address/prefix_len in the current network namespace (the test's own)."""
    subprocess.run(["ip", "link", "del", name], capture_output=True)
    for argv in (["ip", "link", "add", name, "type", "bridge"],
                 ["ip", "addr", "add", f"{address}/{prefix_len}", "dev", name],
                 ["ip", "link", "set", name, "up"]):
        subprocess.run(argv, check=True, capture_output=True)
    SESSION_LINKS.add(name)


def start_nspawn_hosts(base: Path, n: int, *, rootfs: Path | None = None, subnet: str = "10.77.0", first: int = 2,
                       prefix_len: int = 24, bridge: str = "pmbr0", binds: Sequence[BindMount] = (),
                       layer: Layer = "auto", workdir_base: str | None = None, boot_timeout: float = 90
                       ) -> NspawnHosts:
    """Create and boot n hosts h1..hn at SUBNET.first, .first+1, ... (bridge at SUBNET.1) under base.

    rootfs defaults to scripts/make-rootfs.sh's cached tree (built when missing). workdir_base None:
    each host's workdirs are base/hN/wd, bound read-write at the same path inside. Machine names
    carry a per-run token so concurrent runs never share nspawn's per-machine state on the host.
    """
    problem = nspawn_problem()
    if problem:
        raise RuntimeError(problem)
    remove_stale_cgroups()
    t0 = time.monotonic()
    rootfs = rootfs or build_rootfs(build=not isolated_netns())  # no mirror to download from in a private netns
    t_rootfs = time.monotonic() - t0
    client_key, authorized = client_keys(base)
    token = uuid.uuid4().hex[:6]
    names = [f"h{i + 1}" for i in range(n)]
    addresses = [f"{subnet}.{first + i}" for i in range(n)]
    etc_hosts = "".join(f"{a}\t{nm}\n" for nm, a in zip(names, addresses, strict=True))
    bridge_address = f"{subnet}.1"
    make_bridge(bridge, bridge_address, prefix_len)
    hosts = [NspawnHost(nm, a, prefix_len, base / nm, rootfs, f"{nm}-{token}", bridge, authorized, binds=binds,
                        layer=layer, etc_hosts=etc_hosts, workdir_base=workdir_base)
             for nm, a in zip(names, addresses, strict=True)]
    cluster = NspawnHosts(base, hosts, client_key, bridge, bridge_address, {"rootfs_s": t_rootfs})
    try:
        cluster.timings["boot_all_s"] = cluster.start(boot_timeout)
    except BaseException:
        cluster.close()
        raise
    return cluster


def leftover_container_processes(hosts: Iterable[NspawnHost]) -> dict[str, list[int]]:
    """Processes still in any host's cgroups or still below a host's nspawn (should be empty after close)."""
    out: dict[str, list[int]] = {}
    for h in hosts:
        pids = [p for p in cgroup_pids(h.machine) if pid_alive(p)]
        if pids:
            out[h.name] = pids
    return out

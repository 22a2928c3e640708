"""`provision` and `doctor`: the host runtime venv with pinned versions, and drift checks.

Each host gets `<workdir>/runtime/<runtime_key>/`, a venv named by the hash of
the pinned version set, installed from the lock file with the project's
install script. An existing venv whose stamp matches the lock is reused.
While a host installs, its packages and MB so far show on stderr (pip's log
in the staging directory and the venv's site-packages, read every few seconds).

`install_runtime` is the one routine for every target: it is given an
`InstallSite`, what differs (SSH: a host's transport; Slurm: the shared
filesystem, and srun on one node).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from primectl.deploy.cluster import Cluster
from primectl.deploy.fanout import parallel
from primectl.deploy.progress import InstallDisplay
from primectl.errors import DeployError
from primectl.plan.layout import Layout
from primectl.plan.model import Plan, Runtime

INSTALL_TIMEOUT_S = 1800
INSTALL_POLL_S = 3.0  # how often a host's install progress is read
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[^\]]*\])?\s*==")
RUNTIME_STAMP = ".primectl-runtime.stamp"  # install-runtime.sh writes the lock's sha256 there when it is done
# System libraries a role needs, by the shared object the loader must find.
SYSTEM_NEEDS = {"mooncake-master": [("libibverbs.so.1", "libibverbs1")], "etcd": [("/usr/bin/etcd", "etcd-server")]}


def scripts_dir() -> Path:
    """The install script and lock: shipped in the wheel as primectl/runtime, top-level scripts/ in a checkout."""
    packaged = Path(__file__).resolve().parent.parent / "runtime"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "scripts"


def lock_file(runtime: Runtime) -> Path:
    """The pinned requirement set a runtime is installed from (named by the engine's runtime flavour)."""
    return scripts_dir() / runtime.lock


def lock_packages(lock_bytes: bytes) -> int:
    """How many packages a lock pins (`name==version` lines; comments and hash continuations are not)."""
    return sum(1 for line in lock_bytes.decode().splitlines() if PIN.match(line))


def installed(stamp_text: str, lock_bytes: bytes) -> bool:
    """Whether a runtime's stamp says it was installed from exactly this lock."""
    return stamp_text.split()[:1] == [hashlib.sha256(lock_bytes).hexdigest()]


@dataclass(frozen=True)
class HostRuntime:
    """What provision found or did on one host."""

    host: str
    venv: str
    action: str
    freeze: str


def _check_system(cluster: Cluster, host: str) -> list[str]:
    missing = []
    for svc in cluster.plan.services_on(host):
        for obj, package in SYSTEM_NEEDS.get(svc.component, []):
            test = f"test -x {shlex.quote(obj)}" if obj.startswith("/") else f"ldconfig -p | grep -q {shlex.quote(obj)}"
            code, _, _ = cluster.client(host).transport.run(test)
            if code != 0:
                missing.append(f"{package} (for {svc.name}: {obj} not found)")
    return missing


@dataclass(frozen=True)
class Install:
    """One runtime install as a site runs it: `env`, then `argv` (the install script, the venv, the flavour's flags)."""

    runtime: Runtime
    stage: str  # <venv>.install: the script, the lock and the install's log
    argv: list[str]
    env: dict[str, str]
    packages: int  # how many the lock pins


class InstallSite(Protocol):
    """Where one runtime venv is created: what provisioning over SSH and on a Slurm cluster differ in."""

    label: str  # names the machine in messages ("h2: "), "" where one runtime serves every node
    where: str  # appended to "installing runtime ...": how the install runs, where that is not obvious
    wheelhouse: str  # the directory wheels are staged in for the install to find (PIP_FIND_LINKS)

    def read(self, path: str) -> str | None:
        """A file's text; None when it is absent."""
        ...

    def mkdir(self, path: str) -> None:
        """Create a directory (and its parents)."""
        ...

    def names(self, directory: str) -> set[str]:
        """The names in a directory, created when missing."""
        ...

    def put(self, src: Path, path: str, mode: int) -> None:
        """Copy a file of this machine there."""
        ...

    def say(self, text: str) -> None:
        """Tell the operator."""
        ...

    def install(self, job: Install) -> tuple[int, str]:
        """Run the install; its exit status and the end of its output."""
        ...


def install_runtime(site: InstallSite, rt: Runtime, wheelhouse: Path | None) -> str:
    """Create or reuse one runtime venv: "reused" when its stamp says it was installed from this lock, else
    stage the install script and lock beside it (and the wheels the site lacks), run it: "installed"."""
    lock = lock_file(rt)
    lock_bytes = lock.read_bytes()
    if installed(site.read(posixpath.join(rt.dir, RUNTIME_STAMP)) or "", lock_bytes):
        return "reused"
    stage = rt.dir + ".install"
    script = posixpath.join(stage, "install-runtime.sh")
    site.mkdir(stage)
    site.put(scripts_dir() / "install-runtime.sh", script, 0o755)
    site.put(lock, posixpath.join(stage, lock.name), 0o644)
    env: dict[str, str] = {}
    if wheelhouse is not None:
        present = site.names(site.wheelhouse)
        for wheel in sorted(wheelhouse.glob("*.whl")):
            if wheel.name not in present:
                site.put(wheel, posixpath.join(site.wheelhouse, wheel.name), 0o644)
        env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": site.wheelhouse}
    packages = lock_packages(lock_bytes)
    site.say(f"{site.label}installing runtime {rt.key} ({rt.flavour}, lock {lock.name}, {packages} packages){site.where}")
    # install-runtime.sh's flags for the engine's flavour come with the runtime
    code, out = site.install(Install(rt, stage, ["bash", script, rt.dir, *rt.install_flags], env, packages))
    if code != 0:
        raise DeployError(f"{site.label}runtime install failed (exit {code}):\n{out[-3000:]}")
    return "installed"


class _Host:
    """A host's runtime over its transport (SSH or local); pip's progress shows while it installs."""

    where = ""

    def __init__(self, cluster: Cluster, host: str, display: InstallDisplay, say: Callable[[str], None]):
        self.cluster, self.host, self.display, self.said = cluster, host, display, say
        self.t = cluster.client(host).transport
        self.label = f"{host}: "
        self.wheelhouse = Layout(cluster.plan.host(host).workdir).path("wheelhouse")

    def read(self, path: str) -> str | None:
        code, out, _ = self.t.run(f"cat {shlex.quote(path)} 2>/dev/null")
        return out if code == 0 else None

    def mkdir(self, path: str) -> None:
        self.t.run(f"mkdir -p {shlex.quote(path)}")

    def names(self, directory: str) -> set[str]:
        _, have, _ = self.t.run(f"mkdir -p {shlex.quote(directory)} && ls {shlex.quote(directory)}")
        return set(have.split())

    def put(self, src: Path, path: str, mode: int) -> None:
        self.t.put(src.read_bytes(), path, mode)

    def say(self, text: str) -> None:
        self.display.above(self.said, text)

    def install(self, job: Install) -> tuple[int, str]:
        log = shlex.quote(posixpath.join(job.stage, "install.log"))  # pip's output, read by the progress watcher
        env = "".join(f"{k}={shlex.quote(v)} " for k, v in job.env.items())
        command = f"{env}PIP_LOG_PACKAGES=1 {shlex.join(job.argv)} >{log} 2>&1; rc=$?; tail -c 3000 {log}; exit $rc"
        self.display.begin(self.host, job.runtime.key, job.packages)
        with _watch(self.cluster, self.host, job.runtime.dir, posixpath.join(job.stage, "install.log"), self.display):
            code, out, err = self.t.run(command, timeout=INSTALL_TIMEOUT_S)
        return code, out + err


def provision(cluster: Cluster, *, wheelhouse: Path | None = None, say: Callable[[str], None] = print) -> list[HostRuntime]:
    """Create or reuse each host's runtime venv; fail naming missing system packages."""
    plan = cluster.plan

    def one(host: str) -> HostRuntime:
        missing = _check_system(cluster, host)
        if missing:
            raise DeployError(f"{host}: missing system packages: {', '.join(missing)}; "
                              "install them (e.g. scripts/install-system.sh) and retry")
        venv = plan.serving.runtime[host].dir
        action = install_runtime(_Host(cluster, host, display, say), plan.serving.runtime[host], wheelhouse)
        return HostRuntime(host, venv, action, installed_packages(cluster, host, venv))

    with InstallDisplay() as display:
        results = parallel(one, sorted(h for h in plan.deployed_hosts() if plan.serving.runtime[h].provisioned))
    errors = [str(r) for r in results.values() if isinstance(r, BaseException)]
    if errors:
        raise DeployError("provision failed:\n  " + "\n  ".join(errors))
    out = [r for r in results.values() if isinstance(r, HostRuntime)]
    for r in out:
        say(f"{r.host}: runtime {r.action} at {r.venv}")
    return out


class _watch:
    """While a host installs: read its progress every INSTALL_POLL_S into the display (a failed read is skipped)."""

    def __init__(self, cluster: Cluster, host: str, venv: str, log: str, display: InstallDisplay):
        self.args = (cluster, host, venv, log, display)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"install-progress-{host}", daemon=True)

    def _run(self) -> None:
        cluster, host, venv, log, display = self.args
        while not self.stop.wait(INSTALL_POLL_S):
            try:
                display.update(host, cluster.client(host).install_progress(venv, log))
            except Exception:  # progress is a courtesy: the install goes on without it
                pass

    def __enter__(self) -> _watch:
        if self.args[4].mode != "off":
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        self.args[4].done(self.args[1])


def installed_packages(cluster: Cluster, host: str, venv: str, *, python: str | None = None) -> str:
    """`pip freeze` of a host's runtime: recorded at install, or asked of a user-managed interpreter."""
    if python:
        _, out, _ = cluster.client(host).transport.run(f"{shlex.quote(python)} -m pip freeze --all 2>/dev/null")
        return out
    _, out, _ = cluster.client(host).transport.run(f"cat {shlex.quote(posixpath.join(venv, 'pip-freeze.txt'))} 2>/dev/null")
    return out


def drift(plan: Plan, freeze: str) -> dict[str, tuple[str, str | None]]:
    """Pinned package -> (pinned version, installed version or None) for every mismatch."""
    installed = {}
    for line in freeze.splitlines():
        name, sep, version = line.partition("==")
        if sep:
            installed[name.strip().lower().replace("_", "-")] = version.strip()
    out: dict[str, tuple[str, str | None]] = {}
    for name, pin in plan.pins.items():
        key = name.lower()
        candidates = [key] if key in installed else sorted(k for k in installed if k.startswith(key + "-"))
        have = installed[candidates[0]] if candidates else None
        if have != pin:
            out[name] = (pin, have)
    return out


def doctor(cluster: Cluster) -> tuple[list[str], int]:
    """Per host, installed runtime versions against the pins: report lines and how many hosts drifted."""
    plan = cluster.plan
    lines: list[str] = []
    bad = 0
    for h in sorted(cluster.clients):
        rt = plan.serving.runtime[h]
        freeze = installed_packages(cluster, h, rt.dir, python=None if rt.provisioned else rt.python)
        if not freeze:
            lines.append(f"{h}: no runtime at {rt.dir if rt.provisioned else rt.python} (run `primectl provision`)")
            bad += 1
            continue
        d = drift(plan, freeze)
        for name, (pin, have) in sorted(d.items()):
            lines.append(f"{h}: {name} pinned {pin}, installed {have or 'missing'}")
        if not d:
            lines.append(f"{h}: ok ({len(plan.pins)} pins match)")
        bad += bool(d)
    return lines, bad

"""Fixtures for the real-SSH apply tests: three sshd hosts for the session, one deployment per test.

Everything here is real except the engine runtime: OpenSSH servers on 127.0.0.2-4,
the real /usr/bin/etcd started by primectl, real processes. Dynamo components are
replaced by tests/fakes/fake_python (instantly-ready HTTP servers) so the apply
mechanics can be exercised in seconds; tests relying on it say `fake_engine`.

The suite must run in a private network namespace with only loopback:

    unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest tests/integration -q -x'

Outside one, every test fails with that hint (PRIMECTL_ALLOW_HOST_NET=1 overrides).
PRIMECTL_TEST_TIMING=1 (with -s) prints how long each primectl command took.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from primectl.plan.model import HostPlan

from tests import cliproc

from . import slurmcluster
from .nspawnhosts import (
    BindMount,
    NspawnHosts,
    cgroup_pids,
    leftover_container_processes,
    nspawn_problem,
    runtime_binds,
    start_nspawn_hosts,
)
from .sshhosts import (
    SSHHost,
    SSHHosts,
    kill_leftovers,
    netns_problem,
    pid_alive,
    processes_under,
    recorded_pids,
    start_hosts,
)

REPO = Path(__file__).resolve().parents[2]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
FAKE_PYTHON = str(REPO / "tests" / "fakes" / "fake_python")
ETCD = "/usr/bin/etcd"
# The Dynamo/Mooncake runtime venv bound read-only into the nspawn hosts (and the Python it was made from).
NSPAWN_RUNTIME_ENV = "PRIMECTL_NSPAWN_RUNTIME"
# Where each service of the test recipe runs.
LAYOUT = {"h1": {"etcd", "frontend", "balancer"}, "h2": {"prefill-0"}, "h3": {"decode-0", "decode-1"}}
_counter = iter(range(1, 10_000))


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """base updated with over, recursively for dicts (None deletes a key)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def ports_for(index: int) -> tuple[int, dict[str, int]]:
    """A frontend port and port bases of their own for deployment number `index` (100 ports each)."""
    base = 10_000 + 100 * index
    return base, {
        "response_stream": base + 4, "etcd_client": base + 2, "etcd_peer": base + 3, "frontend_replica": base + 80,
        "worker_system": base + 10, "tcp_rpc": base + 20, "bootstrap": base + 30, "kv_events": base + 40,
    }


def base_recipe(name: str, hosts: list[SSHHost], client_key: Path, known_hosts: Path, index: int) -> dict[str, Any]:
    """The test recipe: etcd + frontend on h1, prefill on h2, two decode workers on h3, fake engine runtime."""
    fe_port, ports = ports_for(index)
    return {
        "name": name,
        "model": {"served_name": "demo", "generate": "demo-tiny", "arch": "demo-tiny", "max_context": 4096},
        "hardware": {"profile": "cpu"},
        "hosts": [{"name": h.name, "address": h.address, "port": h.port, "user": "root",
                   "identity_file": str(client_key), "workdir": str(h.workdir(name))} for h in hosts],
        "engine": "mocker",
        "supervisor": "process",
        "frontend": {"host": "h1", "port": fe_port},
        "prefill": {"groups": 1, "parallel": "TP1", "hosts": ["h2"], "startup_timeout_s": 20},
        "decode": {"workers": 2, "parallel": "TP1", "hosts": ["h3"], "startup_timeout_s": 20},
        "control_plane": {"discovery": "etcd"},
        "software": {"python": FAKE_PYTHON},
        "ports": ports,
        "known_hosts": str(known_hosts),
    }


class Deployment:
    """One test's deployment: its own name, workdirs, ports, recipe file and known_hosts."""

    def __init__(self, cluster: SSHHosts, tmp: Path, name: str, index: int):
        self.cluster = cluster
        self.hosts = {h.name: h for h in cluster.hosts[:3]}
        self.tmp = tmp
        self.name = name
        self.known_hosts = cluster.known_hosts(tmp / "known_hosts", self.hosts.values())
        self.base = base_recipe(name, list(self.hosts.values()), cluster.client_key, self.known_hosts, index)
        self.frontend_port = self.base["frontend"]["port"]
        self.ports = self.base["ports"]
        self.path = self.write()

    # -- recipe -----------------------------------------------------------------------------------
    def write(self, changes: dict[str, Any] | None = None, file: str = "recipe.yaml") -> Path:
        """Write the base recipe with `changes` deep-merged in; the path (also remembered as self.path)."""
        doc = deep_merge(self.base, changes or {})
        path = self.tmp / file
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.path = path
        return path

    # -- the operator's commands --------------------------------------------------------------------
    def cli(self, *args: str | os.PathLike[str], recipe: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`primectl ARGS... RECIPE` as a subprocess, the way an operator runs it."""
        argv = [PRIMECTL, str(args[0]), str(recipe or self.path), *map(str, args[1:])]
        full_env = os.environ | cliproc.OPERATOR_ENV | (env or {})
        t0 = time.monotonic()
        r = cliproc.run(argv, timeout=timeout, cwd=REPO, env=full_env)
        if os.environ.get("PRIMECTL_TEST_TIMING"):
            print(f"[{time.monotonic() - t0:5.2f}s] primectl {' '.join(map(str, args))} -> {r.returncode}")
        return r

    def popen(self, *args: str, recipe: Path | None = None, env: dict[str, str] | None = None
              ) -> subprocess.Popen[str]:
        """`primectl ARGS... RECIPE` in the background (pass --no-smoke to `up` yourself)."""
        argv = [PRIMECTL, args[0], str(recipe or self.path), *args[1:]]
        full_env = os.environ | cliproc.OPERATOR_ENV | (env or {})
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                env=full_env)

    def up(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120, preflight: bool = False
           ) -> subprocess.CompletedProcess[str]:
        """`up --no-smoke [--skip-preflight]`.

        --no-smoke: the fake engine serves health endpoints only, not the OpenAI API the smoke tests call.
        --skip-preflight (unless preflight=True): these tests exercise the apply layer's own guards (ports,
        lock, host keys, rollback); the preflight checks are tested on their own.
        """
        extra = () if preflight else ("--skip-preflight",)
        return self.cli("up", "--no-smoke", *extra, *args, env=env, timeout=timeout)

    def up_ok(self, *args: str, env: dict[str, str] | None = None, preflight: bool = False
              ) -> subprocess.CompletedProcess[str]:
        """`up` (as above) that must succeed."""
        r = self.up(*args, env=env, preflight=preflight)
        assert r.returncode == 0, f"up failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        return r

    def status_json(self) -> tuple[int, dict[str, Any]]:
        """`status -o json`: exit code and the document."""
        r = self.cli("status", "-o", "json")
        return r.returncode, json.loads(r.stdout)

    # -- what is on the hosts -----------------------------------------------------------------------
    def workdir(self, host: str) -> Path:
        return self.hosts[host].workdir(self.name)

    def pids(self) -> dict[str, int]:
        """service -> pid from every host's run/*.pid, checked alive and running in that host's workdir."""
        out: dict[str, int] = {}
        for h in self.hosts:
            wd = self.workdir(h)
            for svc, pid in recorded_pids(wd).items():
                assert pid_alive(pid), f"{svc} on {h}: recorded pid {pid} is not running"
                assert os.readlink(f"/proc/{pid}/cwd") == str(wd), f"{svc} pid {pid} does not run in {wd}"
                out[svc] = pid
        return out

    def current(self, host: str) -> str | None:
        """The revision the host's `current` link points at."""
        link = self.workdir(host) / "current"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def state(self, host: str) -> dict[str, Any] | None:
        f = self.workdir(host) / "state.json"
        return json.loads(f.read_text()) if f.exists() else None

    def snapshot(self) -> dict[str, Any]:
        """Everything `up` may change on the hosts: links, state, releases, pids."""
        return {
            h: {"current": self.current(h), "state": self.state(h), "pids": recorded_pids(self.workdir(h)),
                "releases": sorted(p.name for p in (self.workdir(h) / "releases").glob("*"))}
            for h in self.hosts
        }

    def leftovers(self) -> dict[str, list[tuple[int, str]]]:
        """Processes still running in any of this deployment's workdirs."""
        return {h: procs for h in self.hosts if (procs := processes_under(self.workdir(h)))}

    def wait_for(self, path: Path, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
            time.sleep(0.01)


def serving_agents(dep: Deployment) -> dict[str, set[int]]:
    """Per host, the pids of host agents serving a connection (`serve`) for this deployment's workdir."""
    return {h: agents_serving(dep.workdir(h)) for h in dep.hosts}


def agents_serving(workdir: Path) -> set[int]:
    """The pids of host agents serving a connection (`serve`) with their cache under `workdir`."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[-2:] == [b"serve", b""] and str(workdir / "agent").encode() in argv and pid_alive(int(entry)):
            found.add(int(entry))
    return found


def host_plan(h: SSHHost, key: Path | None, workdir: Path) -> HostPlan:
    """A recipe's `connection: ssh` entry for a test sshd host, logging in as root with `key`."""
    from primectl.deploy.access import SSHAccess
    from primectl.plan.model import HostPlan

    reach = SSHAccess(connection="ssh", port=h.port, user="root", identity_file=str(key) if key else None)
    return HostPlan(name=h.name, address=h.address, workdir=str(workdir), gpus=0, access=reach.plain())


def _problem_message() -> str | None:
    problem = netns_problem()
    if problem:
        return problem
    missing = [p for p in ("/usr/sbin/sshd", ETCD, "/usr/bin/ssh-keygen") if not os.path.exists(p)]
    if missing:
        return (f"missing {', '.join(missing)}: run scripts/install-system.sh "
                "(or apt-get install -y openssh-server etcd-server)")
    if not os.access(PRIMECTL, os.X_OK):
        return f"{PRIMECTL} is missing: install primectl editable into .venv"
    return None


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    """Three real sshd hosts (h1-h3 on 127.0.0.2-4), shared by the whole session; stopped by pid."""
    problem = _problem_message()
    if problem:
        pytest.fail(problem, pytrace=False)
    base = tmp_path_factory.mktemp("sshhosts")
    cluster = start_hosts(base, 3)
    try:
        yield cluster
    finally:
        left = kill_leftovers(base)  # safety net: pids recorded in the hosts' run/*.pid files
        cluster.stop()
        if left:
            print(f"\nintegration safety net killed {len(left)} leftover process(es): {left}")


@pytest.fixture
def deployment(ssh_hosts: SSHHosts, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """A fresh deployment (own name, workdirs, ports, recipe) on the shared hosts.

    Afterwards: every sshd is running again, `primectl down --break-lock` stops what the test left and
    no process may remain in the deployment's workdirs (a leftover fails the test, after being killed).
    """
    index = next(_counter)
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower().removeprefix("test_"))[:28].strip("-")
    dep = Deployment(ssh_hosts, tmp_path, f"t{index:02d}-{slug}", index)
    yield dep
    ssh_hosts.start()  # a test may have stopped or killed an sshd
    down = dep.cli("down", "--break-lock", recipe=dep.write(file="teardown.yaml"))
    leftovers = dep.leftovers()
    for h in dep.hosts:
        kill_leftovers(dep.workdir(h))
    assert down.returncode == 0, f"teardown `down` failed:\n{down.stdout}\n{down.stderr}"
    assert not leftovers, f"processes left behind after `down`: {leftovers}"


def nspawn_runtime() -> Path | None:
    """The runtime venv for the nspawn hosts: $PRIMECTL_NSPAWN_RUNTIME, else the repo's .runtime when it exists."""
    chosen = os.environ.get(NSPAWN_RUNTIME_ENV)
    venv = Path(chosen) if chosen else REPO / ".runtime"
    return venv if (venv / "bin" / "python").exists() else None


@pytest.fixture(scope="session")
def nspawn_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NspawnHosts]:
    """Three systemd-nspawn hosts h1-h3 (10.77.0.2-4, bridge pmbr0 at 10.77.0.1), each with systemd as PID 1 and sshd.

    Shared by the session (tests may reboot or power-cut a host; they leave it running). The runtime venv
    from nspawn_runtime() is bound read-only at its own path when there is one, and so is the repo's
    tests/fakes (the FAKE engine runtime a recipe's software.python names). Afterwards every host is
    shut down and nothing may remain: no process in a host's cgroups, no veth, no bridge, no cgroup dirs.
    """
    problem = nspawn_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    base = tmp_path_factory.mktemp("nspawnhosts")
    runtime = nspawn_runtime()
    binds = [BindMount(Path(FAKE_PYTHON).parent), *(runtime_binds(runtime) if runtime else ())]
    cluster = start_nspawn_hosts(base, 3, binds=binds)
    print(f"\nnspawn hosts up in {cluster.timings['boot_all_s']:.2f}s (rootfs {cluster.timings['rootfs_s']:.2f}s, "
          f"layer {cluster.hosts[0].used_layer}, runtime {runtime})")
    try:
        yield cluster
    finally:
        killed = cluster.close()
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        left_links = [line.split(":")[1].strip() for line in links.splitlines()
                      if cluster.bridge in line or ": vb-" in line]
        left_procs = leftover_container_processes(cluster.hosts)
        left_cgroups = [h.machine for h in cluster.hosts if cgroup_pids(h.machine) or
                        any((root / "primectl-nspawn" / h.machine).exists()
                            for root in (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified")))]
        left_mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(base) in line]
        print(f"\nnspawn hosts stopped in {cluster.timings['stop_s']:.2f}s; "
              f"boots {[(h.name, h.boots, round(h.timings.get('boot_s', 0), 2)) for h in cluster.hosts]}")
        assert not killed, f"the safety net had to kill container processes: {killed}"
        assert not (left_procs or left_links or left_cgroups or left_mounts), (left_procs, left_links, left_cgroups,
                                                                               left_mounts)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[slurmcluster.SlurmCluster]:
    """A real Slurm cluster (munged, slurmctld, slurmd n1-n3 on 127.0.0.2-4) for the session; stopped by pid.

    Its directory (conf, logs, spool) is removed afterwards unless PRIMECTL_KEEP_SLURM=1.
    PRIMECTL_TEST_TIMING=1 (with -s) prints how long start and stop took.
    """
    problem = slurmcluster.problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    base = slurmcluster.make_base_dir()
    cluster = slurmcluster.start_cluster(base)
    try:
        yield cluster
    finally:
        left = cluster.stop()
        if os.environ.get("PRIMECTL_TEST_TIMING"):
            print(f"\n[slurm] start {cluster.timings['start']:.2f}s, stop {cluster.timings['stop']:.2f}s")
        if left:
            print(f"\nSlurm test cluster: stopped with leftovers (killed by pid): {left}")
        if os.environ.get("PRIMECTL_KEEP_SLURM") == "1":
            print(f"\nSlurm test cluster kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: slurmcluster.SlurmCluster) -> Iterator[slurmcluster.SlurmCluster]:
    """The session's Slurm cluster for one test, which must leave no job or step process behind.

    Afterwards whatever is left is cancelled and killed by pid, and the test fails if there was any.
    """
    before = slurm_cluster.leftovers()
    assert not before, f"Slurm cluster not clean before the test: {before}"
    yield slurm_cluster
    left = slurm_cluster.clean_up()
    assert not left, f"jobs or step processes left behind: {left}"


def log_errors(workdir: Path, limit: int = 12) -> str:
    """The last error lines of a deployment's service logs (what a failed assertion shows beside primectl's own
    output, so a CI failure names what the workers said)."""
    seen = []
    for log in sorted((workdir / "logs").glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if any(word in line for word in ("ERROR", "Error", "error:", "Traceback", "Rejected", "panicked")):
                seen.append(f"{log.name}: {line[-300:]}")
    return "\n--- error lines in the deployment's logs ---\n" + ("\n".join(seen[-limit:]) or "(none)")

"""A real Slurm cluster on this machine, for the Slurm-target integration tests.

Debian's slurm-wlm 22.05 and munge: one munged, one slurmctld and three slurmd (n1, n2, n3,
the multiple-slurmd build: `slurmd -N NAME`), each node with its own loopback address
(NodeAddr 127.0.0.2/3/4) so a job step on n2 can bind its service to n2's address. All
state (slurm.conf, munge key and socket, spool, state save, logs) lives in one directory.
Daemons run in the foreground as our children and are stopped BY PID; nothing here ever
kills a process by name.

slurmd double-forks every slurmstepd away from itself, so each slurmd runs under
`subreaper.py`: steps are re-parented to that subreaper instead of PID 1, and
`SlurmCluster.step_processes()` (everything below the subreapers except slurmd itself) is
exactly what the cluster's jobs left running.

The daemons listen on 0.0.0.0 (slurm 22.05 has no bind-address option), so this refuses to
start outside a private network namespace that has only loopback:

    unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest tests/integration/test_slurm_cluster.py'

Inside one, it adds 127.0.0.2-4/8 to lo itself: Slurm resolves every address with
getaddrinfo(AI_ADDRCONFIG), which glibc answers with "Name or service not known" when the
only IPv4 address configured is 127.0.0.1 (even for the literal "127.0.0.1").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primectl.targets.slurm_cli import CLIENTS, FINAL_STATES, parse_records, run_client

from .sshhosts import descendants, foreign_links, isolated_netns, kill_pids, pid_alive, reap, wait_gone

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SUBREAPER = str(Path(__file__).with_name("subreaper.py"))
PACKAGES = "slurm-wlm slurm-client munge"
RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && exec .venv/bin/pytest "
            "tests/integration/test_slurm_cluster.py -q'")

# Outside the 10000-20000 block the SSH-host tests give their deployments (conftest.ports_for).
CTLD_PORT = 6817
SLURMD_PORT_BASE = 6900
DEFAULT_SCHEDULER_PARAMETERS = "bf_interval=1,bf_hetjob_immediate"


# -- parsing what the clients print ------------------------------------------------------------

def parse_exit_code(value: str) -> tuple[int, int]:
    """scontrol's `ExitCode=3:0` as (exit status, signal); unlike primectl's `exit_code`, garbage raises."""
    status, _, sig = value.partition(":")
    return int(status or 0), int(sig or 0)


# -- daemons -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmNode:
    """One slurmd: its NodeName, the loopback address jobs bind to, and its own slurmd port."""

    name: str
    address: str
    port: int


@dataclass
class Daemon:
    """A foreground daemon we started; under a subreaper when `reaped` (slurmd)."""

    name: str
    argv: list[str]
    log: Path
    reaped: bool = False
    env: Mapping[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    pidfile: Path | None = None

    def start(self) -> None:
        """Start it (stdout and stderr to its log)."""
        argv = self.argv
        if self.reaped:
            self.pidfile = self.log.with_suffix(".pid")
            self.pidfile.unlink(missing_ok=True)
            argv = [sys.executable, SUBREAPER, str(self.pidfile), "--", *argv]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True, env=dict(self.env or os.environ))

    @property
    def pid(self) -> int | None:
        """The daemon's own pid (not its subreaper's) while it runs."""
        if self.proc is None:
            return None
        if not self.reaped:
            return self.proc.pid if self.proc.poll() is None else None
        deadline = time.monotonic() + 5
        while self.pidfile is not None and not self.pidfile.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.005)
        assert self.pidfile is not None
        pid = int(self.pidfile.read_text())
        return pid if pid_alive(pid) else None

    def running(self) -> bool:
        """The daemon (not just its subreaper) is alive."""
        return self.pid is not None

    def below(self) -> list[int]:
        """Live processes below the daemon's subreaper other than the daemon: what its jobs left."""
        if not self.reaped or self.proc is None or self.proc.poll() is not None:
            return []
        own = self.pid
        return [p for p in descendants(self.proc.pid) if p != own and pid_alive(p)]

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the daemon by pid, SIGKILL after `timeout`; then its subreaper's leftovers, by pid."""
        if self.proc is None:
            return
        pid = self.pid
        if pid is not None:
            kill_pids([pid], signal.SIGTERM)
            if wait_gone([pid], timeout):
                kill_pids([pid], signal.SIGKILL)
                wait_gone([pid], 5)
        if self.reaped:
            left = descendants(self.proc.pid)
            kill_pids(left, signal.SIGKILL)
            wait_gone(left, 5)
        reap(self.proc)
        self.proc = None

    def log_tail(self, chars: int = 3000) -> str:
        """The end of its log (for error messages)."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


# -- configuration -------------------------------------------------------------------------------

def slurm_conf(base: Path, nodes: list[SlurmNode], *, hostname: str, ctld_port: int = CTLD_PORT,
               scheduler_parameters: str = DEFAULT_SCHEDULER_PARAMETERS, kill_wait: int = 3,
               cpus: int = 4, gpus: int = 4, extra: str = "") -> str:
    """slurm.conf text for this cluster, every path under base; `extra` lines go before the nodes."""
    names = ",".join(n.name for n in nodes)
    lines = [
        "# Written by tests/integration/slurmcluster.py: a throw-away cluster on loopback.",
        "ClusterName=primectl-test",
        f"SlurmctldHost={hostname}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={base}/munge/munge.sock",
        f"StateSaveLocation={base}/state",
        f"SlurmdSpoolDir={base}/spool/%n",
        f"SlurmctldPidFile={base}/run/slurmctld.pid",
        f"SlurmdPidFile={base}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={base}/log/slurmctld.log",
        f"SlurmdLogFile={base}/log/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        # Nodes are declared with the CPUs and GPUs of a small tray, not this machine's: use the config.
        "SlurmdParameters=config_overrides",
        f"KillWait={kill_wait}",
        "GresTypes=gpu",
    ]
    if scheduler_parameters:  # an empty "SchedulerParameters=" is a parse error
        lines.append(f"SchedulerParameters={scheduler_parameters}")
    lines += [line for line in extra.splitlines() if line.strip()]
    for n in nodes:
        lines.append(f"NodeName={n.name} NodeHostname={hostname} NodeAddr={n.address} Port={n.port} "
                     f"CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 "
                     f"RealMemory=2000 Gres=gpu:{gpus}")
    lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def gres_conf(base: Path, nodes: list[SlurmNode], gpus: int) -> str:
    """gres.conf: `gpus` stand-in GPU devices per node (links to /dev/null), so --gpus-per-node is honoured."""
    return "".join(f"NodeName={n.name} Name=gpu File={base}/dev/{n.name}/nvidia[0-{gpus - 1}]\n" for n in nodes)


def ensure_loopback_addresses(addresses: Iterable[str]) -> None:
    """Add each address to lo as a /8 secondary (only ever inside a private namespace)."""
    have = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", "lo"], capture_output=True, text=True,
                          check=True).stdout
    for addr in addresses:
        if f"inet {addr}/" not in have:
            subprocess.run(["ip", "addr", "add", f"{addr}/8", "dev", "lo"], check=True, capture_output=True)


def unsearchable_ancestor(path: Path) -> Path | None:
    """The first directory from / down to path that others cannot search (munged requires o+x on all)."""
    for d in [*reversed(path.resolve().parents), path.resolve()]:
        if d.exists() and not d.stat().st_mode & 0o001:
            return d
    return None


def make_base_dir(prefix: str = "primectl-slurm-") -> Path:
    """A fresh mode-0711 directory in the system temp dir, fit for the munge socket (caller removes it)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o711)
    return base


def problem() -> str | None:
    """Why the cluster cannot start here, or None."""
    if not isolated_netns():
        return (f"not in a private network namespace with only loopback (`ip -o link` also shows {foreign_links()}); "
                "slurmctld and slurmd listen on 0.0.0.0. Run it as\n  " + RUN_HINT)
    missing = [p for p in (MUNGED, SLURMCTLD, SLURMD) if not os.path.exists(p)]
    missing += [b for b in CLIENTS if shutil.which(b) is None]
    if missing:
        return f"missing {', '.join(missing)}: run scripts/install-system.sh (apt-get install -y {PACKAGES})"
    if os.geteuid() != 0:
        return "the test cluster runs its daemons as root (SlurmUser=root)"
    return None


# -- the cluster ---------------------------------------------------------------------------------

class SlurmError(RuntimeError):
    """A Slurm client command failed, or the cluster did not come up."""


@dataclass
class SlurmCluster:
    """munged + slurmctld + one slurmd per node, all state under `base`."""

    base: Path
    nodes: list[SlurmNode]
    hostname: str
    ctld_port: int = CTLD_PORT
    scheduler_parameters: str = DEFAULT_SCHEDULER_PARAMETERS
    kill_wait: int = 3
    cpus: int = 4
    gpus: int = 4
    extra_conf: str = ""
    topology: str | None = None
    daemons: dict[str, Daemon] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        """slurm.conf (what SLURM_CONF points at)."""
        return self.base / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client needs on top of the caller's environment."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment for a client command (os.environ + SLURM_CONF + extra)."""
        return {**os.environ, **self.env, **(extra or {})}

    def node(self, name: str) -> SlurmNode:
        """The node called `name`."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    # -- files ------------------------------------------------------------------------------------
    def write_config(self) -> None:
        """Create the directory tree, the munge key and slurm.conf/gres.conf."""
        for sub in ("etc", "state", "log", "run", "jobs"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        munge = self.base / "munge"
        munge.mkdir(exist_ok=True)
        munge.chmod(0o711)  # munged refuses a socket directory without search permission for others
        key = munge / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(128))
        for n in self.nodes:
            (self.base / "spool" / n.name).mkdir(parents=True, exist_ok=True)
            dev = self.base / "dev" / n.name
            dev.mkdir(parents=True, exist_ok=True)
            for i in range(self.gpus):  # slurmd wants character devices: stand-ins pointing at /dev/null
                gpu = dev / f"nvidia{i}"
                if not gpu.is_symlink():
                    gpu.symlink_to("/dev/null")
        self.write_slurm_conf()
        (self.base / "etc" / "gres.conf").write_text(gres_conf(self.base, self.nodes, self.gpus))
        (self.base / "etc" / "plugstack.conf").write_text("")

    def write_slurm_conf(self) -> None:
        """(Re)write slurm.conf from the current settings."""
        self.conf.write_text(slurm_conf(self.base, self.nodes, hostname=self.hostname, ctld_port=self.ctld_port,
                                        scheduler_parameters=self.scheduler_parameters, kill_wait=self.kill_wait,
                                        cpus=self.cpus, gpus=self.gpus, extra=self.extra_conf))
        topology = self.base / "etc" / "topology.conf"
        if self.topology is not None:
            topology.write_text(self.topology)
        else:
            topology.unlink(missing_ok=True)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 30) -> None:
        """Start munged, slurmctld and every slurmd; return once every node is idle."""
        t0 = time.monotonic()
        blocked = unsearchable_ancestor(self.base)
        if blocked:
            raise SlurmError(f"{blocked} is not searchable by others (mode {blocked.stat().st_mode & 0o777:o}); munged "
                             "refuses a socket below it: put the cluster in make_base_dir()")
        self.write_config()
        ensure_loopback_addresses(n.address for n in self.nodes)
        log = self.base / "log"
        munge = self.base / "munge"
        self.daemons["munged"] = Daemon("munged", [
            MUNGED, "--foreground", f"--socket={munge}/munge.sock", f"--key-file={munge}/munge.key",
            f"--pid-file={munge}/munged.pid", f"--seed-file={munge}/munged.seed", "--num-threads=4",
        ], log / "munged.out")
        self.daemons["munged"].start()
        self._wait(lambda: (munge / "munge.sock").exists(), "munged socket", self.daemons["munged"], timeout)
        self.timings["munged"] = time.monotonic() - t0

        env = self.client_env()
        self.daemons["slurmctld"] = Daemon("slurmctld", [SLURMCTLD, "-D", "-f", str(self.conf)],
                                           log / "slurmctld.out", env=env)
        self.daemons["slurmctld"].start()
        self._wait(lambda: self._port_open("127.0.0.1", self.ctld_port), "slurmctld port",
                   self.daemons["slurmctld"], timeout)
        self.timings["slurmctld"] = time.monotonic() - t0

        for n in self.nodes:
            d = Daemon(f"slurmd-{n.name}", [SLURMD, "-D", "-f", str(self.conf), "-N", n.name],
                       log / f"slurmd-{n.name}.out", reaped=True, env=env)
            self.daemons[d.name] = d
            d.start()
        self._wait(lambda: self.idle_nodes() == {n.name for n in self.nodes}, "every node idle", None, timeout)
        self.timings["start"] = time.monotonic() - t0

    def _wait(self, ready: Any, what: str, daemon: Daemon | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [d for d in self.daemons.values() if not d.running()]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0].name} exited" if dead else f"no {what} within {timeout}s"
                shown = dead or ([daemon] if daemon else list(self.daemons.values()))
                tails = "\n".join(f"--- {d.name}:\n{d.log_tail()}" for d in shown)
                self.stop()
                raise SlurmError(f"test Slurm cluster did not start: {why}\n{tails}")
            time.sleep(0.02)

    @staticmethod
    def _port_open(host: str, port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.2)
            return s.connect_ex((host, port)) == 0

    def step_processes(self) -> list[tuple[int, str]]:
        """(pid, command line) of every live process the cluster's jobs started (slurmstepd and below)."""
        out = []
        for d in self.daemons.values():
            for pid in d.below():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    continue
                out.append((pid, cmd))
        return out

    def active_jobs(self) -> list[dict[str, str]]:
        """Job records (one per het component) that are not finished."""
        return [r for r in self.jobs() if r.get("JobState") not in FINAL_STATES]

    def leftovers(self) -> dict[str, list[Any]]:
        """Unfinished jobs and live step processes, by kind (empty when the cluster is clean)."""
        out: dict[str, list[Any]] = {}
        if jobs := self.active_jobs():
            out["jobs"] = [f"{r.get('JobId')} {r.get('JobName')} {r.get('JobState')}" for r in jobs]
        if procs := self.step_processes():
            out["processes"] = procs
        return out

    def clean_up(self, timeout: float = 15) -> dict[str, list[Any]]:
        """Cancel every unfinished job, then SIGKILL any step process still alive (by pid); what was left."""
        left = self.leftovers()
        if "jobs" in left:
            ids = sorted({r["JobId"] for r in self.active_jobs()})
            self.run("scancel", *ids, check=False)
            deadline = time.monotonic() + timeout
            while self.active_jobs() and time.monotonic() < deadline:
                time.sleep(0.1)
        procs = [p for p, _ in self.step_processes()]
        kill_pids(procs, signal.SIGKILL)
        wait_gone(procs, 5)
        return left

    def stop(self) -> dict[str, list[Any]]:
        """Stop everything by pid: leftover step processes first, then slurmd, slurmctld, munged."""
        t0 = time.monotonic()
        left: dict[str, list[Any]] = {}
        if self.daemons.get("slurmctld") and self.daemons["slurmctld"].running():
            try:
                left = self.leftovers()
            except SlurmError:
                left = {}
        procs = [p for p, _ in self.step_processes()]
        kill_pids(procs, signal.SIGKILL)
        wait_gone(procs, 5)
        order = [n for n in self.daemons if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            if name in self.daemons:
                self.daemons[name].stop()
        self.daemons.clear()
        self.timings["stop"] = time.monotonic() - t0
        return left

    def reconfigure(self, **settings: Any) -> None:
        """Change settings (e.g. scheduler_parameters=...), rewrite slurm.conf and `scontrol reconfigure`."""
        for k, v in settings.items():
            if not hasattr(self, k):
                raise AttributeError(k)
            setattr(self, k, v)
        self.write_slurm_conf()
        self.run("scontrol", "reconfigure")

    # -- clients ----------------------------------------------------------------------------------
    def run(self, *argv: str | os.PathLike[str], check: bool = True, timeout: float = 30,
            cwd: Path | None = None, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (`sbatch`, `squeue`, ...) against this cluster; SlurmError when check and rc != 0."""
        args = [str(a) for a in argv]
        r = run_client(args, lambda: subprocess.run(args, capture_output=True, text=True, timeout=timeout,
                                                    cwd=cwd or self.base / "jobs", env=self.client_env(env)))
        if check and r.returncode != 0:
            raise SlurmError(f"{' '.join(args)} -> {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    def sbatch(self, script: Path, *args: str, cwd: Path | None = None) -> str:
        """Submit a batch script; its job id (the het job's leader id for a heterogeneous job)."""
        out = self.run("sbatch", "--parsable", *args, script, cwd=cwd or script.parent).stdout.strip()
        return out.split(";")[0]  # --parsable prints "id" or "id;cluster"

    def scancel(self, job_id: str, *args: str) -> None:
        """scancel [ARGS] JOB_ID."""
        self.run("scancel", *args, job_id)

    def scontrol(self, *args: str) -> str:
        """scontrol ARGS: its stdout."""
        return self.run("scontrol", *args).stdout

    def jobs(self, job_id: str | None = None) -> list[dict[str, str]]:
        """`scontrol show job -o [JOB]` records: one per job, one per component of a het job.

        A finished job stays listed for MinJobAge (300 s); a job id slurmctld no longer knows gives [].
        """
        r = self.run("scontrol", "show", "job", "-o", *([job_id] if job_id else []), check=False)
        if r.returncode != 0:
            if "Invalid job id" in r.stderr:
                return []
            raise SlurmError(f"scontrol show job {job_id or ''} -> {r.returncode}: {r.stderr}")
        return [rec for rec in parse_records(r.stdout) if "JobId" in rec]

    def steps(self, job_id: str) -> list[dict[str, str]]:
        """Running steps of a job (all components of a het job), from `scontrol show step -o`."""
        ids = {r["JobId"] for r in self.jobs(job_id)}
        r = self.run("scontrol", "show", "step", "-o", check=False)
        recs = parse_records(r.stdout) if r.returncode == 0 else []
        return [s for s in recs if s.get("StepId", "").split(".")[0] in ids]

    def squeue(self, *args: str) -> list[dict[str, Any]]:
        """`squeue --json [ARGS]`'s job list (data_parser v0.0.38 in 22.05)."""
        jobs: list[dict[str, Any]] = json.loads(self.run("squeue", "--json", *args).stdout)["jobs"]
        return jobs

    def idle_nodes(self) -> set[str]:
        """Nodes sinfo reports as idle (empty while slurmctld does not answer)."""
        r = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        if r.returncode != 0:
            return set()
        return {parts[0] for line in r.stdout.splitlines() if len(parts := line.split()) == 2 and parts[1] == "idle"}

    def wait_job(self, job_id: str, done: Any, timeout: float = 30, interval: float = 0.05) -> list[dict[str, str]]:
        """Poll `scontrol show job` until done(records) is true; the records (SlurmError on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            recs = self.jobs(job_id)
            if recs and done(recs):
                return recs
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} did not reach the expected state within {timeout}s: "
                                 f"{[(r.get('JobId'), r.get('JobState'), r.get('Reason')) for r in recs]}")
            time.sleep(interval)

    def wait_state(self, job_id: str, *states: str, timeout: float = 30) -> list[dict[str, str]]:
        """Wait until every component of the job is in one of `states`; the records."""
        return self.wait_job(job_id, lambda recs: all(r.get("JobState") in states for r in recs), timeout)


def default_nodes(count: int = 3) -> list[SlurmNode]:
    """n1..nN on 127.0.0.2.. with slurmd ports 6901..."""
    return [SlurmNode(f"n{i + 1}", f"127.0.0.{i + 2}", SLURMD_PORT_BASE + i + 1) for i in range(count)]


def start_cluster(base: Path, nodes: list[SlurmNode] | None = None, **settings: Any) -> SlurmCluster:
    """Create and start a cluster under base (three nodes by default); SlurmError when it cannot."""
    why = problem()
    if why:
        raise SlurmError(why)
    cluster = SlurmCluster(base, nodes or default_nodes(), socket.gethostname().split(".")[0], **settings)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextmanager
def running_cluster(base: Path, **settings: Any) -> Iterator[SlurmCluster]:
    """A started cluster for a with-block; stopped by pid afterwards."""
    cluster = start_cluster(base, **settings)
    try:
        yield cluster
    finally:
        cluster.stop()

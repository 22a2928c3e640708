"""The Slurm client commands primectl runs (sbatch, squeue, scontrol, scancel, sinfo, srun), and their parsing.

Everything goes through the installed clients with the caller's environment
(SLURM_CONF included), so primectl talks to whatever cluster the operator's
shell does. Formats are the ones that hold from 22.05 to 25.x: `scontrol show
... -o` records (one line, ` Key=Value` pairs) and `squeue -o` with a
separator, never `--json` (its schema changes between versions).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from primectl.errors import DeployError

CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun")
# Job states after which a job runs nothing any more.
FINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
    "REVOKED", "SPECIAL_EXIT",
})
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_record(line: str) -> dict[str, str]:
    """One `scontrol show job|step|node -o` line as {key: value}.

    Values run to the next ` Key=`; keys may contain ':' and '/' (`ReqB:S:C:T`, `CPUs/Task`). A value
    holding " Word=" itself (a job name or comment) would be split there: keep such text out of names
    primectl controls.
    """
    text = line.strip()
    marks = list(_KEY.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out[m.group(1)] = text[m.end():end].strip()
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """Every `-o` line of scontrol output as a record."""
    return [parse_record(line) for line in text.splitlines() if "=" in line]


def exit_code(value: str) -> tuple[int, int]:
    """scontrol's `ExitCode=3:0` as (exit status, signal)."""
    status, _, sig = value.partition(":")
    try:
        return int(status or 0), int(sig or 0)
    except ValueError:
        return 0, 0


@dataclass(frozen=True)
class JobView:
    """A (heterogeneous) job as one thing: its components' records and their common state."""

    job_id: str
    components: list[dict[str, str]]

    @property
    def state(self) -> str:
        """RUNNING only when every component runs; a final state once all are final; else the first unsettled one."""
        states = [c.get("JobState", "") for c in self.components]
        if not states:
            return "UNKNOWN"
        if all(s == "RUNNING" for s in states):
            return "RUNNING"
        if all(s in FINAL_STATES for s in states):
            return states[0]
        for s in ("COMPLETING", "PENDING", "CONFIGURING"):
            if s in states:
                return s
        return next(s for s in states if s != "RUNNING")

    @property
    def final(self) -> bool:
        """Every component has ended (COMPLETING is not final: processes are still being killed)."""
        return bool(self.components) and all(c.get("JobState") in FINAL_STATES for c in self.components)

    @property
    def reason(self) -> str:
        """The first component's Reason, unless it is None."""
        reasons = [c.get("Reason", "None") for c in self.components if c.get("Reason", "None") != "None"]
        return reasons[0] if reasons else ""

    @property
    def exit(self) -> tuple[int, int]:
        """The batch script's (status, signal)."""
        return exit_code(self.components[0].get("ExitCode", "0:0")) if self.components else (0, 0)

    @property
    def nodes(self) -> str:
        """The node lists of all components, comma-separated."""
        return ",".join(c.get("NodeList", "") for c in self.components if c.get("NodeList") not in (None, "", "(null)"))

    def describe(self) -> str:
        """`job 12 FAILED (NonZeroExitCode, exit 3)` and the like."""
        bits = [b for b in (self.reason, f"exit {self.exit[0]}" if self.exit[0] else "",
                            f"signal {self.exit[1]}" if self.exit[1] else "") if b]
        return f"job {self.job_id} {self.state}" + (f" ({', '.join(bits)})" if bits else "")


def reads_only(argv: tuple[str, ...] | list[str]) -> bool:
    """Whether a client command only reads (squeue, sinfo, scontrol show): safe to run again."""
    head = list(argv[:2])
    return head[:1] in (["squeue"], ["sinfo"]) or head == ["scontrol", "show"]


def run_client(argv: list[str], run: Callable[[], subprocess.CompletedProcess[str]]
               ) -> subprocess.CompletedProcess[str]:
    """`run()` of the client command `argv`; a query that a signal ended (SIGPIPE when a busy slurmctld drops the
    connection) is asked again, up to twice. A command that changes something runs once."""
    for attempt in range(3 if reads_only(argv) else 1):
        time.sleep(0.2 * attempt)
        r = run()
        if r.returncode >= 0:
            break
    return r


class SlurmClient:
    """The Slurm clients on this machine, with the caller's environment."""

    def __init__(self, env: Mapping[str, str] | None = None, runner: Callable[..., subprocess.CompletedProcess[str]] | None = None):
        self.env = dict(env if env is not None else os.environ)
        self._run = runner or subprocess.run
        self._kill_wait: int | None = None

    def missing(self) -> list[str]:
        """Client programs not on PATH."""
        path = self.env.get("PATH")
        return [c for c in CLIENTS if shutil.which(c, path=path) is None]

    def run(self, *argv: str, check: bool = True, timeout: float = 60, cwd: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run one client (a query again when a signal ended it: `run_client`); DeployError naming the command when
        check and it fails (or is missing)."""
        try:
            r = run_client(list(argv), lambda: self._run(list(argv), capture_output=True, text=True, timeout=timeout,
                                                         cwd=cwd, env=self.env))
        except FileNotFoundError:
            raise DeployError(f"{argv[0]} not found: install the Slurm clients (e.g. slurm-client) on this machine") from None
        except subprocess.TimeoutExpired:
            raise DeployError(f"{' '.join(argv)} did not answer within {timeout:g}s (is slurmctld reachable?)") from None
        if check and r.returncode != 0:
            raise DeployError(f"{' '.join(argv)} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()}")
        return r

    def version(self) -> str:
        """`slurm 22.05.8` as the clients report it."""
        r = self.run("sbatch", "--version", check=False)
        return (r.stdout or r.stderr).strip()

    def submit(self, script: str, cwd: str, *args: str) -> str:
        """sbatch from `cwd`; the job id (the het leader's)."""
        out = self.run("sbatch", "--parsable", *args, script, cwd=cwd).stdout.strip()
        job = out.split(";")[0].strip()
        if not job.isdigit():
            raise DeployError(f"sbatch printed no job id: {out!r}")
        return job

    def test_only(self, script: str, cwd: str) -> tuple[bool, str]:
        """`sbatch --test-only`: whether the cluster accepts the job as written, and what sbatch said."""
        r = self.run("sbatch", "--test-only", script, cwd=cwd, check=False)
        return r.returncode == 0, (r.stderr + r.stdout).strip()

    def job(self, job_id: str) -> JobView:
        """`scontrol show job -o ID`: one record per component (none once slurmctld forgot the job)."""
        r = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if r.returncode != 0:
            if "Invalid job id" in r.stderr:
                return JobView(job_id, [])
            raise DeployError(f"scontrol show job {job_id} failed: {r.stderr.strip()}")
        return JobView(job_id, [rec for rec in parse_records(r.stdout) if "JobId" in rec])

    def steps(self, job: JobView) -> list[dict[str, str]]:
        """Running steps of every component of the job (Name = the service)."""
        ids = {c["JobId"] for c in job.components}
        if not ids:
            return []
        r = self.run("scontrol", "show", "step", "-o", check=False)
        recs = parse_records(r.stdout) if r.returncode == 0 else []
        return [s for s in recs if s.get("StepId", "").split(".")[0] in ids]

    def active_jobs(self, name: str) -> list[tuple[str, str]]:
        """(leader id, state) of this user's unfinished jobs called `name`."""
        r = self.run("squeue", "-h", "-u", getpass.getuser(), "-n", name, "-o", "%A|%i|%T")
        out: dict[str, str] = {}
        for line in r.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 3:
                continue
            own, composite, state = parts
            leader = composite.split("+")[0] if "+" in composite else own
            if leader.isdigit():
                out.setdefault(leader, state)
        return sorted(out.items(), key=lambda kv: int(kv[0]))

    def cancel(self, job_id: str, *args: str) -> None:
        """scancel [ARGS] ID (a job that already ended is not an error)."""
        r = self.run("scancel", *args, job_id, check=False)
        if r.returncode != 0 and "already completing or completed" not in r.stderr and "Invalid job id" not in r.stderr:
            raise DeployError(f"scancel {' '.join(args)} {job_id} failed: {r.stderr.strip()}")

    def kill_wait(self) -> int:
        """The cluster's KillWait (seconds between SIGTERM and SIGKILL when a job is cancelled)."""
        if self._kill_wait is None:
            r = self.run("scontrol", "show", "config", check=False)
            m = re.search(r"^KillWait\s*=\s*(\d+)", r.stdout, re.M)
            self._kill_wait = int(m.group(1)) if m else 30
        return self._kill_wait

    def partition(self, name: str) -> str | None:
        """`up`/`down`/... for a partition, None when it does not exist."""
        r = self.run("sinfo", "-h", "-p", name, "-o", "%a", check=False)
        states = r.stdout.split()
        return states[0] if r.returncode == 0 and states else None

    def wait_final(self, job_id: str, timeout: float, interval: float = 0.2) -> JobView:
        """Poll until every component of the job is final (or slurmctld forgot it), at most `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            view = self.job(job_id)
            if not view.components or view.final or time.monotonic() > deadline:
                return view
            time.sleep(interval)

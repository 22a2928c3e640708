"""A Slurm deployment's files on the shared filesystem, the lock, and binding a plan to a running job.

    <slurm.job_dir>/<deployment>/
      lock                      flock held by the `up`/`down` that runs (owner inside, for messages)
      state.json                the job that serves and what it runs (written by `up` once it is healthy)
      secrets/<name>.env        secret values (0600), sourced by the run scripts
      releases/<revision>/      job.sbatch, bin/<service>.sh, ready/<service>.json, configs, model, manifest.json
      jobs/<id>.out             the batch script's output (srun's own errors land here)
      jobs/<id>/                per job: events, pids, bound.json, release/ (addresses bound), logs/<service>.out,
                                <host>/ (each logical host's workdir: etcd data, discovery)
    <slurm.job_dir>/runtime/<key>/   the provisioned runtime venv (shared by deployments)
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import re
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from primectl.errors import DeployError
from primectl.host.files import write_atomic
from primectl.host.logs import readable
from primectl.plan.model import JOB, NODE_MARKER_RE, Plan

STATE_SCHEMA = 1
ADDRESS_RE = re.compile(r"^[0-9A-Za-z.:-]+$")


@dataclass(frozen=True)
class Event:
    """One line the job's batch script (or its waiter) wrote to jobs/<id>/events."""

    at: float
    kind: str
    service: str
    detail: str


class DeploymentFiles:
    """Paths under <job_dir>/<deployment>, and reading/writing what lives there."""

    def __init__(self, root: str):
        self.root = root

    def path(self, *parts: str) -> str:
        """A path under the deployment directory."""
        return os.path.join(self.root, *parts)

    def release(self, revision: str) -> str:
        return self.path("releases", revision)

    def job(self, job_id: str) -> str:
        """jobs/<id>: what one job wrote."""
        return self.path("jobs", job_id)

    def batch_log(self, job_id: str) -> str:
        """The batch script's own output."""
        return self.path("jobs", f"{job_id}.out")

    def log(self, job_id: str, service: str) -> str:
        return self.path("jobs", job_id, "logs", f"{service}.out")

    def secrets(self, deployment: str) -> str:
        return self.path("secrets", f"{deployment}.env")

    # -- state ------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """state.json ({} when there is none)."""
        try:
            with open(self.path("state.json")) as f:
                doc: dict[str, Any] = json.load(f)
                return doc
        except (OSError, ValueError):
            return {}

    def write_state(self, state: dict[str, Any]) -> None:
        """Replace state.json atomically."""
        os.makedirs(os.path.dirname(self.path("state.json")), exist_ok=True)
        write_atomic(self.path("state.json"), (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())

    def bound(self, job_id: str) -> dict[str, dict[str, str]] | None:
        """logical host -> {node, address} as the job bound them, once it has."""
        try:
            with open(os.path.join(self.job(job_id), "bound.json")) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            return None
        hosts: dict[str, dict[str, str]] = doc.get("hosts", {})
        return hosts

    def events(self, job_id: str) -> list[Event]:
        """Every event the job wrote so far, in order."""
        try:
            with open(os.path.join(self.job(job_id), "events")) as f:
                lines = f.read().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            parts = line.split(" ", 3)
            if len(parts) < 2:
                continue
            try:
                at = float(parts[0])
            except ValueError:
                continue
            out.append(Event(at, parts[1], parts[2] if len(parts) > 2 else "", parts[3] if len(parts) > 3 else ""))
        return out

    def jobs_seen(self) -> list[str]:
        """Ids of the jobs that have a directory here, oldest first."""
        try:
            names = os.listdir(self.path("jobs"))
        except OSError:
            return []
        return sorted((n for n in names if n.isdigit() and os.path.isdir(self.job(n))), key=int)

    def tail(self, path: str, lines: int = 40) -> str:
        """The last lines of a log file, escape codes removed ('' when it does not exist)."""
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 65536))
                text = readable(f.read().decode(errors="replace")).splitlines()
        except OSError:
            return ""
        return "\n".join(line[:400] for line in text[-lines:])

    def write_release(self, revision: str, files: dict[str, bytes], modes: dict[str, int]) -> bool:
        """Write releases/<revision>/ (atomically, by renaming a finished directory); False when it exists."""
        final = self.release(revision)
        if os.path.isdir(final):
            return False
        os.makedirs(self.path("releases"), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{revision}-", dir=self.path("releases"))
        try:
            for rel, data in sorted(files.items()):
                p = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "wb") as f:
                    f.write(data)
                os.chmod(p, modes.get(rel, 0o644))
            os.chmod(tmp, 0o755)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return True

    def write_secrets(self, deployment: str, content: str) -> None:
        """secrets/<name>.env, mode 0600."""
        path = self.secrets(deployment)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, content.encode(), 0o600)

    def mark_stopping(self, job_id: str) -> None:
        """Tell the job's batch script that primectl is stopping it (it then ends with status 0)."""
        d = self.job(job_id)
        with contextlib.suppress(OSError):
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "stopping"), "w") as f:
                f.write(f"{time.time():.3f}\n")

    def prune(self, keep_revisions: set[str], keep_jobs: set[str], releases: int = 5, jobs: int = 10) -> list[str]:
        """Remove old releases and job directories (never those kept); what was removed."""
        removed: list[str] = []
        rel_dir = self.path("releases")
        try:
            revs = sorted((r for r in os.listdir(rel_dir) if not r.startswith(".")),
                          key=lambda r: os.path.getmtime(os.path.join(rel_dir, r)), reverse=True)
        except OSError:
            revs = []
        for r in [r for r in revs if r not in keep_revisions][max(0, releases - len(keep_revisions)):]:
            shutil.rmtree(os.path.join(rel_dir, r), ignore_errors=True)
            removed.append(f"releases/{r}")
        old_jobs = [j for j in reversed(self.jobs_seen()) if j not in keep_jobs][jobs:]
        for j in old_jobs:
            shutil.rmtree(self.job(j), ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(self.batch_log(j))
            removed.append(f"jobs/{j}")
        return removed


def bind(plan: Plan, job_id: str, hosts: dict[str, dict[str, str]]) -> Plan:
    """The plan with every late-bound address (and the job id) replaced by what the job resolved."""
    text = plan.model_dump_json()
    missing = sorted({m.group(1) for m in NODE_MARKER_RE.finditer(text)} - set(hosts))
    if missing:
        raise DeployError(f"job {job_id} did not bind logical host(s) {', '.join(missing)}")
    bad = {h: v.get("address", "") for h, v in hosts.items() if not ADDRESS_RE.match(v.get("address", ""))}
    if bad:
        raise DeployError(f"job {job_id} resolved unusable addresses: {bad}")
    text = NODE_MARKER_RE.sub(lambda m: hosts[m.group(1)]["address"], text)
    return Plan.model_validate_json(text.replace(JOB, job_id))


class DeploymentLock:
    """An exclusive flock on <deployment>/lock: released when its holder exits, however it exits."""

    def __init__(self, path: str, deployment: str):
        self.path = path
        self.deployment = deployment
        self.fd: int | None = None

    def owner(self) -> dict[str, Any]:
        """Who holds (or last held) the lock."""
        try:
            with open(self.path) as f:
                doc: dict[str, Any] = json.loads(f.read() or "{}")
                return doc
        except (OSError, ValueError):
            return {}

    def acquire(self, command: str, *, break_lock: bool, say: Any) -> None:
        """Take the lock; DeployError naming the holder when another run has it (unless break_lock)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            o = self.owner()
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(o.get("started", 0)))
            who = f"{o.get('user')}@{o.get('host')} pid {o.get('pid')} running `{o.get('command')}` since {since}"
            if not break_lock:
                raise DeployError(f"deployment {self.deployment} is locked by {who} ({self.path}); nothing was changed "
                                  "(the lock goes with its holder; --break-lock takes it anyway)") from None
            say(f"WARNING: breaking the lock held by {who}")
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # the holder keeps a lock on a file nobody else can open any more
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        owner = {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(), "command": command,
                 "started": time.time()}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(owner).encode())
        self.fd = fd

    def release(self) -> None:
        """Give the lock up (the file stays: removing it could split a waiting locker from the next one)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

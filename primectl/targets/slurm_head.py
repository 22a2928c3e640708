"""The head's Prometheus and Alertmanager of a monitored Slurm deployment: they run on the machine primectl runs
on, from the files slurm_monitoring.py renders under monitoring/head/.

`up` brings them to a release's files. The files are staged in <head_dir>/incoming/ and checked there (`promtool
check config`, `promtool check rules`, `amtool check-config`): a file that does not pass is refused with the tool's
error, and nothing running is replaced. Then each one is started if it does not run, restarted if its command line
changed, reloaded (SIGHUP, confirmed by its last-reload timestamp) if its files changed, and left alone otherwise
(`decide`). They run under primectl's own process supervisor (host/process_supervisor.py: a session of their own,
<head_dir>/run/<name>.pid holding pid and start time, <head_dir>/logs/<name>.log), whether or not systemd is PID 1
on the head. `down` stops them by pid; `down --purge` removes their files and data.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Literal

from primectl.components.monitoring import AMTOOL, PROMTOOL
from primectl.errors import DeployError
from primectl.host.files import write_atomic
from primectl.host.probes import http_fetch
from primectl.host.process_supervisor import ProcessSupervisor
from primectl.host.wire import ServiceRef
from primectl.plan.layout import Layout
from primectl.plan.model import Plan
from primectl.targets.base import Say
from primectl.targets.slurm_job import deploy_dir
from primectl.targets.slurm_monitoring import HEAD_FILES, component_port, data_dir, head_argv, head_dir, sd_dir

Action = Literal["start", "restart", "reload", "keep"]
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
# the metric each one sets when it has loaded its files (seconds since the epoch)
RELOADED = {"prometheus": "prometheus_config_last_reload_success_timestamp_seconds",
            "alertmanager": "alertmanager_config_last_reload_success_timestamp_seconds"}


def decide(*, running: bool, argv_changed: bool, files_changed: bool) -> Action:
    """What `up` does to one of the head's processes."""
    if not running:
        return "start"
    if argv_changed:
        return "restart"
    return "reload" if files_changed else "keep"


def checks(component: str, directory: str) -> list[list[str]]:
    """The commands that must pass on `component`'s files in `directory` before they replace the running ones."""
    if component == "prometheus":
        return [[PROMTOOL, "check", "config", os.path.join(directory, HEAD_FILES["prometheus"][0])],
                [PROMTOOL, "check", "rules", os.path.join(directory, HEAD_FILES["prometheus"][1])]]
    return [[AMTOOL, "check-config", os.path.join(directory, HEAD_FILES["alertmanager"][0])]]


@dataclass(frozen=True)
class HeadProcess:
    """One of the head's processes as a release wants it."""

    name: str
    argv: list[str]
    files: dict[str, bytes]  # file name in the head's directory -> content
    port: int

    @property
    def script(self) -> bytes:
        """The run script the process supervisor starts (its content records the command line)."""
        return f"#!/bin/bash\nexec {shlex.join(self.argv)}\n".encode()

    @property
    def ref(self) -> ServiceRef:
        return {"name": self.name, "unit": self.name, "stop_timeout": STOP_TIMEOUT_S}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


class Head:
    """The deployment's Prometheus and Alertmanager on this machine."""

    def __init__(self, plan: Plan, release_files: dict[str, bytes] | None = None):
        self.dir, self.data = head_dir(plan), data_dir(plan)
        self.sd_dir = sd_dir(deploy_dir(plan))
        self.layout = Layout(self.dir)
        self.supervisor = ProcessSupervisor(self.layout)
        argv = head_argv(plan)
        files = release_files or {}
        self.processes = [HeadProcess(c, argv[c], {n: files.get(f"monitoring/head/{n}", b"") for n in names},
                                      component_port(plan, c)) for c, names in HEAD_FILES.items()]

    def pid(self, name: str) -> int | None:
        """The pid of one of the head's processes, None where it does not run."""
        return self.supervisor.liveness(name, name).get("pid")

    def plan(self) -> dict[str, tuple[Action, str]]:
        """What `up` would do to each process, and why (reads files and pids, changes nothing)."""
        out: dict[str, tuple[Action, str]] = {}
        for p in self.processes:
            running = self.pid(p.name) is not None
            argv_changed = _read(self.layout.script(p.name)) != p.script
            changed = [n for n, data in p.files.items() if _read(os.path.join(self.dir, n)) != data]
            action = decide(running=running, argv_changed=argv_changed, files_changed=bool(changed))
            why = {"start": f"not running on this machine (the head): start it from {self.dir}",
                   "restart": "its command line changed: restart it",
                   "reload": f"{', '.join(changed)} changed: reload it (SIGHUP)",
                   "keep": "running with these files"}[action]
            out[p.name] = (action, why)
        return out

    def check(self) -> str:
        """Stage every file in <head_dir>/incoming/ and check it; the staging directory, or DeployError naming the
        tool's complaint (the staged files removed, the running ones untouched)."""
        staged = os.path.join(self.dir, "incoming")
        shutil.rmtree(staged, ignore_errors=True)
        os.makedirs(staged)
        for p in self.processes:
            for name, data in p.files.items():
                write_atomic(os.path.join(staged, name), data)
        for p in self.processes:
            for argv in checks(p.name, staged):
                r = subprocess.run(argv, capture_output=True, text=True)
                if r.returncode != 0:
                    shutil.rmtree(staged, ignore_errors=True)
                    detail = " ".join((r.stderr + r.stdout).split())[-600:]
                    raise DeployError(f"the head's {p.name} configuration does not load ({' '.join(argv)}: {detail}); "
                                      f"nothing in {self.dir} was replaced", service=p.name)
        return staged

    def apply(self, say: Say) -> dict[str, Action]:
        """Bring both processes to the release's files: check, replace, then start, restart, reload or leave each."""
        todo = self.plan()
        if all(a == "keep" for a, _ in todo.values()):
            return {n: a for n, (a, _) in todo.items()}
        staged = self.check()
        os.makedirs(self.data, exist_ok=True)
        # file_sd watches the directory only if it exists when Prometheus starts (else it re-reads it every 5 min)
        os.makedirs(self.sd_dir, exist_ok=True)
        for p in self.processes:
            action = todo[p.name][0]
            for name in p.files:
                os.replace(os.path.join(staged, name), os.path.join(self.dir, name))
            os.makedirs(os.path.dirname(self.layout.script(p.name)), exist_ok=True)
            write_atomic(self.layout.script(p.name), p.script, 0o755)
            if action in ("start", "restart"):
                self.supervisor.start(p.ref)
                self._await_ready(p)
            elif action == "reload":
                self._reload(p)
            if action != "keep":
                say(f"monitoring: head {p.name} {action}ed ({todo[p.name][1]}), "
                    f"pid {self.pid(p.name)}, http://127.0.0.1:{p.port}")
        shutil.rmtree(staged, ignore_errors=True)
        return {n: a for n, (a, _) in todo.items()}

    def _log_tail(self, p: HeadProcess) -> str:
        return (_read(self.layout.log(p.name)) or b"").decode(errors="replace")[-1500:]

    def _await_ready(self, p: HeadProcess) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.pid(p.name) is None:
                raise DeployError(f"the head's {p.name} exited on start (log {self.layout.log(p.name)})",
                                  service=p.name, log_tail=self._log_tail(p))
            try:
                if http_fetch(f"http://127.0.0.1:{p.port}/-/ready", timeout=2)[0] == 200:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise DeployError(f"the head's {p.name} is not ready on port {p.port} after {READY_TIMEOUT_S:g}s",
                          service=p.name, log_tail=self._log_tail(p))

    def _reloaded_at(self, p: HeadProcess) -> float:
        try:
            status, body = http_fetch(f"http://127.0.0.1:{p.port}/metrics", timeout=2)
        except (OSError, ValueError):
            return 0.0
        for line in body.decode(errors="replace").splitlines() if status == 200 else []:
            if line.startswith(RELOADED[p.name] + " "):
                return float(line.split()[1])
        return 0.0

    def _reload(self, p: HeadProcess) -> None:
        pid = self.pid(p.name)
        assert pid is not None
        since = self._reloaded_at(p)
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._reloaded_at(p) > since:
                return
            time.sleep(0.2)
        raise DeployError(f"the head's {p.name} (pid {pid}) did not report loading its new files within "
                          f"{READY_TIMEOUT_S:g}s of SIGHUP", service=p.name, log_tail=self._log_tail(p))

    def stop(self, say: Say, *, purge: bool) -> list[str]:
        """Stop both processes (SIGTERM to their sessions, SIGKILL after STOP_TIMEOUT_S); with `purge`, remove
        their files and data. The names that were running."""
        stopped = [p.name for p in self.processes if self.supervisor.stop(p.ref, remove=True)]
        if stopped:
            say(f"monitoring: stopped the head's {', '.join(stopped)}")
        if purge:
            shutil.rmtree(self.dir, ignore_errors=True)
            shutil.rmtree(self.data, ignore_errors=True)
        return stopped

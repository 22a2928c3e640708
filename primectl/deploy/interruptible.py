"""Invoke and Fabric runners that stop on Ctrl-C.

Invoke's runners catch KeyboardInterrupt while a command runs, forward it (`\\x03` on the command's stdin,
which a command without a terminal ignores) and go on waiting. So a Ctrl-C that came while `up` ran a shell
command (an agent call on `connection: local`, a provisioning install over SSH) was lost: the command
finished and `up` went on as if nothing had been pressed. These runners end the command instead (kill
locally, close the channel remotely, as Invoke's own timeout does) and raise the interrupt, so `up` rolls
back and `sweep` stops. Imported only when a transport opens (Invoke is slow to import); Fabric's remote
runner is in deploy/interruptible_remote.py, so a `connection: local` run never imports Fabric and paramiko
(~75 ms of CPU each run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from typing import Any

from invoke.runners import Local, Result


class _OwnedPopen(subprocess.Popen[bytes]):
    """A Popen that hands itself to its runner as soon as the child exists, and kills the child when a Ctrl-C
    lands while Popen still waits for the exec (the runner never got the process to kill)."""

    def __init__(self, runner: InterruptibleLocal, *args: Any, **kwargs: Any) -> None:
        self._runner = runner
        super().__init__(*args, **kwargs)

    def _execute_child(self, *args: Any) -> None:
        before = _own_children()
        try:
            super()._execute_child(*args)  # type: ignore[misc]  # CPython's private, stable since 3.2
        except KeyboardInterrupt:
            # a Ctrl-C during the fork raises before Popen has even recorded the pid: what this thread forked is it
            pid = getattr(self, "pid", None)
            for child in {pid} if pid else _own_children() - before:
                try:
                    os.kill(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            raise
        self._runner.process = self


def _own_children() -> set[int]:
    """The processes this thread forked that have not been reaped (Linux's /proc/<pid>/task/<tid>/children)."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/children") as f:
            return {int(pid) for pid in f.read().split()}
    except OSError:
        return set()


class InterruptibleLocal(Local):
    """Invoke's local runner; Ctrl-C kills the command and raises, whenever it comes after the command started."""

    process: subprocess.Popen[bytes]

    def start(self, command: str, shell: str, env: dict[str, Any]) -> None:
        if self.using_pty:
            super().start(command, shell, env)
            return
        _OwnedPopen(self, command, shell=True, executable=shell, env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, stdin=subprocess.PIPE)

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        self.kill()
        raise interrupt

    def _run_body(self, command: str, **kwargs: Any) -> Result | None:
        try:
            return super()._run_body(command, **kwargs)
        except KeyboardInterrupt:
            # a Ctrl-C after the command started but before Invoke waits on it (starting its I/O threads)
            # never reaches send_interrupt: the command ran on after primectl had stopped
            process = getattr(self, "process", None)
            if process is not None and process.poll() is None:
                self.kill()
            raise

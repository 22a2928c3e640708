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

from typing import Any

from invoke.runners import Local, Result


class InterruptibleLocal(Local):
    """Invoke's local runner; Ctrl-C kills the command and raises."""

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

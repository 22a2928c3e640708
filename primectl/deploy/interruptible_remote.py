"""Fabric's remote runner that stops on Ctrl-C (why: deploy/interruptible.py).

Apart from the local runner so that only SSH connections import Fabric (and paramiko).
"""

from __future__ import annotations

from typing import Any

from fabric.runners import Remote


class InterruptibleRemote(Remote):  # type: ignore[misc]  # Fabric has no type hints
    """Fabric's remote runner; Ctrl-C closes the command's channel and raises."""

    def send_interrupt(self, interrupt: KeyboardInterrupt) -> None:
        self.kill()
        raise interrupt

    def _run_body(self, command: str, **kwargs: Any) -> Any:
        try:
            return super()._run_body(command, **kwargs)
        except KeyboardInterrupt:  # after the channel opened, before Invoke waits on it (deploy/interruptible.py)
            if getattr(self, "channel", None) is not None:
                self.kill()
            raise

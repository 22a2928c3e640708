"""`supervisor: process`: primectl itself supervises a host's services (for laptops and hosts without systemd
as PID 1).
"""

from __future__ import annotations

import os
import time

from primectl.host.files import write_atomic
from primectl.host.processes import kill_session, kill_session_members, spawn_session, starttime
from primectl.host.supervisor import DRAINED_STOP_S, Supervisor, mark_start

TYPE_CHECKING = False
if TYPE_CHECKING:
    from primectl.host.wire import Liveness, ServiceRef


class ProcessSupervisor(Supervisor):
    """`supervisor: process`: setsid + pidfile + log file, for laptops and hosts without systemd as PID 1."""

    name = "process"

    def _recorded(self, name: str) -> tuple[int, str] | None:
        try:
            with open(self.layout.pidfile(name)) as f:
                pid_s, start = f.read().split()
        except (OSError, ValueError):
            return None
        return int(pid_s), start

    def _pid(self, name: str) -> int | None:
        recorded = self._recorded(name)
        if recorded is None:
            return None
        pid, start = recorded
        return pid if starttime(pid) == start else None

    def liveness(self, name: str, unit: str) -> Liveness:
        pid = self._pid(name)
        return {"alive": pid is not None, "pid": pid, "state": "running" if pid else "stopped"}

    def start(self, svc: ServiceRef) -> tuple[int | None, str | None]:
        name = svc["name"]
        self.stop(svc, remove=False)
        os.makedirs(self.layout.path("run"), exist_ok=True)
        mark_start(self.layout, name)
        pid = spawn_session(["/bin/bash", self.layout.script(name)], cwd=self.layout.workdir,
                            log=self.layout.log(name))
        start = None
        for _ in range(100):
            start = starttime(pid)
            if start:
                break
            time.sleep(0.01)
        write_atomic(self.layout.pidfile(name), f"{pid} {start}\n".encode())
        return pid, None

    def stop(self, svc: ServiceRef, *, remove: bool) -> bool:
        name = svc["name"]
        running = self._pid(name) is not None
        drained = self.drain(svc)
        pid = self._pid(name)
        if pid is not None:
            # drained: nothing is left in flight, and a worker would only sit out its grace period
            kill_session(pid, DRAINED_STOP_S if drained else float(svc.get("stop_timeout", 30)))
        elif (recorded := self._recorded(name)) is not None:
            # the main process died (a crash, kill -9); what it started may live on in its session (vLLM's
            # engine core and workers do): stop them too
            kill_session_members(recorded[0])
        try:  # a process that exited by itself leaves its pidfile behind: it goes too
            os.unlink(self.layout.pidfile(name))
        except FileNotFoundError:
            pass
        return running

"""`supervisor: systemd`: a host's services are systemd units, installed from the release."""

from __future__ import annotations

import os

from primectl.host.supervisor import Supervisor, mark_start

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

    from primectl.host.wire import Liveness, ServiceRef


SYSTEMD_UNIT_DIR = "/etc/systemd/system"


class SystemdSupervisor(Supervisor):
    """`supervisor: systemd`: units installed from the release, enabled so a reboot brings them back.

    Units run the same run script and append to the same log file as the process supervisor
    (StandardOutput=append:, so the journal holds only systemd's own lines about the unit). What
    this relies on, measured with systemd 252 as PID 1 (tests/integration/test_systemd_hosts.py):
    - `enable`/`disable` reload the whole manager unless --no-reload (0.4 s each on a loaded
      2-core machine): units are enabled/disabled with --no-reload and the manager is reloaded
      once per batch, which also keeps its UnitFileState current.
    - Type=simple: `restart` returns 0 as soon as the process is forked, so readiness is only
      ever primectl's probe, and a unit that is not `active (running)` while primectl waits
      (e.g. `activating (auto-restart)` after a crash) counts as exited.
    - NRestarts counts systemd's own restarts since the unit was last started by hand:
      `restart` and `reset-failed` set it to 0, so `status` shows systemd's restarts since
      primectl last started the unit.
    - A unit whose process died waits RestartSec in `activating (auto-restart)`; `stop` cancels
      that restart, so a rolled-back unit never comes back by itself.
    """

    name = "systemd"
    unit_dir = SYSTEMD_UNIT_DIR

    @staticmethod
    def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
        import subprocess

        return subprocess.run(["systemctl", *args], capture_output=True, text=True)

    @staticmethod
    def _unit(svc: ServiceRef) -> str:
        return f"{svc['unit']}.service"

    def liveness(self, name: str, unit: str) -> Liveness:
        r = self._ctl("show", "-p", "ActiveState", "-p", "SubState", "-p", "MainPID", "-p", "NRestarts",
                      "-p", "LoadState", "-p", "UnitFileState", f"{unit}.service")
        props = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        active, sub = props.get("ActiveState", "unknown"), props.get("SubState", "")
        pid = int(props.get("MainPID") or 0) or None
        restarts = int(props.get("NRestarts") or 0)
        alive = active == "active" and sub == "running"
        if props.get("LoadState") == "not-found":
            state = "not installed"
        else:
            state = f"{active} ({sub})" if sub else active
            enabled = props.get("UnitFileState", "")
            if enabled and enabled != "enabled":  # running but not brought back by a reboot: say so
                state += f", {enabled}"
        return {"alive": alive, "pid": pid if alive else None, "state": state, "restarts": restarts,
                "installed": props.get("LoadState") != "not-found"}

    def prepare(self, services: list[ServiceRef]) -> str | None:
        import shutil

        if not services:
            return None
        for svc in services:
            shutil.copyfile(self.layout.unit_file(svc["unit"]), os.path.join(self.unit_dir, self._unit(svc)))
        units = [self._unit(svc) for svc in services]
        r = self._ctl("enable", "--no-reload", *units)
        if r.returncode != 0:
            return f"systemctl enable {' '.join(units)}: {r.stderr.strip()}"
        r = self._ctl("daemon-reload")
        return None if r.returncode == 0 else f"systemctl daemon-reload: {r.stderr.strip()}"

    def start(self, svc: ServiceRef) -> tuple[int | None, str | None]:
        unit = self._unit(svc)
        if self.drain(svc):
            self._ctl("kill", "--signal=SIGKILL", unit)  # drained: nothing left in flight
        self._ctl("reset-failed", unit)  # a unit that failed before must not hit its start limit now
        mark_start(self.layout, svc["name"])
        r = self._ctl("restart", unit)
        if r.returncode != 0:
            return None, f"systemctl restart {unit}: {r.stderr.strip()}"
        return self.liveness(svc["name"], svc["unit"]).get("pid"), None

    def stop(self, svc: ServiceRef, *, remove: bool) -> bool:
        return bool(self.stop_many([svc], remove=remove))

    def stop_many(self, services: list[ServiceRef], *, remove: bool) -> list[str]:
        """disable + stop the batch in one systemctl call each (systemd stops them in parallel), then one reload."""
        if not services:
            return []
        was = [svc["name"] for svc in services if self.liveness(svc["name"], svc["unit"]).get("alive")]
        units = [self._unit(svc) for svc in services]
        drained = [self._unit(svc) for svc in services if self.drain(svc)]
        if drained:
            self._ctl("kill", "--signal=SIGKILL", *drained)  # drained: nothing left in flight
        # Disabled first: a stopped unit must not come back at the next boot. `stop` also cancels a
        # pending automatic restart; it waits for each unit's TimeoutStopSec, then systemd SIGKILLs.
        installed = [u for u in units if os.path.exists(os.path.join(self.unit_dir, u))]
        if installed:  # one missing unit file would make `disable` refuse the whole batch
            self._ctl("disable", "--no-reload", *installed)
        self._ctl("stop", *units)
        self._ctl("reset-failed", *units)
        if remove:
            for unit in units:
                try:
                    os.unlink(os.path.join(self.unit_dir, unit))
                except FileNotFoundError:
                    pass
        self._ctl("daemon-reload")
        return was

    def journal(self, unit: str, lines: int) -> str:
        import subprocess

        r = subprocess.run(["journalctl", "-u", f"{unit}.service", "-n", str(lines), "--no-pager", "-o", "short-iso"],
                           capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

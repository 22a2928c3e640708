"""primectl-wait: inside a primectl Slurm job, wait until services pass their readiness probes.

    primectl-wait JOB_DIR SERVICE...

Run by the job's batch script (standard library only, any python3) after it started a wave
of services as job steps. Each SERVICE's probe is JOB_DIR/release/ready/SERVICE.json (the
plan's Probe, addresses already bound); JOB_DIR/pids lists `service pid` of every step the
script started, so a service that ends while others are still starting is seen at once.
Appends `ready`/`timeout` lines to JOB_DIR/events (what `primectl up` watches).

Exit status: 0 every SERVICE is ready; 3 a started service ended (its name on stdout);
4 a probe did not pass in its timeout (the name on stdout); 5 the job is being stopped
(JOB_DIR/stopping exists).
"""

from __future__ import annotations

import json
import os
import sys
import time

from primectl.host.probes import ProbeRetry, run_probe
from primectl.host.processes import starttime
from primectl.host.wire import CODE_EXITED, CODE_TIMEOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from primectl.host.wire import ProbeSpec

USAGE = "usage: primectl-wait JOB_DIR SERVICE...\n"


def note(job_dir: str, text: str) -> None:
    """Append one event line (`<unix time> <text>`)."""
    with open(os.path.join(job_dir, "events"), "a") as f:
        f.write(f"{time.time():.3f} {text}\n")


def alive(pid: int) -> bool:
    """The process exists and has not ended (a zombie has ended)."""
    return starttime(pid) is not None


def started(job_dir: str) -> dict[str, int]:
    """service -> pid of every step started so far."""
    out: dict[str, int] = {}
    try:
        with open(os.path.join(job_dir, "pids")) as f:
            for line in f:
                name, _, pid = line.strip().partition(" ")
                if pid.isdigit():
                    out[name] = int(pid)
    except OSError:
        pass
    return out


def wait(job_dir: str, services: list[str]) -> int:
    """Probe until all are ready; the exit status described above."""
    release = os.path.join(job_dir, "release")
    probes: dict[str, ProbeSpec] = {}
    for name in services:
        with open(os.path.join(release, "ready", f"{name}.json")) as f:
            probes[name] = json.load(f)
    t0 = time.time()
    retry = ProbeRetry(probes)
    detail = {n: "not probed yet" for n in services}
    pending = list(services)
    while pending:
        if os.path.exists(os.path.join(job_dir, "stopping")):
            return 5
        for name, pid in started(job_dir).items():
            if not alive(pid):
                print(name)
                return CODE_EXITED
        now = time.time()
        for name in list(pending):
            if not retry.due(name, now):
                continue
            ok, detail[name] = run_probe(probes[name], release)
            if ok:
                pending.remove(name)
                note(job_dir, f"ready {name} {time.time() - t0:.2f}s")
                continue
            timeout = float(probes[name].get("timeout_s", 60))
            if time.time() - t0 > timeout:
                note(job_dir, f"timeout {name} not ready after {timeout:g}s ({detail[name]})")
                print(name)
                return CODE_TIMEOUT
            retry.missed(name, now)
        if pending:
            time.sleep(0.05)
    return 0


def main(argv: list[str]) -> int:
    """Command line entry point."""
    if len(argv) < 2:
        sys.stderr.write(USAGE)
        return 2
    return wait(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Run one command under a child subreaper, so every process it ever starts stays below this one.

    python subreaper.py PIDFILE -- COMMAND [ARGS...]

slurmd double-forks each slurmstepd (and so each job step) away from itself; without a
subreaper those processes are re-parented to PID 1 and a test can no longer tell which
processes its cluster left behind. With this process as the subreaper, they are re-parented
here instead: `descendants(<this pid>)` is everything the command started, alive or not yet
reaped, and this process exits only once all of them are gone (or on SIGKILL).

PIDFILE receives the command's pid once it runs. Signals are not forwarded: the caller
signals the command's pid itself. Exit status: the command's (128+N when killed by signal N).
Standard library only (it runs with whatever python3 the test uses).
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Make orphaned descendants re-parent to this process instead of PID 1 (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_until_alone(main_pid: int) -> int:
    """Reap every child (the command and adopted orphans) until none is left; the command's exit status."""
    status = 0
    while True:
        try:
            pid, raw = os.wait()
        except ChildProcessError:
            return status
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
        if pid == main_pid:
            status = os.waitstatus_to_exitcode(raw)
            status = 128 - status if status < 0 else status


def main(argv: list[str]) -> int:
    """Entry point: `PIDFILE -- COMMAND...`."""
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    pidfile, command = argv[0], argv[2:]
    become_subreaper()
    child = os.posix_spawnp(command[0], command, dict(os.environ))  # inherits stdio and cwd
    tmp = f"{pidfile}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{child}\n")
    os.replace(tmp, pidfile)
    return reap_until_alone(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

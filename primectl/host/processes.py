"""Processes on a host: a service runs in a session of its own, started here (`spawn_session`), found by its
session id, and stopped with every process still in that session. Signals are their Linux numbers: importing
signal would cost a host agent more than the rest of a start.
"""

from __future__ import annotations

import os
import time

SIGKILL, SIGTERM = 9, 15  # Linux's numbers; every host is Linux


def spawn_session(argv: list[str], *, cwd: str, log: str) -> int:
    """Start `argv` in a session of its own (stdin /dev/null, stdout and stderr appended to `log`, no other
    descriptor inherited) and return its pid without waiting for it; OSError when it cannot be executed.
    subprocess.Popen does the same, but importing subprocess costs a host agent ~10 ms of CPU."""
    err_r, err_w = os.pipe()  # close-on-exec: EOF here means the exec succeeded
    pid = os.fork()
    if pid == 0:  # the child: only os calls until exec, then _exit whatever happened
        what = cwd
        try:
            os.close(err_r)
            os.setsid()
            os.chdir(cwd)
            what = log
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            # only the descriptors that are open: a loop up to the open-file limit (a million, or more under
            # LimitNOFILE=infinity) takes seconds where close_range is missing
            for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
                if fd > 2 and fd != err_w:
                    try:
                        os.close(fd)
                    except OSError:
                        pass  # the directory listing's own descriptor, closed already
            import _signal  # the C module: Python ignores SIGPIPE and SIGXFSZ, and exec keeps what is ignored

            _signal.signal(13, _signal.SIG_DFL)
            _signal.signal(25, _signal.SIG_DFL)
            what = argv[0]
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(err_w, f"{exc.errno}:{exc.strerror}: {what}".encode())
        finally:
            os._exit(127)
    os.close(err_w)
    try:
        failure = os.read(err_r, 4096)
    finally:
        os.close(err_r)
    if failure:
        os.waitpid(pid, 0)
        errno, _, text = failure.decode(errors="replace").partition(":")
        raise OSError(int(errno) if errno.isdigit() else 0, text)
    return pid


def reap_exited() -> None:
    """Collect the exit status of every child of this process that has ended (services and helpers started by
    spawn_session): an agent that serves many requests in one session, as a kept connection's does, would
    otherwise hold each one that exits as a zombie until the session ends."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def starttime(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks), None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def kill_session(pid: int, timeout: float) -> None:
    """SIGTERM a process group, SIGKILL after `timeout`; then kill what still holds its session id."""
    try:
        os.killpg(pid, SIGTERM)
    except ProcessLookupError:
        kill_session_members(pid)
        return
    deadline = time.time() + timeout
    while time.time() < deadline and starttime(pid) is not None:
        time.sleep(0.05)
    if starttime(pid) is not None:
        try:
            os.killpg(pid, SIGKILL)
        except ProcessLookupError:
            pass
        while starttime(pid) is not None:
            time.sleep(0.05)
    kill_session_members(pid)


WATCH_ENV = "PRIMECTL_WATCH_OF"
"""Set (to the service's unit name) on the watch a run script starts beside its service, and on nothing else."""


def session_of(pid: int) -> int:
    """The session a process runs in; its own pid once it is gone (a service leads its session)."""
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return pid


def end_watches(unit: str, session: int) -> list[int]:
    """SIGTERM the watches started beside `unit`'s service (found by WATCH_ENV in their environment). Its run
    script starts them in the service's `session`: only the environments of that session's processes are
    read, not those of every process on the host."""
    mark = f"{WATCH_ENV}={unit}".encode()
    ended = []
    for pid in session_members(session):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    os.kill(pid, SIGTERM)
                    ended.append(pid)
        except (OSError, ProcessLookupError):
            pass
    return ended


def session_members(sid: int) -> list[int]:
    """The pids of the processes in session `sid` (os.getsid of each, no file read)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    members.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return members


MEMBER_EXIT_WAIT_S = 30.0
"""How long a stop waits for SIGKILLed session members to finish exiting (a process with tens of GB mapped, a
vLLM engine core, takes seconds to hand its memory back; the next start should not race it)."""


def kill_session_members(sid: int, wait: float = MEMBER_EXIT_WAIT_S) -> list[int]:
    """SIGKILL every process still in session `sid` (children that left the group, or that outlived a leader
    that died: Linux never hands out a pid still in use as a session id, so they are ours), and wait up to
    `wait` seconds until they have ended (a zombie has)."""
    killed = []
    for pid in session_members(sid):
        try:
            os.kill(pid, SIGKILL)
            killed.append((pid, starttime(pid)))
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.time() + wait
    while time.time() < deadline and any(start is not None and starttime(pid) == start for pid, start in killed):
        time.sleep(0.05)
    return [pid for pid, _ in killed]

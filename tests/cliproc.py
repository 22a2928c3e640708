"""`primectl ARGS` as a process of its own, forked from a parent that has already imported primectl's libraries.

Each `primectl` run spends most of its CPU importing modules before it does anything (~0.5 of ~0.7 CPU-s for
`plan`; ~1 CPU-s more where it imports openai to smoke-test), and the suite runs it ~450 times. `run()` asks a
per-test-process *zygote* to fork: the child is a real process with its own pid, stdin, stdout, stderr,
working directory, environment and exit code, which runs the console script itself (`runpy` on
.venv/bin/primectl, as `__main__`) and exits through the interpreter's normal shutdown. What the fork shares
with the zygote is the modules it imported once: the libraries in PRELOAD and primectl's own. That is sound
while no primectl module reads the environment, the working directory, its arguments, the clock or the terminal,
or sets up handlers, hooks or threads, when imported: tests/test_cliproc.py checks the modules' source for that
(their own top-level code and the helpers it calls) and that a forked run prints and exits as a fresh one.
docs/testing.md has the measurement.

`run()` falls back to `subprocess.run` where a fresh interpreter could behave differently: another script or
interpreter, or a call whose environment differs from the zygote's in a variable read at start-up or import
(PYTHON*, the locale, typer's, rich's, openai's and invoke's switches). Background runs that a test signals
(Ctrl-C) keep using subprocess.Popen. The zygote is stopped by pid when the test process exits, and exits by
itself when its test process goes away.
"""

from __future__ import annotations

import atexit
import functools
import io
import os
import pickle
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("primectl")
# What an operator's wide terminal gives the command in a pipe: no wrapping at 80 columns, no colour codes.
OPERATOR_ENV = {"COLUMNS": "250", "NO_COLOR": "1"}
# What every primectl run imports before its own code runs, costly to import (python -X importtime).
PRELOAD = ("typer", "typer.main", "typer.core", "typer._adapters", "typer.rich_utils", "pydantic", "pydantic.main",
           "pydantic.fields", "pydantic_core", "rich.console", "rich.table", "rich.markup", "rich.text", "jinja2",
           "yaml", "ssh2.session", "ssh2.sftp", "annotated_types", "typing_extensions", "json", "urllib.request",
           "http.client", "email.parser", "ipaddress", "shlex", "hashlib", "tempfile", "concurrent.futures",
           "concurrent.futures.thread", "importlib.metadata", "importlib.resources", "pydantic.plugin._loader",
           "pydantic.functional_serializers", "rich._emoji_codes", "typer._click.decorators", "statistics", "csv",
           "zipfile", "argparse", "getpass", "queue", "pkgutil", "tokenizers", "paramiko", "fabric", "invoke")
# Preloaded where installed: the smoke test's client (primectl's `smoke` extra).
OPTIONAL_PRELOAD = ("openai",)
# primectl's own modules are preloaded too, all but these: scripts run inside an engine's runtime, the gateway's
# (its libraries live in the hosts' runtime, not here) and the plots (matplotlib, imported when a bench plots).
NOT_PRELOADED = ("primectl.bridges", "primectl.fleet.gateway", "primectl.bench.plots")
# Variables a fresh interpreter or a preloaded module reads at start-up or import, not at run time.
_STARTUP_PREFIXES = ("PYTHON", "LC_", "TYPER_", "_TYPER_", "PYDANTIC_", "OPENAI_", "AZURE_OPENAI_", "INVOKE_")
_STARTUP_NAMES = frozenset({"LANG", "LANGUAGE", "TERMINAL_WIDTH", "GITHUB_ACTIONS", "FORCE_COLOR", "PY_COLORS",
                            "DEFER_PYDANTIC_BUILD"})


def preloaded(module: str) -> bool:
    """Whether the zygote imports this primectl module."""
    return not (module + ".").startswith(tuple(p + "." for p in NOT_PRELOADED))


def preload_primectl() -> None:
    """Import every primectl module the zygote preloads, and nothing of the packages it leaves out (pkgutil's
    walk_packages would import their __init__ to look inside)."""
    import importlib
    import pkgutil

    import primectl

    todo = [(primectl.__path__, "primectl.")]
    while todo:
        path, prefix = todo.pop()
        for info in pkgutil.iter_modules(path, prefix):
            if preloaded(info.name):
                module = importlib.import_module(info.name)
                if info.ispkg:
                    todo.append((module.__path__, info.name + "."))


def _startup_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES}


class _Zygote:
    """The client side: one zygote per test process, started on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ctl: socket.socket | None = None
        self.env: dict[str, str] = {}

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno()), str(SCRIPT)],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=None, env=self.env)
        theirs.close()
        self.ctl = ours
        atexit.register(self.stop)
        return ours

    def stop(self) -> None:
        """End the zygote (closing its socket ends it; SIGKILL by pid if it lingers)."""
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def usable(self, argv: Sequence[str], env: Mapping[str, str]) -> bool:
        """Whether a forked run behaves as a fresh `primectl` would for this call."""
        if not argv or not _script_runs_here() or Path(argv[0]).resolve() != SCRIPT.resolve():
            return False
        return _startup_env(env) == _startup_env(self.env if self.ctl is not None else os.environ)

    def run(self, argv: Sequence[str], cwd: str, env: Mapping[str, str], timeout: float | None,
            input: str | None) -> subprocess.CompletedProcess[str]:
        with self.lock:
            ctl = self.ctl or self._start()
        reply, reply_theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), -1)
        request = pickle.dumps({"argv": list(argv), "cwd": cwd, "env": dict(env)})
        try:
            socket.send_fds(ctl, [request], [reply_theirs.fileno(), in_r, out_w, err_w])
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
            reply_theirs.close()
        with reply:
            pid = int(_line(reply))
            out: list[bytes] = []
            err: list[bytes] = []
            readers = [threading.Thread(target=_drain, args=(fd, sink), daemon=True)
                       for fd, sink in ((out_r, out), (err_r, err))]
            for t in readers:
                t.start()
            if input is not None:
                threading.Thread(target=_feed, args=(in_w, input.encode()), daemon=True).start()
            reply.settimeout(timeout)
            try:
                code = int(_line(reply))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)  # as subprocess.run does on a timeout
                reply.settimeout(None)
                _line(reply)
                for t in readers:
                    t.join()
                raise subprocess.TimeoutExpired(list(argv), timeout or 0, b"".join(out), b"".join(err)) from None
            for t in readers:
                t.join()
        return subprocess.CompletedProcess(list(argv), code, _text(out), _text(err))


@functools.cache
def _script_runs_here() -> bool:
    """Whether the console script exists and runs on this interpreter (its shebang), as the zygote does."""
    try:
        return SCRIPT.read_bytes().split(b"\n", 1)[0] == b"#!" + os.fsencode(sys.executable)
    except OSError:
        return False


def _line(sock: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(64)
        if not chunk:
            raise RuntimeError("the primectl zygote went away")
        data += chunk
    return data.decode().strip()


def _drain(fd: int, sink: list[bytes]) -> None:
    with open(fd, "rb", closefd=True) as f:
        while chunk := f.read1(65536):
            sink.append(chunk)


def _feed(fd: int, data: bytes) -> None:
    with open(fd, "wb", closefd=True) as f:
        try:
            f.write(data)
        except BrokenPipeError:
            pass


def _text(chunks: list[bytes]) -> str:
    # as subprocess.run(text=True) decodes: the locale's encoding, universal newlines
    return io.TextIOWrapper(io.BytesIO(b"".join(chunks))).read()


_ZYGOTE = _Zygote()


def run(argv: Sequence[str | os.PathLike[str]], *, cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None, timeout: float | None = None,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """What `subprocess.run(argv, capture_output=True, text=True, ...)` returns, from a forked run where it
    behaves the same (see the module's docstring), else from subprocess.run itself."""
    args = [os.fspath(a) for a in argv]
    env = dict(os.environ if env is None else env)
    cwd = os.fspath(cwd) if cwd is not None else os.getcwd()
    if os.environ.get("PRIMECTL_TEST_NO_ZYGOTE") or not _ZYGOTE.usable(args, env):
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, input=input)
    return _ZYGOTE.run(args, cwd, env, timeout, input)


def primectl(*args: str | os.PathLike[str], timeout: float, env: Mapping[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    """`primectl ARGS` from the repository root with OPERATOR_ENV (and `env`) over this process's environment."""
    return run([SCRIPT, *args], cwd=REPO, env=os.environ | OPERATOR_ENV | dict(env or {}), timeout=timeout)


# -- the zygote ------------------------------------------------------------------------------------------------
def _serve(ctl: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Fork one child per request; tell each requester the child's pid, then its exit code. Returns only in a
    child (its request and stdio fds), or None once the test process has closed its end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: dict[int, socket.socket] = {}
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is ctl:
                msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 22, 4)
                if not msg:
                    return None
                reply = socket.socket(fileno=fds[0])
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    sel.close()
                    for fd in (wake_r, wake_w, ctl.detach(), reply.detach(), *(s.detach() for s in running.values())):
                        os.close(fd)
                    return pickle.loads(msg), fds[1:]
                for fd in fds[1:]:
                    os.close(fd)
                reply.sendall(f"{pid}\n".encode())
                running[pid] = reply
            else:
                os.read(wake_r, 4096)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            if (done := running.pop(pid, None)) is not None:
                try:
                    done.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                done.close()


def _become(request: dict[str, Any], stdio: list[int]) -> None:
    """Turn this forked child into `primectl ARGS` as the console script would run."""
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    runpy.run_path(request["argv"][0], run_name="__main__")


if __name__ == "__main__":
    import gc
    import importlib

    # the console script's own sys.path: its directory first, not tests/
    sys.path[0] = str(Path(sys.argv[2]).parent)
    for name in PRELOAD:
        importlib.import_module(name)
    for name in OPTIONAL_PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    preload_primectl()
    gc.freeze()  # the collector then leaves the preloaded objects alone in each child (no copy-on-write of them)
    got = _serve(socket.socket(fileno=int(sys.argv[1])))
    if got is not None:
        _become(*got)

"""probes/worker_watch.py against a real HTTP listing and a real process standing in for the worker (a `sleep`,
or a shell that writes to its stderr, a log file): it ends the process once the listing, having held it, drops it
for --grace; never before it was listed, never while the listing cannot be read; it ends a worker whose stderr
shows a Rust panic written after the watch started, never for one written before; and it leaves on SIGTERM
(primectl ends it before it drains the worker)."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

WATCH = Path(__file__).resolve().parents[1] / "primectl" / "engines" / "worker_watch.py"
MARK = '"127.0.0.1:23100/'


class Listing:
    """The frontend's /health stand-in: `body` served with `status`."""

    def __init__(self) -> None:
        self.body = b""
        self.status = 200
        self.hits = 0
        listing = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                listing.hits += 1
                self.send_response(listing.status)
                self.send_header("content-length", str(len(listing.body)))
                self.end_headers()
                self.wfile.write(listing.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/health"

    def lists(self, worker: bool) -> None:
        self.body = ('{"instances":[{"transport":{"tcp":' + (MARK + 'x/ns/backend/generate"' if worker else '"127.0.0.1:23101/y"')
                     + "}}]}").encode()


@pytest.fixture
def listing() -> Iterator[Listing]:
    served = Listing()
    yield served
    served.server.shutdown()


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    if proc.poll() is None:  # stopped by its pid, never by name
        proc.kill()
    proc.wait()


def watch(listing: Listing, pid: int, grace: float = 0.6) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-I", str(WATCH), "--pid", str(pid), "--url", listing.url,
                             "--expect", MARK, "--grace", str(grace), "--interval", "0.1"],
                            stdout=subprocess.PIPE, text=True)


def test_a_worker_the_listing_dropped_is_ended_after_the_grace(listing: Listing, worker: subprocess.Popen[bytes]) -> None:
    listing.lists(True)
    w = watch(listing, worker.pid)
    polled(listing)
    listing.lists(False)
    t0 = time.monotonic()
    assert worker.wait(timeout=10) == -signal.SIGKILL  # a failure, so that systemd's Restart=on-failure acts
    assert time.monotonic() - t0 >= 0.5
    out, _ = w.communicate(timeout=10)
    assert w.returncode == 0 and f"ending pid {worker.pid}" in out and "discovery registration is gone" in out


def test_never_listed_or_an_unreadable_listing_ends_nothing(listing: Listing, worker: subprocess.Popen[bytes]) -> None:
    listing.lists(False)  # a worker still starting: not registered yet
    w = watch(listing, worker.pid)
    time.sleep(1.5)
    assert worker.poll() is None
    listing.lists(True)
    time.sleep(0.5)
    listing.status = 503  # the frontend restarting: neither listed nor unlisted
    listing.lists(False)
    time.sleep(1.5)
    assert worker.poll() is None
    w.send_signal(signal.SIGTERM)  # what primectl does before it drains the worker
    assert w.wait(timeout=10) == 0 and worker.poll() is None


def test_it_leaves_when_the_worker_exits(listing: Listing, worker: subprocess.Popen[bytes]) -> None:
    listing.lists(True)
    w = watch(listing, worker.pid)
    worker.kill()
    worker.wait()
    assert w.wait(timeout=10) == 0


@pytest.fixture
def logged_worker(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A worker stand-in whose stderr is a log file (as both supervisors start workers), and that file."""
    log = tmp_path / "worker.log"
    with open(log, "ab") as f:
        f.write(b"thread 'old' (1) panicked at before/the/watch.rs:1:1:\n")  # a restart's earlier life
        proc = subprocess.Popen(["sleep", "60"], stdout=f, stderr=f)
    yield proc, log
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def panic_watch(pid: int, log: Path) -> subprocess.Popen[str]:
    """The watch on `pid`, once it follows `log` (on a loaded machine its start can take seconds)."""
    w = subprocess.Popen([sys.executable, "-I", str(WATCH), "--pid", str(pid), "--interval", "0.1"],
                         stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and w.poll() is None:
        try:
            if any(os.readlink(f"/proc/{w.pid}/fd/{fd}") == str(log) for fd in os.listdir(f"/proc/{w.pid}/fd")):
                return w
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the watch did not open {log} within 30 s")


def polled(listing: Listing, hits: int = 2) -> None:
    """Wait until the watch has read the listing `hits` more times (its start can take seconds under load)."""
    want = listing.hits + hits
    deadline = time.monotonic() + 30
    while listing.hits < want and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_worker_whose_engine_panicked_is_ended(logged_worker: tuple[subprocess.Popen[bytes], Path]) -> None:
    worker, log = logged_worker
    w = panic_watch(worker.pid, log)
    time.sleep(0.3)
    assert worker.poll() is None  # the panic already in the log was an earlier life's
    with open(log, "ab") as f:
        f.write(b"thread 'tokio-rt-worker' (18314) panicked at /src/engine/host_offload/tier.rs:1222:50:\n"
                b"host completions must be ticked before a later mutation\n")
    assert worker.wait(timeout=10) == -signal.SIGKILL
    out, _ = w.communicate(timeout=10)
    assert w.returncode == 0 and f"ending pid {worker.pid}" in out and "the engine panicked" in out
    assert "tier.rs:1222:50" in out


def test_an_ordinary_log_line_ends_nothing(logged_worker: tuple[subprocess.Popen[bytes], Path]) -> None:
    worker, log = logged_worker
    w = panic_watch(worker.pid, log)
    with open(log, "ab") as f:
        f.write(b"INFO request completed request_id=1\nWARN engine is busy\n")
    time.sleep(1.0)
    assert worker.poll() is None
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=10) == 0 and worker.poll() is None

"""probes/listing_watch.py against a real HTTP listing and a real process standing in for the worker (a `sleep`):
it ends the process once the listing, having held it, drops it for --grace; never before it was listed, never
while the listing cannot be read, and it leaves on SIGTERM (primectl ends it before it drains the worker)."""

from __future__ import annotations

import http.server
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

WATCH = Path(__file__).resolve().parents[1] / "primectl" / "engines" / "listing_watch.py"
MARK = '"127.0.0.1:23100/'


class Listing:
    """The frontend's /health stand-in: `body` served with `status`."""

    def __init__(self) -> None:
        self.body = b""
        self.status = 200
        listing = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
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
    time.sleep(0.5)
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

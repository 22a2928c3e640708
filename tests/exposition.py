"""Test helpers for Prometheus text exposition: a strict parser, `promtool check metrics`, and the real
node_exporter started on a free port and scraped.

prometheus_client is not in .venv, so `parse` is a small parser that refuses what Prometheus's own text parser
refuses (a sample before its family's TYPE, a family split in two, a repeated series, a bad name, label or value)
and `promtool_check` runs the real linter beside it.
"""

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

NODE_EXPORTER = Path("/usr/bin/prometheus-node-exporter")
PROMTOOL = Path("/usr/bin/promtool")

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*,?)?\}})? (\S+)(?: (-?\d+))?$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
Series = tuple[str, frozenset[tuple[str, str]]]


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def _family(name: str, types: dict[str, str]) -> str:
    """The family a sample belongs to (a histogram's _bucket, _sum and _count are its own)."""
    for suffix in ("_bucket", "_sum", "_count"):
        base = name.removesuffix(suffix)
        if base != name and types.get(base) in ("histogram", "summary"):
            return base
    return name


def parse(text: str) -> dict[Series, float]:
    """Every sample of a text exposition page, keyed by (name, labels); AssertionError on anything malformed."""
    out: dict[Series, float] = {}
    types: dict[str, str] = {}
    helps: set[str] = set()
    done: set[str] = set()  # families whose samples are over (a later sample of one would split it)
    current = ""
    for n, line in enumerate(text.splitlines(), 1):
        where = f"line {n}: {line!r}"
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                assert re.fullmatch(NAME, name), f"bad metric name, {where}"
                if parts[1] == "HELP":
                    assert name not in helps, f"second HELP, {where}"
                    helps.add(name)
                    assert "\\" not in re.sub(r"\\[\\n]", "", parts[3] if len(parts) > 3 else ""), f"bad escape, {where}"
                else:
                    assert name not in types, f"second TYPE, {where}"
                    assert name not in done and name != current, f"TYPE after the family's samples, {where}"
                    assert len(parts) == 4 and parts[3] in TYPES, f"bad TYPE, {where}"
                    types[name] = parts[3]
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample, {where}"
        name = m.group(1)
        pairs = re.findall(LABEL, m.group(2) or "")
        assert len({k for k, _ in pairs}) == len(pairs), f"repeated label, {where}"
        labels = frozenset((k, _unescape(v)) for k, v in pairs)
        family = _family(name, types)
        if family != current:
            assert family not in done, f"family {family} split in two, {where}"
            if current:
                done.add(current)
            current = family
        value = _number(m.group(7), where)  # groups: name, label block, 2 x (label, value), value, timestamp
        assert (name, labels) not in out, f"repeated series, {where}"
        out[(name, labels)] = value
    return out


def _number(text: str, where: str) -> float:
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    assert re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text), f"bad value {text!r}, {where}"
    return float(text)


def value(series: dict[Series, float], name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels`; None when there is none."""
    hits = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) <= 1, f"{len(hits)} samples of {name}{labels}"
    return hits[0] if hits else None


def labels_of(series: dict[Series, float], name: str) -> list[dict[str, str]]:
    """The label sets of every sample of `name`."""
    return [dict(ls) for n, ls in series if n == name]


def promtool_check(text: str) -> None:
    """`promtool check metrics` accepts the page (it parses it with Prometheus's own parser, then lints it)."""
    r = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"promtool check metrics: {r.stdout}{r.stderr}"


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    """The body of a GET."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def wait_for_metrics(url: str, proc: subprocess.Popen[bytes], timeout: float = 15) -> str:
    """The first /metrics page `proc` serves (AssertionError if it exits or never answers)."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"exited {proc.returncode} before serving {url}"
        try:
            return get(url)
        except OSError:
            assert time.monotonic() < deadline, f"nothing answered at {url} in {timeout:g}s"
            time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process (by its pid), SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def node_exporter(*args: str, log: Path) -> Iterator[str]:
    """The real node_exporter with `args` on a free port; yields its /metrics URL and stops it by pid after."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(NODE_EXPORTER), f"--web.listen-address=127.0.0.1:{port}", *args],
                                stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for_metrics(url, proc)
        yield url
    finally:
        stop(proc)


def prometheus_targets(config: Path, data: Path, want: int, timeout: float = 30) -> tuple[list[dict[str, Any]], str]:
    """The real Prometheus run on `config` (its data under `data`) until it lists `want` active targets or `timeout`
    passes, then stopped: (its active targets, its log)."""
    port = free_port()
    log = data.with_suffix(".log")
    proc = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={config}", f"--storage.tsdb.path={data}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=log.open("wb"))
    active: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(active) < want:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets?state=active", timeout=2) as r:
                    active = json.load(r)["data"]["activeTargets"]
            except OSError:
                continue
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return active, log.read_text()


class Gate(http.server.BaseHTTPRequestHandler):
    """A readiness gate answering `status` (a class attribute the test sets; `gate_url` serves it)."""

    status = 503

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on a loopback port in a thread while the block runs: its base URL (http://127.0.0.1:PORT)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def serve_gate() -> Iterator[str]:
    """A local readiness gate's URL while the block runs; it answers Gate.status (503 again afterwards)."""
    try:
        with serving(Gate) as base:
            yield f"{base}/v1/models/demo/ready"
    finally:
        Gate.status = 503

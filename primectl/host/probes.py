"""Readiness probes on a host: http (on the C socket module, not urllib), tcp and command probes, run once
each (`run_probe`), and when to try one that failed again (`ProbeRetry`).
"""

from __future__ import annotations

import os

from primectl.host.json_codec import json_loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from primectl.host.wire import ProbeSpec


# Stands for the release directory in command probes (the same marker the Plan uses).
RELEASE_MARK = "@release@"


TEXT_MISSING = "the answer lacks "
"""How an http probe with `expect_text` says the text was not there (the URL answered as expected otherwise)."""


Answers = dict[str, tuple[int, bytes]]
"""HTTP answers by URL, shared by the probes of one batch: each URL is fetched once per batch."""


def http_get(url: str, answers: Answers | None) -> tuple[int, bytes]:
    """Status and body (at most 8 MiB) of a GET; from `answers` when this batch already fetched `url`."""
    if answers is not None and url in answers:
        return answers[url]
    got = http_fetch(url, timeout=3)  # a not-ready /ready still says what it counts: any status comes back
    if answers is not None:
        answers[url] = got
    return got


HTTP_BODY_MAX = 8 << 20


def http_fetch(url: str, timeout: float) -> tuple[int, bytes]:
    """One HTTP/1.1 GET of a plain http:// URL with `Connection: close`: (status, body up to 8 MiB, chunked
    encoding undone); OSError or ValueError when there is no HTTP answer. Redirects are not followed: a probe
    reports what the address it names answers. Written on the C socket module because urllib costs a host agent
    ~20 ms of CPU to import, more than the rest of a probe batch; https goes through urllib."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError(f"not an http URL: {url!r}")
    if scheme.lower() == "https":
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, resp.read(HTTP_BODY_MAX)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(HTTP_BODY_MAX)
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, path = rest[:cut].rsplit("@", 1)[-1], rest[cut:].split("#", 1)[0]
    path = path if path.startswith("/") else "/" + path
    host, port = netloc, 80
    if host.startswith("["):  # [IPv6]:port
        literal, _, tail = host[1:].partition("]")
        host, port = literal, int(tail[1:]) if tail.startswith(":") else 80
    elif ":" in host:
        host, port_s = host.rsplit(":", 1)
        port = int(port_s)
    import _socket

    sock, error = None, None
    # an ASCII name as bytes: a str is encoded with the idna codec, whose import (unicodedata) costs more CPU than
    # the probe
    name = host.encode() if host.isascii() else host
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            break
        except OSError as exc:  # try the name's next address, as urllib does
            sock.close()
            sock, error = None, exc
    if sock is None:
        raise error or OSError(f"no address for {host}")
    try:
        head = f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        sock.sendall(head.encode("latin-1"))
        chunks: list[bytes] = []
        size = 0
        while size <= HTTP_BODY_MAX + 65536:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        sock.close()
    return parse_http_response(b"".join(chunks))


def parse_http_response(raw: bytes) -> tuple[int, bytes]:
    """(status, body) of a whole HTTP/1.x response read until the server closed it."""
    header, sep, body = raw.partition(b"\r\n\r\n")
    lines = header.split(b"\r\n")
    words = lines[0].split(None, 2)
    if not sep or len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        raise ValueError(f"not an HTTP answer: {raw[:60]!r}")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        out, rest = [], body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if n == 0:
                break
            out.append(rest[:n])
            rest = rest[n + 2:]
        body = b"".join(out)
    elif (length := fields.get(b"content-length", b"")).isdigit():
        body = body[:int(length)]
    return int(words[1]), body[:HTTP_BODY_MAX]


def json_at(body: bytes, path: str) -> Any:
    """The value at a dotted path of a JSON document (None when absent or not JSON)."""
    try:
        node: Any = json_loads(body)
    except ValueError:
        return None
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def run_probe(p: ProbeSpec, release: str, answers: Answers | None = None) -> tuple[bool, str]:
    """Run one readiness probe once: (passed, what it saw). Command probes get `release` for RELEASE_MARK;
    http probes in one batch share `answers` (the listing probes of every worker read one URL)."""
    kind = p["kind"]
    try:
        if kind == "http":
            status, body = http_get(str(p["url"]), answers)
            if status == p.get("expect_status", 200) and p.get("expect_text"):
                text = str(p["expect_text"])
                found = text.encode() in body
                return found, (f"HTTP {status}, lists {text}" if found else f"HTTP {status}, {TEXT_MISSING}{text}")
            if p.get("json_path") and (status == p.get("expect_status", 200) or body):
                seen = json_at(body, str(p["json_path"]))
                return seen == p.get("json_expect"), f"HTTP {status}, {p['json_path']} = {seen!r} (want {p.get('json_expect')!r})"
            return status == p.get("expect_status", 200), f"HTTP {status}"
        if kind == "tcp":
            import socket

            with socket.create_connection((str(p["host"]), int(p["port"] or 0)), timeout=3):
                return True, f"tcp {p['host']}:{p['port']} open"
        import subprocess

        command = [c.replace(RELEASE_MARK, release) for c in p.get("command") or []]
        try:
            r = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired as exc:
            return False, f"{kind} probe: {exc}"
        text = r.stdout if r.returncode == 0 and r.stdout.strip() else r.stderr or r.stdout
        last = text.strip().splitlines()[-1:] or [""]
        return r.returncode == 0, f"exit {r.returncode}: {last[0][:120]}"
    except (OSError, ValueError) as exc:
        return False, f"{kind} probe: {exc}"


def probe_once(p: ProbeSpec, workdir: str = "", answers: Answers | None = None) -> tuple[bool, str]:
    """Run one probe against the host's current release: (passed, what it saw)."""
    return run_probe(p, os.path.realpath(os.path.join(workdir, "current")), answers)


class ProbeRetry:
    """When to probe each service that is not ready yet again.

    A service just started is rarely ready on the first try: retry soon (0.05 s) and grow the wait
    1.5x per miss up to its probe's interval_s. Doubling overshot readiness by up to the last wait (a
    service ready at 0.8 s was seen at 1.55 s); 1.5x bounds that at a third, for a few more cheap probes.
    """

    def __init__(self, probes: Mapping[str, ProbeSpec]):
        self.cap = {n: max(0.05, float(p.get("interval_s", 0.5))) for n, p in probes.items()}
        self.delay = {n: 0.05 for n in probes}
        self.next_try = {n: 0.0 for n in probes}

    def due(self, name: str, now: float) -> bool:
        """Whether `name` is to be probed at `now`."""
        return now >= self.next_try[name]

    def next_due(self, names: Iterable[str]) -> float:
        """The earliest time one of `names` is to be probed."""
        return min((self.next_try[n] for n in names), default=float("inf"))

    def missed(self, name: str, now: float) -> None:
        """`name`'s probe at `now` did not pass: schedule the next one."""
        self.next_try[name] = now + self.delay[name]
        self.delay[name] = min(self.delay[name] * 1.5, self.cap[name])

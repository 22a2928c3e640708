#!/usr/bin/env python3
"""What HAProxy's buffer size costs a request, and what keeping its buffers (`-dMglobal`) gives back.

primectl sizes HAProxy's buffer (tune.bufsize) to hold a whole prompt at the model's context limit, so that a
request refused before its first byte can be sent again (primectl/components/haproxy.py). This starts a minimal
SSE server (one event, then [DONE]) and HAProxy instances in front of it with the balancer's request options
(`http-buffer-request`, `http-no-delay`, `retry-on`) and:

- the default buffer (16 KiB);
- `--bufsize` (4 MiB by default: the demo fleet's 524,288-token context), as Debian's build runs it;
- the same with `-dMglobal`, as primectl starts it;

then sends `--requests` sequential streamed requests on one kept-alive connection to each (interleaved) and
prints the time to the first event at p50 and p99, what each adds to the server alone, and the ratio of the
large buffer's added p50 without and with `-dMglobal`.

It binds loopback ports, so it refuses to run outside a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/haproxy_buffers.py'
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from primectl.components.haproxy import HAPROXY_BINARY, keep_buffers  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

RUN_HINT = "unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/haproxy_buffers.py'"
BODY = b'{"model":"demo","messages":[{"role":"user","content":"hi"}],"stream":true}'
EVENT = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
CONFIG = """global
    maxconn 256
    tune.bufsize {bufsize}
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 3
    retry-on conn-failure empty-response 500 502 503 504
    option http-buffer-request
    option http-no-delay
    option abortonclose
frontend openai
    bind 127.0.0.1:{port}
    default_backend frontends
backend frontends
    server s1 127.0.0.1:{upstream}
"""


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Each request: headers, one SSE event, then (2 ms later) [DONE], chunked."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
            await writer.drain()
            await asyncio.sleep(0.002)
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def serve(port: int) -> None:
    """The SSE server, in a daemon thread."""
    async def main() -> None:
        server = await asyncio.start_server(_answer, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()


def first_event_ms(conn: socket.socket) -> float:
    """One streamed request on `conn`: milliseconds until its first event arrived (the rest is read too)."""
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
    t0 = time.perf_counter()
    conn.sendall(request)
    buf, first = b"", None
    while not buf.endswith(b"0\r\n\r\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the connection closed mid-answer")
        buf += chunk
        if first is None and b"data:" in buf:
            first = (time.perf_counter() - t0) * 1000
    assert first is not None
    return first


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--bufsize", type=int, default=4 << 20)
    ap.add_argument("--port", type=int, default=19_900)
    args = ap.parse_args()
    problem = netns_problem(RUN_HINT)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    serve(args.port)
    wait_listening(args.port)
    paths: dict[str, int] = {"server alone": args.port}
    variants = [("default buffer (16 KiB)", 16 << 10, []),
                (f"{args.bufsize >> 10} KiB buffer", args.bufsize, []),
                (f"{args.bufsize >> 10} KiB buffer, -dMglobal", args.bufsize, keep_buffers(args.bufsize))]
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="primectl-haproxy-bench-") as tmp:
        try:
            for i, (name, bufsize, flags) in enumerate(variants, 1):
                config = Path(tmp) / f"{i}.cfg"
                config.write_text(CONFIG.format(bufsize=bufsize, port=args.port + i, upstream=args.port))
                procs.append(subprocess.Popen([HAPROXY_BINARY, "-db", *flags, "-f", str(config)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                paths[name] = args.port + i
            for port in paths.values():
                wait_listening(port)
            conns = {name: socket.create_connection(("127.0.0.1", port)) for name, port in paths.items()}
            times: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(args.requests):
                for name, conn in conns.items():
                    times[name].append(first_event_ms(conn))
        finally:
            for p in procs:  # started here, stopped by pid
                p.terminate()
                p.wait(10)
    base = statistics.median(times["server alone"])
    print(f"HAProxy buffers: {args.requests} sequential streamed requests per path (interleaved), one connection each")
    print(f"  {'path':34} {'p50':>8} {'p99':>8} {'added p50':>10}")
    added = {}
    for name, values in times.items():
        values.sort()
        p50, p99 = statistics.median(values), values[int(len(values) * 0.99)]
        added[name] = p50 - base
        print(f"  {name:34} {p50:7.2f}ms {p99:7.2f}ms {added[name]:9.2f}ms")
    large, kept = (added[variants[1][0]], added[variants[2][0]])
    print(f"  the large buffer's added p50 without / with -dMglobal: {large / max(kept, 1e-3):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

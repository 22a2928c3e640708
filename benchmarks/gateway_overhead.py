#!/usr/bin/env python3
"""What the fleet gateway adds to a request, side by side with LiteLLM's proxy, in one run.

Brings a copy of the demo fleet up with all weight on site a (primectl.bench.fleet_copy), starts LiteLLM's proxy
(its own venv, .venv-litellm: `make litellm-tools`) with one model pointing at site a's frontend and a master
key (it refuses to start without one), and drives four paths to the same Dynamo frontend with the openai client:

- direct: site a's frontend;
- replica: one primectl gateway replica (key check, admission, usage, SSE relay);
- edge: the fleet's public endpoint (HAProxy in front of the replicas);
- litellm: LiteLLM's proxy (one uvicorn worker).

It prints, per path: TTFT p50 and p99 of `--requests` sequential short streamed chats (the paths interleaved,
so drift hits all alike) and what each proxy adds to direct's; the proxy's CPU time per streamed chunk
(utime + stime of its processes over the run, from /proc); and requests per CPU-second of the proxy under
`--concurrency` closed-loop streams for `--seconds`, which is the largest rate one core of it sustains when
the proxy is what runs out of CPU. The last line is the gateway's rate over LiteLLM's.

It binds loopback ports, so it refuses to run outside a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/gateway_overhead.py'

Goals (issue 39): added TTFT p50 <= 2 ms and p99 <= 10 ms; at least 3x LiteLLM's rate per core.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from primectl.bench.fleet_copy import write_fleet  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python "
            ".venv/bin/python benchmarks/gateway_overhead.py'")
LITELLM = REPO / ".venv-litellm" / "bin" / "litellm"
TICKS = os.sysconf("SC_CLK_TCK")


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PRIMECTL, *map(str, args)], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env=os.environ | {"NO_COLOR": "1"})


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes and their live children."""
    total = 0
    seen = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            todo += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            continue
    return total / TICKS


def pid_listening(port: int) -> int:
    """The pid of the process that listens on 127.0.0.1:port (from ss)."""
    out = subprocess.run(["ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True).stdout
    return int(out.split("pid=")[1].split(",")[0])


def one_stream(client, model: str) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """TTFT (s) and chunks of one short streamed chat."""
    t0 = time.perf_counter()
    ttft = 0.0
    chunks = 0
    for ch in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=16, stream=True):
        if not ttft and ch.choices and ch.choices[0].delta.content:
            ttft = time.perf_counter() - t0
        chunks += 1
    return ttft, chunks


def closed_loop(make, model: str, concurrency: int, seconds: float) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """Requests completed and chunks streamed by `concurrency` clients in a loop for `seconds`."""
    done = [0, 0]
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def loop() -> None:
        c = make()
        while time.monotonic() < stop:
            try:
                _, chunks = one_stream(c, model)
            except Exception:
                continue
            with lock:
                done[0] += 1
                done[1] += chunks

    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done[0], done[1]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    from openai import OpenAI

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--port", type=int, default=19_900)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    refusal = netns_problem(RUN_HINT)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    if not LITELLM.exists():
        print(f"no LiteLLM at {LITELLM}: run `make litellm-tools`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="primectl-gw-bench-") as tmp:
        fleet = write_fleet(Path(tmp), port=args.port, name="overhead", capacity=1024, block=16, weights=(1, 0))
        up = cli("up", fleet.recipe)
        if up.returncode != 0:
            print(up.stdout + up.stderr, file=sys.stderr)
            return 1
        litellm: subprocess.Popen[bytes] | None = None
        try:
            key = cli("keys", "create", fleet.recipe, "--team", "bench").stdout.strip()
            direct = f"http://127.0.0.1:{args.port + 50}"
            lite_port = args.port + 90
            config = Path(tmp) / "litellm.yaml"
            master = "sk-" + secrets.token_hex(24)  # LiteLLM's proxy refuses to start without a master key
            config.write_text(json.dumps({"model_list": [{"model_name": "demo", "litellm_params": {
                "model": "openai/demo", "api_base": f"{direct}/v1", "api_key": "none"}}],
                "litellm_settings": {"drop_params": True}, "general_settings": {"master_key": master}}))
            lite_log = Path(tmp) / "litellm.log"
            litellm = subprocess.Popen(
                [str(LITELLM), "--config", str(config), "--host", "127.0.0.1", "--port", str(lite_port),
                 "--num_workers", "1"], stdout=lite_log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
                env=os.environ | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"})
            deadline = time.monotonic() + 600  # LiteLLM imports for minutes on a busy 2-core machine
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{lite_port}/health/liveliness", timeout=2).read()
                    break
                except OSError:
                    if time.monotonic() > deadline or litellm.poll() is not None:
                        print("LiteLLM's proxy did not start:\n" + lite_log.read_text()[-3000:], file=sys.stderr)
                        return 1
                    time.sleep(0.5)
            paths = {"direct": (f"{direct}/v1", "none"), "replica": (f"{fleet.replicas[0]}/v1", key),
                     "edge": (f"{fleet.edge}/v1", key), "litellm": (f"http://127.0.0.1:{lite_port}/v1", master)}
            clients = {n: OpenAI(base_url=u, api_key=k, max_retries=0, timeout=60) for n, (u, k) in paths.items()}
            for c in clients.values():  # warm every path (connections, caches) before measuring
                for _ in range(5):
                    one_stream(c, "demo")
            ttft: dict[str, list[float]] = {n: [] for n in paths}
            for _ in range(args.requests):
                for n, c in clients.items():
                    ttft[n].append(one_stream(c, "demo")[0])
            procs = {"replica": [pid_listening(args.port + 10)], "edge": [pid_listening(args.port + 10),
                     pid_listening(args.port + 11), pid_listening(args.port)], "litellm": [litellm.pid]}
            rates: dict[str, dict[str, float]] = {}
            for n in ("replica", "litellm"):
                before = cpu_seconds(procs[n])
                done, chunks = closed_loop(lambda n=n: OpenAI(base_url=paths[n][0], api_key=paths[n][1],  # type: ignore[misc]
                                                              max_retries=0, timeout=60),
                                           "demo", args.concurrency, args.seconds)
                cpu = cpu_seconds(procs[n]) - before
                rates[n] = {"requests": done, "chunks": chunks, "cpu_s": cpu,
                            "req_per_cpu_s": done / cpu if cpu else 0.0,
                            "cpu_ms_per_chunk": 1000 * cpu / chunks if chunks else 0.0}
            base50, base99 = pct(ttft["direct"], 0.5), pct(ttft["direct"], 0.99)
            print(f"gateway overhead: {args.requests} sequential short streams per path (interleaved), then "
                  f"{args.concurrency} closed-loop streams for {args.seconds:g} s per proxy")
            print(f"  {'path':8} {'TTFT p50':>9} {'p99':>9} {'added p50':>10} {'added p99':>10}")
            for n in paths:
                p50, p99 = pct(ttft[n], 0.5), pct(ttft[n], 0.99)
                print(f"  {n:8} {p50 * 1000:8.1f}ms {p99 * 1000:8.1f}ms {(p50 - base50) * 1000:9.1f}ms "
                      f"{(p99 - base99) * 1000:9.1f}ms")
            for n, r in rates.items():
                print(f"  {n:8} {r['requests']} requests, {r['cpu_ms_per_chunk']:.3f} ms CPU per chunk, "
                      f"{r['req_per_cpu_s']:.0f} requests per CPU-second")
            ratio = rates["replica"]["req_per_cpu_s"] / rates["litellm"]["req_per_cpu_s"] if rates["litellm"][
                "req_per_cpu_s"] else 0.0
            print(f"  gateway replica / LiteLLM requests per CPU-second: {ratio:.1f}x")
            if args.json:
                args.json.write_text(json.dumps({"ttft": {n: statistics.quantiles(v, n=100) for n, v in ttft.items()},
                                                 "rates": rates, "ratio": ratio}, indent=2))
            return 0
        finally:
            if litellm is not None:
                litellm.send_signal(signal.SIGTERM)
                try:
                    litellm.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    litellm.kill()
            cli("down", fleet.recipe)


if __name__ == "__main__":
    sys.exit(main())

"""A gateway replica's /metrics (primectl/fleet/gateway/metrics.py): Prometheus text exposition 0.0.4 written by
hand, checked with a strict parser (tests/exposition.py) and `promtool check metrics` (Prometheus's own parser and
lint).

The replica runs on the host runtime's Python (aiohttp), which .venv does not have: the driver below imports the
replica's package there, from the files the plan ships (`fleet_gateway`), answers requests through the replica's
own middleware on a real aiohttp server (handlers that answer as `proxy` does: 401, 429, a deployment's JSON, a
stream) and prints the page it serves at /metrics.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from primectl.fleet.plan import REPLICA_DIR, replica_files
from tests.exposition import PROMTOOL, labels_of, parse, promtool_check, value

REPO = Path(__file__).resolve().parents[1]


def _runtime_python() -> Path | None:
    env = os.environ.get("PRIMECTL_RUNTIME_PYTHON")
    candidate = Path(env) if env else REPO / ".runtime" / "bin" / "python"
    return candidate if candidate.exists() else None


RUNTIME = _runtime_python()
pytestmark = pytest.mark.skipif(RUNTIME is None or not PROMTOOL.exists(),
                                reason="needs the host runtime (PRIMECTL_RUNTIME_PYTHON or .runtime) and promtool")

DRIVER = r'''
import asyncio, importlib.util, sys, time
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

sys.path.insert(0, sys.argv[1])
from fleet_gateway.admission import Deployment, Pool
from fleet_gateway.metrics import Metrics


def deployment(name, role, capacity):
    pool = Pool(f"/admit/{name}/", capacity, 4, spare=True)
    return Deployment(name, "http://" + role, 1, role, pool, Pool(pool.path, capacity, 4))


deps = [deployment("site-a", "primary", 8), deployment('odd"site\\b', "spill", 4)]
deps[0].pool.held, deps[0].pool.inflight, deps[1].open_since = {0: 4}, 3, time.time()
m = Metrics(deps)

async def gone(request):  # what aiohttp does to a handler whose client closed its connection
    raise asyncio.CancelledError()

async def unauthorized(request):
    return web.json_response({"error": {}}, status=401)

async def full(request):
    return web.json_response({"error": {}}, status=429)

async def answered(request):
    request["deployment"] = "site-a"
    return web.json_response({"choices": []})

async def stream(request):
    request["deployment"] = "site-a"
    resp = web.StreamResponse()
    await resp.prepare(request)
    await resp.write(b"data: {}\n\n")
    request["first_event"] = time.monotonic()
    await asyncio.sleep(0.02)
    await resp.write(b"data: [DONE]\n\n")
    return resp

async def main():
    app = web.Application(middlewares=[m.middleware])
    app.router.add_post("/v1/unauthorized", unauthorized)
    app.router.add_post("/v1/gone", gone)
    app.router.add_post("/v1/full", full)
    app.router.add_post("/v1/answered", answered)
    app.router.add_post("/v1/stream", stream)
    app.router.add_get("/-/ready", answered)
    async with TestServer(app) as server, ClientSession() as s:
        for path in ["/v1/unauthorized", "/v1/full", "/v1/full", "/v1/answered", "/v1/stream", "/v1/stream"]:
            async with s.post(server.make_url(path)) as r:
                await r.read()
        try:
            async with s.post(server.make_url("/v1/gone")) as r:
                await r.read()
        except Exception:
            pass
        async with s.get(server.make_url("/-/ready")) as r:
            await r.read()
    m.inc("failovers_total", "site-a")
    m.inc("breaker_trips_total", 'odd"site\\b')
    m.inc("lease_keepalive_failures_total")
    sys.stdout.write(m.text())

asyncio.run(main())
'''


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> str:
    assert RUNTIME is not None
    release = tmp_path_factory.mktemp("release")
    for spec in replica_files():
        (release / spec.path).parent.mkdir(parents=True, exist_ok=True)
        (release / spec.path).write_text(spec.content)
    proc = subprocess.run([str(RUNTIME), "-I", "-c", DRIVER, str(release / REPLICA_DIR)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_prometheus_parses_and_lints_the_page(page: str) -> None:
    promtool_check(page)
    parse(page)


def test_requests_are_counted_by_status_and_answering_deployment(page: str) -> None:
    series = parse(page)
    req = "primectl_gateway_requests_total"
    assert value(series, req, code="401") == 1
    assert {"code": "401"} in labels_of(series, req)  # the gateway answered it: no deployment label
    assert value(series, req, code="429") == 2
    assert value(series, req, code="200", deployment="site-a") == 3
    assert value(series, req, code="499") == 1  # a client that left is not a server error
    assert not [labels for labels in labels_of(series, req) if labels["code"] == "500"]
    assert sum(v for (n, _), v in series.items() if n == req) == 7  # /-/ready is not an API request
    assert all("code" in labels for labels in labels_of(series, req))
    assert value(series, "primectl_gateway_throttled_total") == 2
    assert value(series, "primectl_gateway_unauthorized_total") == 1
    assert value(series, "primectl_gateway_lease_keepalive_failures_total") == 1


def test_per_deployment_counters_start_at_zero_and_label_values_are_escaped(page: str) -> None:
    series = parse(page)
    assert value(series, "primectl_gateway_failovers_total", deployment="site-a") == 1
    assert value(series, "primectl_gateway_failovers_total", deployment='odd"site\\b') == 0
    assert value(series, "primectl_gateway_breaker_trips_total", deployment='odd"site\\b') == 1
    assert value(series, "primectl_gateway_continuations_total", deployment="site-a") == 0


def test_breaker_and_admission_gauges(page: str) -> None:
    series = parse(page)
    assert value(series, "primectl_gateway_breaker_open", deployment="site-a") == 0
    assert value(series, "primectl_gateway_breaker_open", deployment='odd"site\\b') == 1
    assert value(series, "primectl_gateway_inflight_requests", deployment="site-a") == 3
    assert value(series, "primectl_gateway_granted_slots", deployment="site-a") == 4
    assert value(series, "primectl_gateway_capacity_slots", deployment='odd"site\\b') == 4


def test_histograms_hold_the_streams_first_event_and_every_requests_duration(page: str) -> None:
    series = parse(page)
    ttft = "primectl_gateway_time_to_first_event_seconds"
    assert value(series, f"{ttft}_count", deployment="site-a") == 2  # the two streams
    assert value(series, f"{ttft}_bucket", deployment="site-a", le="60") == 2
    les = [dict(ls)["le"] for n, ls in series if n == f"{ttft}_bucket"]
    assert les[0] == "0.001" and les[-1] == "+Inf"
    dur = "primectl_gateway_request_duration_seconds"
    assert value(series, f"{dur}_count", deployment="site-a") == 3
    assert sum(v for (n, _), v in series.items() if n == f"{dur}_count") == 7
    streamed = value(series, f"{dur}_sum", deployment="site-a")
    assert streamed is not None and streamed >= 0.04  # both streams waited 20 ms between their events
    assert value(series, f"{dur}_bucket", deployment="site-a", le="0.005") is not None

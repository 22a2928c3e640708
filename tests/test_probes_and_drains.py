"""How the host agent judges an http probe, and what a recorded drain or a plan hash keeps across versions.

A real HTTP server on 127.0.0.1 answers the probes (make test runs the suite inside `unshare --net`).
"""

from __future__ import annotations

import hashlib
import http.server
import json
from collections.abc import Iterator

import pytest

from primectl.host.probes import http_fetch, run_probe
from primectl.host.supervisor import inflight
from primectl.plan.model import Drain, Probe, Service
from primectl.rollout.strategy import recorded_drain
from tests.exposition import serving

ANSWERS = {  # path -> (status, body): what Dynamo's /ready says before and after the model is ready
    "/ready-503": (503, {"ready": False, "namespaces": {"ns": {"worker_types": {"prefill": {"workers": 2}}}}}),
    "/ready-404": (404, {"message": "Model not found"}),
    "/ready-200": (200, {"ready": True, "namespaces": {"ns": {"worker_types": {"prefill": {"workers": 2}}}}}),
}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/chunked":  # how a streaming server (hyper, axum) answers: no length, chunks
                self.send_response(200)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for part in (b'{"instances": ', b'["dyn://ns.decode.generate-1a"]', b"}"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
                return
            if self.path == "/metrics":
                data = b"# TYPE inflight gauge\ninflight{model=\"a\"} 2\ninflight{model=\"b\"} 1\nother 7\n"
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            status, body = ANSWERS[self.path]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as base:
        yield base


def _count(url: str, want: int) -> dict[str, object]:
    return {"kind": "http", "url": url, "json_path": "namespaces.ns.worker_types.prefill.workers", "json_expect": want}


def test_a_count_probe_reads_a_not_ready_answer_but_only_its_count(server: str) -> None:
    # a renamed model's new generation: prefill has registered, decode not yet, so /ready is 503 with the count
    assert run_probe(_count(f"{server}/ready-503", 2), "") == (True, "HTTP 503, namespaces.ns.worker_types.prefill.workers = 2 (want 2)")  # type: ignore[arg-type]
    assert run_probe(_count(f"{server}/ready-503", 3), "")[0] is False  # type: ignore[arg-type]
    ok, detail = run_probe(_count(f"{server}/ready-404", 2), "")  # type: ignore[arg-type]
    assert not ok and detail.startswith("HTTP 404"), detail
    assert run_probe(_count(f"{server}/ready-200", 2), "")[0] is True  # type: ignore[arg-type]


def test_a_status_probe_still_wants_its_status(server: str) -> None:
    assert run_probe({"kind": "http", "url": f"{server}/ready-503"}, "") == (False, "HTTP 503")
    assert run_probe({"kind": "http", "url": f"{server}/ready-200"}, "") == (True, "HTTP 200")


def test_a_balancer_drain_recorded_without_its_address_takes_it_from_the_readiness_url() -> None:
    record = {"unit": "u", "ready": {"kind": "http", "url": "http://127.0.0.1:8100/health"},
              "drain": {"how": "balancer", "socket": "/s", "server": "frontends/frontend-0", "timeout_s": 60}}
    assert recorded_drain(record)["address"] == "127.0.0.1:8100"  # type: ignore[arg-type,index]
    signal = {"how": "signal", "timeout_s": 60}
    assert recorded_drain({**record, "drain": signal}) == signal  # type: ignore[arg-type]


def test_a_drain_without_an_address_hashes_as_before_the_field_existed() -> None:
    def svc(drain: Drain) -> Service:
        return Service(name="w", role="decode", component="c", host="h", address="127.0.0.1", argv=["x"], env={},
                       ready=Probe(kind="tcp", host="127.0.0.1", port=1), drain=drain)

    plain = svc(Drain(how="signal", timeout_s=60))
    # the hash of a drain that never sets `address` is the hash of the same dict without the key

    blob = json.dumps({k: v for k, v in plain.model_dump(mode="json")["drain"].items() if k != "address"},
                      sort_keys=True, separators=(",", ":"))
    assert plain.hashes()["fields"]["drain"] == hashlib.sha256(blob.encode()).hexdigest()[:16]
    moved = svc(Drain(how="balancer", server="b/s", address="127.0.0.1:8200", timeout_s=60))
    assert moved.hashes()["fields"]["drain"] != svc(Drain(how="balancer", server="b/s", timeout_s=60)).hashes()["fields"]["drain"]


def test_the_agents_http_client_undoes_chunked_answers_and_reads_lengths(server: str) -> None:
    status, body = http_fetch(f"{server}/chunked", timeout=3)
    assert (status, json.loads(body)) == (200, {"instances": ["dyn://ns.decode.generate-1a"]})
    listed = {"kind": "http", "url": f"{server}/chunked", "expect_text": "dyn://ns.decode.generate-1a"}
    assert run_probe(listed, "") == (True, "HTTP 200, lists dyn://ns.decode.generate-1a")  # type: ignore[arg-type]
    assert http_fetch(f"{server}/ready-404", timeout=3) == (404, json.dumps(ANSWERS["/ready-404"][1]).encode())
    drain = {"inflight_url": f"{server}/metrics", "inflight_metrics": ["inflight"]}
    assert inflight(drain) == 3  # type: ignore[arg-type]
    assert inflight(drain | {"inflight_url": f"{server}/ready-404"}) is None  # type: ignore[arg-type]


def test_a_probe_of_a_closed_port_says_so() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        ok, detail = run_probe({"kind": "http", "url": f"http://127.0.0.1:{port}/health"}, "")  # type: ignore[typeddict-item]
    assert not ok and "Connection refused" in detail, detail
    ok, detail = run_probe({"kind": "http", "url": "ftp://127.0.0.1/x"}, "")  # type: ignore[typeddict-item]
    assert not ok and "not an http URL" in detail, detail

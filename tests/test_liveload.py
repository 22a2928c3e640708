"""The live-change tests' load generator: a stop() that comes at once still has every client send a request."""

from __future__ import annotations

from primectl.bench.liveload import LiveLoad
from tests.exposition import free_port


def test_a_load_stopped_at_once_has_sent_one_request_per_client() -> None:
    load = LiveLoad(f"http://127.0.0.1:{free_port()}", "m", clients=3, timeout_s=5)
    report = load.start().stop()
    assert {o.client for o in report.outcomes} == {0, 1, 2}
    assert not any(o.ok for o in report.outcomes)
    assert all("Connection" in o.detail for o in report.outcomes), report.outcomes

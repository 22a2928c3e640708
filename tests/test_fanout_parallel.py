"""`parallel`: every host's call runs at once, however many hosts a rack holds."""

from __future__ import annotations

import threading

import pytest

from primectl.deploy.fanout import parallel


def test_seventy_two_hosts_all_wait_at_the_same_time() -> None:
    # each call blocks until all 72 are in flight, as 72 start_waits do while their engines load; a pool
    # smaller than the host count would leave some waiting for a free thread, and the barrier would break
    barrier = threading.Barrier(72, timeout=10)
    results = parallel(lambda i: barrier.wait() >= 0, range(72))
    assert all(r is True for r in results.values()), [r for r in results.values() if r is not True][:1]


def test_each_failure_is_returned_for_its_own_host() -> None:
    def call(host: str) -> str:
        if host == "h2":
            raise OSError("no route to host")
        return f"{host} ok"

    results = parallel(call, ["h1", "h2", "h3"])
    assert results["h1"] == "h1 ok" and results["h3"] == "h3 ok"
    assert isinstance(results["h2"], OSError) and "no route" in str(results["h2"])


@pytest.mark.parametrize("items", [[], ["only"]])
def test_no_host_and_one_host(items: list[str]) -> None:
    assert parallel(str.upper, items) == {i: i.upper() for i in items}


def test_a_fan_out_inside_a_fan_out_completes() -> None:
    # each outer call fans out again (a head node reaching its trays, say); the inner calls must not wait for
    # threads the outer ones hold
    results = parallel(lambda rack: sorted(parallel(lambda tray: f"{rack}/{tray}", range(3)).values()), ["r1", "r2"])
    assert results == {"r1": ["r1/0", "r1/1", "r1/2"], "r2": ["r2/0", "r2/1", "r2/2"]}


def test_threads_are_reused_from_one_fan_out_to_the_next() -> None:
    def thread_name(_: int) -> str:
        return threading.current_thread().name

    used: set[str] = set()
    for _ in range(20):  # an up fans out this way, once per step
        used |= set(parallel(thread_name, range(8)).values())
    assert len(used) < 40, len(used)  # a pool per fan-out would have started 160 threads

"""Run one function over many hosts at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# One thread per host, up to this many: a call can hold its thread for as long as a service takes to become
# ready (minutes for a real engine), so a smaller pool would start the hosts beyond it only after the first
# ones are up, several starts' time in a row.
MAX_AT_ONCE = 1024


def parallel(fn: Callable[[T], R], items: Iterable[T]) -> dict[T, R | BaseException]:
    """Run fn over items on threads; each result or the exception it raised."""
    items = list(items)
    out: dict[T, R | BaseException] = {}
    if not items:
        return out
    pool = ThreadPoolExecutor(max_workers=min(MAX_AT_ONCE, len(items)))
    try:
        futures = {item: pool.submit(fn, item) for item in items}
        for item, fut in futures.items():
            try:
                out[item] = fut.result()
            except KeyboardInterrupt:
                raise  # the operator's Ctrl-C, not a host's failure
            except BaseException as exc:  # collected and reported per host
                out[item] = exc
    finally:
        # On Ctrl-C do not wait for calls still running on hosts: rollback starts at once.
        pool.shutdown(wait=False, cancel_futures=True)
    return out

"""Run one function over many hosts at once."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# One thread per host, up to this many: a call can hold its thread for as long as a service takes to become
# ready (minutes for a real engine), so a smaller pool would start the hosts beyond it only after the first
# ones are up, several starts' time in a row.
MAX_AT_ONCE = 1024
THREAD_PREFIX = "fanout"

# The threads are kept between calls: an `up` fans out seven times or more, and starting a thread per host
# each time cost the controller more CPU than the calls it made on most hosts.
_shared: ThreadPoolExecutor | None = None
_shared_lock = threading.Lock()


def _forget_pool() -> None:
    global _shared
    _shared = None  # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_forget_pool)


def _pool() -> ThreadPoolExecutor:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ThreadPoolExecutor(max_workers=MAX_AT_ONCE, thread_name_prefix=THREAD_PREFIX)
        return _shared


def parallel(fn: Callable[[T], R], items: Iterable[T]) -> dict[T, R | BaseException]:
    """Run fn over items on threads; each result or the exception it raised."""
    items = list(items)
    out: dict[T, R | BaseException] = {}
    if not items:
        return out
    # a call made from one of the shared threads gets threads of its own: waiting on the shared pool from
    # inside it could leave every thread waiting for one
    nested = threading.current_thread().name.startswith(THREAD_PREFIX)
    pool = ThreadPoolExecutor(max_workers=min(MAX_AT_ONCE, len(items))) if nested else _pool()
    futures: dict[T, Future[R]] = {}
    try:
        for item in items:
            futures[item] = pool.submit(fn, item)
        for item, fut in futures.items():
            try:
                out[item] = fut.result()
            except KeyboardInterrupt:
                raise  # the operator's Ctrl-C, not a host's failure
            except BaseException as exc:  # collected and reported per host
                out[item] = exc
    finally:
        # On Ctrl-C do not wait for calls still running on hosts: rollback starts at once, and calls not
        # started yet never start.
        for fut in futures.values():
            fut.cancel()
        if nested:
            pool.shutdown(wait=False)
    return out

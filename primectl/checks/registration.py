"""Which running workers the frontend no longer lists, read from the controller over HTTP.

A worker whose discovery entry is gone keeps running and passes its own health probe, but the frontend routes
nothing to it; with one worker of a role, the model is not served at all. Dynamo 1.6.1's file store drops an
entry whose owner has not refreshed it for 10 s (a process stalled that long: a busy disk, a paused VM), and the
owner never writes it again. `status` names such a worker and `up` restarts it, so it registers again.
"""

from __future__ import annotations

import dataclasses
import time
import urllib.request
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primectl.deploy.status import ServiceStatus
    from primectl.plan.model import Plan

LOST = "the frontend does not list it: its discovery registration is gone"
CONFIRM_S = 1.0
"""How long to wait before reading the listing again: a worker that has just registered is not in it yet."""


def _listing(plan: Plan) -> str | None:
    if not plan.worker_listing_url:
        return None
    try:
        with urllib.request.urlopen(plan.worker_listing_url, timeout=5) as resp:
            return str(resp.read(8 << 20).decode("utf-8", "replace"))
    except OSError:  # the frontend is down or restarting: nothing to compare with
        return None


def _missing(plan: Plan, names: Iterable[str]) -> list[str] | None:
    text = _listing(plan)
    if text is None:
        return None
    out = []
    for name in names:
        marker = plan.service(name).listed_as
        if marker and marker not in text:
            out.append(name)
    return out


def unlisted(plan: Plan, names: Iterable[str], confirm_s: float = CONFIRM_S) -> list[str] | None:
    """Those of `names` (workers that run and pass their own probe) that the frontend's listing lacks, twice
    `confirm_s` apart; None when the listing cannot be read."""
    first = _missing(plan, [n for n in names if plan.service(n).listed_as])
    if not first:
        return first
    time.sleep(confirm_s)
    second = _missing(plan, first)
    return None if second is None else [n for n in first if n in second]


def mark_unlisted(plan: Plan, rows: list[ServiceStatus]) -> list[ServiceStatus]:
    """`status` rows with the workers that run and pass their own probe but that the frontend does not list
    marked not ready, saying so."""
    lost = set(unlisted(plan, [r.service for r in rows if r.healthy]) or [])
    return [dataclasses.replace(r, ready=False, detail=f"{r.detail}, but {LOST} (`primectl up` restarts it)")
            if r.service in lost else r for r in rows]

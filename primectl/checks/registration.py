"""Which running workers the frontend no longer lists.

A worker whose discovery entry is gone keeps running and passes its own health probe, but the frontend routes
nothing to it; with one worker of a role, the model is not served at all. Dynamo 1.6.1's file store drops an
entry whose owner has not refreshed it for 10 s (a process stalled that long: a busy disk, a paused VM), and the
owner never writes it again (on etcd a worker whose lease lapses ends itself). `status` names such a worker, and
`up` restarts it so that it registers again.

The check is one http probe per worker against the frontend's listing (`plan.worker_listing_url`), passing
when the listing holds the worker's `listed_as`. `status` and `up` run the probes on the frontend's host,
through its agent, like the gate; `smoke` runs them where it runs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from primectl.host.probes import TEXT_MISSING

if TYPE_CHECKING:
    from primectl.deploy.status import ServiceStatus
    from primectl.plan.model import Plan

LOST = "the frontend does not list it: its discovery registration is gone"
SUFFIX = " listed"
"""Listing probes are named `<worker> listed`."""
CONFIRM_S = 1.0
"""How long to wait before probing again: a worker that has just registered may not be listed yet."""

Run = Callable[[list[dict[str, Any]]], Mapping[str, Mapping[str, Any]]]
"""Runs a batch of named probes once: name -> {ok, detail} (a host agent's `probe`)."""


def listing_probes(plan: Plan, names: Iterable[str]) -> list[dict[str, Any]]:
    """One probe per worker of `names` that the frontend's listing names: passes while it lists the worker."""
    if not plan.worker_listing_url:
        return []
    return [{"name": n + SUFFIX, "probe": {"kind": "http", "url": plan.worker_listing_url,
                                           "expect_text": plan.service(n).listed_as, "timeout_s": 5}}
            for n in names if plan.service(n).listed_as]


def run_here(probes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Run listing probes on this machine, in the shape a host agent's `probe` answers: name -> {ok, detail}."""
    from primectl.host.probes import Answers, run_probe

    answers: Answers = {}  # every worker's probe reads the same listing: fetch it once
    return {p["name"]: dict(zip(("ok", "detail"), run_probe(p["probe"], "", answers), strict=True)) for p in probes}


def missing(results: Mapping[str, Mapping[str, Any]], names: Iterable[str]) -> list[str]:
    """Those of `names` whose listing probe read the listing and did not find them (not: could not read it)."""
    return [n for n in names if TEXT_MISSING in str((results.get(n + SUFFIX) or {}).get("detail", ""))]


def unlisted(plan: Plan, names: Iterable[str], run: Run, confirm_s: float = CONFIRM_S) -> list[str]:
    """Those of `names` the frontend's listing lacks twice, `confirm_s` apart (none when it cannot be read)."""
    probes = listing_probes(plan, names)
    if not probes:
        return []
    first = missing(run(probes), [p["name"].removesuffix(SUFFIX) for p in probes])
    if not first:
        return []
    time.sleep(confirm_s)
    return missing(run(listing_probes(plan, first)), first)


def mark_unlisted(rows: list[ServiceStatus], results: Mapping[str, Mapping[str, Any]]) -> list[ServiceStatus]:
    """`status` rows of workers that run and pass their own probe but whose listing probe (in `results`) did
    not find them: not ready, saying so."""
    lost = set(missing(results, [r.service for r in rows if r.healthy]))
    return [dataclasses.replace(r, ready=False, detail=f"{r.detail}, but {LOST} (`primectl up` restarts it)")
            if r.service in lost else r for r in rows]

"""The rollout strategy's decisions (primectl/rollout/), from two plans of one recipe and nothing else: what runs
(as the last `up` recorded it) and what the recipe now says. No host, agent or fake world is involved: which
services surge, which roll in batches and how big, which reload, the order things drain in, and what `diff` says
clients lose.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from primectl.components import base as components
from primectl.components.haproxy import check_uri, checked_model
from primectl.deploy.changes import Change, compute_changes
from primectl.host.wire import InspectResult, ServiceRecord
from primectl.plan.model import Plan, Service
from primectl.planner.build import plan_recipe
from primectl.render.bundle import render_plan
from primectl.rollout.expected import expected_loss
from primectl.rollout.strategy import (
    RoleBatches,
    Seen,
    Surge,
    check_moves,
    leftover_twins,
    moves,
    observe,
    registered_counts,
    removals,
    rollback_restores,
    rollback_stops,
    stop_order,
    twin_drain_order,
    wave_rollout,
    waves,
)
from tests.test_rollout_fake import fake_recipe

GPU_FULL = {"hardware": {"profile": "h200-hgx", "gpus_per_host": 2}}  # the workers fill their hosts: no twins
TWO = {"host": "h1", "replicas": 2}


class Recipe:
    """The fake deployment's recipe (tests/test_rollout_fake.py), planned with changes."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.base: dict[str, Any] = fake_recipe(tmp, "strategy")

    def plan(self, **changes: Any) -> Plan:
        doc = json.loads(json.dumps(self.base))
        for key, value in changes.items():
            doc[key] = {**doc[key], **value} if isinstance(value, dict) and isinstance(doc.get(key), dict) else value
        path = self.tmp / "recipe.yaml"
        path.write_text(yaml.safe_dump(doc))
        return plan_recipe(path)[1]


@pytest.fixture
def recipe(tmp_path: Path) -> Recipe:
    return Recipe(tmp_path)


def _record(svc: Service, manifest: dict[str, Any]) -> ServiceRecord:
    record = {k: manifest[k] for k in ("hash", "files_hash", "expect_hash", "fields", "unit", "role")}
    record["ready"] = svc.ready.model_dump(mode="json")
    if svc.drain:
        record["drain"] = svc.drain.model_dump(mode="json")
    return cast(ServiceRecord, record)


def situation(old: Plan, new: Plan, *, dead: Iterable[str] = (), twins: Iterable[str] = (),
              current: Iterable[str] = ()) -> tuple[list[Change], Seen]:
    """The diff of `new` against hosts that run `old` as its `up` recorded it (but `dead`, and with the surge
    `twins` an interrupted `up` left running, `current` of them started from `new`'s revision), and what the
    hosts report as the strategy reads it."""
    recorded = {h: {n: _record(old.service(n), m) for n, m in b.services.items()} for h, b in render_plan(old).items()}
    running = {n for recs in recorded.values() for n in recs} - set(dead) | set(twins)
    views = {h: cast(InspectResult, {"state": {"services": recs}, "services": {n: {"alive": n in running} for n in recs}})
             for h, recs in recorded.items()}
    records = {s.name: recorded[s.host][s.name] for s in new.services if s.name in recorded.get(s.host, {})}
    seen = observe(new, records, running, current)
    changes = compute_changes(render_plan(new), views) + leftover_twins(new, seen)
    return changes, seen


def only_wave(plan: Plan, changes: list[Change]) -> list[str]:
    [wave] = waves(plan, changes)
    return wave


def test_an_env_change_with_room_surges_the_changed_workers_in_the_running_generation(recipe: Recipe) -> None:
    new = recipe.plan(decode={"env": {"NCCL_DEBUG": "INFO"}})
    changes, seen = situation(recipe.plan(), new)
    wave = only_wave(new, changes)
    assert wave == ["decode-0", "decode-1"]
    step = wave_rollout(new, changes, seen, wave)
    assert step.surge == Surge(["decode-0", "decode-1"], new_generation=False, stages=[["decode-0", "decode-1"]],
                               twins={"prefill": 0, "decode": 2})
    assert (step.at_once, step.reloads, step.rolls) == ([], [], [])
    assert expected_loss(new, changes, seen) == [
        "surge, same generation: twins decode-0-surge, decode-1-surge start beside the running ones and register; "
        "then decode-0, decode-1 drain (up to 60s) and restart; then the twins drain and stop; expected loss 0"]


def test_a_command_line_change_with_room_surges_a_new_generation_of_every_worker_prefill_first(recipe: Recipe) -> None:
    """A new argv of the decoders is a new generation for every worker (the prefill worker registers there too):
    all of them surge, the prefill twin first, and the old prefill worker drains last."""
    new = recipe.plan(decode={"max_num_seqs": 32})
    changes, seen = situation(recipe.plan(), new)
    wave = only_wave(new, changes)
    surge = wave_rollout(new, changes, seen, wave).surge
    assert surge is not None and surge.new_generation
    assert surge.services == ["prefill-0", "decode-0", "decode-1"]
    assert surge.stages == [["prefill-0"], ["decode-0", "decode-1"]]
    # while the new generation registers, the router counts only its twins there; after, every instance again
    rollouts = {r.role: r for r in new.rollouts}
    assert registered_counts(new, seen, ["decode-0", "decode-1"], surge.twins, fresh=True) == [(rollouts["decode"], 2)]
    assert registered_counts(new, seen, surge.services, {}, fresh=False) == [(rollouts["prefill"], 1),
                                                                              (rollouts["decode"], 2)]
    [line] = expected_loss(new, changes, seen)
    assert line == ("surge, new generation (its own Dynamo namespace: the router never mixes the two): twins "
                    "prefill-0-surge; decode-0-surge, decode-1-surge start beside the running ones and register "
                    "(prefill first); then decode-0, decode-1; prefill-0 drain (up to 60s) and restart; then the "
                    "twins drain and stop; expected loss 0")


def test_without_room_an_env_change_rolls_in_batches_of_max_unavailable(recipe: Recipe) -> None:
    new = recipe.plan(**GPU_FULL, decode={"env": {"X": "1"}})
    changes, seen = situation(recipe.plan(**GPU_FULL), new)
    step = wave_rollout(new, changes, seen, only_wave(new, changes))
    decode = next(r for r in new.rollouts if r.role == "decode")
    assert step.surge is None and step.rolls == [RoleBatches(decode, [["decode-0"], ["decode-1"]], together=False)]
    assert expected_loss(new, changes, seen) == [
        "decode: 2 batch(es) of at most 1 instance(s): drain (up to 60s) -> restart -> ready -> registered with the "
        "router; expected loss 0"]


@pytest.mark.parametrize(("max_unavailable", "sizes"), [(1, [1] * 6), (2, [2, 2, 2]), (4, [4, 2]), (9, [5, 1])])
def test_batch_sizes_follow_max_unavailable_and_never_take_the_whole_role(recipe: Recipe, max_unavailable: int,
                                                                         sizes: list[int]) -> None:
    six = {"workers": 6, "rollout": {"max_unavailable": max_unavailable}}
    hw = {"hardware": {"profile": "h200-hgx", "gpus_per_host": 6}}
    new = recipe.plan(**hw, decode={**six, "env": {"X": "1"}})
    changes, seen = situation(recipe.plan(**hw, decode=six), new)
    [roll] = wave_rollout(new, changes, seen, only_wave(new, changes)).rolls
    assert [len(b) for b in roll.batches] == sizes
    assert [n for b in roll.batches for n in b] == [f"decode-{i}" for i in range(6)]


def test_without_room_a_new_command_line_restarts_the_role_together_and_diff_says_why(recipe: Recipe) -> None:
    new = recipe.plan(**GPU_FULL, decode={"max_num_seqs": 32})
    changes, seen = situation(recipe.plan(**GPU_FULL), new)
    step = wave_rollout(new, changes, seen, only_wave(new, changes))
    by_role = {roll.rollout.role: roll for roll in step.rolls}
    assert by_role["decode"].together and by_role["decode"].batches == [["decode-0", "decode-1"]]
    lines = expected_loss(new, changes, seen)
    assert ("decode: decode-0, decode-1 restart together: their command line changes, and Dynamo's router rejects "
            "workers whose model card differs from the running ones; no room for a second generation here: up to "
            "1s without this role") in lines, lines


def test_a_worker_that_is_not_running_starts_at_once_beside_the_surge_of_the_others(recipe: Recipe) -> None:
    new = recipe.plan(decode={"env": {"X": "1"}})
    changes, seen = situation(recipe.plan(), new, dead=["decode-1"])
    step = wave_rollout(new, changes, seen, only_wave(new, changes))
    assert step.at_once == ["decode-1"]
    assert step.surge is not None and step.surge.services == ["decode-0"]


def test_a_new_replica_reloads_the_balancer_in_place_and_starts_alone(recipe: Recipe) -> None:
    new = recipe.plan(frontend={**TWO, "replicas": 3})
    changes, seen = situation(recipe.plan(frontend=TWO), new)
    steps = [wave_rollout(new, changes, seen, w) for w in waves(new, changes)]
    assert [(s.at_once, s.reloads) for s in steps] == [(["frontend-2"], []), ([], ["balancer"])]
    assert check_moves(new, changes, seen) == []
    assert expected_loss(new, changes, seen) == [
        "balancer: reloads in place (SIGUSR2: only its files change); it keeps its sockets and finishes the "
        "connections it holds; expected loss 0"]


def test_a_renamed_model_moves_the_balancer_check_and_its_component_says_what_clients_see(recipe: Recipe) -> None:
    new = recipe.plan(frontend=TWO, model={**recipe.base["model"], "served_name": "demo2"})
    changes, seen = situation(recipe.plan(frontend=TWO), new)
    assert check_moves(new, changes, seen) == ["balancer"]
    [line] = [d for d in expected_loss(new, changes, seen) if d.startswith("balancer:")]
    assert line.endswith("the served model is renamed ('demo' -> 'demo2'); its health check follows, so it reloads "
                         "as soon as the new workers have registered, before any replica rolls; clients must ask for "
                         "'demo2': the old name answers 404 once its workers have drained"), line


def test_the_balancers_check_names_the_served_model_and_others_say_nothing_is_lost(recipe: Recipe) -> None:
    assert check_uri("a/b c") == "/v1/models/a%2Fb%20c/ready"
    assert checked_model("http://127.0.0.2:8000" + check_uri("a/b c")) == "a/b c"
    assert checked_model("http://127.0.0.2:8000/health") is None
    plan = recipe.plan(frontend=TWO)
    balancer = components.get("haproxy")
    assert components.check_move(balancer, plan, plan.service("balancer"), "http://127.0.0.2:8000/health") == (
        components.CheckMove("its health check moves to the model's readiness", "expected loss 0"))
    assert components.check_move(None, plan, plan.service("etcd"), "http://x/old") == (
        components.CheckMove("its readiness check moves", "expected loss 0"))


def test_replicas_moved_to_new_ports_come_back_at_their_new_address(recipe: Recipe) -> None:
    new = recipe.plan(frontend=TWO, ports={"frontend_replica": 8200})
    changes, seen = situation(recipe.plan(frontend=TWO), new)
    assert moves(new, seen, "frontend") and moves(new, seen, "frontend-1")
    lines = expected_loss(new, changes, seen)
    assert ("frontend: 2 batch(es) of at most 1 instance(s): drain (up to 60s) -> restart -> ready -> back in the "
            "balancer at its new address; expected loss 0") in lines, lines


def test_twins_drain_decode_first_and_down_stops_in_reverse_start_order(recipe: Recipe) -> None:
    plan = recipe.plan()
    order = twin_drain_order(plan, ["prefill-0-surge", "decode-1-surge", "decode-0-surge"])
    assert [[t.name for t in group] for group in order] == [["decode-0-surge", "decode-1-surge"], ["prefill-0-surge"]]
    assert twin_drain_order(plan, []) == []
    known = {s.name for s in plan.services} | {"decode-0-surge"}
    assert stop_order(plan, known) == [["decode-0-surge"], ["balancer"], ["frontend"],
                                       ["prefill-0", "decode-0", "decode-1"], ["etcd"]]


@pytest.mark.parametrize("current", [False, True])
def test_a_twin_an_interrupted_up_left_is_adopted_only_when_it_runs_this_revision(recipe: Recipe, current: bool) -> None:
    plan = recipe.plan(decode={"env": {"X": "1"}})
    changes, seen = situation(recipe.plan(), plan, twins=["decode-0-surge"], current=["decode-0-surge"] if current else [])
    [left] = [c for c in changes if c.service == "decode-0-surge"]
    assert (left.host, left.action) == ("h3", "remove")
    assert left.reason == "surge twin left running by an interrupted `up`: " + (
        "it serves until this run's surge is done, then drains and stops" if current
        else "drained and stopped before anything starts")
    gone = removals(plan, changes, seen)
    assert (gone.adopted_twins, gone.stale_twins) == ((["decode-0-surge"], []) if current else ([], ["decode-0-surge"]))
    assert gone.services == {}


def test_a_smaller_plan_stops_what_it_no_longer_has(recipe: Recipe) -> None:
    new = recipe.plan(decode={"workers": 1})
    changes, seen = situation(recipe.plan(), new)
    assert removals(new, changes, seen).services == {"h3": ["decode-1"]}


def test_a_rollback_stops_what_this_run_started_and_puts_back_what_it_replaced(recipe: Recipe) -> None:
    new = recipe.plan(decode={"workers": 3, "env": {"X": "1"}})
    changes, _ = situation(recipe.plan(), new)
    started = ["decode-2", "decode-0"]  # the run failed as decode-1 was about to restart
    stops = rollback_stops(new, changes, started)
    assert list(stops) == ["h3"] and (stops["h3"].restarted, stops["h3"].added) == (["decode-0"], ["decode-2"])
    recorded = {"h1": ["etcd", "frontend", "balancer"], "h2": ["prefill-0"], "h3": ["decode-0", "decode-1"]}
    assert rollback_restores(changes, started, recorded) == {"h3": ["decode-0"]}


def test_a_role_with_one_instance_and_a_twin_but_no_room_for_a_generation_restarts_in_place(recipe: Recipe) -> None:
    """2-GPU hosts: prefill-0 has a twin, the decoders none. Its twin would join the running generation, so a new
    command line cannot surge: it restarts in place, and `diff` says so."""
    new = recipe.plan(**GPU_FULL, prefill={"token_budget_per_gpu": 1024})
    changes, seen = situation(recipe.plan(**GPU_FULL), new)
    step = wave_rollout(new, changes, seen, only_wave(new, changes))
    assert step.surge is None
    assert [roll.rollout.role for roll in step.rolls] == ["prefill"]
    assert expected_loss(new, changes, seen) == [
        "prefill: single instance, its command line changes, and there is room for its twin but not for a whole "
        "second generation (Dynamo's router rejects a twin whose model card differs from the running one): up to 1s "
        "without this role"]

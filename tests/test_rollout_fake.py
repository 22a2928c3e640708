"""`up`, `diff`, rollback, dropped hosts and Ctrl-C, fast: the FAKE transport runs the real host agent
in-process on temp-dir workdirs, with processes, probes and faults simulated (primectl/deploy/fake.py).

The same operator scenarios run over real sshd hosts in tests/integration/test_apply_*.py; these pin
the pipeline's decisions (what starts, what is kept, what is restored) in milliseconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.deploy.cluster import ConnectionPolicy
from primectl.deploy.fake import FakeWorld
from primectl.errors import DeployError
from primectl.pipeline import UpOptions, diff, up
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.targets.ssh import SSHTarget

HOSTS = ("h1", "h2", "h3")


def fake_recipe(tmp: Path, name: str) -> dict[str, Any]:
    """The fake deployment's recipe: mocker workers, etcd and the frontend on h1, prefill on h2, decode on h3."""
    return {
        "name": name,
        "model": {"served_name": "demo", "generate": "demo-tiny", "arch": "demo-tiny", "max_context": 4096},
        "hardware": {"profile": "cpu"},
        "hosts": [{"name": h, "address": f"127.0.0.{i + 2}", "workdir": str(tmp / h)} for i, h in enumerate(HOSTS)],
        "engine": "mocker",
        "supervisor": "process",
        "frontend": {"host": "h1"},
        "prefill": {"groups": 1, "parallel": "TP1", "hosts": ["h2"], "startup_timeout_s": 1},
        "decode": {"workers": 2, "parallel": "TP1", "hosts": ["h3"], "startup_timeout_s": 1},
        "control_plane": {"discovery": "etcd"},
        "software": {"python": "/opt/fake/bin/python"},
    }


class Env:
    """One fake deployment: recipe file, world, what `up` said."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.world = FakeWorld()
        self.said: list[str] = []
        self.base: dict[str, Any] = fake_recipe(tmp, "fake")

    def plan(self, **changes: Any) -> Plan:
        doc = json.loads(json.dumps(self.base))
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key].update(value)
            else:
                doc[key] = value
        path = self.tmp / "recipe.yaml"
        path.write_text(yaml.safe_dump(doc))
        return plan_recipe(path)[1]

    @property
    def options(self) -> UpOptions:
        return UpOptions(connection=ConnectionPolicy(connector=self.world.connector()), preflight=False, smoke=False)

    def up(self, plan: Plan, **kw: Any) -> Any:
        opts = self.options
        return up(plan, UpOptions(**{**opts.__dict__, **kw}), self.said.append)

    def state(self, host: str) -> dict[str, Any]:
        return json.loads((self.tmp / host / "state.json").read_text())

    def current(self, host: str) -> str:
        return (self.tmp / host / "current").readlink().name


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_up_starts_every_service_in_dependency_order_and_records_it(env: Env) -> None:
    plan = env.plan()
    res = env.up(plan)
    order = [s for _, s in env.world.starts]
    assert order.index("etcd") < order.index("prefill-0") < order.index("frontend")
    assert set(order) == {s.name for s in plan.services} and len(order) == len(plan.services)
    for h in HOSTS:
        state = env.state(h)
        assert state["deployment"] == "fake" and set(state["services"]) == {s.name for s in plan.services_on(h)}
        assert env.current(h) == state["revision"]
    assert sorted(res.started) == sorted(s.name for s in plan.services)
    assert any(line.startswith("ready: http://127.0.0.2:8000") for line in env.said)


def test_up_twice_restarts_nothing(env: Env) -> None:
    plan = env.plan()
    env.up(plan)
    before = list(env.world.starts)
    res = env.up(plan)
    assert env.world.starts == before and res.started == []
    assert "no changes: every service is running its planned revision" in env.said


def test_a_dead_service_is_restarted_and_nothing_else(env: Env) -> None:
    plan = env.plan()
    env.up(plan)
    env.world.running.pop(("h3", "decode-1"))
    before = len(env.world.starts)
    env.up(plan)
    assert env.world.starts[before:] == [("h3", "decode-1")]


def test_a_running_worker_the_frontend_lost_is_restarted_by_up_and_diff_says_why(env: Env) -> None:
    plan = env.plan()
    env.up(plan)
    env.world.unlisted.add("decode-1")  # its discovery entry expired while it was stalled; it runs on, unlisted
    lines, _ = diff(plan, env.options.connection, env.said.append)
    changes = {c.service: c for c in lines}
    assert changes["decode-1"].action == "restart"
    assert changes["decode-1"].reason == "running, but the frontend does not list it: its discovery registration is gone"
    assert {n for n, c in changes.items() if c.action != "keep"} == {"decode-1"}
    before = len(env.world.starts)
    env.up(plan)
    assert env.world.starts[before:] == [("h3", "decode-1")] and not env.world.unlisted
    assert all(c.action == "keep" for c in diff(plan, env.options.connection, env.said.append)[0])


def test_a_decode_env_change_keeps_the_generation_and_restarts_only_the_decoders_beside_twins(env: Env) -> None:
    env.up(env.plan())
    before = len(env.world.starts)
    changed = env.plan(decode={"env": {"NCCL_DEBUG": "INFO"}})
    assert changed.service("decode-0").generation == env.plan().service("decode-0").generation
    env.up(changed)
    starts = [s for _, s in env.world.starts[before:]]
    assert sorted(starts[:2]) == ["decode-0-surge", "decode-1-surge"] and sorted(starts[2:]) == ["decode-0", "decode-1"]
    assert not any(env.world.is_running("h3", t) for t in ("decode-0-surge", "decode-1-surge"))


def test_a_decode_argument_change_starts_a_new_generation_beside_the_old_one_then_retires_the_twins(env: Env) -> None:
    env.up(env.plan())
    before, drained = len(env.world.starts), len(env.world.drains)
    changed = env.plan(decode={"max_num_seqs": 32})
    env.up(changed)
    starts = [s for _, s in env.world.starts[before:]]
    twins = ["prefill-0-surge", "decode-0-surge", "decode-1-surge"]
    # twins of every worker first (the new generation, its prefill before its decode: the frontend routes to a
    # generation once its decode workers register), then the workers in place, never the frontend or etcd
    assert starts[0] == "prefill-0-surge" and sorted(starts[1:3]) == ["decode-0-surge", "decode-1-surge"]
    # the old decode workers drain and restart before the old prefill worker they route through
    assert sorted(starts[3:5]) == ["decode-0", "decode-1"] and starts[5:] == ["prefill-0"]
    drains = [s for _, s in env.world.drains[drained:]]
    assert drains.index("decode-0") < drains.index("prefill-0") and drains.index("decode-1") < drains.index("prefill-0")
    assert drains.index("decode-0-surge") < drains.index("prefill-0-surge"), drains
    assert not any(env.world.is_running(h, t) for h in HOSTS for t in twins), "the twins were left running"
    generation = changed.service("decode-0").generation
    assert generation and generation != env.plan().service("decode-0").generation
    assert {env.world.namespaces[("h3", "decode-0")], env.world.namespaces[("h2", "prefill-0")]} == {generation}
    assert ("h3", "decode-0") in env.world.drains and ("h3", "decode-0-surge") in env.world.drains
    assert any("surge: starting" in line for line in env.said)


def test_a_new_generation_loses_nothing_behind_the_balancer_with_one_frontend_or_two(env: Env) -> None:
    """Dynamo answers 503 (retryable) while its prefill router for a new generation activates, and 500 when it picks
    the old generation as its last decode worker leaves: the balancer in front of the frontend, one or several,
    resends them, so `diff` expects no loss."""
    env.up(env.plan())
    assert env.plan().service("balancer").ports["http"] == 8000
    _, steps = diff(env.plan(decode={"max_num_seqs": 32}), env.options.connection, env.said.append)
    [line] = [d for d in next(s for s in steps if s.step == "waves").details if d.startswith("surge")]
    assert line.endswith("expected loss 0"), line
    balanced = {"frontend": {"host": "h1", "replicas": 2}}
    env.up(env.plan(**balanced))
    _, steps = diff(env.plan(**balanced, decode={"max_num_seqs": 32}), env.options.connection, env.said.append)
    [line] = [d for d in next(s for s in steps if s.step == "waves").details if d.startswith("surge")]
    assert line.endswith("expected loss 0"), line


def test_a_change_to_the_one_frontend_surges_a_twin_behind_the_balancer(env: Env) -> None:
    """One frontend: its twin starts and takes traffic at the balancer while the frontend drains and restarts,
    then drains and stops; the balancer itself stays."""
    env.up(env.plan())
    changed = env.plan(frontend={"host": "h1", "session_affinity": {"ttl_secs": 900}})
    _, steps = diff(changed, env.options.connection, env.said.append)
    waves = next(s for s in steps if s.step == "waves").details
    assert any(d.startswith("surge") and "frontend-surge" in d and d.endswith("expected loss 0") for d in waves), waves
    before = len(env.world.starts)
    env.up(changed)
    assert [s for _, s in env.world.starts[before:]] == ["frontend-surge", "frontend"]
    assert "frontend-surge" not in {s for _, s in env.world.running}


def test_a_kv_contract_change_rolls_prefill_and_decode_as_one_new_generation(env: Env) -> None:
    """An old prefill must never hand KV to a new decode: a new block size moves both roles to a new namespace,
    and the old generation serves until the new one is registered."""
    env.up(env.plan())
    old = env.plan().service("prefill-0").generation
    changed = env.plan(kv={"block_size": 32})
    new = changed.service("prefill-0").generation
    assert new != old and changed.service("decode-0").generation == new
    _, steps = diff(changed, env.options.connection, env.said.append)
    waves = next(s for s in steps if s.step == "waves")
    assert any(d.startswith("surge, new generation") for d in waves.details), waves.details
    before = len(env.world.starts)
    env.up(changed)
    twins = {"prefill-0-surge", "decode-0-surge", "decode-1-surge"}
    assert {s for _, s in env.world.starts[before:before + 3]} == twins  # the new generation first, whole
    assert {env.world.namespaces[k] for k in env.world.running if k[1] in ("prefill-0", "decode-0", "decode-1")} == {new}


def _gpu(env: Env, **changes: Any) -> Plan:
    """The same deployment on GPU hosts that it fills: no room for a twin, so no generations."""
    return env.plan(hardware={"profile": "h200-hgx", "gpus_per_host": 2}, **changes)


def test_without_room_an_env_change_rolls_through_the_decoders_one_at_a_time(env: Env) -> None:
    env.up(_gpu(env))
    before = len(env.world.starts)
    env.up(_gpu(env, decode={"env": {"NCCL_DEBUG": "INFO"}}))
    assert [s for _, s in env.world.starts[before:]] == ["decode-0", "decode-1"]
    assert [line for line in env.said if line.startswith("rolling decode")] == [
        "rolling decode 1/2: decode-0 (drain, restart, ready, registered)",
        "rolling decode 2/2: decode-1 (drain, restart, ready, registered)"]
    assert env.world.drains[-2:] == [("h3", "decode-0"), ("h3", "decode-1")]


def test_without_room_a_new_command_line_restarts_the_role_together_and_diff_says_why(env: Env) -> None:
    env.up(_gpu(env))
    changed = _gpu(env, decode={"max_num_seqs": 32})
    _, steps = diff(changed, env.options.connection, env.said.append)
    waves = next(s for s in steps if s.step == "waves")
    assert any("decode-0, decode-1 restart together" in d and "model card" in d for d in waves.details), waves.details
    before = len(env.world.starts)
    env.up(changed)
    assert sorted(s for _, s in env.world.starts[before:]) == ["decode-0", "decode-1"]
    assert not any(line.startswith("rolling decode 2/") for line in env.said)


def _roomy_gpu(env: Env, **changes: Any) -> Plan:
    """The same deployment on 4-GPU hosts: every worker leaves a spare GPU on its host for a twin."""
    return env.plan(hardware={"profile": "h200-hgx", "gpus_per_host": 4}, **changes)


def test_gpu_hosts_with_spare_gpus_give_each_twin_gpus_no_worker_uses(env: Env) -> None:
    plan = _roomy_gpu(env)
    for host in ("h2", "h3"):
        workers = [s for s in plan.services_on(host) if s.role in ("prefill", "decode")]
        taken = [g for s in workers for g in s.gpus]
        twins = [g for s in workers if s.twin for g in s.twin.gpus]
        assert len(twins) == len(taken) and not set(twins) & set(taken) and len(set(twins)) == len(twins), (host, taken,
                                                                                                          twins)
        assert set(twins) <= set(range(4))
    assert plan.service("decode-0").generation, "room for a whole second generation: each one in its namespace"


def test_a_decode_argument_change_on_gpu_hosts_with_room_surges_a_new_generation(env: Env) -> None:
    env.up(_roomy_gpu(env))
    changed = _roomy_gpu(env, decode={"max_num_seqs": 32})
    _, steps = diff(changed, env.options.connection, env.said.append)
    waves = next(s for s in steps if s.step == "waves")
    assert any(d.startswith("surge, new generation") for d in waves.details), waves.details
    assert not any("restart together" in d for d in waves.details), waves.details
    before = len(env.world.starts)
    env.up(changed)
    twins = {"prefill-0-surge", "decode-0-surge", "decode-1-surge"}
    assert {s for _, s in env.world.starts[before:before + 3]} == twins
    assert not any(env.world.is_running(h, t) for h in HOSTS for t in twins), "the twins were left running"
    assert env.world.namespaces[("h3", "decode-0")] == changed.service("decode-0").generation


def test_room_for_only_some_twins_surges_an_env_change_but_not_a_new_command_line(env: Env) -> None:
    """2-GPU hosts: prefill-0 (one GPU of h2) has a twin, the decoders (both of h3's) have none. A twin in the
    running namespace must carry the running model card, so only a change that keeps it surges."""
    plan = _gpu(env)
    assert plan.service("prefill-0").twin is not None and plan.service("decode-0").twin is None
    assert plan.service("prefill-0").generation is None
    env.up(plan)
    before = len(env.world.starts)
    env.up(_gpu(env, prefill={"env": {"NCCL_DEBUG": "INFO"}}))
    assert [s for _, s in env.world.starts[before:]] == ["prefill-0-surge", "prefill-0"]
    assert not env.world.is_running("h2", "prefill-0-surge")
    new_argv = _gpu(env, prefill={"env": {"NCCL_DEBUG": "INFO"}, "token_budget_per_gpu": 1024})
    _, steps = diff(new_argv, env.options.connection, env.said.append)
    waves = next(s for s in steps if s.step == "waves")
    assert any(d.startswith("prefill: single instance, its command line changes") and "not for a whole second "
               "generation" in d for d in waves.details), waves.details
    before = len(env.world.starts)
    env.up(new_argv)
    assert [s for _, s in env.world.starts[before:]] == ["prefill-0"]


def test_a_failed_batch_rolls_back_only_what_it_touched(env: Env) -> None:
    env.up(_gpu(env))
    env.world.faults["decode-1"] = "never-ready"
    with pytest.raises(DeployError, match="decode-1"):
        env.up(_gpu(env, decode={"env": {"X": "1"}}))
    # decode-0 had rolled and is put back; nothing else was touched
    assert env.world.is_running("h3", "decode-0") and env.world.is_running("h2", "prefill-0")
    assert env.state("h3")["services"]["decode-0"]["release"] == env.current("h3")


def test_batches_never_take_every_instance_of_a_role_out_at_once() -> None:
    from primectl.plan.model import RoleRollout
    from primectl.rollout.strategy import batches

    twelve = RoleRollout(role="decode", instances=[[f"decode-{i}"] for i in range(12)], max_unavailable=4)
    assert batches(twelve, {f"decode-{i}" for i in range(12)}) == [
        [f"decode-{i}" for i in range(j, j + 4)] for j in (0, 4, 8)]
    assert len(batches(twelve.model_copy(update={"max_unavailable": 1}), {"decode-3", "decode-7"})) == 2
    two = RoleRollout(role="decode", instances=[["decode-0"], ["decode-1"]], max_unavailable=5)
    assert batches(two, {"decode-0", "decode-1"}) == [["decode-0"], ["decode-1"]]
    group = RoleRollout(role="prefill", instances=[["prefill-0-0", "prefill-0-1"], ["prefill-1-0", "prefill-1-1"]],
                        max_unavailable=1)
    assert batches(group, {"prefill-0-0", "prefill-0-1", "prefill-1-0", "prefill-1-1"}) == [
        ["prefill-0-0", "prefill-0-1"], ["prefill-1-0", "prefill-1-1"]]


def test_scaling_decode_adds_a_worker_and_restarts_neither_frontend_nor_the_others(env: Env) -> None:
    env.up(env.plan())
    bigger = env.plan(decode={"workers": 3})
    lines, _ = diff(bigger, env.options.connection, env.said.append)
    by = {c.service: c for c in lines}
    assert by["decode-2"].action == "add"
    assert by["frontend"].action == "update" and "depends_on" in by["frontend"].reason
    assert by["decode-0"].action == "keep" and by["etcd"].action == "keep"
    before = len(env.world.starts)
    env.up(bigger)
    assert env.world.starts[before:] == [("h3", "decode-2")]
    # the new expectation (start order) is recorded, so the next diff is clean
    lines, _ = diff(bigger, env.options.connection, env.said.append)
    assert {c.action for c in lines} == {"keep"}


def test_a_new_frontend_replica_is_added_to_the_balancer_by_a_reload_not_a_restart(env: Env) -> None:
    two = {"host": "h1", "replicas": 2}
    env.up(env.plan(frontend=two))
    three = env.plan(frontend={**two, "replicas": 3})
    lines, steps = diff(three, env.options.connection, env.said.append)
    by = {c.service: c for c in lines}
    assert by["frontend-2"].action == "add" and by["balancer"].action == "change", lines
    waves = next(s for s in steps if s.step == "waves")
    assert any(line.startswith("balancer: reloads in place") and "expected loss 0" in line for line in waves.details), waves
    before = len(env.world.starts)
    env.up(three)
    assert env.world.starts[before:] == [("h1", "frontend-2")], "only the new replica starts: the balancer keeps running"
    assert env.world.reloads == [("h1", "balancer")]
    assert any("reloaded balancer on h1 in place" in line for line in env.said)
    # and back: the replica leaves (drained at the balancer), the balancer reloads again
    env.up(env.plan(frontend=two))
    assert env.world.starts[before + 1:] == [] and env.world.reloads == [("h1", "balancer")] * 2
    assert ("h1", "frontend-2") in env.world.drains and not env.world.is_running("h1", "frontend-2")


def test_a_renamed_model_moves_the_balancer_check_while_both_generations_serve(env: Env) -> None:
    two = {"host": "h1", "replicas": 2}
    env.up(env.plan(frontend=two))
    renamed = env.plan(frontend=two, model={**env.base["model"], "served_name": "demo2"})
    _, steps = diff(renamed, env.options.connection, env.said.append)
    waves = next(s for s in steps if s.step == "waves")
    line = next(d for d in waves.details if d.startswith("balancer: reloads in place"))
    assert "the served model is renamed ('demo' -> 'demo2')" in line and "clients must ask for 'demo2'" in line, line
    env.said.clear()
    env.up(renamed)
    said = [line for line in env.said if line.startswith(("surge:", "reloaded", "rolling"))]
    # the balancer takes the new name once the new generation has registered, before the old one drains, and
    # before any replica comes back into its rotation (where the old name's check would call it down)
    assert said.index("reloaded balancer on h1 in place") == said.index("surge: draining and replacing decode-0, decode-1") - 1, said
    assert said.index("reloaded balancer on h1 in place") < said.index("rolling frontend 1/2: frontend (drain, restart, ready)")
    assert env.world.reloads == [("h1", "balancer")], "reloaded once, not again in its own wave"
    lines, _ = diff(renamed, env.options.connection, env.said.append)
    assert lines and all(c.action == "keep" for c in lines), lines


def test_a_renamed_model_without_room_for_a_generation_moves_the_balancer_check_before_the_replicas_roll(env: Env) -> None:
    two = {"host": "h1", "replicas": 2}
    env.up(_gpu(env, frontend=two))
    env.said.clear()
    env.up(_gpu(env, frontend=two, model={**env.base["model"], "served_name": "demo2"}))
    said = env.said
    workers = said.index("rolling decode 1/1: decode-0, decode-1 (drain, restart, ready, registered)")
    reload = said.index("reloaded balancer on h1 in place")
    # not before the workers serve the new name (the balancer would call every replica down), not after a replica
    # came back (the old name's check would never call it up)
    assert workers < reload < said.index("rolling frontend 1/2: frontend (drain, restart, ready)"), said
    assert env.world.reloads == [("h1", "balancer")]


def test_a_balancer_recorded_before_its_health_check_named_the_model_is_not_called_a_rename(env: Env) -> None:
    two = {"host": "h1", "replicas": 2}
    env.up(env.plan(frontend=two))
    state = env.tmp / "h1" / "state.json"
    doc = json.loads(state.read_text())
    doc["services"]["balancer"]["ready"]["url"] = "http://127.0.0.2:8000/health"  # as an older primectl recorded it
    state.write_text(json.dumps(doc))
    _, steps = diff(env.plan(frontend={**two, "replicas": 3}), env.options.connection, env.said.append)
    line = next(d for d in next(s for s in steps if s.step == "waves").details if d.startswith("balancer:"))
    assert "its health check moves to the model's readiness" in line and "renamed" not in line, line


def test_replicas_moved_to_new_ports_roll_and_diff_says_they_come_back_there(env: Env) -> None:
    two = {"host": "h1", "replicas": 2}
    env.up(env.plan(frontend=two))
    moved = env.plan(frontend=two, ports={"frontend_replica": 8200})
    assert [s.drain.address for s in moved.services if s.drain and s.drain.how == "balancer"] == [
        "127.0.0.2:8200", "127.0.0.2:8201"]
    _, steps = diff(moved, env.options.connection, env.said.append)
    waves = next(s for s in steps if s.step == "waves")
    assert any("back in the balancer at its new address; expected loss 0" in d for d in waves.details), waves.details
    env.up(moved)
    assert env.world.drains[-2:] == [("h1", "frontend"), ("h1", "frontend-1")], "each replica drains, one by one"


def test_a_failed_up_after_a_balancer_reload_reloads_it_back(env: Env) -> None:
    two = {"host": "h1", "replicas": 2}
    env.up(env.plan(frontend=two))
    env.world.gate_ready = False  # the deployment's gate fails after every wave
    three = env.plan(frontend={**two, "replicas": 3})
    three = three.model_copy(update={"gate": three.gate.model_copy(update={"timeout_s": 1})})  # fail fast
    with pytest.raises(DeployError):
        env.up(three)
    assert env.world.reloads == [("h1", "balancer")] * 2, "the balancer kept the new replica set after the rollback"
    assert not env.world.is_running("h1", "frontend-2") and env.world.is_running("h1", "balancer")


def test_diff_names_the_field_that_changed(env: Env) -> None:
    env.up(env.plan())
    lines, steps = diff(env.plan(decode={"env": {"X": "1"}}), env.options.connection, env.said.append)
    by = {c.service: c for c in lines}
    assert by["decode-0"].action == "change" and by["decode-0"].reason == "env changed"
    assert "+export X=1" in by["decode-0"].detail
    assert [s.step for s in steps][:3] == ["connect", "lock", "diff"] and steps[-1].step == "retire"


def test_a_service_that_exits_at_start_is_rolled_back_to_the_previous_revision(env: Env) -> None:
    env.up(env.plan())
    old = {h: env.current(h) for h in HOSTS}
    env.world.faults["decode-0"] = "exit-at-start"
    with pytest.raises(DeployError) as exc:
        env.up(env.plan(decode={"env": {"X": "1"}}))
    assert "decode-0 on h3: decode-0 exited before it became ready" in str(exc.value)
    assert exc.value.service == "decode-0" and "rolled back" in str(exc.value)
    assert {h: env.current(h) for h in HOSTS} == old
    env.world.faults.clear()
    assert env.world.is_running("h3", "decode-1"), "the previous revision was restored"
    assert "previous revision is healthy again" in env.said or "restoring" in " ".join(env.said)


def test_a_readiness_timeout_rolls_back_and_names_the_service(env: Env) -> None:
    env.up(env.plan())
    env.world.faults["prefill-0"] = "never-ready"
    with pytest.raises(DeployError, match=r"prefill-0 not ready after 1s"):
        env.up(env.plan(prefill={"env": {"X": "1"}}))
    assert env.state("h2")["services"]["prefill-0"]["release"] == env.current("h2")


def test_a_new_service_that_fails_is_stopped_and_the_old_ones_keep_running(env: Env) -> None:
    env.up(env.plan())
    env.world.faults["decode-2"] = "exit-at-start"
    with pytest.raises(DeployError):
        env.up(env.plan(decode={"workers": 3}))
    assert not env.world.is_running("h3", "decode-2")
    assert env.world.is_running("h3", "decode-0") and env.world.is_running("h1", "frontend")
    assert "decode-2" not in env.state("h3")["services"]


def test_an_unreachable_host_changes_nothing(env: Env) -> None:
    env.up(env.plan())
    snapshot = {h: (env.current(h), env.state(h)) for h in HOSTS}
    env.world.unreachable.add("h2")
    with pytest.raises(DeployError, match=r"connecting failed on 1 host.*nothing was changed"):
        env.up(env.plan(decode={"env": {"X": "1"}}))
    assert {h: (env.current(h), env.state(h)) for h in HOSTS} == snapshot


def test_ctrl_c_while_starting_rolls_back(env: Env) -> None:
    env.up(env.plan())
    old = env.current("h3")
    env.world.faults["decode-0"] = "interrupt-at-start"
    with pytest.raises(DeployError, match="interrupted by the operator"):
        env.up(env.plan(decode={"env": {"X": "1"}}))
    assert env.current("h3") == old
    assert "interrupted: rolling back to the previous revision" in env.said


def test_a_host_dropping_mid_rollout_fails_and_the_others_are_put_back(env: Env) -> None:
    env.up(env.plan())
    old = env.current("h2")
    env.world.drop_after["h3"] = 3  # inspect, lock? (h1 holds the lock), stage... then gone
    with pytest.raises(DeployError):
        env.up(env.plan(decode={"env": {"X": "1"}}, prefill={"env": {"X": "1"}}))
    assert env.current("h2") == old


def test_a_held_lock_refuses_up_and_names_the_holder(env: Env) -> None:
    plan = env.plan()
    env.up(plan)
    lock = env.tmp / "h1" / "lock"
    lock.mkdir()
    (lock / "owner.json").write_text(json.dumps({"user": "ops", "host": "bastion", "pid": 42, "command": "up",
                                                  "started": 0, "expires": 4e9}))
    with pytest.raises(DeployError, match="locked by ops@bastion pid 42 running `up`"):
        env.up(env.plan(decode={"env": {"X": "1"}}))
    env.up(env.plan(decode={"env": {"X": "1"}}), break_lock=True)


def test_ctrl_c_while_the_head_host_takes_the_lock_still_releases_it(env: Env) -> None:
    # seen in CI: a sweep interrupted as its next `up` was locking left the lock behind, and `--resume` was refused
    plan = env.plan()
    env.up(plan)
    env.world.interrupt_after.add("lock")
    with pytest.raises(KeyboardInterrupt):
        env.up(env.plan(decode={"env": {"X": "1"}}))
    assert not (env.tmp / "h1" / "lock").exists()
    env.up(env.plan(decode={"env": {"X": "1"}}))  # no --break-lock needed


def test_dry_run_says_what_each_step_would_do_and_changes_nothing(env: Env) -> None:
    env.up(env.plan())
    before = (len(env.world.starts), {h: env.current(h) for h in HOSTS})
    res = env.up(env.plan(decode={"workers": 3}), dry_run=True)
    steps = {s.step: s.action for s in res.steps}
    assert list(steps) == ["connect", "lock", "diff", "preflight", "provision", "ports", "push", "activate",
                           "stop removed", "waves", "gate", "smoke", "record", "retire"]
    assert steps["waves"] == "1: decode-2" and "h3 <- revision" in steps["push"]
    assert (len(env.world.starts), {h: env.current(h) for h in HOSTS}) == before


def test_a_host_dropped_from_the_recipe_has_its_services_stopped_and_leaves(env: Env) -> None:
    env.up(env.plan())
    smaller = env.plan(hosts=env.base["hosts"][:2], decode={"hosts": ["h2"]})
    lines, _ = diff(smaller, env.options.connection, env.said.append)
    assert {(c.host, c.service, c.action) for c in lines if c.host == "h3"} == {
        ("h3", "decode-0", "remove"), ("h3", "decode-1", "remove")}
    env.up(smaller)
    assert not env.world.is_running("h3", "decode-0") and env.world.is_running("h2", "decode-0")
    assert env.state("h3")["retired"] is True and env.state("h3")["services"] == {}
    assert "h3 left the deployment (dropped from the recipe)" in env.said


def test_an_unreachable_dropped_host_warns_and_stays_on_the_roster(env: Env) -> None:
    env.up(env.plan())
    env.world.unreachable.add("h3")
    env.up(env.plan(hosts=env.base["hosts"][:2], decode={"hosts": ["h2"]}))
    assert any(line.startswith("WARNING: h3 (127.0.0.4) was dropped from the recipe") for line in env.said)
    assert "h3" in env.state("h1")["roster"]
    env.world.unreachable.clear()
    env.up(env.plan(hosts=env.base["hosts"][:2], decode={"hosts": ["h2"]}))
    assert not env.world.is_running("h3", "decode-0") and env.state("h3")["retired"] is True


def test_a_taken_port_changes_nothing(env: Env) -> None:
    plan = env.plan()
    env.world.taken["h1"] = {plan.service("balancer").ports["http"]}
    with pytest.raises(DeployError, match=r"port 8000 on h1 .* is already in use; balancer needs it"):
        env.up(plan)
    assert env.world.starts == [] and not (env.tmp / "h1" / "current").exists()


def test_down_stops_services_a_killed_first_up_started_but_never_recorded(env: Env) -> None:
    plan = env.plan()
    env.up(plan)
    for h in HOSTS:  # as if that first `up` had been SIGKILLed after starting them, before recording them
        (env.tmp / h / "state.json").unlink()
    stopped = SSHTarget().down(plan, env.options.connection, env.said.append, purge=False, break_lock=False)
    assert set(stopped) == {s.name for s in plan.services}
    assert not env.world.running


def test_down_stops_everything_in_reverse_order_and_purge_removes_the_files(env: Env) -> None:
    plan = env.plan()
    env.up(plan)
    stopped = SSHTarget().down(plan, env.options.connection, env.said.append, purge=True, break_lock=False)
    assert set(stopped) == {s.name for s in plan.services}
    order = [s for _, s in env.world.stops]
    assert order.index("frontend") < order.index("decode-0") < order.index("etcd")
    assert not env.world.running
    for h in HOSTS:
        assert not (env.tmp / h / "state.json").exists() and not (env.tmp / h / "releases").exists()


def six_hosts(env: Env) -> list[dict[str, Any]]:
    return [{"name": f"h{i}", "address": f"127.0.0.{i + 1}", "workdir": str(env.tmp / f"h{i}")} for i in range(1, 7)]


def test_only_the_roster_keepers_hold_the_roster_and_are_asked_when_the_recipe_drops_them_all(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = six_hosts(env)
    env.up(env.plan(hosts=hosts, decode={"hosts": ["h3", "h4", "h5", "h6"], "workers": 4}))
    everyone = {f"h{i}" for i in range(1, 7)}
    for h in everyone:  # the head host (h1), the middle and the last of the others keep it; every host names them
        assert set(env.state(h)["roster"]) == (everyone if h in ("h1", "h3", "h6") else set()), h
        assert set(env.state(h)["roster_keepers"]) == {"h1", "h3", "h6"}

    # a recipe that keeps none of the keepers: they are asked for the roster (once), and leave with their services
    connected: list[str] = []
    connect = ConnectionPolicy.connect

    def spy(self: ConnectionPolicy, host: Any) -> Any:
        connected.append(host.name)
        return connect(self, host)

    monkeypatch.setattr(ConnectionPolicy, "connect", spy)
    env.up(env.plan(hosts=[hosts[1], hosts[3], hosts[4]], frontend={"host": "h2"}, prefill={"hosts": ["h4"]},
                    decode={"hosts": ["h5"], "workers": 1}))
    assert sorted(connected) == ["h1", "h2", "h3", "h4", "h5", "h6"], connected
    for h in ("h1", "h3", "h6"):
        assert env.state(h)["retired"] is True and env.state(h)["services"] == {}, h
        assert f"{h} left the deployment (dropped from the recipe)" in env.said
    assert not any(env.world.is_running(h, s) for h in ("h1", "h3", "h6")
                   for s in ("frontend", "etcd", "decode-0", "decode-3"))
    assert set(env.state("h2")["roster"]) == {"h2", "h4", "h5"}


def test_keepers_that_cannot_be_asked_are_warned_about_and_stay_on_the_roster(env: Env) -> None:
    hosts = six_hosts(env)
    env.up(env.plan(hosts=hosts, decode={"hosts": ["h3", "h4", "h5", "h6"], "workers": 4}))
    env.world.unreachable.update({"h1", "h3", "h6"})
    smaller = env.plan(hosts=[hosts[1], hosts[3], hosts[4]], frontend={"host": "h2"}, prefill={"hosts": ["h4"]},
                       decode={"hosts": ["h5"], "workers": 1})
    env.up(smaller)
    assert any(line.startswith("WARNING: the roster of fake is kept on h1, h3, h6") for line in env.said), env.said
    assert {"h1", "h3", "h6"} <= set(env.state("h2")["roster"])  # tried again by the next `up`
    env.world.unreachable.clear()
    env.up(smaller)
    assert all(env.state(h)["retired"] is True for h in ("h1", "h3", "h6"))


def test_status_asks_each_host_once_its_probes_riding_with_the_inspection(env: Env,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from primectl.deploy.client import HostClient

    plan = env.plan()
    env.up(plan)
    calls: list[tuple[str, str]] = []
    call = HostClient.call

    def spy(self: HostClient, op: str, *args: Any, **kwargs: Any) -> Any:
        calls.append((self.name, op))
        return call(self, op, *args, **kwargs)

    monkeypatch.setattr(HostClient, "call", spy)
    report = SSHTarget().status(plan, env.options.connection, env.said.append)
    assert sorted(calls) == [(h, "inspect") for h in HOSTS]
    assert {r.service: r.ready for r in report.rows} == {s.name: True for s in plan.services}
    assert report.gate["ok"] is True


def test_one_frontend_to_two_adds_a_replica_beside_the_one_that_runs(env: Env) -> None:
    """The first replica is `frontend` whether there is one or several: 1 -> 2 starts `frontend-1` and reloads the
    balancer in place; the running frontend is neither drained nor restarted, and 2 -> 1 drains `frontend-1` only."""
    env.up(env.plan())
    two = env.plan(frontend={"host": "h1", "replicas": 2})
    lines, _ = diff(two, env.options.connection, env.said.append)
    by = {c.service: c for c in lines}
    assert by["frontend"].action == "keep" and by["frontend-1"].action == "add", [(c.service, c.action, c.reason) for c in lines]
    before = len(env.world.starts)
    env.up(two)
    assert env.world.starts[before:] == [("h1", "frontend-1")]
    assert ("h1", "frontend") not in env.world.drains
    env.up(env.plan())
    assert ("h1", "frontend-1") in env.world.drains and not env.world.is_running("h1", "frontend-1")
    assert env.world.is_running("h1", "frontend")

"""Placement across four GB200 NVL72 racks (recipes/bench-4rack.yaml): DEP groups stay in one
NVLink domain, every GPU is used once, ports never collide."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from primectl.plan.model import Plan
from primectl.planner.build import build_plan, check_ports
from primectl.planner.load import load_recipe

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def plan() -> Plan:
    return build_plan(load_recipe(REPO / "recipes" / "bench-4rack.yaml").recipe)


def test_four_racks_use_all_288_gpus_once(plan: Plan) -> None:
    assert (plan.capacity.gpus_used, plan.capacity.gpus_total) == (288, 288)
    seen: set[tuple[str, int]] = set()
    for svc in plan.services:
        for gpu in svc.gpus:
            assert (svc.host, gpu) not in seen
            seen.add((svc.host, gpu))
    assert len(seen) == 288
    assert check_ports(plan) == []


def test_dep8_groups_never_leave_their_nvlink_domain(plan: Plan) -> None:
    groups: dict[str, list[str]] = defaultdict(list)
    for svc in plan.services:
        if svc.role == "prefill":
            assert svc.group is not None
            groups[svc.group].append(svc.host)
    assert len(groups) == 12
    for name, hosts in groups.items():
        domains = {plan.host(h).labels["nvlink_domain"] for h in hosts}
        assert len(hosts) == 2 and len(domains) == 1, (name, hosts)


def test_capacity_per_decoder_does_not_depend_on_rack_count(plan: Plan) -> None:
    one_rack = build_plan(load_recipe(REPO / "recipes" / "glm53.yaml").recipe)
    assert plan.capacity.decode == one_rack.capacity.decode.model_copy(update={"instances": 48})  # type: ignore[union-attr]

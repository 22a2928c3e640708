"""The planner on the GLM-5.3 reference rack: KV arithmetic, GPU accounting, ports, start order.

Figures from facts.md: 37,752 B/token NVFP4 and 55,224 B/token FP8 (indexer on all 78 layers),
1.63M / 1.09M tokens per TP4 decoder.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primectl.plan.model import Plan
from primectl.planner.build import build_plan, check_ports
from primectl.planner.load import load_recipe

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"


def _plan(name: str) -> Plan:
    return build_plan(load_recipe(RECIPES / name).recipe)


@pytest.fixture(scope="module")
def glm53() -> Plan:
    return _plan("glm53.yaml")


@pytest.fixture(scope="module")
def glm53_fp8() -> Plan:
    return _plan("glm53-fp8.yaml")


def _workers(plan: Plan) -> list[Any]:
    return [s for s in plan.services if s.role in ("prefill", "decode")]


# --- KV arithmetic -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("recipe", "bytes_per_token", "tokens_per_decoder"),
    [("glm53.yaml", 37_752, 1.63e6), ("glm53-fp8.yaml", 55_224, 1.09e6)],
    ids=["nvfp4", "fp8"],
)
def test_decoder_kv_capacity_matches_the_published_figures(
    recipe: str, bytes_per_token: int, tokens_per_decoder: float
) -> None:
    cap = _plan(recipe).capacity
    assert cap.decode is not None and cap.prefill is not None
    assert cap.decode.kv_bytes_per_token == bytes_per_token
    assert cap.prefill.kv_bytes_per_token == bytes_per_token
    got = cap.decode.kv_tokens_per_decoder
    assert abs(got - tokens_per_decoder) / tokens_per_decoder < 0.03, f"{got:,} tokens per decoder"


def test_nvfp4_holds_about_1_46x_the_tokens_of_fp8(glm53: Plan, glm53_fp8: Plan) -> None:
    assert glm53.capacity.decode and glm53_fp8.capacity.decode
    ratio = glm53.capacity.decode.kv_tokens_per_decoder / glm53_fp8.capacity.decode.kv_tokens_per_decoder
    assert ratio == pytest.approx(55_224 / 37_752, rel=1e-3)
    assert glm53.capacity.kv_row_bytes == 352 and glm53_fp8.capacity.kv_row_bytes == 576


def test_plan_json_shows_services_and_decode_capacity(cli: Callable[..., Any]) -> None:
    result = cli("plan", "recipes/glm53.yaml", "--output", "json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert isinstance(doc["services"], list)
    serving = [s for s in doc["services"] if s["role"] != "auxiliary"]
    assert len(serving) == 22  # 18 workers, etcd, Mooncake, the frontend and its balancer
    # monitoring: node_exporter and the health loop on all 19 hosts, dcgm-exporter on the 18 trays, Prometheus,
    # Alertmanager
    assert len(doc["services"]) - len(serving) == 19 + 19 + 18 + 2
    decode = doc["capacity"]["decode"]
    assert decode["kv_bytes_per_token"] == 37_752
    assert abs(decode["kv_tokens_per_decoder"] - 1.63e6) / 1.63e6 < 0.03
    # The JSON reads back into the same Plan (plans are data).
    assert Plan.model_validate_json(result.stdout) == _plan("glm53.yaml")


# --- GPU accounting ----------------------------------------------------------------------------

def test_every_gpu_of_the_rack_is_used_exactly_once(glm53: Plan) -> None:
    assert (glm53.capacity.gpus_used, glm53.capacity.gpus_total) == (72, 72)
    used: dict[str, list[int]] = defaultdict(list)
    for svc in _workers(glm53):
        used[svc.host] += svc.gpus
    for host, gpus in used.items():
        assert len(gpus) == len(set(gpus)), f"GPU used twice on {host}: {sorted(gpus)}"
        assert set(gpus) <= set(range(glm53.host(host).gpus))
    assert sum(len(g) for g in used.values()) == 72
    assert not glm53.services_on("head") or all(not s.gpus for s in glm53.services_on("head"))


def test_dep8_prefill_group_spans_two_trays_of_one_nvlink_domain(glm53: Plan) -> None:
    groups: dict[str, list[Any]] = defaultdict(list)
    for svc in glm53.services:
        if svc.role == "prefill":
            groups[svc.group or svc.name].append(svc)
    assert len(groups) == 3
    for name, parts in groups.items():
        assert len(parts) == 2, name
        hosts = [glm53.host(p.host) for p in parts]
        assert len({h.name for h in hosts}) == 2
        assert len({h.labels["nvlink_domain"] for h in hosts}) == 1
        dps = [p.data_parallel for p in parts]
        assert all(dp is not None for dp in dps)
        assert [dp.start_rank for dp in dps] == [0, 4]
        assert {(dp.size, dp.local) for dp in dps} == {(8, 4)}
        assert len({dp.address for dp in dps}) == 1 and dps[0].address == hosts[0].address
        assert len({p.ports["dp_rpc"] for p in parts}) == 1
        for p, dp in zip(parts, dps, strict=True):
            argv = p.argv
            assert argv[argv.index("--data-parallel-start-rank") + 1] == str(dp.start_rank)
            assert argv[argv.index("--data-parallel-address") + 1] == hosts[0].address
            assert argv[argv.index("--data-parallel-rpc-port") + 1] == str(p.ports["dp_rpc"])
            assert "--data-parallel-hybrid-lb" in argv and "--enable-expert-parallel" in argv
            assert p.gpus == [0, 1, 2, 3]
        # Only rank 0's process binds the DP RPC port.
        assert parts[0].ports["dp_rpc"] in parts[0].listens
        assert parts[1].ports["dp_rpc"] not in parts[1].listens


def test_tp4_decoder_stays_inside_one_tray(glm53: Plan) -> None:
    decoders = [s for s in glm53.services if s.role == "decode"]
    assert len(decoders) == 12
    assert len({d.host for d in decoders}) == 12
    for d in decoders:
        assert d.group is None and d.data_parallel is None
        assert d.gpus == [0, 1, 2, 3]
        assert d.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        assert d.argv[d.argv.index("--tensor-parallel-size") + 1] == "4"


# --- ports -------------------------------------------------------------------------------------

def test_ports_are_deterministic_and_never_shared_on_a_host(glm53: Plan) -> None:
    again = _plan("glm53.yaml")
    assert again.model_dump_json() == glm53.model_dump_json()
    assert [s.hashes() for s in again.services] == [s.hashes() for s in glm53.services]
    assert check_ports(glm53) == []
    on_host: dict[str, Counter[int]] = defaultdict(Counter)
    for s in glm53.services:
        on_host[s.host].update(s.listens)
    for host, counts in on_host.items():
        assert max(counts.values()) == 1, host
    # the endpoint (the frontend sits behind it), and HAProxy's own /metrics for Prometheus
    assert glm53.service("balancer").ports == {"http": 8000, "metrics": 8404}
    assert glm53.service("frontend").ports == {"http": 8100, "response_stream": 23000}
    twin = glm53.service("frontend").twin
    assert twin is not None and twin.ports == {"http": 8101, "response_stream": 23001}
    assert glm53.service("etcd").ports == {"client": 2379, "peer": 2380}
    assert glm53.service("decode-0").ports == {"system": 8081, "tcp_rpc": 23100, "nixl": 5600, "kv_events": 20080}
    # The second tray of a DEP8 group publishes KV events and NIXL side channels at port + DP rank.
    second = glm53.service("prefill-0-1")
    assert {20084, 20085, 20086, 20087, 5604, 5605, 5606, 5607} <= set(second.listens)


def test_workers_on_one_host_get_consecutive_port_blocks() -> None:
    recipe = load_recipe(REPO / "recipes" / "demo.yaml").recipe
    plan = build_plan(recipe)
    workers = _workers(plan)
    assert [w.ports["system"] for w in workers] == [8081, 8082, 8083]
    assert [w.ports["tcp_rpc"] for w in workers] == [23100, 23101, 23102]
    assert check_ports(plan) == []


# --- start order -------------------------------------------------------------------------------

ROLE_ORDER = {"control": 0, "cache": 1, "prefill": 2, "decode": 2, "frontend": 3, "balancer": 4}


def test_start_waves_go_control_plane_cache_workers_frontend(glm53: Plan) -> None:
    waves = glm53.start_waves()
    assert waves[-1] == ["prometheus"]  # it scrapes once everything it watches has started: a first `up` never pages
    roles = [r for r in ([glm53.service(n).role for n in wave if glm53.service(n).role != "auxiliary"]
                         for wave in waves) if r]
    flat = [ROLE_ORDER[r] for wave in roles for r in wave]
    assert flat == sorted(flat), roles
    assert roles[0] == ["control", "cache"]  # etcd and mooncake_master need nothing else
    assert set(roles[1]) == {"prefill", "decode"} and len(roles[1]) == 18
    assert roles[-2:] == [["frontend"], ["balancer"]]
    frontend = glm53.service("frontend")
    assert set(frontend.depends_on) == {s.name for s in glm53.services
                                        if s.role not in ("frontend", "balancer", "auxiliary")}


# --- DEP vs TEP --------------------------------------------------------------------------------

def test_dep8_prefill_caches_several_times_the_prefix_tokens_of_tep8() -> None:
    """TEP8 now plans on the trays themselves (two trays of the NVL72 domain): recipes/glm53-tep8.yaml."""
    dep = _plan("glm53.yaml").capacity.prefill
    tep = _plan("glm53-tep8.yaml").capacity.prefill
    assert dep and tep
    ratio = dep.kv_tokens_per_instance / tep.kv_tokens_per_instance
    print(f"DEP8 {dep.kv_tokens_per_instance:,} vs TEP8 {tep.kv_tokens_per_instance:,} tokens: {ratio:.2f}x")
    assert ratio > 4
    # TEP shards dense weights 8 ways (more KV per GPU) but its 8 ranks hold copies of one KV.
    assert tep.kv_budget_gb > dep.kv_budget_gb
    assert tep.kv_tokens_per_instance == tep.kv_tokens_per_gpu

"""The agentic workload generator: exact sizes, prefix reuse, session pinning ids, cold share, AIPerf format."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from primectl.bench.workload import PRESETS, WorkloadSpec, generate, inspect_trace, preset

BLOCK = 64


def demo(sessions: int = 40, seed: int = 7, **over):
    return generate(preset("agentic-demo", **over), seed=seed, block_size=BLOCK, sessions=sessions)


def test_presets_and_engine_default() -> None:
    from pathlib import Path

    from primectl.planner.build import plan_recipe

    recipes = Path(__file__).resolve().parent.parent / "recipes"
    # the engine's capabilities name the default preset: the demo scale for the mocker, production for vLLM on
    # GPUs, and prompts that fit a 2K-context model for vLLM on CPU
    assert plan_recipe(recipes / "demo.yaml")[1].serving.capabilities.workload == "agentic-demo"
    assert plan_recipe(recipes / "glm53.yaml")[1].serving.capabilities.workload == "agentic"
    assert plan_recipe(recipes / "demo-vllm.yaml")[1].serving.capabilities.workload == "agentic-tiny"
    assert all(r.prompt_tokens + r.output_tokens < 2048
               for r in generate(PRESETS["agentic-tiny"], seed=1, block_size=64, sessions=8).requests)
    prod = PRESETS["agentic"]
    assert prod.turn_tokens == 6_000
    w = generate(prod, seed=1, block_size=64, sessions=3)
    mean = sum(r.prompt_tokens for r in w.requests if not r.cold) / sum(not r.cold for r in w.requests)
    assert 120_000 < mean < 160_000  # "a ~140K-token prompt"
    with pytest.raises(ValueError, match="unknown workload"):
        preset("nope")


def test_same_seed_same_bytes_other_seed_differs() -> None:
    assert demo().to_jsonl() == demo().to_jsonl()
    assert demo(seed=8).to_jsonl() != demo().to_jsonl()


def test_exact_token_counts_in_the_aiperf_rows() -> None:
    spec = preset("agentic-demo")
    w = demo()
    rows = [json.loads(line) for line in w.to_jsonl().splitlines()]
    assert len(rows) == len(w.requests)
    for row, r in zip(rows, w.requests, strict=True):
        assert row["input_length"] == r.new_tokens
        assert row["output_length"] == r.output_tokens
        # AIPerf's hash_ids layout: every block full except possibly the last one.
        assert len(row["hash_ids"]) == math.ceil(r.new_tokens / BLOCK)
        if r.cold:
            assert r.new_tokens == spec.cold_tokens and "delay" not in row
        elif r.turn == 0:
            assert r.new_tokens == spec.initial_tokens and "delay" not in row
        else:
            assert abs(r.new_tokens - spec.turn_tokens) <= spec.turn_tokens * spec.jitter + 1
            assert row["delay"] >= 0
    for reqs in w.sessions().values():
        context = 0
        for r in reqs:  # the prompt is the whole history: earlier turns and earlier replies
            assert r.context_tokens == context
            context += r.new_tokens + r.output_tokens


def test_prefix_reuse_each_turn_extends_the_previous_prompt() -> None:
    w = demo()
    for reqs in w.sessions().values():
        assert [r.turn for r in reqs] == list(range(len(reqs)))
        for prev, cur in itertools.pairwise(reqs):
            assert cur.prefix_hash_ids[: len(prev.prefix_hash_ids)] == prev.prefix_hash_ids
            assert cur.prefix_hash_ids[len(prev.prefix_hash_ids):] == cur.new_hash_ids
    # Blocks are never reused across sessions, except the shared system prompt.
    shared = preset("agentic-demo").shared_prefix_tokens // BLOCK
    firsts = [reqs[0] for reqs in w.sessions().values() if not reqs[0].cold]
    assert all(r.new_hash_ids[:shared] == tuple(range(shared)) for r in firsts)
    owner: dict[int, str] = {}
    for r in w.requests:
        for h in r.new_hash_ids:
            if h >= shared:
                assert owner.setdefault(h, r.session_id) == r.session_id


def test_sessions_are_pinned_by_one_id_and_grouped_in_order() -> None:
    w = demo(sessions=10)
    spec = preset("agentic-demo")
    rows = [json.loads(line) for line in w.to_jsonl().splitlines()]
    ids = [r["session_id"] for r in rows]
    # Every row carries its session id; a session's rows are contiguous (AIPerf groups by session_id).
    runs = [sid for i, sid in enumerate(ids) if i == 0 or ids[i - 1] != sid]
    assert len(runs) == len(set(ids))
    agent = {sid for sid in ids if not sid.startswith("cold")}
    assert len(agent) == 10
    assert all(ids.count(sid) == spec.turns for sid in agent)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.25, 0.5])
def test_cold_prompt_share(share: float) -> None:
    w = demo(sessions=40, cold_share=share)
    cold = [r for r in w.requests if r.cold]
    assert len(cold) / len(w.requests) == pytest.approx(share, abs=0.01)
    assert len({r.session_id for r in cold}) == len(cold)  # each its own one-turn session
    assert all(r.context_tokens == 0 and r.turn == 0 for r in cold)
    if cold:  # spread through the file, not bunched at the end
        positions = [i for i, r in enumerate(w.requests) if r.cold]
        assert positions[0] < len(w.requests) / 4


def test_stats_theoretical_hit_rate() -> None:
    w = demo(sessions=20, cold_share=0.0)
    st = w.stats()
    assert st["sessions"] == 20 and st["cold_prompts"] == 0
    assert 0.5 < st["theoretical_prefix_hit_rate"] < 1
    # More cold prompts: fewer hits.
    assert demo(sessions=20, cold_share=0.5).stats()["theoretical_prefix_hit_rate"] < st["theoretical_prefix_hit_rate"]


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        WorkloadSpec("x", 100, 200, 10, 2, 4, 0, 100, 0.1)  # shared prefix larger than the first prompt
    with pytest.raises(ValueError):
        preset("agentic-demo", cold_share=1.0)


def test_demo_sizes_fit_the_demo_context() -> None:
    spec = preset("agentic-demo")
    w = demo()
    # The demo model serves 32K; leave room for the chat template.
    assert max(r.prompt_tokens + r.output_tokens for r in w.requests) < 32_768 - 512
    assert spec.output_tokens == 32


def test_inspect_user_trace(tmp_path) -> None:
    good = tmp_path / "t.jsonl"
    good.write_text('{"session_id":"a","input_length":10,"hash_ids":[1]}\n{"session_id":"a","input_length":5}\n'
                    '{"text_input":"hi"}\n')
    info = inspect_trace(good)
    assert (info.rows, info.sessions, info.has_hash_ids) == (3, 2, True)
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"output_length": 3}\n')
    with pytest.raises(ValueError, match="input_length"):
        inspect_trace(bad)
    bad.write_text("not json\n")
    with pytest.raises(ValueError, match="not JSON"):
        inspect_trace(bad)


def test_the_tiny_models_workload_asks_for_its_whole_answer_and_the_others_do_not(tmp_path) -> None:
    from pathlib import Path

    from primectl.bench.aiperf import Tokenizer, profile_argv

    def argv(name: str) -> list[str]:
        return profile_argv("aiperf", model="demo", url="http://127.0.0.1:8000", tokenizer=Tokenizer("t", None),
                            concurrency=2, duration_s=5, input_file=Path("in.jsonl"), artifacts=tmp_path, seed=1,
                            block_size=64, user_trace=False, ignore_eos=PRESETS[name].ignore_eos).argv

    # a random-weight model stops at a random end-of-sequence, and an answer stopped at its first token is empty
    tiny = argv("agentic-tiny")
    assert "ignore_eos:true" in tiny and tiny[tiny.index("ignore_eos:true") - 1] == "--extra-inputs", tiny
    assert all("ignore_eos:true" not in argv(n) for n in ("agentic", "agentic-demo"))

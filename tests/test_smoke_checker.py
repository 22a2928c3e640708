"""The smoke checker's own logic, on constructed responses (no server): tool checks, schema validator, helpers."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from primectl.checks.metrics import counter_sum
from primectl.checks.smoke import (
    STREAM_ATTEMPTS,
    CheckResult,
    Runner,
    SmokeReport,
    _culprit,
    _gate_detail,
    judge_stream,
    max_context,
    prefill_budget,
)
from primectl.checks.toolcheck import Scenario, check_turn, compare_turns, from_chunks, from_completion, validate
from primectl.checks.toolcheck import scenarios as tool_scenarios

REPO = Path(__file__).resolve().parent.parent

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}},
        "required": ["city", "unit"]}}}
ECHO = {"type": "function", "function": {
    "name": "echo", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
SPECIAL = 'a < b && c > "d" \'e\''


def completion(content: str | None = None, calls: Sequence[tuple[str, Any]] = (), finish: str = "stop") -> ChatCompletion:
    """A ChatCompletion as the openai client would parse it from a server."""
    tool_calls = [{"id": f"call_{i}", "type": "function",
                   "function": {"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)}}
                  for i, (n, a) in enumerate(calls)]
    return ChatCompletion.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": finish, "logprobs": None,
                     "message": {"role": "assistant", "content": content, "tool_calls": tool_calls or None}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})


def chunks(content: str = "", calls: Sequence[tuple[str, Any]] = (), finish: str = "stop",
           pieces: int = 3) -> list[ChatCompletionChunk]:
    """A streamed answer: content one char per chunk, each call's arguments split into `pieces` fragments."""
    def chunk(delta: dict[str, Any], fr: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk.model_validate({
            "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": fr}]})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": ch}) for ch in content]
    for i, (name, args) in enumerate(calls):
        text = args if isinstance(args, str) else json.dumps(args)
        step = max(1, len(text) // pieces + 1)
        out.append(chunk({"tool_calls": [{"index": i, "id": f"call_{i}", "type": "function",
                                          "function": {"name": name, "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": text[j:j + step]}}]})
                for j in range(0, len(text), step)]
    out.append(chunk({}, finish))
    out.append(ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}))
    return out


AUTO = Scenario("auto", "weather?", [WEATHER, ECHO], "auto", "get_weather", {"city": "Paris"})
GOOD_ARGS = {"city": "Paris", "unit": "celsius", "days": 3}


def problems_both(sc: Scenario, calls: Sequence[tuple[str, Any]], content: str = "", finish: str = "tool_calls") -> list[str]:
    """check_turn on the unary and the streamed form of the same answer, plus their comparison."""
    unary = from_completion(completion(content or None, calls, finish))
    streamed = from_chunks(chunks(content, calls, finish))
    return check_turn(unary, sc) + check_turn(streamed, sc) + compare_turns(unary, streamed)


# --- passing cases -------------------------------------------------------------------------------


def test_auto_call_with_valid_arguments_passes_streamed_and_unary():
    assert problems_both(AUTO, [("get_weather", GOOD_ARGS)]) == []


def test_stream_accumulates_fragmented_arguments_like_unary():
    streamed = from_chunks(chunks("", [("get_weather", GOOD_ARGS), ("echo", {"text": SPECIAL})], "tool_calls", 7))
    assert [c.name for c in streamed.tool_calls] == ["get_weather", "echo"]
    assert json.loads(streamed.tool_calls[1].arguments) == {"text": SPECIAL}
    assert streamed.finish_reason == "tool_calls"


def test_none_without_call_passes():
    sc = Scenario("none", "weather?", [WEATHER], "none")
    assert problems_both(sc, [], content="It is sunny.", finish="stop") == []


def test_required_with_call_passes():
    assert problems_both(Scenario("required", "hi", [WEATHER], "required"), [("get_weather", GOOD_ARGS)]) == []


def test_named_function_passes():
    sc = Scenario("named", "repeat", [WEATHER, ECHO], {"type": "function", "function": {"name": "echo"}}, "echo")
    assert problems_both(sc, [("echo", {"text": "hello"})], finish="stop") == []


def test_special_characters_kept_verbatim_pass():
    sc = Scenario("special", "echo", [ECHO], "auto", "echo", {"text": SPECIAL})
    assert problems_both(sc, [("echo", {"text": SPECIAL})]) == []


def test_undeclared_call_surfaced_passes():
    sc = Scenario("undeclared", "call get_time", [WEATHER], "auto", "get_time")
    assert problems_both(sc, [("get_time", {"timezone": "UTC"})]) == []


def test_builtin_scenarios_accept_their_ideal_answers():
    special = 'a < b && "c" \'d\' <e/>'
    ideal: dict[str, list[tuple[str, Any]]] = {
        "auto": [("get_weather", {"city": "Paris", "unit": "celsius"})],
        "required: enums": [("get_weather", {"city": "Lima", "unit": "celsius"})],
        "none": [],
        "named function: types (pattern, integer range, boolean)": [
            ("book_flight", {"code": "CDG", "seats": 2, "refundable": False})],
        "nested/$ref schema": [("create_order", {
            "customer": {"id": 7, "tier": "gold"}, "items": [{"sku": "ab12", "qty": 1}, {"sku": "cd34", "qty": 5}]})],
        "special characters arrive unchanged": [("render_markup", {"snippet": special, "glyphs": "<&"})],
        "undeclared tool never silently dropped": [],
        "string argument holding the parser's end tag </tool_call>": [("echo_tag", {"text": "a</tool_call>b"})],
    }
    scenarios = tool_scenarios()
    assert {s.name for s in scenarios} == set(ideal)
    for sc in scenarios:
        calls = ideal[sc.name]
        assert problems_both(sc, calls, content="" if calls else "ok", finish="tool_calls" if calls else "stop") == [], sc.name


def test_builtin_scenarios_refuse_what_a_broken_stack_returns():
    by = {s.name: s for s in tool_scenarios()}
    # a bounded argument that came back altered or escaped
    assert problems_both(by["special characters arrive unchanged"],
                         [("render_markup", {"snippet": "a &lt; b &amp;&amp; \"c\" 'd' &lt;e/&gt;", "glyphs": "<"})])
    # a call whose JSON broke off at the end tag inside its argument: dropped, its tail leaked into content
    leaked = problems_both(by["string argument holding the parser's end tag </tool_call>"], [],
                           content='b"}}\n</tool_call>', finish="stop")
    assert any("no tool call came" in p for p in leaked)
    # the undeclared tool's call was dropped but its markup leaked
    assert any("leaked into content" in p for p in problems_both(
        by["undeclared tool never silently dropped"], [], content='<tool_call>{"name": "get_time"', finish="stop"))
    # finish_reason tool_calls without a call
    assert any("call dropped" in p for p in problems_both(by["undeclared tool never silently dropped"], [],
                                                            content="", finish="tool_calls"))
    # a call cut off by max_tokens must not pass as complete
    assert any("cut off by max_tokens" in p for p in problems_both(
        by["required: enums"], [("get_weather", {"city": "Paris", "unit": "c"})], content="", finish="length"))


def test_the_end_tag_defect_is_recognised_from_both_answers():
    from primectl.checks.toolcheck import ToolCall, Turn, known_end_tag_defect

    broken = Turn('b"}}\n</tool_call>', (), "stop")
    assert known_end_tag_defect(broken, broken, "</tool_call>")
    fixed = Turn("", (ToolCall("echo_tag", '{"text": "a</tool_call>b"}'),), "tool_calls")
    assert not known_end_tag_defect(fixed, fixed, "</tool_call>")
    assert not known_end_tag_defect(broken, fixed, "</tool_call>")


def test_the_end_tag_scenario_warns_on_the_known_defect_and_fails_on_anything_else():
    from primectl.checks.toolcheck import ToolCall, Turn, verdict

    sc = next(s for s in tool_scenarios() if s.id == "end_tag")
    broken = Turn('b"}}\n</tool_call>', (), "stop")
    status, evidence = verdict(sc, broken, broken, "</tool_call>")
    assert status == "warn" and evidence.startswith("serving-stack defect")
    other = Turn("no call", (), "stop")
    status, evidence = verdict(sc, other, other, "</tool_call>")
    assert status == "fail" and evidence.startswith("non-streaming: tool_choice required but no tool call came")
    good = Turn("", (ToolCall("echo_tag", '{"text": "a</tool_call>b"}'),), "tool_calls")
    assert verdict(sc, good, good, "</tool_call>") == ("pass", good.summary())


# --- failure modes -------------------------------------------------------------------------------


def test_dropped_call_to_undeclared_tool_with_normal_content_fails():
    sc = Scenario("undeclared", "call get_time", [WEATHER], "auto", "get_time")
    probs = check_turn(from_completion(completion("The time is noon.", [], "stop")), sc)
    assert any("undeclared tool get_time was not surfaced" in p for p in probs), probs


def test_finish_reason_tool_calls_without_calls_is_a_dropped_call():
    probs = check_turn(from_completion(completion("Sure.", [], "tool_calls")), AUTO)
    assert any("dropped" in p for p in probs), probs


def test_call_to_undeclared_tool_in_normal_scenario_fails():
    probs = check_turn(from_completion(completion(None, [("get_time", {})], "tool_calls")), AUTO)
    assert any("undeclared tool 'get_time'" in p for p in probs), probs


def test_wrong_argument_type_fails():
    probs = check_turn(from_completion(completion(None, [("get_weather", GOOD_ARGS | {"days": "3"})])), AUTO)
    assert any("$.days: expected integer, got string" in p for p in probs), probs


def test_boolean_is_not_an_integer():
    probs = check_turn(from_completion(completion(None, [("get_weather", GOOD_ARGS | {"days": True})])), AUTO)
    assert any("$.days: expected integer, got boolean" in p for p in probs), probs


def test_missing_required_field_fails():
    probs = check_turn(from_completion(completion(None, [("get_weather", {"city": "Paris"})])), AUTO)
    assert any("missing required field 'unit'" in p for p in probs), probs


def test_enum_violated_fails():
    probs = check_turn(from_completion(completion(None, [("get_weather", GOOD_ARGS | {"unit": "kelvin"})])), AUTO)
    assert any("$.unit" in p and "not one of" in p for p in probs), probs


def test_arguments_not_json_fail():
    probs = check_turn(from_completion(completion(None, [("get_weather", '{"city": "Paris", ')])), AUTO)
    assert any("not valid JSON" in p for p in probs), probs


def test_html_escaped_special_characters_fail():
    sc = Scenario("special", "echo", [ECHO], "auto", "echo", {"text": SPECIAL})
    escaped = 'a &lt; b &amp;&amp; c &gt; &quot;d&quot; \'e\''
    probs = check_turn(from_completion(completion(None, [("echo", {"text": escaped})])), sc)
    assert any("HTML-escaped" in p for p in probs), probs


def test_altered_special_characters_fail():
    sc = Scenario("special", "echo", [ECHO], "auto", "echo", {"text": SPECIAL})
    probs = check_turn(from_completion(completion(None, [("echo", {"text": SPECIAL.replace('"', "'")})])), sc)
    assert any("altered" in p for p in probs), probs


def test_streaming_and_unary_disagree_on_arguments_fails():
    unary = from_completion(completion(None, [("get_weather", GOOD_ARGS)], "tool_calls"))
    streamed = from_chunks(chunks("", [("get_weather", GOOD_ARGS | {"days": 4})], "tool_calls"))
    probs = compare_turns(unary, streamed)
    assert any("disagree on get_weather arguments" in p for p in probs), probs


def test_streaming_drops_the_call_fails():
    unary = from_completion(completion(None, [("get_weather", GOOD_ARGS)], "tool_calls"))
    streamed = from_chunks(chunks("It is sunny in Paris.", [], "stop"))
    probs = compare_turns(unary, streamed) + check_turn(streamed, AUTO)
    assert any("disagree on calls" in p for p in probs), probs
    assert any("expected a call to get_weather" in p for p in probs), probs


def test_tool_choice_none_but_a_call_came_fails():
    sc = Scenario("none", "weather?", [WEATHER], "none")
    probs = check_turn(from_completion(completion(None, [("get_weather", GOOD_ARGS)], "tool_calls")), sc)
    assert any("tool_choice none" in p for p in probs), probs


def test_tool_choice_required_but_no_call_fails():
    sc = Scenario("required", "hi", [WEATHER], "required")
    probs = check_turn(from_completion(completion("Hello!", [], "stop")), sc)
    assert any("tool_choice required but no tool call" in p for p in probs), probs


def test_named_tool_choice_but_other_function_called_fails():
    sc = Scenario("named", "repeat", [WEATHER, ECHO], {"type": "function", "function": {"name": "echo"}}, "echo")
    probs = check_turn(from_completion(completion(None, [("get_weather", GOOD_ARGS)], "tool_calls")), sc)
    assert any("tool_choice named echo but get_weather was called" in p for p in probs), probs


# --- the schema validator ------------------------------------------------------------------------

TREE = {
    "type": "object",
    "properties": {"root": {"$ref": "#/$defs/node"}},
    "required": ["root"],
    "$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["name"], "additionalProperties": False}},
}


def _chain(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"name": "leaf"}
    for i in range(depth):
        node = {"name": f"n{i}", "kids": [node]}
    return {"root": node}


def test_recursive_ref_valid_and_invalid_deep_node():
    assert validate(_chain(5), TREE) == []
    bad = _chain(3)
    bad["root"]["kids"][0]["kids"][0]["kids"][0] = {"nom": "x"}
    errs = validate(bad, TREE)
    assert "$.root.kids[0].kids[0].kids[0]: missing required field 'name'" in errs
    assert "$.root.kids[0].kids[0].kids[0]: unexpected field 'nom'" in errs


def test_recursion_depth_limit():
    errs = validate(_chain(10), TREE, max_depth=5)
    assert any("deeper than 5" in e for e in errs), errs


def test_unresolvable_ref_and_nested_types():
    assert validate({"a": 1}, {"properties": {"a": {"$ref": "#/$defs/nope"}}}) == ["$.a: unresolvable $ref '#/$defs/nope'"]
    schema = {"type": "object", "properties": {"m": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["tags"]}}}
    assert validate({"m": {"tags": ["a", 2]}}, schema) == ["$.m.tags[1]: expected string, got integer 2"]
    assert validate({"m": {}}, schema) == ["$.m: missing required field 'tags'"]
    assert validate(1.0, {"type": "integer"}) == []
    assert validate(None, {"type": ["string", "null"]}) == []
    assert validate("x", {"anyOf": [{"type": "integer"}, {"enum": ["y"]}]}) == ["$: matches 0 of the anyOf alternatives"]


# --- smoke helpers -------------------------------------------------------------------------------

METRICS = """# HELP dynamo_component_requests_total Total
# TYPE dynamo_component_requests_total counter
dynamo_component_requests_total{dynamo_component="prefill",dynamo_endpoint="generate",worker_id="f5"} 5
dynamo_component_requests_total{dynamo_component="prefill",dynamo_endpoint="worker_kv_query_source_46",worker_id="f5"} 1
dynamo_component_requests_total{dynamo_component="backend",dynamo_endpoint="generate",worker_id="dc"} 2
"""


def test_counter_sum_picks_the_generate_series_of_the_role():
    assert counter_sum(METRICS, "dynamo_component_requests_total",
                       {"dynamo_component": "prefill", "dynamo_endpoint": "generate"}) == 5
    assert counter_sum(METRICS, "dynamo_component_requests_total",
                       {"dynamo_component": "backend", "dynamo_endpoint": "generate"}) == 2
    assert counter_sum(METRICS, "dynamo_component_requests_total", {"dynamo_component": "decode"}) == 0


def test_budget_and_context_come_from_the_plan_not_from_argv():
    from primectl.planner.build import plan_recipe

    _, plan = plan_recipe(REPO / "recipes" / "glm53.yaml")
    assert (prefill_budget(plan), max_context(plan)) == (4096, 202752)
    # the serving block is the source: a worker's argv is output only
    assert (plan.serving.prefill_budget, plan.serving.context_limit) == (4096, 202752)


def test_budget_and_context_from_the_demo_plan():
    from primectl.planner.build import build_plan
    from primectl.planner.load import load_recipe

    plan = build_plan(load_recipe(REPO / "recipes" / "demo.yaml").recipe)
    assert prefill_budget(plan) == 4096
    assert max_context(plan) == 262144
    assert prefill_budget(None) == 4096
    assert max_context(None) is None


def test_gate_detail_names_missing_worker_types():
    body = {"model": "demo", "ready": False, "reason": "no namespace has all required worker types live",
            "namespaces": {"demo": {"ready": False, "worker_types": {"decode": {"workers": 2}},
                                    "missing_worker_types": ["prefill"]}}}
    assert _gate_detail(body) == ("no namespace has all required worker types live; workers decodex2; "
                                  "MISSING worker types: prefill")


def test_report_json_and_junit():
    rep = SmokeReport("http://h:8000", "demo", "mocker", [
        CheckResult("t.a", "a", "pass", 1.0, "ok"), CheckResult("t.b", "b", "fail", 2.0, "HTTP 503 <missing> & more"),
        CheckResult("t.c", "c", "n/a", 0.0, "n/a (engine: mocker)"), CheckResult("t.d", "d", "warn", 3.0, "5xx")])
    doc = rep.to_dict()
    assert doc["ok"] is False and doc["counts"] == {"pass": 1, "fail": 1, "warn": 1, "n/a": 1}
    assert doc["checks"][1] == {"id": "t.b", "check": "b", "result": "fail", "ms": 2.0,
                                "evidence": "HTTP 503 <missing> & more"}
    suite = ET.fromstring(rep.to_junit().split("\n", 1)[1]).find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "1", "1")
    cases = suite.findall("testcase")
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message") == "HTTP 503 <missing> & more"
    assert cases[2].find("skipped") is not None


@pytest.mark.parametrize("evidence, culprit", [
    ("decode-10: KV transfer timed out", "decode-10"),
    ("worker decode-11 stopped answering", "decode-11"),
    ("decode-1: KV transfer timed out", "decode-1"),
    ("no answer from decode-1.", "decode-1"),
    ("decode-1-x stalled; decoded 0 tokens", "frontend"),
    ("prefill-2-1 (HTTP 503)", "prefill-2-1"),
    ("a decode worker stopped answering", "decode-0"),
    ("prefill_budget exceeded", "frontend"),
])
def test_the_culprit_is_the_service_named_whole_not_one_whose_name_is_a_prefix(evidence, culprit):
    from primectl.planner.build import plan_recipe

    plan = plan_recipe(REPO / "recipes" / "glm53.yaml")[1]
    assert {"decode-1", "decode-10", "decode-11"} <= {s.name for s in plan.services}
    report = SmokeReport("http://h:8000", "m", "vllm", [CheckResult("chat.basic", "chat", "fail", 1.0, evidence)])
    assert _culprit(report, plan) == culprit


def test_cli_needs_a_recipe_or_url(cli):
    res = cli("smoke")
    assert res.exit_code == 2 and "give a RECIPE or --url (with --model)" in res.stderr, res.stderr
    res = cli("smoke", "--url", "http://127.0.0.1:9")
    assert res.exit_code == 2 and "--model is required with --url and no recipe" in res.stderr, res.stderr


def test_cli_unreachable_endpoint_fails_with_junit(cli, tmp_path):
    junit = tmp_path / "smoke.xml"
    res = cli("smoke", "--url", "http://127.0.0.1:9", "--model", "m", "-o", "json", "--junit", junit)
    assert res.exit_code == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["checks"][0]["result"] == "fail" and "Connection" in doc["checks"][0]["evidence"]
    assert all(c["result"] == "n/a" for c in doc["checks"][1:])
    assert "<failure" in junit.read_text()


def test_cli_recipe_unreachable_table(cli):
    res = cli("smoke", "recipes/demo.yaml", "--url", "http://127.0.0.1:9")
    assert res.exit_code == 1
    lines = res.stdout.splitlines()
    assert re.match(r"smoke http://127\.0\.0\.1:9 model demo: FAILED \(\d+ pass, [1-9]\d* fail, \d+ warn, \d+ n/a\)$", lines[0])
    rows = {re.split(r"\s{2,}", line)[0]: re.split(r"\s{2,}", line)[1:] for line in lines[2:]}
    gate = rows["ready: GET /v1/models/demo/ready == 200"]
    assert gate[0] == "fail" and "Connection" in gate[-1], gate
    assert rows["chat: non-streaming"][0] == "n/a" and rows["chat: non-streaming"][-1] == "not run: readiness gate failed"


@pytest.mark.parametrize("name", ["auto", "none"])
def test_tool_checks_are_na_on_mocker(name):
    from primectl.checks.smoke import Runner
    from primectl.planner.build import plan_recipe

    r = Runner("http://127.0.0.1:9", "m", plan_recipe(REPO / "recipes" / "demo.yaml")[1])
    sc = next(s for s in tool_scenarios() if s.name == name)
    res = r.check(f"tools.{sc.id}", f"tools: {name}", lambda: r.tool_scenario(sc))
    assert (res.status, res.evidence) == ("n/a", "n/a (engine mocker serves no tool calls)")


def test_a_stream_whose_chunks_come_at_once_is_not_incremental():
    problems, _ = judge_stream([0.8, 0.8004, 0.8008], (20, 32), "length")
    assert problems == ["all content chunks arrived within 1 ms (not incremental)"]
    assert judge_stream([0.2, 0.25, 0.3], (20, 32), "length")[0] == []
    assert judge_stream([0.2], None, None)[0] == [
        "fewer than 2 content chunks", "no usage chunk despite stream_options.include_usage", "no finish_reason"]


def _runner_streaming(answers: list[list[float]], completion_tokens: int = 32) -> tuple[Runner, list[int]]:
    """A Runner whose streamed chats arrive at the given times, one list per attempt (no server)."""
    runner = Runner("http://127.0.0.1:9", "m", None)
    calls: list[int] = []

    def once() -> tuple[list[float], tuple[int, int] | None, str | None]:
        calls.append(1)
        return answers[len(calls) - 1], (20, completion_tokens), "length"

    runner._stream_once = once  # type: ignore[method-assign]
    return runner, calls


def test_a_coalesced_stream_is_tried_again_and_passes_once_it_streams():
    runner, calls = _runner_streaming([[0.8, 0.8004], [0.2, 0.3, 0.4]])
    res = runner.check("chat.stream", "chat: streaming", runner.chat_stream)
    assert res.status == "pass" and len(calls) == 2
    assert "attempt 2 of 3" in res.evidence and "not incremental" in res.evidence


def test_a_frontend_that_always_buffers_fails_after_every_attempt():
    runner, calls = _runner_streaming([[0.8, 0.8004]] * STREAM_ATTEMPTS)
    res = runner.check("chat.stream", "chat: streaming", runner.chat_stream)
    assert res.status == "fail" and len(calls) == STREAM_ATTEMPTS and "not incremental" in res.evidence


def test_a_stream_of_one_token_fails_without_a_retry():
    runner, calls = _runner_streaming([[0.5]], completion_tokens=1)
    res = runner.check("chat.stream", "chat: streaming", runner.chat_stream)
    assert res.status == "fail" and len(calls) == 1 and "fewer than 2 content chunks" in res.evidence


def test_many_tokens_in_one_chunk_are_merged_deltas_and_tried_again():
    """vLLM on a loaded CPU host sometimes hands a whole answer over as one delta: the next try streams."""
    runner, calls = _runner_streaming([[0.5], [0.2, 0.3, 0.4]])
    res = runner.check("chat.stream", "chat: streaming", runner.chat_stream)
    assert res.status == "pass" and len(calls) == 2 and "32 tokens in 1 content chunk(s)" in res.evidence

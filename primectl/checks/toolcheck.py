"""The tool-calling smoke checks: their scenarios and verdicts, no I/O, unit-testable on constructed responses.

`scenarios` are the requests sent to engines that can call tools, each with a
stable id; `request` is the chat request one scenario sends (twice: streamed
and not); `verdict` judges the two answers. A response (an openai `ChatCompletion`, or the chunks of a streamed one) is
reduced to a `Turn`: content, tool calls with their raw argument text, and the
finish reason. `check_turn` says what is wrong with one turn given the
`Scenario` that produced it; `compare_turns` says where a streamed and a
non-streamed answer to the same request disagree. An empty list means pass.

Argument JSON is checked against the tool's JSON Schema by `validate`, a small
validator covering what tool schemas use: types, required, enum/const,
properties/additionalProperties, items, min/max bounds, any/all/oneOf and
`$ref` into `$defs`/`definitions` (recursion bounded by a depth limit).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

MAX_DEPTH = 32
"""How many nested `$ref` expansions `validate` follows before it gives up (recursive schemas)."""

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "object": (dict,), "array": (list, tuple), "null": (type(None),), "boolean": (bool,),
}


@dataclass(frozen=True)
class ToolCall:
    """One tool call as the server returned it (arguments left as raw text)."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class Turn:
    """What one assistant turn amounted to, whether it was streamed or not."""

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None

    def summary(self) -> str:
        """Short description for evidence text."""
        calls = ", ".join(f"{c.name}({_clip(' '.join(c.arguments.split()), 80)})" for c in self.tool_calls) or "none"
        return f"calls: {calls}; finish_reason={self.finish_reason}; content={_clip(self.content, 60)!r}"


@dataclass(frozen=True)
class Scenario:
    """One tool-calling request and what a correct answer must look like."""

    name: str
    prompt: str
    tools: list[dict[str, Any]]
    tool_choice: str | dict[str, Any] = "auto"
    expect_call: str | None = None  # the function the prompt asks for (may be an undeclared one)
    expect_args: dict[str, Any] = field(default_factory=dict)  # exact values expected, by dotted argument path
    markers: tuple[str, ...] = ("<tool_call>", "</tool_call>")  # the parser's tags: never in content
    id: str = ""  # the smoke check's stable id (`tools.<id>`), apart from `name`, its display text

    def declared(self) -> dict[str, Any]:
        """Declared function name -> its parameters schema."""
        out: dict[str, Any] = {}
        for t in self.tools:
            fn = t.get("function") or {}
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                out[fn["name"]] = fn.get("parameters") or {}
        return out

    def forced_name(self) -> str | None:
        """The function a named tool_choice forces, if any."""
        if isinstance(self.tool_choice, dict):
            fn = self.tool_choice.get("function") or {}
            name = fn.get("name") if isinstance(fn, dict) else None
            return name if isinstance(name, str) else None
        return None


def _clip(text: str | None, n: int) -> str:
    text = text or ""
    return text if len(text) <= n else text[: n - 1] + "…"


# --- turning responses into Turns ----------------------------------------------------------------


def from_completion(resp: ChatCompletion) -> Turn:
    """The first choice of a non-streamed chat completion."""
    if not resp.choices:
        return Turn("", (), None)
    choice = resp.choices[0]
    calls: list[ToolCall] = []
    for tc in choice.message.tool_calls or []:
        fn = getattr(tc, "function", None)
        if fn is not None:
            calls.append(ToolCall(fn.name or "", fn.arguments or "", tc.id or ""))
        else:  # a custom (non-function) tool call: keep it visible rather than dropping it
            custom = getattr(tc, "custom", None)
            calls.append(ToolCall(getattr(custom, "name", "") or "", getattr(custom, "input", "") or "", tc.id or ""))
    return Turn(choice.message.content or "", tuple(calls), choice.finish_reason)


def from_chunks(chunks: Iterable[ChatCompletionChunk]) -> Turn:
    """Accumulate streamed chunks (choice 0) into one turn; tool-call fragments are joined by index."""
    content: list[str] = []
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    ids: dict[int, str] = {}
    finish: str | None = None
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            for tc in delta.tool_calls or []:
                i = tc.index
                args.setdefault(i, [])
                if tc.id:
                    ids[i] = tc.id
                if tc.function is not None:
                    name = tc.function.name
                    if name and i not in names:
                        names[i] = name
                    elif name and name != names[i]:  # a name streamed in fragments
                        names[i] += name
                    if tc.function.arguments:
                        args[i].append(tc.function.arguments)
            if choice.finish_reason:
                finish = choice.finish_reason
    calls = tuple(ToolCall(names.get(i, ""), "".join(args[i]), ids.get(i, "")) for i in sorted(args))
    return Turn("".join(content), calls, finish)


# --- JSON Schema subset --------------------------------------------------------------------------


def _resolve(ref: str, root: Mapping[str, Any]) -> Any:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise KeyError(ref)
    node: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _is_type(value: Any, t: str) -> bool:
    if t == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if t == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(t, ()))


def validate(instance: Any, schema: Any, *, root: Mapping[str, Any] | None = None, path: str = "$",
             depth: int = 0, max_depth: int = MAX_DEPTH) -> list[str]:
    """Problems with `instance` under `schema` (empty list: valid). Each problem names its JSON path."""
    if schema is True or schema is None or schema == {}:
        return []
    if schema is False:
        return [f"{path}: not allowed here"]
    if not isinstance(schema, Mapping):
        return [f"{path}: unusable schema {schema!r}"]
    root = schema if root is None else root
    errs: list[str] = []

    def sub(inst: Any, sch: Any, p: str, d: int = depth) -> list[str]:
        return validate(inst, sch, root=root, path=p, depth=d, max_depth=max_depth)

    if "$ref" in schema:
        if depth >= max_depth:
            return [f"{path}: nesting deeper than {max_depth} $ref levels"]
        try:
            target = _resolve(str(schema["$ref"]), root)
        except (KeyError, IndexError, ValueError, TypeError):
            return [f"{path}: unresolvable $ref {schema['$ref']!r}"]
        errs += sub(instance, target, path, depth + 1)
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_is_type(instance, str(x)) for x in types):
            return [*errs, f"{path}: expected {'/'.join(map(str, types))}, got {_json_type(instance)} {_clip(json.dumps(instance), 40)}"]
    if "enum" in schema and instance not in schema["enum"]:
        errs.append(f"{path}: {_clip(json.dumps(instance), 40)} not one of {schema['enum']}")
    if "const" in schema and instance != schema["const"]:
        errs.append(f"{path}: expected {schema['const']!r}, got {instance!r}")
    if isinstance(instance, dict):
        props = schema.get("properties") or {}
        errs += [f"{path}: missing required field {k!r}" for k in schema.get("required") or [] if k not in instance]
        extra = schema.get("additionalProperties", True)
        for k, v in instance.items():
            if k in props:
                errs += sub(v, props[k], f"{path}.{k}")
            elif extra is False:
                errs.append(f"{path}: unexpected field {k!r}")
            elif isinstance(extra, Mapping):
                errs += sub(v, extra, f"{path}.{k}")
    if isinstance(instance, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, v in enumerate(instance):
                errs += sub(v, items, f"{path}[{i}]")
        if "minItems" in schema and len(instance) < schema["minItems"]:
            errs.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            errs.append(f"{path}: more than {schema['maxItems']} items")
    if isinstance(instance, str):
        if "minLength" in schema and len(instance) < schema["minLength"]:
            errs.append(f"{path}: shorter than {schema['minLength']}")
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            errs.append(f"{path}: longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(str(schema["pattern"]), instance):
            errs.append(f"{path}: does not match {schema['pattern']!r}")
    if _is_type(instance, "number"):
        if "minimum" in schema and instance < schema["minimum"]:
            errs.append(f"{path}: {instance} below minimum {schema['minimum']}")
        if "maximum" in schema and instance > schema["maximum"]:
            errs.append(f"{path}: {instance} above maximum {schema['maximum']}")
    for s in schema.get("allOf") or []:
        errs += sub(instance, s, path)
    for key, want in (("anyOf", "any"), ("oneOf", "one")):
        options = schema.get(key)
        if options:
            ok = sum(not sub(instance, s, path) for s in options)
            if (want == "any" and ok == 0) or (want == "one" and ok != 1):
                errs.append(f"{path}: matches {ok} of the {key} alternatives")
    return errs


def _json_type(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "array", "object", "null"):
        if _is_type(value, name):
            return name
    return type(value).__name__


# --- the checks ----------------------------------------------------------------------------------


def parse_arguments(call: ToolCall) -> tuple[dict[str, Any] | None, str | None]:
    """The call's arguments as a JSON object, or (None, problem)."""
    try:
        args = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        return None, f"arguments of {call.name} are not valid JSON ({exc.msg}): {_clip(call.arguments, 80)!r}"
    if not isinstance(args, dict):
        return None, f"arguments of {call.name} are not a JSON object: {_clip(call.arguments, 80)!r}"
    return args, None


def _lookup(args: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = args
    for part in dotted.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, None
    return True, node


def check_turn(turn: Turn, sc: Scenario) -> list[str]:
    """Everything wrong with `turn` as an answer to `sc` (empty: pass)."""
    problems: list[str] = []
    declared = sc.declared()
    names = [c.name for c in turn.tool_calls]
    undeclared_expected = sc.expect_call is not None and sc.expect_call not in declared
    if turn.finish_reason == "tool_calls" and not turn.tool_calls:
        problems.append("finish_reason is tool_calls but the response carries no tool call (call dropped)")
    leaked = [m for m in sc.markers if m and m in turn.content]
    if leaked:
        problems.append(f"tool-call markup {', '.join(leaked)} leaked into content (a call was cut or dropped): "
                        f"{_clip(turn.content, 80)!r}")
    if turn.tool_calls and turn.finish_reason == "length":
        problems.append("a tool call cut off by max_tokens was returned as if complete (finish_reason=length)")
    if sc.tool_choice == "none":
        if turn.tool_calls:
            problems.append(f"tool_choice none, yet {len(names)} call(s) came: {', '.join(names)}")
        return problems
    if sc.tool_choice == "required" and not turn.tool_calls:
        problems.append(f"tool_choice required but no tool call came (content {_clip(turn.content, 60)!r})")
    forced = sc.forced_name()
    if forced is not None:
        if not turn.tool_calls:
            problems.append(f"tool_choice named {forced} but no tool call came")
        problems += [f"tool_choice named {forced} but {n} was called" for n in names if n != forced]
    if undeclared_expected:
        if sc.expect_call not in names:
            problems.append(
                f"a call to the undeclared tool {sc.expect_call} was not surfaced: "
                f"{'calls ' + ', '.join(names) if names else 'no tool_calls'}, finish_reason={turn.finish_reason}, "
                f"content {_clip(turn.content, 60)!r} (silently dropped?)")
    elif sc.expect_call is not None and sc.expect_call not in names and forced is None:
        problems.append(f"expected a call to {sc.expect_call}, got {', '.join(names) or 'no call'}"
                        f" (content {_clip(turn.content, 60)!r})")
    for call in turn.tool_calls:
        if call.name not in declared:
            if not undeclared_expected or call.name != sc.expect_call:
                problems.append(f"call to undeclared tool {call.name!r}")
            continue
        args, err = parse_arguments(call)
        if err is not None or args is None:
            problems.append(err or "unparseable arguments")
            continue
        problems += [f"{call.name}: {e}" for e in validate(args, declared[call.name])]
        if call.name == sc.expect_call or (forced is not None and call.name == forced):
            problems += _check_values(call.name, args, sc.expect_args)
    return problems


def _check_values(name: str, args: Mapping[str, Any], expect: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key, want in expect.items():
        found, got = _lookup(args, key)
        if not found:
            out.append(f"{name}: argument {key} missing (expected {want!r})")
        elif got != want:
            how = "HTML-escaped" if isinstance(got, str) and html.unescape(got) == want else "altered"
            out.append(f"{name}: argument {key} {how}: got {got!r}, expected {want!r}")
    return out


def compare_turns(unary: Turn, streamed: Turn) -> list[str]:
    """Where the streamed answer disagrees with the non-streamed one (tool calls, arguments, finish reason)."""
    problems: list[str] = []
    a = [c.name for c in unary.tool_calls]
    b = [c.name for c in streamed.tool_calls]
    if a != b:
        problems.append(f"streaming and non-streaming disagree on calls: {a or 'none'} vs {b or 'none'}")
    else:
        for ca, cb in zip(unary.tool_calls, streamed.tool_calls, strict=True):
            pa, _ = parse_arguments(ca)
            pb, _ = parse_arguments(cb)
            same = pa == pb if pa is not None and pb is not None else ca.arguments == cb.arguments
            if not same:
                problems.append(f"streaming and non-streaming disagree on {ca.name} arguments: "
                                f"{_clip(ca.arguments, 80)} vs {_clip(cb.arguments, 80)}")
    fa, fb = unary.finish_reason, streamed.finish_reason
    if fa != fb:
        problems.append(f"streaming and non-streaming disagree on finish_reason: {fa} vs {fb}")
    return problems


def known_end_tag_defect(unary: Turn, streamed: Turn, end_tag: str) -> bool:
    """Both answers show the parser defect: no call, and the argument's tail after the end tag in the content."""
    return all(not t.tool_calls and 'b"' in t.content and end_tag in t.content for t in (unary, streamed))


Verdict = tuple[Literal["pass", "warn", "fail"], str]


def verdict(sc: Scenario, unary: Turn, streamed: Turn, end_tag: str) -> Verdict:
    """How the scenario ends given its non-streamed and streamed answers, and the evidence."""
    problems = [f"non-streaming: {p}" for p in check_turn(unary, sc)]
    problems += [f"streaming: {p}" for p in check_turn(streamed, sc)]
    problems += compare_turns(unary, streamed)
    if not problems:
        return "pass", unary.summary()
    if sc.expect_args.get("text") == f"a{end_tag}b" and known_end_tag_defect(unary, streamed, end_tag):
        return "warn", (
            f"serving-stack defect (upstream, Dynamo 1.6.1's tool-call parser): a string argument holding "
            f"{end_tag} ends the call early; the call is dropped and its tail leaks into content "
            f"[non-streaming {unary.summary()}] [streaming {streamed.summary()}]. The grammar let the model "
            f"write it (xgrammar); the frontend's parser (lib/parsers tool_calling json base_json_parser "
            f"extract_tool_call_content, a non-greedy <tool_call>(.*?)</tool_call> match that is not "
            f"JSON-string aware) cuts it. Not a rollback: the previous revision has the same parser.")
    return "fail", "; ".join(problems) + f" [non-streaming {unary.summary()}]"


# --- the scenarios -------------------------------------------------------------------------------


def request(sc: Scenario, model: str, timeout_s: float) -> dict[str, Any]:
    """The chat request `sc` sends (keyword arguments of `chat.completions.create`)."""
    return {
        "model": model, "messages": [{"role": "user", "content": sc.prompt}], "tools": sc.tools,
        # greedy, so streaming and non-streaming must agree exactly; the frequency penalty keeps a weak model
        # from padding a grammar-forced call with whitespace until max_tokens. (No `seed`: with sampling it
        # kills vLLM 0.31's CPU engine core, "CPU Generator does not use offset".)
        "tool_choice": sc.tool_choice, "max_tokens": 512, "temperature": 0, "frequency_penalty": 1.0,
        "timeout": timeout_s, "parallel_tool_calls": False,
    }


def _fn(name: str, description: str, properties: dict[str, Any], **schema: Any) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": list(properties),
              "additionalProperties": False, **schema}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def scenarios(end_tag: str = "</tool_call>") -> list[Scenario]:
    """The tool-calling requests sent to engines that can call tools.

    Every string argument is bounded (enum or pattern) so the checks judge the serving stack (schema-constrained
    decoding, the tool-call parser, streaming) and hold for any model, a random-weight one included.
    """
    weather = _fn("get_weather", "Current weather for a city.", {
        "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}})
    flight = _fn("book_flight", "Book a flight.", {
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "seats": {"type": "integer", "minimum": 1, "maximum": 9},
        "refundable": {"type": "boolean"}})
    order = _fn("create_order", "Create an order.", {
        "customer": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999},
                                                      "tier": {"type": "string", "enum": ["gold", "basic"]}},
                     "required": ["id", "tier"], "additionalProperties": False},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1, "maxItems": 2}},
        **{"$defs": {"item": {"type": "object", "properties": {
            "sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"},
            "qty": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["sku", "qty"], "additionalProperties": False}}})
    special = 'a < b && "c" \'d\' <e/>'
    markup = _fn("render_markup", "Render markup characters verbatim.", {
        "snippet": {"type": "string", "enum": [special]},
        "glyphs": {"type": "string", "pattern": "^[<&\"']{1,4}$"}})
    tagged = f"a{end_tag}b"
    echo_tag = _fn("echo_tag", "Echo a text that contains the tool-call end tag.", {
        "text": {"type": "string", "enum": [tagged]}})
    markers = ("<tool_call>", end_tag)
    return [
        Scenario("auto", "What is the weather in Paris in celsius? Use the tool.", [weather, flight], "auto",
                 markers=markers, id="auto"),
        Scenario("required: enums", "Hello there!", [weather], "required", markers=markers, id="required"),
        Scenario("none", "What is the weather in Paris in celsius? Use the tool.", [weather], "none",
                 markers=markers, id="none"),
        Scenario("named function: types (pattern, integer range, boolean)", "Book me a flight.",
                 [weather, flight], {"type": "function", "function": {"name": "book_flight"}}, "book_flight",
                 markers=markers, id="named"),
        Scenario("nested/$ref schema", "Order two items for customer 7.", [order], "required",
                 markers=markers, id="nested_ref"),
        Scenario("special characters arrive unchanged", f"Render this: {special}", [markup], "required",
                 "render_markup", {"snippet": special}, markers=markers, id="special_chars"),
        Scenario("undeclared tool never silently dropped",
                 "You must call the function get_time with timezone 'UTC' now (it exists even if not "
                 "listed). Do not answer in text.", [weather], "auto", markers=markers, id="undeclared"),
        Scenario(f"string argument holding the parser's end tag {end_tag}", "Echo the tag.", [echo_tag],
                 "required", "echo_tag", {"text": tagged}, markers=(), id="end_tag"),
    ]

"""Endpoint smoke tests: `primectl smoke`, and the gate `up` runs after readiness.

Every request to the model endpoint goes through the official `openai` client
(`base_url=URL/v1`, `api_key="none"`, no retries, short timeouts). Worker
metrics (Prometheus text on each worker's system port) are read by
`workers.py`; the tool-calling scenarios and their verdicts are `toolcheck.py`'s;
the JUnit form is `report.py`'s, shared with preflight.

Every check has a stable id (`chat.basic`, `tools.required`), apart from its
display text: the JSON output carries both, JUnit testcases are named by the id.
Each check ends as one of:
- pass;
- fail: the deployment is broken (exit 1; `up` rolls back);
- warn: a known deviation that does not make the deployment unusable, e.g. a
  5xx instead of a 4xx for a prompt over the context limit while the server
  keeps serving (reported, does not fail the run);
- n/a: not applicable (no plan, mocker engine, readiness gate failed, ...).
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from primectl.checks import registration, toolcheck, workers
from primectl.checks.report import Case, Status, junit_xml, tally
from primectl.errors import DeployError
from primectl.output import print_table

if TYPE_CHECKING:
    from openai import OpenAI

    from primectl.plan.model import Plan, Service

REQUEST_TIMEOUT_S = 20.0
LONG_TIMEOUT_S = 60.0
DEFAULT_PREFILL_BUDGET = 4096
SESSION_HEADER = "X-Dynamo-Session-ID"
GATE = "ready.gate"


@dataclass
class CheckResult:
    """One row of the report: the check's stable id, its display text, how it ended."""

    id: str
    title: str
    status: Status
    ms: float
    evidence: str


@dataclass
class SmokeReport:
    """Everything `primectl smoke` found."""

    url: str
    model: str
    engine: str | None
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failed(self) -> list[CheckResult]:
        """Checks that failed."""
        return [r for r in self.results if r.status == "fail"]

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.failed

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return tally(r.status for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`--output json`): each check by id, with its display text under `check`."""
        return {"url": self.url, "model": self.model, "engine": self.engine, "ok": self.ok, "counts": self.counts(),
                "checks": [{"id": r.id, "check": r.title, "result": r.status, "ms": round(r.ms, 1),
                            "evidence": r.evidence} for r in self.results]}

    def to_junit(self) -> str:
        """JUnit XML (report.py's, as preflight's): one testcase per check, named by its id."""
        cases = [Case("primectl.smoke", r.id, r.status, r.evidence, seconds=r.ms / 1000,
                      properties={"title": r.title}) for r in self.results]
        return junit_xml(f"primectl smoke {self.model}", cases, failure_type="SmokeFailure",
                         properties={"url": self.url, "model": self.model, "engine": self.engine or ""})


class CheckFailed(Exception):
    """Raised inside a check body: the check fails with this evidence."""


class CheckNA(Exception):
    """Raised inside a check body: the check does not apply."""


class CheckWarn(Exception):
    """Raised inside a check body: a known, non-blocking deviation."""


# --- pure helpers --------------------------------------------------------------------------------

def prefill_budget(plan: Plan | None) -> int:
    """Tokens one prefill step takes (the plan's serving block), else 4096."""
    return plan.serving.prefill_budget if plan is not None else DEFAULT_PREFILL_BUDGET


def max_context(plan: Plan | None) -> int | None:
    """The serving context limit (None when unknown)."""
    return plan.serving.context_limit if plan is not None else None


def words(n: int, salt: str = "") -> str:
    """A prompt of `n` words (each at least one token with any tokenizer)."""
    base = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]
    return (salt + " " if salt else "") + " ".join(base[i % len(base)] for i in range(n))


def _clip(text: str | None, n: int = 120) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _error_detail(exc: Exception) -> str:
    from openai import APIStatusError, APITimeoutError

    if isinstance(exc, APITimeoutError):
        return "timed out"
    if isinstance(exc, APIStatusError):
        body = exc.body if exc.body is not None else exc.response.text
        return f"HTTP {exc.status_code} {_clip(json.dumps(body) if not isinstance(body, str) else body, 160)}"
    return f"{type(exc).__name__}: {_clip(str(exc), 160)}"


def _answer_names(exc: Exception, limit: int) -> bool:
    """Whether an error answer names `limit` (Dynamo's frontend: `"limit": N` in its details; vLLM: its message)."""
    from openai import APIStatusError

    if not isinstance(exc, APIStatusError):
        return False
    body = exc.body if exc.body is not None else exc.response.text
    return re.search(rf"\b{limit}\b", body if isinstance(body, str) else json.dumps(body)) is not None


STREAM_ATTEMPTS = 3
COALESCED = "all content chunks arrived within 1 ms"


def judge_stream(arrivals: list[float], usage: tuple[int, int] | None, finish: str | None) -> tuple[list[str], str]:
    """What is wrong with one streamed answer (nothing: it streamed), and the evidence line.

    A frontend that buffers the answer delivers every chunk at once, every time. An engine whose consumer
    fell behind (vLLM merges the deltas of a request while its output queue is not drained: a loaded CPU
    host) does that now and then, so the caller tries again before it calls a coalesced stream a failure.
    """
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    tokens = f"{usage[0]}+{usage[1]}" if usage else "-+-"
    ev = (f"{len(arrivals)} content chunks, first at {arrivals[0] * 1000:.0f} ms, "
          f"median gap {statistics.median(gaps) * 1000:.1f} ms, spread {(arrivals[-1] - arrivals[0]) * 1000:.0f} ms, "
          f"finish_reason={finish}, usage={tokens}") if len(arrivals) >= 2 else f"{len(arrivals)} content chunk(s)"
    problems = []
    if len(arrivals) < 2 and usage is not None and usage[1] >= 2:
        # several tokens in one chunk: merged the same way as a burst of chunks (worth another try)
        problems.append(f"{COALESCED} ({usage[1]} tokens in {len(arrivals)} content chunk(s))")
    elif len(arrivals) < 2:
        problems.append("fewer than 2 content chunks")
    elif arrivals[-1] - arrivals[0] < 0.001:
        problems.append(f"{COALESCED} (not incremental)")
    if usage is None:
        problems.append("no usage chunk despite stream_options.include_usage")
    if not finish:
        problems.append("no finish_reason")
    return problems, ev


# --- the runner ----------------------------------------------------------------------------------


class Runner:
    """Runs the checks in order against one endpoint and collects the rows."""

    def __init__(self, url: str, model: str, plan: Plan | None):
        from openai import OpenAI

        self.url = url.rstrip("/")
        self.model = model
        self.plan = plan
        self.engine = plan.engine if plan is not None else None
        self.end_tag = plan.serving.capabilities.tool_call_end_tag if plan is not None else "</tool_call>"
        self.client: OpenAI = OpenAI(base_url=self.url + "/v1", api_key="none", timeout=REQUEST_TIMEOUT_S,
                                     max_retries=0)
        self.report = SmokeReport(self.url, model, self.engine)
        self.halted: str | None = None

    def check(self, check_id: str, title: str, body: Callable[[], str], *, after_halt: bool = False) -> CheckResult:
        """Run one check; its body returns pass evidence or raises Check* / any error (fail).

        Once `halted` is set the checks after it are n/a, except those that run `after_halt` (diagnostics).
        """
        t0 = time.monotonic()
        status: Status
        if self.halted and not after_halt:
            status, evidence = "n/a", f"not run: {self.halted}"
        else:
            try:
                status, evidence = "pass", body()
            except CheckNA as exc:
                status, evidence = "n/a", str(exc)
            except CheckWarn as exc:
                status, evidence = "warn", str(exc)
            except (CheckFailed, workers.MetricsUnreachable) as exc:
                status, evidence = "fail", str(exc)
            except Exception as exc:
                status, evidence = "fail", _error_detail(exc)
        res = CheckResult(check_id, title, status, (time.monotonic() - t0) * 1000, evidence)
        self.report.results.append(res)
        return res

    # --- 1. readiness -------------------------------------------------------------------------

    def ready_gate(self) -> str:
        from openai import APIStatusError

        path = f"/models/{self.model}/ready"
        try:
            body = self.client.get(path, cast_to=object)
        except APIStatusError as exc:
            detail = _gate_detail(exc.body)
            if exc.status_code == 404 and self._listed():
                raise CheckNA(f"GET /v1{path} -> 404 but /v1/models lists {self.model}: "
                              "no Dynamo readiness endpoint here") from None
            if not isinstance(exc.body, dict) and (own := self._frontend_says(path)):
                detail = f"{detail}; the frontend itself: {own}"  # a balancer's page says nothing of the model
            raise CheckFailed(f"GET /v1{path} -> {exc.status_code}{': ' + detail if detail else ''}") from None
        return f"GET /v1{path} -> 200 {_gate_detail(body)}".strip()

    def _frontend_says(self, path: str) -> str:
        """The readiness the first frontend gives itself, behind the balancer ('' when there is none to ask)."""
        import json
        import urllib.error
        import urllib.request

        listing = self.plan.worker_listing_url if self.plan is not None else ""
        if not listing or not listing.endswith("/health"):
            return ""
        url = listing.removesuffix("/health") + "/v1" + path
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return f"{resp.status} {_gate_detail(json.loads(resp.read()))}"
        except urllib.error.HTTPError as exc:
            try:
                return f"{exc.code} {_gate_detail(json.loads(exc.read()))}"
            except ValueError:
                return str(exc.code)
        except (OSError, ValueError):
            return ""

    def _listed(self) -> bool:
        try:
            return any(m.id == self.model for m in self.client.models.list())
        except Exception:
            return False

    def models_list(self) -> str:
        ids = [m.id for m in self.client.models.list()]
        if self.model not in ids:
            raise CheckFailed(f"/v1/models lists {ids or 'nothing'}, not {self.model!r}")
        return f"/v1/models lists {', '.join(ids)}"

    # --- 2. basic requests --------------------------------------------------------------------

    def warm_up(self) -> str:
        """The first request after a start: engines that warm up lazily (vLLM on CPU) answer it slowly."""
        budget = self.plan.serving.capabilities.first_request_timeout_s if self.plan is not None else LONG_TIMEOUT_S
        t0 = time.monotonic()
        r = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Warm up."}], max_tokens=4, timeout=budget)
        took = time.monotonic() - t0
        if not r.choices:
            raise CheckFailed(f"no choices after {took:.1f} s")
        return f"answered in {took:.1f} s (budget {budget:g} s), finish_reason={r.choices[0].finish_reason}"

    def chat_unary(self) -> str:
        r = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Say hello in five words."}], max_tokens=12)
        if not r.choices:
            raise CheckFailed("no choices in the response")
        ch = r.choices[0]
        problems = []
        if not (ch.message.content or "").strip():
            problems.append("empty content")
        if r.usage is None or not r.usage.completion_tokens or not r.usage.prompt_tokens:
            problems.append(f"usage missing or zero ({r.usage})")
        if not ch.finish_reason:
            problems.append("no finish_reason")
        ev = (f"content {_clip(ch.message.content, 50)!r}, finish_reason={ch.finish_reason}, "
              f"usage={r.usage.prompt_tokens if r.usage else '-'}+{r.usage.completion_tokens if r.usage else '-'}")
        if problems:
            raise CheckFailed("; ".join(problems) + f" ({ev})")
        return ev

    def chat_stream(self) -> str:
        last = ""
        for attempt in range(1, STREAM_ATTEMPTS + 1):
            arrivals, usage, finish = self._stream_once()
            problems, ev = judge_stream(arrivals, usage, finish)
            if not problems:
                return ev + (f" (attempt {attempt} of {STREAM_ATTEMPTS}; earlier: {last})" if attempt > 1 else "")
            last = "; ".join(problems) + f" ({ev})"
            if not any(p.startswith(COALESCED) for p in problems):
                break  # only a coalesced stream is worth another try: the rest fails the same way every time
        raise CheckFailed(last)

    def _stream_once(self) -> tuple[list[float], tuple[int, int] | None, str | None]:
        """One streamed chat: arrival time (s) of each content chunk, (prompt, completion) usage, finish reason."""
        t0 = time.monotonic()
        stream = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Count from one to forty."}], max_tokens=32,
            stream=True, stream_options={"include_usage": True})
        arrivals: list[float] = []
        finish = None
        usage = None
        for chunk in stream:
            now = time.monotonic() - t0
            if chunk.usage is not None:
                usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
            for choice in chunk.choices:
                if choice.delta.content:
                    arrivals.append(now)
                if choice.finish_reason:
                    finish = choice.finish_reason
        return arrivals, usage, finish

    def completions(self) -> str:
        r = self.client.completions.create(model=self.model, prompt="Once upon a time", max_tokens=8)
        if not r.choices or not r.choices[0].text.strip():
            raise CheckFailed(f"empty text ({r.choices[0].text if r.choices else 'no choices'!r})")
        if r.usage is None or not r.usage.completion_tokens:
            raise CheckFailed(f"usage missing ({r.usage})")
        return (f"text {_clip(r.choices[0].text, 50)!r}, finish_reason={r.choices[0].finish_reason}, "
                f"usage={r.usage.prompt_tokens}+{r.usage.completion_tokens}")

    # --- 3. long prompts ----------------------------------------------------------------------

    def _tokens_per_word(self) -> float:
        """How many prompt tokens a word of `words()` costs with this model's tokenizer (measured)."""
        probe = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": words(200, uuid.uuid4().hex)}], max_tokens=1,
            timeout=LONG_TIMEOUT_S)
        return max(1.0, (probe.usage.prompt_tokens if probe.usage else 200) / 200)

    def long_prompt(self) -> str:
        budget = prefill_budget(self.plan)
        limit = max_context(self.plan)
        n = budget * 3 // 2
        if limit is not None:
            if budget + 128 >= limit:
                raise CheckNA(f"the prefill budget ({budget}) is not below the context limit ({limit}): "
                              "no prompt can be over one and under the other")
            per_word = self._tokens_per_word()
            if n * per_word > limit - 128:  # aim between the budget and the context limit
                n = int((budget + (limit - budget) / 2) / per_word)
        r = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": words(n, uuid.uuid4().hex)}], max_tokens=4,
            timeout=LONG_TIMEOUT_S)
        pt = r.usage.prompt_tokens if r.usage else None
        if not r.choices or not (r.choices[0].message.content or "").strip():
            raise CheckFailed(f"{n}-word prompt: empty answer (prompt_tokens={pt})")
        if pt is not None and pt <= budget:
            raise CheckFailed(f"{n}-word prompt was only {pt} tokens, not over the {budget}-token budget")
        return f"{n} words = {pt} prompt tokens > budget {budget}: 200, finish_reason={r.choices[0].finish_reason}"

    def over_context(self) -> str:
        from openai import APIConnectionError, APIStatusError, APITimeoutError

        limit = max_context(self.plan)
        if limit is None:
            raise CheckNA("context limit unknown (no plan, or the recipe sets no model.max_context for this engine)")
        n = limit + limit // 8 + 16
        t0 = time.monotonic()
        try:
            r = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": words(n)}], max_tokens=4,
                timeout=LONG_TIMEOUT_S)
        except APITimeoutError:
            raise CheckFailed(f"{n}-word prompt (limit {limit}): no answer within {LONG_TIMEOUT_S:.0f} s (hang)") from None
        except APIStatusError as exc:
            took = (time.monotonic() - t0) * 1000
            what = f"{n}-word prompt (limit {limit}) -> {_error_detail(exc)} in {took:.0f} ms"
            if 400 <= exc.status_code < 500:
                if not _answer_names(exc, limit):
                    raise CheckWarn(f"{what}; refused, but the answer does not name the limit {limit}") from None
                return what
            alive = self._still_serving()
            if alive and self.plan is not None and self.plan.serving.capabilities.over_context == "5xx-warn":
                # an engine that declares it leaves the length check to an admission control answering 5xx;
                # a 4xx is what a client can act on
                raise CheckWarn(f"{what}; expected a 4xx, got a 5xx from engine {self.engine} (known: it leaves "
                                f"the length check to admission control; the server keeps serving: {alive})") from None
            if alive:
                raise CheckFailed(f"{what}; expected a 4xx, got a 5xx (the server keeps serving: {alive})") from None
            raise CheckFailed(f"{what}; and the endpoint stopped answering afterwards") from None
        except APIConnectionError as exc:
            raise CheckFailed(f"{n}-word prompt (limit {limit}): connection failed ({exc})") from None
        pt = r.usage.prompt_tokens if r.usage else None
        raise CheckFailed(f"{n}-word prompt (limit {limit}) was accepted with 200 (prompt_tokens={pt}): "
                          "over-long prompts are not rejected")

    def _still_serving(self) -> str:
        try:
            r = self.client.chat.completions.create(model=self.model, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=2)
            return f"a follow-up request got 200, finish_reason={r.choices[0].finish_reason}" if r.choices else ""
        except Exception:
            return ""

    # --- 4. disaggregation and session affinity -------------------------------------------------

    def _workers(self, role: str) -> list[Service]:
        assert self.plan is not None
        return workers.with_metrics(self.plan, role)

    def _measure(self, send: Callable[[], Any]) -> tuple[Any, dict[str, float], dict[str, float]]:
        """Send one request; per-service counter deltas (MetricsUnreachable fails the check)."""
        assert self.plan is not None
        return workers.counter_deltas(self.plan, send)

    def _need_plan(self) -> None:
        if self.plan is None:
            raise CheckNA("needs a recipe (worker metrics URLs)")
        if not self._workers("prefill") or not self._workers("decode"):
            raise CheckNA("plan has no separate prefill and decode workers with metrics")

    def workers_reachable(self) -> str:
        if self.plan is None:
            raise CheckNA("needs a recipe (worker metrics URLs)")
        if not self._workers("prefill") and not self._workers("decode"):
            raise CheckNA("plan has no prefill or decode workers with metrics")
        prefill, decode = workers.request_counters(self.plan)
        return f"prefill {', '.join(sorted(prefill)) or 'none'}; decode {', '.join(sorted(decode)) or 'none'}"

    def workers_listed(self) -> str:
        if self.plan is None:
            raise CheckNA("needs a recipe (each worker's request-plane address)")
        names = [s.name for s in self.plan.workers() if s.listed_as]
        if not names:
            raise CheckNA("plan has no worker the frontend's listing names")
        results = registration.run_here(registration.listing_probes(self.plan, names))
        if not any(r["ok"] for r in results.values()) and not registration.missing(results, names):
            detail = next(iter(results.values()))["detail"]
            raise CheckFailed(f"cannot read the frontend's worker listing {self.plan.worker_listing_url}: {detail}")
        lost = registration.missing(results, names)
        if lost:
            raise CheckFailed(f"{', '.join(lost)}: {registration.LOST} (`primectl up` restarts it)")
        return f"{', '.join(names)} listed at {self.plan.worker_listing_url}"

    def disaggregation(self) -> str:
        self._need_plan()

        def send() -> Any:
            return self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": words(40, uuid.uuid4().hex)}], max_tokens=4)

        assert self.plan is not None
        nixl = self.plan.serving.capabilities.nixl_metrics
        kv0 = workers.kv_moved(self.plan) if nixl else {}
        _, dp, dd = self._measure(send)
        ev = f"prefill {workers.deltas(dp)}; decode {workers.deltas(dd)}"
        problems = []
        if sum(dp.values()) <= 0:
            problems.append("no prefill worker counted the request "
                            f"({workers.metric_ref(workers.REQUESTS, workers.PREFILL_LABELS)})")
        if sum(dd.values()) <= 0:
            problems.append("no decode worker counted the request "
                            f"({workers.metric_ref(workers.REQUESTS, workers.DECODE_LABELS)})")
        if nixl:
            moved = {k: v - kv0.get(k, 0.0) for k, v in workers.kv_moved(self.plan).items()}
            ev += (f"; decode KV: {moved['transfers']:g} NIXL transfer(s), {moved['bytes']:g} bytes, "
                   f"{moved['failed']:g} failed; prompt tokens from external_kv_transfer {moved['external']:g}, "
                   f"local_compute {moved['local']:g}")
            if moved["transfers"] <= 0:
                problems.append("decode's NIXL transfer count did not rise: the KV did not move prefill -> decode")
            if moved["failed"] > 0:
                problems.append(f"{moved['failed']:g} NIXL transfer(s) or notification(s) failed")
            if moved["external"] <= 0 or moved["local"] > 0:
                problems.append("decode computed the prompt itself instead of taking prefill's KV")
        if problems:
            raise CheckFailed("; ".join(problems) + f" ({ev})")
        return ev

    def session_affinity(self) -> str:
        self._need_plan()
        sid = f"primectl-smoke-{uuid.uuid4().hex[:12]}"
        msgs: list[Any] = [{"role": "user", "content": words(300, sid)}]

        def turn() -> Any:
            return self.client.chat.completions.create(model=self.model, messages=msgs, max_tokens=8,
                                                       extra_headers={SESSION_HEADER: sid})

        r1, _, dd1 = self._measure(turn)
        msgs += [{"role": "assistant", "content": r1.choices[0].message.content or "ok"},
                 {"role": "user", "content": "And then? " + words(20)}]
        r2, _, dd2 = self._measure(turn)
        w1 = [k for k, v in dd1.items() if v > 0]
        w2 = [k for k, v in dd2.items() if v > 0]
        details = r2.usage.prompt_tokens_details if r2.usage else None
        cached = getattr(details, "cached_tokens", None) if details is not None else None
        cache_ev = ("server does not report cached_tokens" if cached is None
                    else f"turn 2 cached_tokens={cached}" + (" (engine reports no prefix reuse)" if cached == 0 else ""))
        ev = f"{SESSION_HEADER}={sid}: turn 1 on {w1 or 'none'}, turn 2 on {w2 or 'none'}; {cache_ev}"
        if len(self._workers("decode")) < 2:
            ev += " (one decode worker: same worker trivially)"
        if not w1 or not w2:
            raise CheckFailed(f"a turn was not counted by any decode worker: {ev}")
        if len(w1) > 1 or len(w2) > 1:
            raise CheckWarn(f"ambiguous: several decode workers moved (other traffic?): {ev}")
        if w1 != w2:
            raise CheckFailed(f"session moved between decode workers: {ev}")
        return ev

    # --- 5. errors ----------------------------------------------------------------------------

    def unknown_model(self) -> str:
        from openai import APIStatusError

        name = f"primectl-no-such-model-{uuid.uuid4().hex[:8]}"
        try:
            self.client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        except APIStatusError as exc:
            if exc.status_code == 404:
                return f"model {name} -> {_error_detail(exc)}"
            raise CheckFailed(f"model {name} -> {_error_detail(exc)}, expected 404") from None
        raise CheckFailed(f"model {name} was served (200), expected 404")

    def _expect_400(self, what: str, *, content: bytes | None = None, body: object | None = None) -> str:
        from openai import APIStatusError

        opts: Any = {"headers": {"Content-Type": "application/json"}}
        try:
            if content is not None:
                self.client.post("/chat/completions", cast_to=object, content=content, options=opts)
            else:
                self.client.post("/chat/completions", cast_to=object, body=body, options=opts)
        except APIStatusError as exc:
            if exc.status_code == 400:
                return f"{what} -> {_error_detail(exc)}"
            raise CheckFailed(f"{what} -> {_error_detail(exc)}, expected 400") from None
        raise CheckFailed(f"{what} was accepted (200), expected 400")

    def malformed_json(self) -> str:
        return self._expect_400("invalid JSON body", content=b'{"model": "' + self.model.encode() + b'", "messages": [}')

    def malformed_tool(self) -> str:
        base = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        evs = [self._expect_400("tool without function.name",
                                body=base | {"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]}),
               self._expect_400("tool of unknown type", body=base | {"tools": [{"type": "no-such-type"}]}),
               self._expect_400("tool_choice naming an undeclared tool",
                                body=base | {"tools": [{"type": "function", "function": {
                                    "name": "f", "parameters": {"type": "object", "properties": {}}}}],
                                             "tool_choice": {"type": "function", "function": {"name": "launch_rocket"}}})]
        return "; ".join(evs)

    # --- 6. tool calling ----------------------------------------------------------------------

    def tool_scenario(self, sc: toolcheck.Scenario) -> str:
        if self.plan is not None and not self.plan.serving.capabilities.tool_calls:
            raise CheckNA(f"n/a (engine {self.engine} serves no tool calls)")
        kwargs = toolcheck.request(sc, self.model, LONG_TIMEOUT_S)
        unary = toolcheck.from_completion(self.client.chat.completions.create(**kwargs))
        streamed = toolcheck.from_chunks(self.client.chat.completions.create(**kwargs, stream=True))
        status, evidence = toolcheck.verdict(sc, unary, streamed, self.end_tag)
        if status == "warn":
            raise CheckWarn(evidence)
        if status == "fail":
            raise CheckFailed(evidence)
        return evidence


def _gate_detail(body: object) -> str:
    """Readable summary of a /ready body: ready flag, reason, worker types present and missing."""
    if not isinstance(body, dict):
        return _clip(str(body or ""), 120)
    parts = []
    if body.get("reason"):
        parts.append(str(body["reason"]))
    elif body.get("message"):
        parts.append(str(body["message"]))
    missing: list[str] = []
    present: list[str] = []
    for ns in (body.get("namespaces") or {}).values():
        if isinstance(ns, dict):
            missing += [str(x) for x in ns.get("missing_worker_types") or []]
            for t, info in (ns.get("worker_types") or {}).items():
                present.append(f"{t}x{info.get('workers', '?')}" if isinstance(info, dict) else str(t))
    if present:
        parts.append("workers " + ", ".join(present))
    if missing:
        parts.append("MISSING worker types: " + ", ".join(sorted(set(missing))))
    return "; ".join(parts)


# --- the checks, in order ------------------------------------------------------------------------


@dataclass(frozen=True)
class SmokeCheck:
    """One check: its stable id, its display text, its body (a Runner method)."""

    id: str
    title: str
    body: Callable[[], str]
    after_halt: bool = False  # runs even after the readiness gate failed (a diagnostic)


def smoke_checks(r: Runner) -> list[SmokeCheck]:
    """Every check `run_smoke` runs, in order. A new check is one line here (and its Runner method).

    Ids are `area.what`, stable across rewordings of the display text (tests/test_smoke_checker.py pins them).
    """
    model = r.model
    checks = [
        SmokeCheck(GATE, f"ready: GET /v1/models/{model}/ready == 200", r.ready_gate),
        # whether the gate passed or not, which workers answer on their metrics port says where to look
        SmokeCheck("workers.metrics", "workers: every prefill and decode worker answers on its metrics port",
                   r.workers_reachable, after_halt=True),
        SmokeCheck("workers.listed", "workers: the frontend lists every prefill and decode worker", r.workers_listed,
                   after_halt=True),
        SmokeCheck("ready.models", f"ready: /v1/models lists {model}", r.models_list),
        SmokeCheck("chat.warmup", "warm-up: the first request is answered", r.warm_up),
        SmokeCheck("chat.basic", "chat: non-streaming", r.chat_unary),
        SmokeCheck("chat.stream", "chat: streaming", r.chat_stream),
        SmokeCheck("completions.basic", "completions", r.completions),
        SmokeCheck("prompt.over_budget", f"prompt over prefill budget ({prefill_budget(r.plan)} tokens) succeeds",
                   r.long_prompt),
        SmokeCheck("prompt.over_context", "prompt over context limit -> 4xx", r.over_context),
        SmokeCheck("disagg.both_served", "disaggregation: prefill and decode workers both served", r.disaggregation),
        SmokeCheck("session.affinity", f"session affinity: {SESSION_HEADER} keeps one decode worker",
                   r.session_affinity),
        SmokeCheck("errors.unknown_model", "errors: unknown model -> 404", r.unknown_model),
        SmokeCheck("errors.malformed_json", "errors: malformed JSON body -> 400", r.malformed_json),
        SmokeCheck("errors.malformed_tool", "errors: malformed tool definition -> 400", r.malformed_tool),
    ]
    checks += [SmokeCheck(f"tools.{sc.id}", f"tools: {sc.name}", functools.partial(r.tool_scenario, sc))
               for sc in toolcheck.scenarios(r.end_tag)]
    return checks + component_checks(r.plan)


def component_checks(plan: Plan | None) -> list[SmokeCheck]:
    """The checks each service's component declares, with ids `<component>.<id>` (after the endpoint's)."""
    from primectl.components import base as components

    out: list[SmokeCheck] = []
    if plan is None:
        return out
    for svc in plan.services:
        try:
            component = components.get(svc.component)
        except KeyError:
            continue  # a worker: the engine's, checked through the endpoint above
        out += [SmokeCheck(f"{svc.component}.{c.id}", f"{svc.name}: {c.title}", c.body)
                for c in components.smoke_checks(component, plan, svc)]
    return out


# --- entry points --------------------------------------------------------------------------------


def run_smoke(url: str, model: str, plan: Plan | None) -> SmokeReport:
    """Run every check against `url` serving `model`; plan-dependent checks are n/a without a plan."""
    try:
        import openai  # noqa: F401
    except ImportError:
        raise DeployError("the smoke tests need the openai package: pip install 'primectl[smoke]' "
                          "(or pass --no-smoke to up)", service="frontend") from None
    r = Runner(url, model, plan)
    for c in smoke_checks(r):
        res = r.check(c.id, c.title, c.body, after_halt=c.after_halt)
        if c.id == GATE and res.status == "fail":
            r.halted = "readiness gate failed"
    return r.report


def print_report(report: SmokeReport, output: str = "table", stream: TextIO | None = None) -> None:
    """The report as a table (rich on a terminal, whole plain columns in a pipe) or JSON."""
    stream = stream or sys.stdout
    if output == "json":
        stream.write(json.dumps(report.to_dict(), indent=2) + "\n")
        return
    c = report.counts()
    title = (f"smoke {report.url} model {report.model}: {'OK' if report.ok else 'FAILED'} "
             f"({c['pass']} pass, {c['fail']} fail, {c['warn']} warn, {c['n/a']} n/a)")
    print_table(title, ["check", "result", "ms", "evidence"],
                [[r.title, r.status, f"{r.ms:.0f}", r.evidence] for r in report.results], fold="evidence", stream=stream)


def failure_summary(report: SmokeReport) -> str:
    """One line naming every failed check and why."""
    return "; ".join(f"{r.title}: {r.evidence}" for r in report.failed)


def _names(word: str, text: str) -> bool:
    """Whether `text` holds `word` whole: `decode-1` is not in `decode-10`, `decode` is not in `decoded`."""
    return re.search(rf"(?<![\w.-]){re.escape(word)}(?!\w|[.-]\w)", text) is not None


def _culprit(report: SmokeReport, plan: Plan) -> str:
    """The service a failed smoke test blames: one named in the failures, else the first of a named role."""
    text = failure_summary(report)
    for s in plan.services:
        if _names(s.name, text):
            return s.name
    for role in ("prefill", "decode"):
        if _names(role, text):
            return next((s.name for s in plan.services if s.role == role), "frontend")
    return "frontend"


def smoke_gate(plan: Plan) -> None:
    """What `up` runs after readiness: DeployError (so `up` rolls back) if any check fails."""
    report = run_smoke(plan.endpoint, plan.served_model, plan)
    print_report(report, stream=sys.stderr)
    if not report.ok:
        raise DeployError(f"smoke tests failed ({len(report.failed)} of {len(report.results)}): "
                          f"{failure_summary(report)}", service=_culprit(report, plan), log_tail="")


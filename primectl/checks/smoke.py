"""Endpoint smoke tests: `primectl smoke`, and the gate `up` runs after readiness.

Every request to the model endpoint goes through the official `openai` client
(`base_url=URL/v1`, `api_key="none"`, no retries, short timeouts). Worker
metrics (Prometheus text on each worker's system port) are read with urllib.

Each check ends as one of:
- pass;
- fail: the deployment is broken (exit 1; `up` rolls back);
- warn: a known deviation that does not make the deployment unusable, e.g. a
  5xx instead of a 4xx for a prompt over the context limit while the server
  keeps serving (reported, does not fail the run);
- n/a: not applicable (no plan, mocker engine, readiness gate failed, ...).
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TextIO

from primectl.checks import toolcheck
from primectl.checks.metrics import counter_sum
from primectl.errors import DeployError
from primectl.output import print_table

if TYPE_CHECKING:
    from openai import OpenAI

    from primectl.plan.model import Plan, Service

Status = Literal["pass", "fail", "warn", "n/a"]

REQUEST_TIMEOUT_S = 20.0
LONG_TIMEOUT_S = 60.0
DEFAULT_PREFILL_BUDGET = 4096
METRIC = "dynamo_component_requests_total"
PREFILL_LABELS = {"dynamo_component": "prefill", "dynamo_endpoint": "generate"}
DECODE_LABELS = {"dynamo_component": "backend", "dynamo_endpoint": "generate"}
SESSION_HEADER = "X-Dynamo-Session-ID"


@dataclass
class CheckResult:
    """One row of the report."""

    name: str
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
        out = {"pass": 0, "fail": 0, "warn": 0, "n/a": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (`--output json`)."""
        return {"url": self.url, "model": self.model, "engine": self.engine, "ok": self.ok, "counts": self.counts(),
                "checks": [{"check": r.name, "result": r.status, "ms": round(r.ms, 1), "evidence": r.evidence}
                           for r in self.results]}

    def to_junit(self) -> str:
        """JUnit XML: one testsuite, one testcase per check (fail: failure, n/a: skipped, warn: system-out)."""
        c = self.counts()
        suites = ET.Element("testsuites")
        suite = ET.SubElement(suites, "testsuite", {
            "name": f"primectl smoke {self.model}", "tests": str(len(self.results)), "failures": str(c["fail"]),
            "errors": "0", "skipped": str(c["n/a"]), "time": f"{sum(r.ms for r in self.results) / 1000:.3f}",
        })
        props = ET.SubElement(suite, "properties")
        for k, v in (("url", self.url), ("model", self.model), ("engine", self.engine or "")):
            ET.SubElement(props, "property", {"name": k, "value": v})
        for r in self.results:
            case = ET.SubElement(suite, "testcase", {"classname": "primectl.smoke", "name": r.name,
                                                     "time": f"{r.ms / 1000:.3f}"})
            if r.status == "fail":
                ET.SubElement(case, "failure", {"message": r.evidence[:500], "type": "SmokeFailure"}).text = r.evidence
            elif r.status == "n/a":
                ET.SubElement(case, "skipped", {"message": r.evidence[:500]})
            elif r.status == "warn":
                ET.SubElement(case, "system-out").text = f"WARN: {r.evidence}"
            else:
                ET.SubElement(case, "system-out").text = r.evidence
        ET.indent(suites)
        return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


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

    def check(self, name: str, body: Callable[[], str]) -> CheckResult:
        """Run one check; its body returns pass evidence or raises Check* / any error (fail)."""
        t0 = time.monotonic()
        status: Status
        if self.halted:
            status, evidence = "n/a", f"not run: {self.halted}"
        else:
            try:
                status, evidence = "pass", body()
            except CheckNA as exc:
                status, evidence = "n/a", str(exc)
            except CheckWarn as exc:
                status, evidence = "warn", str(exc)
            except CheckFailed as exc:
                status, evidence = "fail", str(exc)
            except Exception as exc:
                status, evidence = "fail", _error_detail(exc)
        res = CheckResult(name, status, (time.monotonic() - t0) * 1000, evidence)
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
            raise CheckFailed(f"GET /v1{path} -> {exc.status_code}{': ' + detail if detail else ''}") from None
        return f"GET /v1{path} -> 200 {_gate_detail(body)}".strip()

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
                return what
            alive = self._still_serving()
            if alive and self.plan is not None and self.plan.serving.capabilities.over_context == "5xx-warn":
                # Dynamo 1.6.1 leaves the length check to the engine, and e.g. the mocker's admission
                # control answers it with a 500; a real engine must answer with a 4xx.
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
        return [s for s in self.plan.services if s.role == role and s.metrics_url]

    def _scrape(self) -> tuple[dict[str, float], dict[str, float]]:
        """Per-service request counters of every prefill and decode worker (CheckFailed naming the unreachable)."""
        prefill: dict[str, float] = {}
        decode: dict[str, float] = {}
        bad: list[str] = []
        for role, labels, out in (("prefill", PREFILL_LABELS, prefill), ("decode", DECODE_LABELS, decode)):
            for s in self._workers(role):
                assert s.metrics_url is not None
                try:
                    with urllib.request.urlopen(s.metrics_url, timeout=5) as resp:
                        text = resp.read().decode("utf-8", "replace")
                except (OSError, urllib.error.URLError) as exc:
                    bad.append(f"{role} worker {s.name} metrics {s.metrics_url} unreachable "
                               f"({getattr(exc, 'reason', exc)})")
                    continue
                out[s.name] = counter_sum(text, METRIC, labels)
        if bad:
            raise CheckFailed("; ".join(bad))
        return prefill, decode

    def _measure(self, send: Callable[[], Any]) -> tuple[Any, dict[str, float], dict[str, float]]:
        """Send one request; per-service counter deltas (polled briefly: metrics may lag the response)."""
        p0, d0 = self._scrape()
        result = send()
        deadline = time.monotonic() + 3.0
        while True:
            p1, d1 = self._scrape()
            dp = {k: p1.get(k, 0.0) - v for k, v in p0.items()}
            dd = {k: d1.get(k, 0.0) - v for k, v in d0.items()}
            if (sum(dp.values()) > 0 and sum(dd.values()) > 0) or time.monotonic() > deadline:
                return result, dp, dd
            time.sleep(0.2)

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
        prefill, decode = self._scrape()
        return f"prefill {', '.join(sorted(prefill)) or 'none'}; decode {', '.join(sorted(decode)) or 'none'}"

    def disaggregation(self) -> str:
        self._need_plan()

        def send() -> Any:
            return self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": words(40, uuid.uuid4().hex)}], max_tokens=4)

        nixl = self.plan is not None and self.plan.serving.capabilities.nixl_metrics
        kv0 = self._kv_moved() if nixl else {}
        _, dp, dd = self._measure(send)
        ev = f"prefill {_deltas(dp)}; decode {_deltas(dd)}"
        problems = []
        if sum(dp.values()) <= 0:
            problems.append(f"no prefill worker counted the request ({METRIC}{_fmt_labels(PREFILL_LABELS)})")
        if sum(dd.values()) <= 0:
            problems.append(f"no decode worker counted the request ({METRIC}{_fmt_labels(DECODE_LABELS)})")
        if nixl:
            moved = {k: v - kv0.get(k, 0.0) for k, v in self._kv_moved().items()}
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

    def _kv_moved(self) -> dict[str, float]:
        """Decode workers' NIXL and prompt-source counters, summed (vLLM's names on Dynamo's system port)."""
        from primectl.checks import workers

        total = {"transfers": 0.0, "bytes": 0.0, "failed": 0.0, "external": 0.0, "local": 0.0}
        for s in self._workers("decode"):
            assert s.metrics_url is not None
            text = workers.scrape(s.metrics_url) or ""
            total["transfers"] += counter_sum(text, workers.NIXL_XFER, {})
            total["bytes"] += counter_sum(text, workers.NIXL_BYTES, {})
            total["failed"] += counter_sum(text, workers.NIXL_FAILED, {}) + counter_sum(text, workers.NIXL_FAILED_NOTIFY, {})
            total["external"] += counter_sum(text, workers.PROMPT_SOURCE, {"source": "external_kv_transfer"})
            total["local"] += counter_sum(text, workers.PROMPT_SOURCE, {"source": "local_compute"})
        return total

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
        kwargs: dict[str, Any] = {
            "model": self.model, "messages": [{"role": "user", "content": sc.prompt}], "tools": sc.tools,
            # greedy, so streaming and non-streaming must agree exactly; the frequency penalty keeps a weak model
            # from padding a grammar-forced call with whitespace until max_tokens. (No `seed`: with sampling it
            # kills vLLM 0.31's CPU engine core, "CPU Generator does not use offset".)
            "tool_choice": sc.tool_choice, "max_tokens": 512, "temperature": 0, "frequency_penalty": 1.0,
            "timeout": LONG_TIMEOUT_S, "parallel_tool_calls": False,
        }
        unary = toolcheck.from_completion(self.client.chat.completions.create(**kwargs))
        streamed = toolcheck.from_chunks(self.client.chat.completions.create(**kwargs, stream=True))
        problems = [f"non-streaming: {p}" for p in toolcheck.check_turn(unary, sc)]
        problems += [f"streaming: {p}" for p in toolcheck.check_turn(streamed, sc)]
        problems += toolcheck.compare_turns(unary, streamed)
        if problems:
            end_tag = self.end_tag
            if sc.expect_args.get("text") == f"a{end_tag}b" and known_end_tag_defect(unary, streamed, end_tag):
                raise CheckWarn(
                    f"serving-stack defect (upstream, Dynamo 1.6.1's tool-call parser): a string argument holding "
                    f"{end_tag} ends the call early; the call is dropped and its tail leaks into content "
                    f"[non-streaming {unary.summary()}] [streaming {streamed.summary()}]. The grammar let the model "
                    f"write it (xgrammar); the frontend's parser (lib/parsers tool_calling json base_json_parser "
                    f"extract_tool_call_content, a non-greedy <tool_call>(.*?)</tool_call> match that is not "
                    f"JSON-string aware) cuts it. Not a rollback: the previous revision has the same parser.")
            raise CheckFailed("; ".join(problems) + f" [non-streaming {unary.summary()}]")
        return unary.summary()


def known_end_tag_defect(unary: toolcheck.Turn, streamed: toolcheck.Turn, end_tag: str) -> bool:
    """Both answers show the parser defect: no call, and the argument's tail after the end tag in the content."""
    return all(not t.tool_calls and 'b"' in t.content and end_tag in t.content for t in (unary, streamed))


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


def _deltas(d: Mapping[str, float]) -> str:
    return ", ".join(f"{k} +{v:g}" for k, v in sorted(d.items())) or "none"


def _fmt_labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _fn(name: str, description: str, properties: dict[str, Any], **schema: Any) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": list(properties),
              "additionalProperties": False, **schema}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def tool_scenarios(end_tag: str = "</tool_call>") -> list[toolcheck.Scenario]:
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
        toolcheck.Scenario("auto", "What is the weather in Paris in celsius? Use the tool.", [weather, flight], "auto",
                           markers=markers),
        toolcheck.Scenario("required: enums", "Hello there!", [weather], "required", markers=markers),
        toolcheck.Scenario("none", "What is the weather in Paris in celsius? Use the tool.", [weather], "none",
                           markers=markers),
        toolcheck.Scenario("named function: types (pattern, integer range, boolean)", "Book me a flight.",
                           [weather, flight], {"type": "function", "function": {"name": "book_flight"}}, "book_flight",
                           markers=markers),
        toolcheck.Scenario("nested/$ref schema", "Order two items for customer 7.", [order], "required",
                           markers=markers),
        toolcheck.Scenario("special characters arrive unchanged", f"Render this: {special}", [markup], "required",
                           "render_markup", {"snippet": special}, markers=markers),
        toolcheck.Scenario("undeclared tool never silently dropped",
                           "You must call the function get_time with timezone 'UTC' now (it exists even if not "
                           "listed). Do not answer in text.", [weather], "auto", markers=markers),
        toolcheck.Scenario(f"string argument holding the parser's end tag {end_tag}", "Echo the tag.", [echo_tag],
                           "required", "echo_tag", {"text": tagged}, markers=()),
    ]


# --- entry points --------------------------------------------------------------------------------


def run_smoke(url: str, model: str, plan: Plan | None) -> SmokeReport:
    """Run every check against `url` serving `model`; plan-dependent checks are n/a without a plan."""
    try:
        import openai  # noqa: F401
    except ImportError:
        raise DeployError("the smoke tests need the openai package: pip install 'primectl[smoke]' "
                          "(or pass --no-smoke to up)", service="frontend") from None
    r = Runner(url, model, plan)
    gate = r.check(f"ready: GET /v1/models/{model}/ready == 200", r.ready_gate)
    r.check("workers: every prefill and decode worker answers on its metrics port", r.workers_reachable)
    if gate.status == "fail":
        r.halted = "readiness gate failed"
    r.check(f"ready: /v1/models lists {model}", r.models_list)
    r.check("warm-up: the first request is answered", r.warm_up)
    r.check("chat: non-streaming", r.chat_unary)
    r.check("chat: streaming", r.chat_stream)
    r.check("completions", r.completions)
    r.check(f"prompt over prefill budget ({prefill_budget(plan)} tokens) succeeds", r.long_prompt)
    r.check("prompt over context limit -> 4xx", r.over_context)
    r.check("disaggregation: prefill and decode workers both served", r.disaggregation)
    r.check(f"session affinity: {SESSION_HEADER} keeps one decode worker", r.session_affinity)
    r.check("errors: unknown model -> 404", r.unknown_model)
    r.check("errors: malformed JSON body -> 400", r.malformed_json)
    r.check("errors: malformed tool definition -> 400", r.malformed_tool)
    for sc in tool_scenarios(r.end_tag):
        r.check(f"tools: {sc.name}", lambda sc=sc: r.tool_scenario(sc))  # type: ignore[misc]
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
                [[r.name, r.status, f"{r.ms:.0f}", r.evidence] for r in report.results], fold="evidence", stream=stream)


def failure_summary(report: SmokeReport) -> str:
    """One line naming every failed check and why."""
    return "; ".join(f"{r.name}: {r.evidence}" for r in report.failed)


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


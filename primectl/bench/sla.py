"""SLA expressions and the knee search: the most concurrent sessions that still meet the SLA.

Pure: the search takes a measurement function, so it is tested without a cluster.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field

#: Figures of summary.json["figures"] an SLA may name (see primectl.bench.summary).
SLA_METRICS: dict[str, str] = {
    "tok_s_per_user": "median output tok/s per user (AIPerf output_token_throughput_per_user, p50)",
    "e2e_tok_s_per_user": "median end-to-end output tok/s per user (output tokens / request latency)",
    "ttft_p50_ms": "time to first token, p50", "ttft_p90_ms": "time to first token, p90",
    "ttft_p99_ms": "time to first token, p99",
    "itl_p50_ms": "inter-token latency, p50", "itl_p90_ms": "inter-token latency, p90",
    "itl_p99_ms": "inter-token latency, p99",
    "output_tok_s_per_gpu": "output tok/s per GPU (or per worker slot on CPU)",
    "output_tok_s": "output tok/s, whole deployment",
    "request_throughput_rps": "requests per second",
    "error_rate": "failed / completed requests (answers that the deployment is at capacity are not failures)",
    "overload_rate": "requests answered that the deployment is at capacity (529, 503 busy, 429) / completed requests",
}
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
}
_EXPR = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class SLA:
    """`metric op value`, e.g. tok_s_per_user >= 100."""

    metric: str
    op: str
    value: float

    def ok(self, measured: float | None) -> bool:
        """Whether a measured value meets the SLA (a missing or NaN value never does)."""
        if measured is None or math.isnan(measured):
            return False
        return _OPS[self.op](measured, self.value)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_sla(text: str) -> SLA:
    """Parse `metric op value` (ops: >= <= > <); ValueError naming the known metrics on anything else."""
    m = _EXPR.match(text)
    if not m:
        raise ValueError(f"cannot parse SLA {text!r}: expected METRIC>=VALUE or METRIC<=VALUE, "
                         "e.g. 'tok_s_per_user>=100' or 'ttft_p90_ms<=2000'")
    metric, op, value = m.group(1), m.group(2), float(m.group(3))
    if metric not in SLA_METRICS:
        raise ValueError(f"unknown SLA metric {metric!r}; known: {', '.join(SLA_METRICS)}")
    return SLA(metric, op, value)


@dataclass(frozen=True)
class Probe:
    """One measurement of the search."""

    concurrency: int
    value: float | None
    passed: bool
    note: str = ""


@dataclass
class KneeResult:
    """The answer: `knee` is the highest concurrency that passed (None if even the lowest failed)."""

    sla: SLA
    low: int
    high: int
    max_runs: int
    probes: list[Probe] = field(default_factory=list)
    knee: int | None = None
    first_fail: int | None = None

    @property
    def resolved(self) -> bool:
        """True when the knee is pinned to one step: the next concurrency up failed (or the knee is a bound)."""
        if self.knee is None:
            return self.first_fail == self.low
        return self.knee == self.high or self.first_fail == self.knee + 1


Measure = Callable[[int], "tuple[float | None, str] | tuple[float | None, str, bool] | float | None"]


def knee_search(measure: Measure, sla: SLA, *, low: int = 1, high: int = 64, max_runs: int = 7) -> KneeResult:
    """Bisect concurrency in [low, high] for the highest value that meets `sla`, in at most `max_runs` runs.

    Plain binary search for the last pass, with low-1 taken as a virtual pass and high+1 as a
    virtual fail, so ceil(log2(high - low + 2)) runs pin it exactly (7 runs: a range of 127 values).
    Assumes the metric degrades with concurrency; with noise the answer is still a concurrency
    that passed when measured, and every probe is reported. With too few runs for the range the
    answer is the highest pass seen and `resolved` is False. `measure(c)` returns the value, (value, note), or
    (value, note, False) for a measured value that fails whatever it is (the deployment shed part of the load).
    """
    if low < 1 or high < low:
        raise ValueError(f"bad concurrency range [{low}, {high}]")
    if max_runs < 1:
        raise ValueError("max_runs must be at least 1")
    res = KneeResult(sla=sla, low=low, high=high, max_runs=max_runs)
    good, bad = low - 1, high + 1
    while bad - good > 1 and len(res.probes) < max_runs:
        mid = (good + bad) // 2
        got = measure(mid)
        if not isinstance(got, tuple):
            got = (got, "")
        value, note = got[0], got[1]
        passed = (got[2] if len(got) == 3 else True) and sla.ok(value)
        res.probes.append(Probe(mid, value, passed, note))
        if passed:
            good = mid
        else:
            bad = mid
    res.knee = good if good >= low else None
    res.first_fail = bad if bad <= high else None
    return res

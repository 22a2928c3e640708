"""SLA expressions and the knee search (fake measurements: monotone, noisy, the 7-run bound)."""

from __future__ import annotations

import random

import pytest

from primectl.bench.sla import SLA, knee_search, parse_sla


def test_parse() -> None:
    assert parse_sla("tok_s_per_user>=100") == SLA("tok_s_per_user", ">=", 100.0)
    assert parse_sla(" ttft_p90_ms <= 2500.5 ") == SLA("ttft_p90_ms", "<=", 2500.5)
    assert parse_sla("error_rate<1e-2").value == 0.01
    assert str(parse_sla("tok_s_per_user>=100")) == "tok_s_per_user>=100"


@pytest.mark.parametrize("bad", ["", "tok_s_per_user", "tok_s_per_user=>100", "tok_s_per_user>=fast",
                                 "latency<=3", "tok_s_per_user==100"])
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_sla(bad)


def test_ok() -> None:
    sla = parse_sla("tok_s_per_user>=100")
    assert sla.ok(100) and sla.ok(150) and not sla.ok(99.9)
    assert not sla.ok(None) and not sla.ok(float("nan"))
    assert parse_sla("ttft_p90_ms<=2000").ok(1999) and not parse_sla("ttft_p90_ms<=2000").ok(2001)


def speed(c: int) -> float:
    """tok/s per user falls with concurrency; 100 is met up to 37 sessions."""
    return 400.0 - 8.1 * c


@pytest.mark.parametrize("knee", [1, 2, 5, 17, 37, 63, 64])
def test_monotone_finds_the_exact_knee_within_7_runs(knee: int) -> None:
    calls: list[int] = []

    def measure(c: int) -> float:
        calls.append(c)
        return 1000.0 if c <= knee else 10.0

    res = knee_search(measure, parse_sla("tok_s_per_user>=100"), low=1, high=64, max_runs=7)
    assert res.knee == knee
    assert res.resolved
    assert len(calls) <= 7 and len(res.probes) == len(calls)
    assert [p.concurrency for p in res.probes] == calls


def test_realistic_curve() -> None:
    res = knee_search(speed, parse_sla("tok_s_per_user>=100"), high=64)
    assert res.knee == 37 and res.first_fail == 38 and len(res.probes) <= 7
    assert all(p.passed == (p.value >= 100) for p in res.probes)


def test_latency_sla() -> None:
    res = knee_search(lambda c: 50.0 * c, parse_sla("ttft_p90_ms<=1000"), high=64)
    assert res.knee == 20


def test_nothing_meets_the_sla() -> None:
    res = knee_search(lambda c: 1.0, parse_sla("tok_s_per_user>=100"), high=64)
    assert res.knee is None and len(res.probes) <= 7 and res.resolved


def test_everything_meets_the_sla() -> None:
    res = knee_search(lambda c: 1e6, parse_sla("tok_s_per_user>=100"), high=64)
    assert res.knee == 64 and len(res.probes) <= 7 and res.resolved


def test_bound_holds_for_wide_ranges() -> None:
    res = knee_search(speed, parse_sla("tok_s_per_user>=100"), high=4096, max_runs=7)
    assert len(res.probes) == 7
    assert res.knee is not None and speed(res.knee) >= 100
    assert not res.resolved  # 7 runs cannot pin a knee in 4096 values; say so
    assert res.first_fail is not None and res.first_fail > res.knee


@pytest.mark.parametrize("seed", range(20))
def test_noisy_measurements_answer_a_passing_concurrency_near_the_knee(seed: int) -> None:
    rng = random.Random(seed)

    def noisy(c: int) -> float:
        return speed(c) * rng.uniform(0.95, 1.05)

    res = knee_search(noisy, parse_sla("tok_s_per_user>=100"), high=64, max_runs=7)
    assert len(res.probes) <= 7
    assert res.knee is not None
    assert any(p.concurrency == res.knee and p.passed for p in res.probes)
    assert abs(res.knee - 37) <= 6


def test_invalid_probe_counts_as_a_fail_and_carries_its_note() -> None:
    def measure(c: int) -> tuple[float | None, str]:
        return (None, "INVALID: zero output tokens") if c >= 40 else (500.0, "")

    res = knee_search(measure, parse_sla("tok_s_per_user>=100"), high=64)
    assert res.knee == 39
    assert any(p.note.startswith("INVALID") and not p.passed for p in res.probes)


def test_an_overloaded_probe_is_measured_but_fails_whatever_its_latency() -> None:
    """Above 8 sessions the deployment refuses part of the load (529): the latency of what it served still meets
    the SLA, but that concurrency is more than it takes, so the knee is 8, and the probe keeps its value."""
    def measure(c: int) -> tuple[float | None, str] | tuple[float | None, str, bool]:
        return (900.0, "overloaded: 198 of 939 requests", False) if c > 8 else (500.0, "")

    res = knee_search(measure, parse_sla("ttft_p90_ms<=1000"), high=16)
    assert res.knee == 8 and res.resolved
    over = [p for p in res.probes if p.concurrency > 8]
    assert over and all(p.value == 900.0 and not p.passed and p.note.startswith("overloaded") for p in over)


def test_bad_ranges() -> None:
    with pytest.raises(ValueError):
        knee_search(speed, parse_sla("tok_s_per_user>=1"), low=0, high=4)
    with pytest.raises(ValueError):
        knee_search(speed, parse_sla("tok_s_per_user>=1"), low=5, high=4)

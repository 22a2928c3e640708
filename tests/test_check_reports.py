"""The smoke and preflight reports: smoke checks keep stable ids, and both reports' JUnit is one writer's."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from primectl.checks import preflight, report, smoke
from primectl.checks.preflight_rules import Result
from primectl.checks.smoke import CheckResult, Runner, SmokeReport, smoke_checks

REPO = Path(__file__).resolve().parent.parent

# CI keeps a testcase's history by its name: renaming one of these is a visible change, made here on purpose.
SMOKE_IDS = [
    "ready.gate", "workers.metrics", "workers.listed", "ready.models", "chat.warmup", "chat.basic", "chat.stream",
    "completions.basic", "prompt.over_budget", "prompt.over_context", "disagg.both_served", "session.affinity", "errors.unknown_model",
    "errors.malformed_json", "errors.malformed_tool", "tools.auto", "tools.required", "tools.none", "tools.named",
    "tools.nested_ref", "tools.special_chars", "tools.undeclared", "tools.end_tag",
]


def _runner(plan: bool) -> Runner:
    from primectl.planner.build import plan_recipe

    return Runner("http://127.0.0.1:9", "demo", plan_recipe(REPO / "recipes" / "demo.yaml")[1] if plan else None)


@pytest.mark.parametrize("with_plan", [False, True])
def test_smoke_check_ids_are_stable_unique_and_apart_from_the_display_text(with_plan: bool) -> None:
    checks = smoke_checks(_runner(with_plan))
    ids = [c.id for c in checks]
    assert ids == SMOKE_IDS
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[a-z]+\.[a-z_]+", i) for i in ids), ids
    titles = [c.title for c in checks]
    assert len(set(titles)) == len(titles) and not set(ids) & set(titles)
    # the display text may name the model, the budget or the parser's end tag; the id does not
    assert "ready: GET /v1/models/demo/ready == 200" in titles


def test_both_reports_write_junit_with_the_one_shared_writer() -> None:
    assert smoke.junit_xml is preflight.junit_xml is report.junit_xml
    sm = SmokeReport("http://h:8000", "demo", "mocker", [
        CheckResult("chat.basic", "chat: non-streaming", "fail", 2.0, "HTTP 503"),
        CheckResult("tools.auto", "tools: auto", "n/a", 0.0, "n/a (engine mocker serves no tool calls)")])
    pf = preflight.Report("demo", [Result("h1", "ports", "fail", "port 8000 taken by nginx", "free it"),
                                   Result("h1", "nixl", "n/a", "skipped (--no-fabric)"),
                                   Result("h2", "clock", "warn", "skew 1.2 s", "sync the clock")], seconds=1.5)
    docs = [ET.fromstring(r.to_junit().split("\n", 1)[1]) for r in (sm, pf)]
    for doc in docs:  # the same shape: one suite, counts, failure / skipped per case
        (suite,) = doc.findall("testsuite")
        cases = suite.findall("testcase")
        assert (suite.get("failures"), suite.get("skipped"), suite.get("errors")) == ("1", "1", "0")
        assert cases[0].find("failure") is not None and cases[1].find("skipped") is not None
    smoke_cases = docs[0].findall("testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in smoke_cases] == [
        ("primectl.smoke", "chat.basic"), ("primectl.smoke", "tools.auto")]
    title = smoke_cases[0].find("properties/property[@name='title']")
    assert title is not None and title.get("value") == "chat: non-streaming"
    pf_suite = docs[1].find("testsuite")
    assert pf_suite is not None and pf_suite.get("time") == "1.500" and pf_suite.get("tests") == "3"
    pf_cases = pf_suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in pf_cases] == [
        ("primectl.preflight.h1", "ports"), ("primectl.preflight.h1", "nixl"), ("primectl.preflight.h2", "clock")]
    failure = pf_cases[0].find("failure")
    assert failure is not None and failure.get("type") == "PreflightFailure"
    assert failure.get("message") == "port 8000 taken by nginx" and failure.text == "port 8000 taken by nginx\n-> free it"
    out = pf_cases[2].find("system-out")
    assert out is not None and out.text == "WARN: skew 1.2 s\n-> sync the clock"


def test_the_tally_counts_every_status_zero_included() -> None:
    assert report.tally(["pass", "fail", "pass"]) == {"pass": 2, "warn": 0, "fail": 1, "n/a": 0}


def test_preflight_junit_names_each_testcase_by_its_check(cli, tmp_path: Path) -> None:
    """`primectl preflight --junit FILE` on this machine (local connection, a workdir of the test's own)."""
    import yaml

    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    doc["name"] = doc["namespace"] = "junitpf"
    doc["hosts"][0]["workdir"] = str(tmp_path / "wd")
    recipe = tmp_path / "demo.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    junit = tmp_path / "preflight.xml"
    res = cli("preflight", recipe, "--no-fabric", "--no-selftest", "--junit", junit)
    assert res.exit_code in (0, 1), res.stderr
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "primectl preflight junitpf"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == list(preflight.CHECK_ORDER)
    assert {c.get("classname") for c in cases} == {"primectl.preflight.local"}
    assert (suite.get("failures") != "0") == (res.exit_code == 1)
    nixl = next(c for c in cases if c.get("name") == "nixl").find("skipped")  # no runtime, or --no-fabric
    assert nixl is not None and nixl.get("message")

"""primectl's alert rules, checked by Prometheus's own promtool: the rendered configuration and rule files of the
mocker demo and of GLM-5.3 on GB200 hosts load (`promtool check config` / `check rules`), and every alert fires in
a unit test where it should and stays quiet where it should not (`promtool test rules`, tests/data/promtool/).

The unit tests run against rules rendered from TEST_FACTS (every component planned, 2 s scrapes); each rule's
annotations are filled into the expected alerts from the rule's own templates, so promtool also checks that every
summary and runbook renders with the labels the alert really has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.monitoring import rules
from primectl.monitoring.model import Slo
from tests.conftest import REPO, CliResult

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
pytestmark = pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed (make system)")

UNIT_TESTS = REPO / "tests" / "data" / "promtool"
TEST_FACTS = rules.RuleFacts(
    deployment="t", slo=Slo(), scrape_interval="2s", workers={"prefill": 1, "decode": 3},
    roles=("auxiliary", "cache", "decode", "frontend", "prefill"),
    components=("alertmanager", "dcgm-exporter", "dynamo-frontend", "dynamo-vllm", "node-exporter", "prometheus"),
    health_interval="15s", infiniband=True, nvlink_domain=True)
# A fleet's gateway tier (fleet.test.yml): its replicas, edge, etcd and monitoring.
FLEET_FACTS = rules.RuleFacts(
    deployment="t", slo=Slo(), scrape_interval="2s", roles=("auxiliary", "balancer", "control", "gateway"),
    components=("alertmanager", "etcd", "fleet-gateway", "haproxy", "node-exporter", "prometheus"),
    health_interval="15s", gateway_replicas=2)
# The rule file each unit-test file names, and the facts it is rendered from.
RULE_FILES = {"primectl.rules.yml": TEST_FACTS, "fleet.rules.yml": FLEET_FACTS}
# Fires by design at every evaluation: it has no case where it stays quiet.
ALWAYS_FIRING = {"Watchdog"}
MONITORING = {"alerts": {"webhook": "http://127.0.0.1:9099/alerts"}}
TEMPLATE = re.compile(r"\{\{\s*\$(?:labels\.(\w+)|(value))\s*\}\}")


def recipe(tmp_path: Path, base: str, **extra: Any) -> Path:
    """A recipe that extends recipes/<base> with a monitoring block."""
    path = tmp_path / f"mon-{base}"
    path.write_text(yaml.safe_dump({"extends": str(REPO / "recipes" / base), "monitoring": MONITORING, **extra}))
    return path


def rendered(cli: Callable[..., CliResult], recipe_path: Path, out: Path) -> Path:
    """`primectl render`'s config directory of the monitoring host (where prometheus.yml is)."""
    result = cli("render", recipe_path, "-o", out)
    assert result.exit_code == 0, result.stderr
    (config,) = {p.parent for p in out.glob("*/config/prometheus.yml")}
    return config


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """promtool, its output kept for the assertion message."""
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120)


def alert_names(rule_file_text: str) -> set[str]:
    """Every alert name of a rule file."""
    return {r["alert"] for g in yaml.safe_load(rule_file_text)["groups"] for r in g["rules"]}


def fill(text: str, labels: dict[str, str], value: str | None, where: str) -> str:
    """A summary or runbook template rendered as Prometheus renders it for these labels and value."""
    def sub(m: re.Match[str]) -> str:
        if m.group(2):
            assert value is not None, f"{where}: the template reads $value: give the case a `value:`"
            return value
        assert m.group(1) in labels, f"{where}: the template reads label {m.group(1)!r}, which the alert lacks"
        return labels[m.group(1)]
    return TEMPLATE.sub(sub, text)


def with_annotations(test_file: dict[str, Any], docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The unit-test file with each expected alert's annotations filled in from the one rule that made it."""
    for group in test_file["tests"]:
        for case in group.get("alert_rule_test", []):
            for exp in case.get("exp_alerts") or []:
                labels = {k: str(v) for k, v in exp["exp_labels"].items()}
                exp["exp_labels"] = labels
                where = f"{group['name']!r} {case['alertname']} at {case['eval_time']}"
                made = [r for r in docs if r["alert"] == case["alertname"]
                        and all(labels.get(k) == v for k, v in r["labels"].items())]
                assert len(made) == 1, f"{where}: {len(made)} rules of that name have labels within {labels}"
                rule = made[0]
                value = exp.pop("value", None)
                exp["exp_annotations"] = {k: fill(v, labels, None if value is None else str(value), where)
                                          for k, v in rule["annotations"].items()}
    return test_file


def unit_test_cases() -> dict[str, set[bool]]:
    """alert name -> whether its cases expect it to fire (True), to stay quiet (False), or both."""
    out: dict[str, set[bool]] = {}
    for path in sorted(UNIT_TESTS.glob("*.test.yml")):
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                out.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    return out


def test_every_alert_fires_and_stays_quiet_in_promtool_unit_tests(tmp_path: Path) -> None:
    docs = {}
    for name, facts in RULE_FILES.items():
        (tmp_path / name).write_text(rules.rules_yaml(facts))
        docs[name] = [r for g in rules.rule_groups(facts) for r in g["rules"]]
    files = []
    for path in sorted(UNIT_TESTS.glob("*.test.yml")):
        test_file = yaml.safe_load(path.read_text())
        (rule_file,) = test_file["rule_files"]
        files.append(tmp_path / path.name)
        files[-1].write_text(yaml.safe_dump(with_annotations(test_file, docs[rule_file]), sort_keys=False,
                                            width=100_000))
    assert len(files) >= 5
    result = promtool("test", "rules", *files, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files), result.stdout


def test_a_killed_target_fires_within_the_demo_budget() -> None:
    """With 2 s scrapes and evaluations, TargetDown waits three scrapes: a failed scrape lands within 2 s of the
    SIGKILL, the next evaluation within 2 s more, then `for`, then Alertmanager's group_wait of 2 s: under 20 s.
    (availability.test.yml shows the same timeline firing, and a one- or two-scrape blip not.)"""
    fire = rules.target_down_for(TEST_FACTS)
    assert fire == "6s"
    assert 2 + 2 + int(fire[:-1]) + 2 + 2 <= 20  # scrape, evaluation, for, the evaluation that sees it, group_wait


def test_every_rendered_alert_has_a_firing_and_a_quiet_unit_test(cli: Callable[..., CliResult],
                                                                  tmp_path: Path) -> None:
    """A new rule without a unit test that shows it fire and stay quiet fails here."""
    demo = rendered(cli, recipe(tmp_path, "demo.yaml"), tmp_path / "demo")
    glm = rendered(cli, recipe(tmp_path, "glm53.yaml"), tmp_path / "glm53")
    names = (alert_names(rules.rules_yaml(TEST_FACTS)) | alert_names(rules.rules_yaml(FLEET_FACTS))
             | alert_names((demo / "primectl.rules.yml").read_text())
             | alert_names((glm / "primectl.rules.yml").read_text()))
    cases = unit_test_cases()
    no_fire = sorted(n for n in names if True not in cases.get(n, set()))
    no_quiet = sorted(n for n in names - ALWAYS_FIRING if False not in cases.get(n, set()))
    assert no_fire == [] and no_quiet == [], f"alerts with no firing case: {no_fire}; with no quiet case: {no_quiet}"
    assert set(cases) <= names, f"unit tests of alerts no rule defines: {sorted(set(cases) - names)}"


@pytest.mark.parametrize("base", ["demo.yaml", "glm53.yaml"])
def test_rendered_prometheus_config_and_rules_load(cli: Callable[..., CliResult], tmp_path: Path, base: str) -> None:
    config = rendered(cli, recipe(tmp_path, base), tmp_path / "out")
    result = promtool("check", "rules", config / "primectl.rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("check", "config", config / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "primectl.rules.yml" in result.stdout, result.stdout


def test_rules_follow_what_is_planned(cli: Callable[..., CliResult], tmp_path: Path) -> None:
    """The demo (no GPU) carries no hardware rule that could never have data; GLM-5.3's GPU hosts carry them."""
    demo = alert_names((rendered(cli, recipe(tmp_path, "demo.yaml"), tmp_path / "demo") / "primectl.rules.yml")
                       .read_text())
    glm = alert_names((rendered(cli, recipe(tmp_path, "glm53.yaml"), tmp_path / "glm") / "primectl.rules.yml")
                      .read_text())
    gpu = {"GpuXidError", "GpuDoubleBitEccError", "GpuThermalSlowdown", "FabricManagerNotReady"}
    assert not demo & gpu and gpu <= glm
    assert {"TargetDown", "WorkersBelowPlan", "GateNotReady", "ErrorRatioHigh", "RequestsStuck", "Watchdog"} <= demo
    assert {"KvCacheNearlyFull", "PreemptionsRising", "KvTransfersFailing"} <= glm - demo  # vLLM's, not the mocker's
    assert "FieldMissing" in glm and "FieldMissing" not in demo
    assert "WorkerSlowerThanPeers" in glm and "WorkerSlowerThanPeers" not in demo  # 2 decode workers: no outlier


def test_hardware_switches_add_only_their_rules() -> None:
    base = rules.RuleFacts(deployment="t", slo=Slo(), components=("dcgm-exporter", "node-exporter"))
    plain = alert_names(rules.rules_yaml(base))
    fabric = alert_names(rules.rules_yaml(rules.RuleFacts(**{**base.__dict__, "nvlink_domain": True})))
    ib = alert_names(rules.rules_yaml(rules.RuleFacts(**{**base.__dict__, "infiniband": True})))
    assert fabric - plain == {"NvlinkRecoveries", "NvlinkRecoveryFailed", "NvlinkBitErrorRateHigh", "ImexNotReady"}
    assert ib - plain == {"InfinibandPortNotActive", "InfinibandLinkDown", "InfinibandLinkFlapping"}


def test_every_rule_says_what_to_do() -> None:
    for group in [*rules.rule_groups(TEST_FACTS), *rules.rule_groups(FLEET_FACTS)]:
        for r in group["rules"]:
            assert r["labels"]["severity"] in ("critical", "warning", "none"), r["alert"]
            assert r["labels"]["deployment"] == "t", r["alert"]
            assert r["annotations"]["summary"] and "primectl " in r["annotations"]["runbook"], r

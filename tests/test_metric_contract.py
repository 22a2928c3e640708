"""Every metric an alert rule reads is a name a real component exports: a rule on a misspelt name (vLLM's
`vllm:num_preemptions` without `_total`, the bug of llm-d PR #553) would load, evaluate to nothing and never fire.

The names come from the rules' PromQL (`metric_names`) and are looked up in exposition captured from the real
components (tests/data/metrics/<component>.prom, written by scripts/capture_metrics.py), in the upstream DCGM field
list for DCGM_FI_* (tests/data/metrics/dcgm-fields.txt: no GPU here), or in what primectl's own health loop writes.
A selector that names its job (`{job="dcgm-exporter"}`) must find the name in that component's captures.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from primectl.checks import health_loop
from primectl.monitoring import dcgm, rules
from primectl.monitoring.model import Slo
from tests.conftest import REPO

CAPTURES = REPO / "tests" / "data" / "metrics"
# Series Prometheus writes itself for every target.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"}
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
            "inf", "nan", "atan2"}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
TOKEN = re.compile(r"(?P<num>(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?))|(?P<name>[a-zA-Z_:][\w:]*)")
SELECTOR = re.compile(r"(?P<name>[a-zA-Z_:][\w:]*)\s*\{(?P<labels>[^}]*)\}")
SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)")
FAMILY_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
# A job's captures: its own file, and files of the same component under another setup (node-exporter-infiniband).
JOBS = ("dynamo-frontend", "dynamo-mocker", "dynamo-vllm", "node-exporter", "mooncake-master", "haproxy", "etcd",
        "prometheus", "alertmanager", rules.GATEWAY_JOB)
DCGM_JOB = "dcgm-exporter"


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: functions, aggregations, keywords, label matchers, grouping
    labels, durations and numbers dropped."""
    text = STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers (strings already blanked, so no brace hides in one)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:\d+(?:ms|s|m|h|d|w|y))+\b", " ", text)  # durations (offset 5m)
    text = GROUPING.sub(" ", text)
    out = set()
    for m in TOKEN.finditer(text):
        name = m.group("name")
        if not name or name in KEYWORDS or name in AGGREGATIONS:
            continue
        if re.match(r"\s*\(", text[m.end():]):  # a function call
            continue
        out.add(name)
    return out


def job_scoped(expr: str) -> set[tuple[str, str]]:
    """(metric, job) for every selector of the expression that names its job with `job="..."`."""
    out = set()
    for m in SELECTOR.finditer(STRING.sub(lambda s: s.group(0).replace("{", "(").replace("}", ")"), expr)):
        job = re.search(r'\bjob\s*=\s*"([^"]*)"', m.group("labels"))
        if job and m.group("name") not in KEYWORDS | AGGREGATIONS:
            out.add((m.group("name"), job.group(1)))
    return out


def exposition_names(text: str) -> set[str]:
    """Every series name of Prometheus exposition text, with each histogram's and summary's series names."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(maxsplit=3)
            names.add(family)
            names |= {family + sfx for sfx in FAMILY_SUFFIXES.get(kind.strip(), ())}
        elif line and not line.startswith("#") and (m := SAMPLE.match(line)):
            names.add(m.group(1))
    return names


def dcgm_fields() -> set[str]:
    """The DCGM field names of the upstream list."""
    lines = (CAPTURES / "dcgm-fields.txt").read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def textfile_names() -> set[str]:
    """What primectl's health loop writes for node_exporter (every metric it can write)."""
    every = [health_loop.Verdict("disk", "warn", "low"), health_loop.Verdict("gpu", "fail", "", error="raised")]
    return exposition_names(health_loop.render(every, "h", gate=True, now=0.0, took=0.1, interval=2.0))


def known_by_job() -> dict[str, set[str]]:
    """component (scrape job) -> the names its captures show."""
    out: dict[str, set[str]] = {}
    for path in sorted(CAPTURES.glob("*.prom")):
        job = next((j for j in JOBS if path.stem == j or path.stem.startswith(j + "-")), path.stem)
        out.setdefault(job, set()).update(exposition_names(path.read_text()))
    out.setdefault("node-exporter", set()).update(textfile_names())
    out[DCGM_JOB] = dcgm_fields()
    return out



def unknown_names(exprs: Iterable[str]) -> list[str]:
    """The names the expressions read that no capture, DCGM field list or primectl textfile has, and the
    job-scoped ones that the job's own captures lack (`name (job)`)."""
    by_job = known_by_job()
    known = set().union(*by_job.values()) | SYNTHETIC
    out = []
    for expr in exprs:
        out += [n for n in sorted(metric_names(expr)) if n not in known]
        out += [f"{n} ({job})" for n, job in sorted(job_scoped(expr)) if n not in SYNTHETIC
                and n not in by_job.get(job, set())]
    return out


def every_rule_expr() -> list[str]:
    """The expressions of every rule primectl can emit (every component planned, every hardware switch on; and a
    fleet's gateway tier)."""
    facts = rules.RuleFacts(
        deployment="t", slo=Slo(), workers={"prefill": 1, "decode": 2}, roles=("decode", "frontend", "prefill"),
        components=("alertmanager", "dcgm-exporter", "dynamo-frontend", "dynamo-mocker", "dynamo-vllm",
                    "etcd", "haproxy", "mooncake-master", "node-exporter", "prometheus"),
        infiniband=True, nvlink_domain=True)
    fleet = rules.RuleFacts(deployment="t", slo=Slo(), roles=("balancer", "control", "gateway"),
                            components=("etcd", rules.GATEWAY_JOB, "haproxy", "node-exporter"), gateway_replicas=2)
    return [r["expr"] for f in (facts, fleet) for g in rules.rule_groups(f) for r in g["rules"]]


def test_every_metric_a_rule_reads_is_exported() -> None:
    exprs = every_rule_expr()
    assert len(exprs) > 40
    assert unknown_names(exprs) == []


def test_every_gateway_rule_reads_the_replicas_capture() -> None:
    """The gateway's rules name their job, so each of their names must be in the replica's own capture."""
    exprs = [e for e in every_rule_expr() if "primectl_gateway_" in e]
    assert len(exprs) >= 4
    assert all(f'job="{rules.GATEWAY_JOB}"' in e for e in exprs)
    assert unknown_names(exprs) == []


def test_the_checker_refuses_a_name_no_component_exports() -> None:
    """The name without `_total`, as llm-d PR #553 had it: vLLM's counter is exported as ..._total."""
    bad = 'sum by (service) (increase(vllm:num_preemptions{deployment="t",job="dynamo-vllm"}[5m])) > 0'
    assert unknown_names([bad]) == ["vllm:num_preemptions", "vllm:num_preemptions (dynamo-vllm)"]
    assert unknown_names([bad.replace("preemptions{", "preemptions_total{")]) == []


def test_the_checker_holds_a_name_to_the_job_it_names() -> None:
    """A real name, but read from a job that does not export it, could never match a series either."""
    assert unknown_names(['vllm:num_preemptions_total{job="dynamo-mocker"} > 0']) == [
        "vllm:num_preemptions_total (dynamo-mocker)"]
    assert unknown_names(['DCGM_FI_DEV_XID_ERRORS{job="dcgm-exporter"} != 0', "DCGM_FI_DEV_NO_SUCH_FIELD > 0"]) == [
        "DCGM_FI_DEV_NO_SUCH_FIELD"]


def test_names_are_parsed_out_of_promql() -> None:
    expr = ('sum by (deployment, le) (rate(foo_bucket{le="0.5",a=~"x|y}"}[5m])) > on (a) group_left () '
            '2 * quantile by (b) (0.5, bar:baz_total offset 1m) and absent(qux{q="}"}) unless count(up == 1e-9) '
            "or vector(1) and histogram_quantile(0.95, sum without (x) (irate(hist_bucket[1m])))")
    assert metric_names(expr) == {"foo_bucket", "bar:baz_total", "qux", "up", "hist_bucket"}
    assert job_scoped('a{job="x"} and b{service="s",job="y"} and c{role="r"}') == {("a", "x"), ("b", "y")}


def test_histograms_map_bucket_sum_and_count_to_their_family() -> None:
    text = "# TYPE h histogram\n# TYPE s summary\n# TYPE c counter\nc_total 1\n"
    assert exposition_names(text) == {"h", "h_bucket", "h_sum", "h_count", "s", "s_sum", "s_count", "c", "c_total"}


def test_captures_are_real_and_small() -> None:
    """Each capture records what produced it; none is over ~200 KB."""
    files = sorted(CAPTURES.glob("*.prom"))
    expected = {"dynamo-frontend", "dynamo-mocker", "dynamo-vllm", "haproxy", "mooncake-master", "node-exporter",
                "node-exporter-infiniband", "prometheus", "alertmanager", "etcd", rules.GATEWAY_JOB}
    assert {p.stem for p in files} >= expected
    for path in files:
        head = path.read_text().splitlines()[:4]
        assert head[0].startswith("# Captured ") and "capture_metrics.py" in head[0], path
        assert any(line.startswith("# version: ") for line in head), path
        assert path.stat().st_size < 200_000, path


def test_the_dcgm_fields_rules_read_are_declared_for_the_counters_file() -> None:
    """dcgm-exporter exports only the fields its counters file lists: each DCGM name a rule reads is declared in
    rules.DCGM_FIELDS / NVLINK_DOMAIN_FIELDS, is in the counters file primectl renders (dcgm.FIELDS), and is a real
    DCGM field."""
    declared = set(rules.DCGM_FIELDS + rules.NVLINK_DOMAIN_FIELDS)
    used = {n for e in every_rule_expr() for n in metric_names(e) if n.startswith("DCGM_")}
    assert used == declared
    assert declared <= {name for name, _, _ in dcgm.FIELDS}
    assert declared <= dcgm_fields()

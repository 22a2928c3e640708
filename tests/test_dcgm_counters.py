"""dcgm-exporter's counters CSV: read as dcgm-exporter reads it, every field name checked against go-dcgm's table.

No GPU here, so dcgm-exporter never runs in these tests: the file is parsed the way its Go code parses it
(NVIDIA/dcgm-exporter internal/pkg/counters/counter_config.go: encoding/csv with Comment '#', the field count of
the first record for all, spaces trimmed, exactly 3 fields, the type one of its promMetricType keys, the name
known to dcgm.GetFieldID) and each name is looked up in tests/data/dcgm/fields.txt (go-dcgm's table as pinned).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from primectl.monitoring import dcgm
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.render.bundle import render_host

REPO = Path(__file__).resolve().parent.parent
FIELDS_FILE = REPO / "tests" / "data" / "dcgm" / "fields.txt"
PROM_TYPES = {"gauge", "counter", "histogram", "summary", "label"}  # dcgm-exporter's promMetricType
DCP_FIELDS = range(1000, 1100)  # skipped unless DCP collection is on (fieldIsSupported)


def known_fields() -> dict[str, int]:
    """Field name -> id, as go-dcgm's GetFieldID knows them."""
    out = {}
    for line in FIELDS_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            name, fid, _ = line.split()
            out[name] = int(fid)
    return out


class CounterFileError(ValueError):
    """What dcgm-exporter would refuse the file for (it exits)."""


def parse_like_dcgm_exporter(text: str) -> list[tuple[str, str, str]]:
    """Records as dcgm-exporter's ReadCSVFile + ExtractCounters get them; CounterFileError where they fail."""
    fields = known_fields()
    records: list[list[str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        if line == "" or line.startswith("#"):  # csv.Reader skips empty lines and lines starting with Comment
            continue
        if '"' in line:  # an unquoted field with a quote is ErrBareQuote; this file never quotes
            raise CounterFileError(f"line {number}: bare quote")
        record = line.split(",")
        if records and len(record) != len(records[0]):  # FieldsPerRecord 0: the first record's count for all
            raise CounterFileError(f"line {number}: wrong number of fields")
        records.append(record)
    out = []
    for record in records:
        record = [r.strip(" ") for r in record]
        if len(record) != 3:
            raise CounterFileError(f"malformed CSV record {record}: expected 3 fields")
        name, kind, help_ = record
        if name not in fields:
            raise CounterFileError(f"could not find DCGM field {name}")
        if kind not in PROM_TYPES:
            raise CounterFileError(f"could not find Prometheus metric type {kind!r}")
        out.append((name, kind, help_))
    return out


def test_every_field_is_one_dcgm_exporter_knows_and_collects_without_dcp() -> None:
    records = parse_like_dcgm_exporter(dcgm.counters_csv())
    fields = known_fields()
    assert [r[0] for r in records] == [f[0] for f in dcgm.FIELDS]
    assert {kind for _, kind, _ in records} <= {"gauge", "counter", "label"}
    assert not [name for name, _, _ in records if fields[name] in DCP_FIELDS], "a DCP field is dropped silently"
    assert len({fields[name] for name, _, _ in records}) == len(records), "one DCGM field twice"


def test_the_fields_the_hardware_rules_need_are_collected_and_sbe_ecc_is_not() -> None:
    names = {r[0] for r in parse_like_dcgm_exporter(dcgm.counters_csv())}
    assert {
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS", "DCGM_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS",
        "DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS", "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",
        "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER_FLOAT",
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "DCGM_FI_DEV_FABRIC_HEALTH_MASK", "DCGM_FI_IMEX_DAEMON_STATUS",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN_NS",
    } <= names
    # dcgm-exporter#581: with SBE in the watch, every NVLINK_COUNT field reads N/A on GB200.
    assert not {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"} & names


@pytest.mark.parametrize(("text", "why"), [
    ("DCGM_FI_DEV_XID_ERRORS, gauge, last XID, with a comma\n", "expected 3 fields"),
    ("DCGM_FI_DEV_XID_ERRORS, gauge, ok\nDCGM_FI_DEV_GPU_TEMP, gauge\n", "wrong number of fields"),
    ("DCGM_FI_DEV_XID_ERROR, gauge, DCGM 4.5 name unknown to the pinned go-dcgm\n", "could not find DCGM field"),
    ("DCGM_FI_DEV_XID_ERRORS, gague, typo\n", "metric type"),
    ('DCGM_FI_DEV_XID_ERRORS, gauge, the "last" XID\n', "bare quote"),
])
def test_the_parser_refuses_what_dcgm_exporter_refuses(text: str, why: str) -> None:
    with pytest.raises(CounterFileError, match=why):
        parse_like_dcgm_exporter(text)


def glm53_monitored(tmp_path: Path, extra: str = "") -> Plan:
    recipe = tmp_path / "glm53-mon.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'glm53.yaml'}\nmonitoring:\n  alerts:\n"
                      f"    webhook: http://alerts.example:9099/hook\n{extra}")
    return plan_recipe(recipe)[1]


def exec_argv(script: str) -> list[str]:
    """The argv a rendered run script execs (its `exec` line and continuations)."""
    text = script[script.index("\nexec ") + len("\nexec "):]
    return shlex.split(text.replace("\\\n", " ").split("\n", 1)[0])


def test_glm53_runs_dcgm_exporter_on_every_gpu_tray_with_this_file_every_5s(tmp_path: Path) -> None:
    plan = glm53_monitored(tmp_path)
    exporters = [s for s in plan.services if s.component == "dcgm-exporter"]
    assert sorted(s.host for s in exporters) == sorted(h.name for h in plan.hosts if h.gpus)
    assert "head" not in {s.host for s in exporters}  # no GPUs there
    tray = plan.host("tray07")
    bundle = render_host(plan, tray)
    argv = exec_argv(bundle.files["bin/dcgm-exporter-tray07.sh"].decode())
    assert argv[0] == "/usr/bin/dcgm-exporter"
    opts = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert opts["-c"] == "5000" and opts["-a"] == f"{tray.address}:9400"
    assert opts["-f"] == "${release_dir}/config/dcgm-counters.csv"  # the script's own release directory
    shipped = bundle.files["config/dcgm-counters.csv"].decode()
    assert shipped == dcgm.counters_csv() and parse_like_dcgm_exporter(shipped)
    scrape = plan.service("dcgm-exporter-tray07").metrics_url
    assert scrape == f"http://{tray.address}:9400/metrics"


def test_the_recipe_sets_the_collection_interval(tmp_path: Path) -> None:
    plan = glm53_monitored(tmp_path, "  dcgm_interval_ms: 1000\n")
    argv = plan.service("dcgm-exporter-tray01").argv
    assert argv[argv.index("-c") + 1] == "1000"

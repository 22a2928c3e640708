"""Preflight verdicts on constructed facts: thresholds, port ownership, drift, GPU parsing, outliers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.checks import preflight_rules as rules
from primectl.checks.preflight import Report, host_needs
from primectl.checks.preflight_fabric import nixl_pairs, rounds
from primectl.checks.preflight_rules import GB, HostNeeds, Result, Transfer
from primectl.plan.model import Plan
from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe

REPO = Path(__file__).resolve().parent.parent


def needs(**kw: Any) -> HostNeeds:
    base: dict[str, Any] = dict(name="h2", address="127.0.0.3", workdir="/srv/wd", roles=frozenset({"prefill"}),
                                ports={8081: "prefill-0", 8998: "prefill-0"}, runtime_python="/rt/bin/python",
                                runtime_dir="/rt", provisioned=False, expected_stamp=None)
    return HostNeeds(**(base | kw))


def plan_from(tmp_path: Path, **changes: Any) -> tuple[Plan, Any]:
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    doc.update(changes)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(doc))
    loaded = load_recipe(path)
    return build_plan(loaded.recipe), loaded.recipe


# -- disk ---------------------------------------------------------------------------------------

def test_disk_fails_under_threshold_and_warns_under_twice() -> None:
    need = rules.MIN_FREE_BYTES
    assert rules.check_disk("h1", "disk_workdir", "/wd", {"at": "/wd", "free": 1_000_000}, need).status == "fail"
    assert rules.check_disk("h1", "disk_workdir", "/wd", {"at": "/wd", "free": need * 1.5}, need).status == "warn"
    assert rules.check_disk("h1", "disk_workdir", "/wd", {"at": "/wd", "free": need * 3}, need).status == "pass"
    r = rules.check_disk("h1", "disk_workdir", "/wd/x", {"at": "/wd", "free": 0}, need)
    assert "(on /wd)" in r.detail and "free at least" in r.remediation


def test_workdir_need_counts_a_runtime_still_to_install() -> None:
    assert rules.workdir_need(needs(provisioned=True), runtime_present=False) == rules.MIN_FREE_BYTES + rules.RUNTIME_VENV_BYTES
    assert rules.workdir_need(needs(provisioned=True), runtime_present=True) == rules.MIN_FREE_BYTES
    assert rules.workdir_need(needs(provisioned=False), runtime_present=False) == rules.MIN_FREE_BYTES


# -- model ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("size_gb", "status"), [(100, "pass"), (109.9, "pass"), (90.1, "pass"), (111, "fail"), (80, "fail")])
def test_weights_within_ten_percent(size_gb: float, status: str) -> None:
    n = needs(model_path="/models/x", weights_gb=100)
    r = rules.check_model(n, {"exists": True, "is_dir": True, "bytes": size_gb * GB, "files": 3})
    assert r.status == status


def test_model_missing_generated_and_unsized() -> None:
    assert rules.check_model(needs(model_path="/m"), {"exists": False}).status == "fail"
    assert rules.check_model(needs(generated_model=True), {}).status == "n/a"
    assert rules.check_model(needs(roles=frozenset({"frontend"})), {}).status == "n/a"
    r = rules.check_model(needs(model_path="/m"), {"exists": True, "is_dir": True, "bytes": 5, "files": 1})
    assert r.status == "warn" and "weights_gb" in r.remediation


# -- ports ----------------------------------------------------------------------------------------

def test_port_taken_by_a_stranger_fails_with_owner() -> None:
    r = rules.check_ports(needs(), {"8081": {"address": "127.0.0.3", "pid": 42, "command": "nc -l"}}, set())
    assert r.status == "fail"
    assert "port 8081 on h2 (127.0.0.3) is already in use; prefill-0 needs it (held by pid 42: nc -l)" in r.detail


def test_port_held_by_our_running_service_passes() -> None:
    view = {"state": {"services": {"prefill-0": {"listens": [8081, 8998]}, "gone": {"listens": [9000]}}},
            "services": {"prefill-0": {"alive": True}, "gone": {"alive": False}}}
    ours = rules.ours_listening(view)
    assert ours == {8081, 8998}
    r = rules.check_ports(needs(), {"8081": {"pid": 1}, "8998": {"pid": 1}}, ours)
    assert r.status == "pass" and "2 held by this deployment" in r.detail


def test_port_recorded_but_dead_service_does_not_count_as_ours() -> None:
    view = {"state": {"services": {"prefill-0": {"listens": [8081]}}}, "services": {"prefill-0": {"alive": False}}}
    assert rules.check_ports(needs(), {"8081": {"pid": None}}, rules.ours_listening(view)).status == "fail"


# -- clock, DRAM, access, OS --------------------------------------------------------------------------

@pytest.mark.parametrize(("skew", "unc", "status"), [(0.2, 0.01, "pass"), (1.5, 0.01, "warn"), (-1.5, 0.01, "warn"),
                                                     (6, 0.01, "fail"), (5.5, 1.0, "warn"), (1.05, 0.1, "pass")])
def test_clock_thresholds(skew: float, unc: float, status: str) -> None:
    assert rules.check_clock("h1", skew, unc).status == status


def test_dram_for_the_host_tier() -> None:
    n = needs(tier_dram_gb=8)
    assert rules.check_dram(n, {"available": int(4 * GB), "total": int(16 * GB)}, False).status == "fail"
    assert rules.check_dram(n, {"available": int(4 * GB), "total": int(16 * GB)}, True).status == "warn"
    assert rules.check_dram(n, {"available": int(9 * GB), "total": int(16 * GB)}, False).status == "warn"
    assert rules.check_dram(n, {"available": int(12 * GB), "total": int(16 * GB)}, False).status == "pass"
    assert rules.check_dram(needs(), {"available": 0}, False).status == "n/a"


def test_access_and_os() -> None:
    assert rules.check_access(needs(supervisor="systemd"), "ops", 1000, False).status == "fail"
    assert rules.check_access(needs(supervisor="systemd"), "ops", 1000, True).status == "warn"
    assert rules.check_access(needs(supervisor="process"), "ops", 1000, None).status == "pass"
    assert rules.check_os(needs(), "Debian", "6.1", "3.7.3").status == "fail"
    assert rules.check_os(needs(), "Debian", "6.1", "3.11.2").status == "pass"


# -- runtime drift ------------------------------------------------------------------------------------

def test_runtime_matches_pins(tmp_path: Path) -> None:
    plan, _ = plan_from(tmp_path)
    pkgs = {"ai-dynamo": "1.6.1", "ai-dynamo-runtime": "1.6.1", "nixl-cu12": "1.4.1",
            "mooncake-transfer-engine-non-cuda": "0.3.13.post1"}
    r = rules.check_runtime(needs(), plan, {"exists": True, "report": {"python": "3.11.7", "packages": pkgs}})
    assert r.status == "pass" and "4 pins match" in r.detail
    pkgs["nixl-cu12"] = "1.4.0"
    r = rules.check_runtime(needs(), plan, {"exists": True, "report": {"python": "3.11.7", "packages": pkgs}})
    assert r.status == "fail" and "nixl pinned 1.4.1, installed 1.4.0" in r.detail


def test_only_primectls_own_venv_without_a_stamp_is_an_install_that_did_not_finish() -> None:
    own = needs(provisioned=True, expected_stamp="abc")
    assert rules.install_unfinished(own, {"exists": True, "stamp": None})  # the install failed before its end
    assert rules.install_unfinished(own, {"exists": True, "stamp": []})  # an empty stamp file
    assert not rules.install_unfinished(own, {"exists": True, "stamp": ["abc"]})
    assert not rules.install_unfinished(own, {"exists": True, "stamp": ["older-lock"]})  # complete: it runs
    assert not rules.install_unfinished(own, {"exists": False, "stamp": None})  # no venv: "no runtime yet"
    assert not rules.install_unfinished(needs(provisioned=False), {"exists": True, "stamp": None})  # software.python


def test_runtime_missing_warns_when_up_provisions_and_fails_for_software_python(tmp_path: Path) -> None:
    plan, _ = plan_from(tmp_path)
    r = rules.check_runtime(needs(provisioned=True), plan, {"exists": False})
    assert r.status == "warn" and "primectl provision" in r.remediation
    assert rules.check_runtime(needs(provisioned=False), plan, {"exists": False}).status == "fail"
    assert rules.check_runtime(needs(), plan, {"exists": True, "code": 1, "output": "boom"}).status == "fail"
    assert rules.check_runtime(needs(), plan, {"exists": True, "code": 0}).status == "warn"


def test_stale_provisioned_venv_warns_because_up_reinstalls(tmp_path: Path) -> None:
    plan, _ = plan_from(tmp_path)
    facts = {"exists": True, "stamp": ["old"], "report": {"packages": {}}}
    assert rules.check_runtime(needs(provisioned=True, expected_stamp="new"), plan, facts).status == "warn"
    facts["stamp"] = ["new"]
    assert rules.check_runtime(needs(provisioned=True, expected_stamp="new"), plan, facts).status == "fail"


# -- GPU ------------------------------------------------------------------------------------------------

def gpu_needs(**kw: Any) -> HostNeeds:
    return needs(**({"gpus": 4, "gpu_name": "NVIDIA GB200", "sm": 100, "multi_host": True, "nvlink_expected": True} | kw))


def gpu_row(i: int, **kw: str) -> dict[str, str]:
    return {"index": str(i), "name": "NVIDIA GB200", "pci.bus_id": f"00000000:0{i}:00.0", "driver_version": "580.65",
            "memory.total": "189471", "ecc.errors.uncorrected.volatile.total": "0", "retired_pages.pending": "No",
            "ecc.mode.current": "Enabled"} | kw


NVLINK_OK = "GPU 0: NVIDIA GB200 (UUID: x)\n\t Link 0: 50 GB/s\n\t Link 1: 50 GB/s\nGPU 1: NVIDIA GB200 (UUID: y)\n\t Link 0: 50 GB/s\n"


def gpu_facts(**kw: Any) -> dict[str, Any]:
    return {"nvidia_smi": "/usr/bin/nvidia-smi", "query_code": 0, "gpus": [gpu_row(i) for i in range(4)],
            "cuda_version": "13.0", "nvlink_code": 0, "nvlink": NVLINK_OK,
            "ib": [{"device": "mlx5_0", "port": "1", "state": "4: ACTIVE", "rate": "400 Gb/sec (4X NDR)"}],
            "peermem": True, "numa_nodes": [0, 1], "gpu_numa": {"0": 0, "1": 0, "2": 1, "3": 1},
            "xid": {"readable": True, "count": 0, "last": []}} | kw


def by_check(results: list[Result]) -> dict[str, Result]:
    return {r.check: r for r in results}


def test_no_nvidia_smi_fails_with_install_hint() -> None:
    res = by_check(rules.gpu_checks(gpu_needs(), {"nvidia_smi": None}))
    assert res["gpu"].status == "fail"
    assert res["gpu"].detail.startswith("no NVIDIA driver: nvidia-smi not found; install the driver")
    assert {r.status for c, r in res.items() if c != "gpu"} == {"n/a"}


def test_healthy_gpu_host_passes_everything() -> None:
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts()))
    assert {c: r.status for c, r in res.items()} == {c: "pass" for c in res}, res
    assert "node 0: GPU0, GPU1; node 1: GPU2, GPU3" in res["numa"].detail


def test_gpu_faults() -> None:
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(gpus=[gpu_row(i) for i in range(3)])))
    assert res["gpu"].status == "fail"
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(gpus=[gpu_row(i, name="NVIDIA H100") for i in range(4)])))
    assert res["gpu"].status == "fail" and "different GPU model" in res["gpu"].remediation
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(cuda_version="12.4")))
    assert res["driver"].status == "fail"
    rows = [gpu_row(0, **{"ecc.errors.uncorrected.volatile.total": "3"})] + [gpu_row(i) for i in range(1, 4)]
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(gpus=rows)))
    assert res["ecc_xid"].status == "fail" and "GPU0: 3 uncorrected ECC" in res["ecc_xid"].detail
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(xid={"readable": True, "count": 2, "last": ["NVRM: Xid 79"]})))
    assert res["ecc_xid"].status == "warn"
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(nvlink=NVLINK_OK + "\t Link 1: <inactive>\n")))
    assert res["nvlink"].status == "fail" and "GPU 1 link 1" in res["nvlink"].detail
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(ib=[])))
    assert res["ib"].status == "fail"
    res = by_check(rules.gpu_checks(gpu_needs(multi_host=False), gpu_facts(ib=[], peermem=False)))
    assert res["ib"].status == "warn" and res["peermem"].status == "warn"
    res = by_check(rules.gpu_checks(gpu_needs(), gpu_facts(peermem=False)))
    assert res["peermem"].status == "fail" and "modprobe nvidia_peermem" in res["peermem"].remediation


def test_parse_nvlink() -> None:
    links = rules.parse_nvlink(NVLINK_OK)
    assert links == {"GPU 0": [(0, "50 GB/s"), (1, "50 GB/s")], "GPU 1": [(0, "50 GB/s")]}


# -- cluster-wide ----------------------------------------------------------------------------------------

def test_selftest_outlier_more_than_five_percent_slower_than_the_median() -> None:
    times = {("h1", "0"): 1.00, ("h1", "1"): 1.02, ("h2", "0"): 0.99, ("h2", "1"): 1.08, ("h3", "0"): 1.01}
    slow = rules.selftest_outliers(times)
    assert list(slow) == [("h2", "1")] and slow[("h2", "1")] == pytest.approx(1.08 / 1.01 - 1, rel=1e-6)
    runs = {h: [{"gpu": int(g), "status": "pass", "seconds": v} for (hh, g), v in times.items() if hh == h]
            for h in ("h1", "h2", "h3")}
    res = {r.host: r for r in rules.selftest_results(runs)}
    assert res["h2"].status == "warn" and "GPU1 +7%" in res["h2"].detail
    assert res["h1"].status == res["h3"].status == "pass"


def test_selftest_failures() -> None:
    res = rules.selftest_results({"h1": [{"gpu": 0, "status": "no_gpu", "exit_code": 3, "message": "no GPU present"}],
                                  "h2": [{"gpu": 0, "status": "fail", "exit_code": 1, "message": "failed: decode fp8"}]})
    assert [r.status for r in res] == ["fail", "fail"]
    assert "torch" in res[0].remediation and "decode fp8" in res[1].detail


def test_nixl_results_per_host() -> None:
    ts = [Transfer("h2", "h3", "DRAM", True, 10.0), Transfer("h2", "h4", "DRAM", True, 3.0),
          Transfer("h2", "h5", "DRAM", False, error="NIXL_ERR_BACKEND"), Transfer("h2", "h6", "DRAM", True, 9.0)]
    res = {r.host: r for r in rules.nixl_results(["h1", "h2", "h3", "h4", "h5", "h6"], ts, {})}
    assert res["h1"].status == "n/a"
    assert res["h3"].status == "pass" and "h2->h3 DRAM 10.00 GB/s" in res["h3"].detail
    assert res["h4"].status == "warn"  # under half the median
    assert res["h5"].status == "fail"
    assert res["h2"].status == "fail"  # the prefill host lists its pairs when it reads none


def test_pairs_and_rounds(tmp_path: Path) -> None:
    plan, _ = plan_from(tmp_path)
    assert nixl_pairs(plan) == [("local", "local")]
    pairs = [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")]
    rs = rounds(pairs)
    assert sorted(p for r in rs for p in r) == sorted(pairs)
    for r in rs:
        hosts = [h for p in r for h in p]
        assert len(hosts) == len(set(hosts))


def test_host_needs_from_the_demo_recipe(tmp_path: Path) -> None:
    plan, _ = plan_from(tmp_path)
    n = host_needs(plan)["local"]
    assert n.provisioned and n.expected_stamp and n.runtime_python.endswith(f"runtime/{plan.runtime_key}/bin/python")
    assert n.tier_dram_gb == 1 and n.generated_model and n.gpus == 0
    assert set(n.ports) == {p for s in plan.services for p in s.listens}


def test_refusal_message_words_unreachable_hosts_like_up() -> None:
    rep = Report("d", [Result("h3", "ssh", "fail", "h3 (127.0.0.4:22): cannot connect: refused", "check"),
                       Result("h2", "ports", "fail", "port 1 on h2 (127.0.0.3) is already in use; x needs it", "stop it"),
                       Result("h1", "clock", "warn", "skew", "sync")])
    assert not rep.ok and rep.counts() == {"pass": 0, "warn": 1, "fail": 2, "n/a": 0}
    msg = rep.refusal()
    assert msg.startswith("connecting failed on 1 host(s); nothing was changed")
    assert "h2 ports: port 1 on h2 (127.0.0.3) is already in use; x needs it -> stop it" in msg
    assert Report("d", [Result("h1", "clock", "warn", "skew", "sync")]).ok

"""Preflight verdicts: pure functions from host facts to pass / warn / fail / n/a.

Nothing here performs I/O. `preflight.py` gathers the facts (preflight_host.py
on each host, the self-test, timings) and `preflight_fabric.py` the transfer
results, and both hand them to these functions, so every threshold is tested
on constructed facts (tests/test_preflight_rules.py).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# The rules that need only the host's own facts live in host_rules.py (the health loop ships it); re-exported here.
from primectl.checks.host_rules import GB as GB
from primectl.checks.host_rules import GPU_CHECKS as GPU_CHECKS
from primectl.checks.host_rules import MIN_FREE_BYTES as MIN_FREE_BYTES
from primectl.checks.host_rules import HostNeeds as HostNeeds
from primectl.checks.host_rules import Result as Result
from primectl.checks.host_rules import Status as Status
from primectl.checks.host_rules import check_disk as check_disk
from primectl.checks.host_rules import fail as fail
from primectl.checks.host_rules import gb as gb
from primectl.checks.host_rules import gpu_checks as gpu_checks
from primectl.checks.host_rules import na as na
from primectl.checks.host_rules import ok as ok
from primectl.checks.host_rules import parse_nvlink as parse_nvlink
from primectl.checks.host_rules import warn as warn
from primectl.deploy.provision import drift
from primectl.plan.model import Plan

RUNTIME_VENV_BYTES = 1.5 * GB  # a provisioned CPU runtime is 1.1 GB (docs/runtime-notes.md)
MIN_PYTHON3 = (3, 8)  # the host agent and preflight_host.py
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 5.0
WEIGHTS_TOLERANCE = 0.10
DRAM_HEADROOM = 1.2
SELFTEST_OUTLIER = 0.05  # slower than the median by more than this fraction
NIXL_SLOW_FRACTION = 0.5  # a pair below half the median bandwidth of all pairs

PROVISION_HINT = "run `primectl provision` (or `primectl up`, which provisions first)"



# -- host basics ---------------------------------------------------------------------------------

def check_access(n: HostNeeds, user: str, uid: int, sudo: bool | None) -> Result:
    """Root for systemd (units go to /etc/systemd/system); any user for the process supervisor."""
    if uid == 0:
        return ok(n.name, "access", f"ssh ok as {user} (root)")
    if n.supervisor != "systemd":
        return ok(n.name, "access", f"ssh ok as {user} (supervisor process: root not needed)")
    if sudo:
        return warn(n.name, "access", f"ssh ok as {user}; passwordless sudo works but the agent runs systemctl directly",
                    "connect as root (hosts[].user: root) for supervisor systemd")
    return fail(n.name, "access", f"ssh ok as {user}, not root and no passwordless sudo",
                "supervisor systemd installs units in /etc/systemd/system: connect as root (hosts[].user: root)")


def check_os(n: HostNeeds, os_name: str, kernel: str, python3: str) -> Result:
    ver = tuple(int(x) for x in re.findall(r"\d+", python3)[:2])
    detail = f"{os_name}, kernel {kernel}, python3 {python3}"
    if ver < MIN_PYTHON3:
        return fail(n.name, "os", detail, f"install python3 >= {'.'.join(map(str, MIN_PYTHON3))} (the host agent needs it)")
    return ok(n.name, "os", detail)


def workdir_need(n: HostNeeds, runtime_present: bool) -> float:
    """Bytes that must be free at the workdir: the base figure, plus a runtime venv if up must install one."""
    return MIN_FREE_BYTES + (RUNTIME_VENV_BYTES if n.provisioned and not runtime_present else 0)



def check_model(n: HostNeeds, facts: Mapping[str, Any]) -> Result:
    if not n.worker:
        return na(n.name, "model", "no worker on this host")
    if n.generated_model:
        return na(n.name, "model", "generated demo model (shipped in the bundle)")
    if not n.model_path:
        return fail(n.name, "model", "model.path is empty", "set model.path to the weights directory on every worker host")
    if not facts.get("exists"):
        return fail(n.name, "model", f"{n.model_path} does not exist", f"copy the weights to {n.model_path} on {n.name}")
    if not facts.get("is_dir"):
        return fail(n.name, "model", f"{n.model_path} is not a directory", "model.path must be the weights directory")
    size = float(facts.get("bytes", 0))
    detail = f"{gb(size)} in {facts.get('files', 0)} files at {n.model_path}"
    if n.weights_gb is None:
        return warn(n.name, "model", detail + "; size not checked", "set model.weights_gb to check the download is complete")
    want = n.weights_gb * GB
    if abs(size - want) > WEIGHTS_TOLERANCE * want:
        return fail(n.name, "model", f"{detail}, expected {n.weights_gb:g} GB ±{WEIGHTS_TOLERANCE:.0%}",
                    "the copy is incomplete or a different checkpoint: re-sync the weights (or fix model.weights_gb)")
    return ok(n.name, "model", f"{detail} (expected {n.weights_gb:g} GB)")


def ours_listening(view: Mapping[str, Any] | None) -> set[int]:
    """Ports that this deployment's recorded, still-running services hold on a host (from the agent's inspect)."""
    if not view:
        return set()
    recorded = (view.get("state") or {}).get("services", {})
    live = view.get("services", {})
    return {int(p) for name, s in recorded.items() if live.get(name, {}).get("alive") for p in s.get("listens", [])}


def check_ports(n: HostNeeds, taken: Mapping[str, Any], ours: set[int]) -> Result:
    """Every port the plan binds on the host is free, or held by this deployment's own running service."""
    if not n.ports:
        return na(n.name, "ports", "no service listens here")
    problems, held = [], []
    for port in sorted(n.ports):
        t = taken.get(str(port))
        if t is None:
            continue
        if port in ours:
            held.append(port)
            continue
        who = f" (held by pid {t['pid']}: {t['command']})" if t.get("pid") else ""
        problems.append(f"port {port} on {n.name} ({n.address}) is already in use; {n.ports[port]} needs it{who}")
    if problems:
        return fail(n.name, "ports", "; ".join(problems),
                    "stop what holds the port, or move this deployment's ports (recipe `ports:` / frontend.port)")
    extra = f", {len(held)} held by this deployment's running services" if held else ""
    return ok(n.name, "ports", f"{len(n.ports) - len(held)} port(s) free{extra}")


def check_clock(host: str, skew: float | None, uncertainty: float) -> Result:
    """Host clock against the control node; the bound subtracts half the round trip."""
    if skew is None:
        return warn(host, "clock", "could not read the host clock", "check that `date` works on the host")
    lower = max(abs(skew) - uncertainty, 0.0)
    detail = f"skew {skew:+.3f} s (±{uncertainty:.3f} s)"
    fix = "enable time sync on every host (chrony/systemd-timesyncd) against one source"
    if lower > CLOCK_FAIL_S:
        return fail(host, "clock", detail + f" > {CLOCK_FAIL_S:g} s", fix)
    if lower > CLOCK_WARN_S:
        return warn(host, "clock", detail + f" > {CLOCK_WARN_S:g} s", fix)
    return ok(host, "clock", detail)


def check_dram(n: HostNeeds, mem: Mapping[str, int], deployment_running: bool) -> Result:
    if n.tier_dram_gb is None:
        return na(n.name, "host_dram", "no Mooncake host tier")
    if not n.worker:
        return na(n.name, "host_dram", "no worker on this host lends memory to the tier")
    need, avail = n.tier_dram_gb * GB, float(mem.get("available", 0))
    detail = f"{gb(avail)} available of {gb(float(mem.get('total', 0)))}, tier needs {n.tier_dram_gb:g} GB"
    fix = "free host memory or lower host_tier.dram_gb_per_host"
    if avail < need:
        if deployment_running:
            return warn(n.name, "host_dram", detail + " (this deployment already runs here and holds its share)", fix)
        return fail(n.name, "host_dram", detail, fix)
    if avail < need * DRAM_HEADROOM:
        return warn(n.name, "host_dram", detail + f" (less than {DRAM_HEADROOM:g}x)", fix)
    return ok(n.name, "host_dram", detail)


def runtime_state(facts: Mapping[str, Any]) -> Literal["missing", "broken", "unknown", "ok"]:
    """missing: no interpreter; broken: it failed; unknown: it ran but printed no report; ok."""
    if not facts.get("exists"):
        return "missing"
    if "report" in facts:
        return "ok"
    return "broken" if facts.get("code", 0) != 0 else "unknown"


def install_unfinished(n: HostNeeds, facts: Mapping[str, Any]) -> bool:
    """Whether this host's runtime is primectl's own venv whose install never finished (it failed or was cut
    short: no stamp). Nothing runs with it: the next `up` installs it before it starts anything."""
    return n.provisioned and bool(n.expected_stamp) and bool(facts.get("exists")) and not facts.get("stamp")


UNFINISHED = "its runtime's install did not finish (no stamp): `up` installs it first"


def freeze_text(packages: Mapping[str, str]) -> str:
    """`pip freeze` lines from a name -> version map (what provision.drift reads)."""
    return "".join(f"{k}=={v}\n" for k, v in sorted(packages.items()))


def check_runtime(n: HostNeeds, plan: Plan, facts: Mapping[str, Any]) -> Result:
    """Installed runtime versions against the recipe's pins (provision.drift)."""
    state = runtime_state(facts)
    if state == "missing":
        if n.provisioned:
            return warn(n.name, "runtime", f"no runtime at {n.runtime_dir} yet", PROVISION_HINT)
        return fail(n.name, "runtime", f"software.python {n.runtime_python} does not exist on {n.name}",
                    "install the runtime there or fix software.python in the recipe")
    if state == "broken":
        out = str(facts.get("output", "")).strip().splitlines()[-1:] or [""]
        return fail(n.name, "runtime", f"{n.runtime_python} exited {facts.get('code')}: {out[0][:200]}",
                    "repair the runtime (`primectl provision`), or fix software.python")
    if state == "unknown":
        return warn(n.name, "runtime", f"{n.runtime_python} ran but reported no packages; versions not checked",
                    "point software.python at a real Python interpreter")
    report = facts["report"]
    d = drift(plan, freeze_text(report.get("packages", {})))
    if not d:
        return ok(n.name, "runtime", f"python {report.get('python')}, {len(plan.pins)} pins match")
    diffs = ", ".join(f"{k} pinned {pin}, installed {have or 'missing'}" for k, (pin, have) in sorted(d.items()))
    stamp = (facts.get("stamp") or [None])[0]
    if n.provisioned and n.expected_stamp and stamp != n.expected_stamp:
        return warn(n.name, "runtime", f"{diffs} (stale venv: `up` reinstalls it)", PROVISION_HINT)
    fix = ("install the pinned versions into that runtime, or point software.python at one that has them"
           if not n.provisioned else f"remove {n.runtime_dir} and run `primectl provision`")
    return fail(n.name, "runtime", diffs, fix)
# -- cluster-wide figures ------------------------------------------------------------------------

def selftest_outliers(seconds: Mapping[tuple[str, str], float], limit: float = SELFTEST_OUTLIER
                      ) -> dict[tuple[str, str], float]:
    """(host, gpu) -> how much slower than the median of all GPUs, for those beyond `limit`."""
    if len(seconds) < 2:
        return {}
    med = statistics.median(seconds.values())
    if med <= 0:
        return {}
    return {k: v / med - 1 for k, v in seconds.items() if v / med - 1 > limit}


def selftest_results(runs: Mapping[str, list[dict[str, Any]]]) -> list[Result]:
    """Per host: every GPU's self-test passed, and none is an outlier across the cluster."""
    times = {(h, str(r.get("gpu"))): float(r["seconds"]) for h, rs in runs.items() for r in rs
             if r.get("status") == "pass" and isinstance(r.get("seconds"), int | float)}
    slow = selftest_outliers(times)
    med = statistics.median(times.values()) if times else 0.0
    out = []
    for h, rs in sorted(runs.items()):
        bad = [r for r in rs if r.get("status") != "pass"]
        if bad:
            r = bad[0]
            msg = r.get("message") or r.get("status")
            if r.get("exit_code") == 3:
                fix = "the runtime's torch sees no GPU: install a CUDA build of torch in the runtime and check the driver"
            else:
                fix = "bad numerics or a crash on that GPU: rerun `python -m primectl_kernels.selftest`, then drain/replace the GPU"
            out.append(fail(h, "selftest", f"GPU{r.get('gpu')}: {msg}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""),
                            fix))
            continue
        mine = {g: v for (hh, g), v in slow.items() if hh == h}
        detail = f"{len(rs)} GPU(s) pass; median {med:.3f} s across the cluster"
        if mine:
            worst = ", ".join(f"GPU{g} +{v:.0%}" for g, v in sorted(mine.items()))
            out.append(warn(h, "selftest", f"{detail}; slower than the median by more than {SELFTEST_OUTLIER:.0%}: {worst}",
                            "a slow GPU stalls its whole DEP group: check clocks/thermals (nvidia-smi -q -d PERFORMANCE)"))
        else:
            out.append(ok(h, "selftest", detail))
    return out


@dataclass
class Transfer:
    """One NIXL READ measurement between a prefill (target) and a decode (reader) host."""

    src: str
    dst: str
    mem: str
    ok: bool
    gb_s: float = 0.0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def nixl_results(hosts: Iterable[str], transfers: list[Transfer], pending: Mapping[str, Result]) -> list[Result]:
    """One `nixl` row per host: the pairs it reads as decode (or serves as prefill), slow pairs flagged."""
    good = [t.gb_s for t in transfers if t.ok]
    med = statistics.median(good) if good else 0.0
    out = []
    for h in hosts:
        if h in pending:
            out.append(pending[h])
            continue
        mine = [t for t in transfers if t.dst == h] or [t for t in transfers if t.src == h]
        if not mine:
            out.append(na(h, "nixl", "no prefill -> decode pair involves this host"))
            continue
        text = "; ".join(f"{t.src}->{t.dst} {t.mem} " + (f"{t.gb_s:.2f} GB/s" if t.ok else f"FAILED: {t.error}")
                         for t in mine)
        if any(not t.ok for t in mine):
            out.append(fail(h, "nixl", text, "check UCX/RDMA between the hosts (ucx_info -d, ibstat, firewall), "
                                             "and that the runtime's nixl imports"))
        elif any(t.extra.get("first_error") for t in mine):
            first = next(t.extra["first_error"] for t in mine if t.extra.get("first_error"))
            out.append(warn(h, "nixl", text + f" (passed on the second try; first: {first})",
                            "an intermittent transfer failure: check UCX/RDMA link errors"))
        elif len(good) > 1 and any(t.gb_s < NIXL_SLOW_FRACTION * med for t in mine):
            out.append(warn(h, "nixl", text + f" (cluster median {med:.2f} GB/s)",
                            "a slow pair: check that host's HCA rails and PCIe/NUMA placement"))
        else:
            out.append(ok(h, "nixl", text))
    return out

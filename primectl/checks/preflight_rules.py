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
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from primectl.deploy.provision import drift
from primectl.plan.model import Plan

Status = Literal["pass", "warn", "fail", "n/a"]
GB = 1e9

MIN_FREE_BYTES = 2 * GB  # releases, logs, the model bundle and room to roll back
RUNTIME_VENV_BYTES = 1.5 * GB  # a provisioned CPU runtime is 1.1 GB (docs/runtime-notes.md)
MIN_PYTHON3 = (3, 8)  # the host agent and preflight_host.py
CLOCK_WARN_S = 1.0
CLOCK_FAIL_S = 5.0
WEIGHTS_TOLERANCE = 0.10
DRAM_HEADROOM = 1.2
SELFTEST_OUTLIER = 0.05  # slower than the median by more than this fraction
NIXL_SLOW_FRACTION = 0.5  # a pair below half the median bandwidth of all pairs
# Minimum CUDA (as the driver reports it) by compute capability x10.
MIN_CUDA = {100: (12, 8), 90: (12, 0)}

PROVISION_HINT = "run `primectl provision` (or `primectl up`, which provisions first)"


@dataclass(frozen=True)
class Result:
    """One check on one host."""

    host: str
    check: str
    status: Status
    detail: str
    remediation: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def ok(host: str, check: str, detail: str) -> Result:
    return Result(host, check, "pass", detail)


def warn(host: str, check: str, detail: str, fix: str = "") -> Result:
    return Result(host, check, "warn", detail, fix)


def fail(host: str, check: str, detail: str, fix: str) -> Result:
    return Result(host, check, "fail", detail, fix)


def na(host: str, check: str, detail: str, fix: str = "") -> Result:
    return Result(host, check, "n/a", detail, fix)


def gb(n: float) -> str:
    return f"{n / GB:.2f} GB"


@dataclass(frozen=True)
class HostNeeds:
    """What the plan asks of one host (derived from Plan + recipe, no I/O)."""

    name: str
    address: str
    workdir: str
    roles: frozenset[str]
    ports: Mapping[int, str]  # port -> service that binds it
    runtime_python: str
    runtime_dir: str
    provisioned: bool  # the runtime is primectl's venv (False: the recipe's software.python)
    expected_stamp: str | None  # sha256 of the lock file a provisioned venv must carry
    model_path: str = ""
    weights_gb: float | None = None
    generated_model: bool = False
    gpus: int = 0
    gpu_name: str = ""
    sm: int = 0
    tier_dram_gb: float | None = None
    supervisor: str = "process"
    multi_host: bool = False
    nvlink_expected: bool = False

    @property
    def worker(self) -> bool:
        return bool(self.roles & {"prefill", "decode"})


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


def check_disk(host: str, check: str, path: str, facts: Mapping[str, Any] | None, need: float) -> Result:
    if not facts:
        return na(host, check, "no path to check")
    if "error" in facts:
        return fail(host, check, f"{path}: cannot stat {facts.get('at')}: {facts['error']}", "check the path and permissions")
    free = float(facts["free"])
    where = path if facts.get("at") == path else f"{path} (on {facts.get('at')})"
    detail = f"{gb(free)} free at {where}, need {gb(need)}"
    if free < need:
        return fail(host, check, detail, f"free at least {gb(need - free)} on that filesystem or move the workdir")
    if free < 2 * need:
        return warn(host, check, detail + " (less than twice that)", "free some space before the next release")
    return ok(host, check, detail)


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


# -- GPU hosts -----------------------------------------------------------------------------------

GPU_CHECKS = ("gpu", "driver", "ecc_xid", "nvlink", "ib", "peermem", "numa", "selftest")
NO_DRIVER = ("no NVIDIA driver: nvidia-smi not found; install the driver (NVIDIA datacenter driver "
             "with nvidia-utils) or put nvidia-smi on PATH")


def gpu_checks(n: HostNeeds, g: Mapping[str, Any] | None) -> list[Result]:
    """GPU count and model, driver/CUDA, ECC and XID, NVLink, IB/RoCE, peermem, NUMA (selftest apart)."""
    h = n.name
    if n.gpus == 0:
        return [na(h, c, "no GPUs on this host") for c in GPU_CHECKS if c != "selftest"]
    if not g or not g.get("nvidia_smi"):
        return [fail(h, "gpu", NO_DRIVER, "install the NVIDIA driver on this host; the profile expects "
                     f"{n.gpus} x {n.gpu_name}")] + [na(h, c, "no NVIDIA driver (see gpu)")
                                                     for c in GPU_CHECKS[1:] if c != "selftest"]
    if g.get("query_code", 0) != 0:
        return [fail(h, "gpu", f"nvidia-smi failed: {g.get('query_error') or 'exit ' + str(g.get('query_code'))}",
                     "check the driver (dmesg, `nvidia-smi`); reboot or reinstall it")] + [
            na(h, c, "nvidia-smi failed (see gpu)") for c in GPU_CHECKS[1:] if c != "selftest"]
    gpus = list(g.get("gpus", []))
    return [_gpu_count(n, gpus), _driver(n, gpus, g.get("cuda_version")), _ecc_xid(n, gpus, g.get("xid") or {}),
            _nvlink(n, str(g.get("nvlink", "")), int(g.get("nvlink_code", 0))), _ib(n, list(g.get("ib", []))),
            _peermem(n, bool(g.get("peermem")), bool(g.get("ib"))),
            _numa(n, list(g.get("numa_nodes", [])), dict(g.get("gpu_numa", {})))]


def _gpu_count(n: HostNeeds, gpus: list[Mapping[str, str]]) -> Result:
    names = sorted({x.get("name", "?") for x in gpus})
    detail = f"{len(gpus)} GPU(s): {', '.join(names) or '-'}; recipe expects {n.gpus} x {n.gpu_name}"
    wrong = [x for x in gpus if n.gpu_name and n.gpu_name.lower() not in x.get("name", "").lower()]
    if len(gpus) < n.gpus:
        return fail(n.name, "gpu", detail, "a GPU is missing or fell off the bus: check `nvidia-smi -q`, reseat/replace, "
                    "or lower hosts[].gpus")
    if wrong:
        return fail(n.name, "gpu", detail, "this host has a different GPU model than the hardware profile: fix "
                    "hardware.profile or the inventory")
    if len(gpus) > n.gpus:
        return warn(n.name, "gpu", detail + " (extra GPUs stay unused)", "set hosts[].gpus to use them")
    return ok(n.name, "gpu", detail)


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text or ""))


def _driver(n: HostNeeds, gpus: list[Mapping[str, str]], cuda: str | None) -> Result:
    drivers = sorted({x.get("driver_version", "?") for x in gpus})
    detail = f"driver {', '.join(drivers) or '?'}, CUDA {cuda or '?'}"
    need = next((v for sm, v in sorted(MIN_CUDA.items(), reverse=True) if n.sm >= sm), None)
    if need and cuda and _version(cuda) < need:
        return fail(n.name, "driver", detail + f" < CUDA {need[0]}.{need[1]} needed for SM{n.sm}",
                    "upgrade the NVIDIA driver")
    if len(drivers) > 1:
        return warn(n.name, "driver", detail + " (mixed driver versions)", "install one driver version")
    return ok(n.name, "driver", detail)


def _ecc_xid(n: HostNeeds, gpus: list[Mapping[str, str]], xid: Mapping[str, Any]) -> Result:
    def num(v: str | None) -> int:
        return int(v) if v and v.isdigit() else 0

    bad = [f"GPU{x.get('index')}: {num(x.get('ecc.errors.uncorrected.volatile.total'))} uncorrected ECC"
           for x in gpus if num(x.get("ecc.errors.uncorrected.volatile.total"))]
    pending = [f"GPU{x.get('index')}" for x in gpus if x.get("retired_pages.pending", "").lower() == "yes"]
    off = [f"GPU{x.get('index')}" for x in gpus if x.get("ecc.mode.current", "").lower() == "disabled"]
    xids = int(xid.get("count", 0)) if xid.get("readable") else None
    detail = f"uncorrected ECC {len(bad)}, pending retirements {len(pending)}, " + (
        f"{xids} Xid event(s) in the kernel log" if xids is not None else "kernel log not readable (Xid unknown)")
    if bad:
        return fail(n.name, "ecc_xid", detail + ": " + "; ".join(bad),
                    "drain the host and reset the GPU (nvidia-smi -r) or replace it")
    if pending or xids or off:
        extra = f"; last: {xid.get('last', [])[-1]}" if xids else ""
        return warn(n.name, "ecc_xid", detail + (f"; ECC disabled on {', '.join(off)}" if off else "") + extra,
                    "reboot to retire pending pages; look up the Xid codes before launching")
    return ok(n.name, "ecc_xid", detail)


LINK_RE = re.compile(r"^\s*Link\s+(\d+):\s*(.+?)\s*$")


def parse_nvlink(text: str) -> dict[str, list[tuple[int, str]]]:
    """`nvidia-smi nvlink -s` -> GPU header -> [(link, state text)]."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = "?"
    for line in text.splitlines():
        if line.startswith("GPU "):
            current = line.split(":")[0].strip()
            out.setdefault(current, [])
            continue
        m = LINK_RE.match(line)
        if m:
            out.setdefault(current, []).append((int(m.group(1)), m.group(2)))
    return out


def _nvlink(n: HostNeeds, text: str, code: int) -> Result:
    links = parse_nvlink(text) if code == 0 else {}
    total = sum(len(v) for v in links.values())
    if not total:
        if n.nvlink_expected:
            return warn(n.name, "nvlink", "no NVLink links reported by `nvidia-smi nvlink -s`",
                        "check the NVLink/NVSwitch fabric (fabric manager, `nvidia-smi -q | grep -i fabric`)")
        return na(n.name, "nvlink", "no NVLink links on this host")
    down = [f"{gpu} link {i}" for gpu, ls in links.items() for i, s in ls if "inactive" in s.lower() or "down" in s.lower()]
    speeds = sorted({s for ls in links.values() for _, s in ls if "GB/s" in s})
    detail = f"{total - len(down)} of {total} links active ({', '.join(speeds) or 'speed ?'})"
    if down:
        return fail(n.name, "nvlink", detail + "; down: " + ", ".join(down[:6]) + ("..." if len(down) > 6 else ""),
                    "a degraded NVLink stalls the whole TP/EP group: reset the GPUs or service the tray")
    return ok(n.name, "nvlink", detail)


def _ib(n: HostNeeds, ports: list[Mapping[str, str]]) -> Result:
    if not ports:
        detail = "no InfiniBand/RoCE HCA (/sys/class/infiniband is empty)"
        fix = "install the HCA driver (MLNX_OFED / rdma-core) or check the NIC"
        return fail(n.name, "ib", detail, fix) if n.multi_host else warn(n.name, "ib", detail, fix)
    active = [p for p in ports if "ACTIVE" in p.get("state", "").upper()]
    down = [f"{p.get('device')}/{p.get('port')} {p.get('state', '?')}" for p in ports if p not in active]
    rates = sorted({p.get("rate", "") for p in active if p.get("rate")})
    detail = f"{len(active)} of {len(ports)} HCA port(s) ACTIVE ({', '.join(rates) or 'rate ?'})"
    if not active:
        return fail(n.name, "ib", detail + "; " + ", ".join(down), "check cables/switch ports and the subnet manager")
    if down:
        return warn(n.name, "ib", detail + "; down: " + ", ".join(down), "check cables/switch ports (fewer rails = less bandwidth)")
    return ok(n.name, "ib", detail)


def _peermem(n: HostNeeds, loaded: bool, have_hca: bool) -> Result:
    if loaded:
        return ok(n.name, "peermem", "nvidia_peermem loaded (GPUDirect RDMA)")
    detail = "nvidia_peermem not loaded: NIXL/Mooncake cannot RDMA GPU memory directly"
    if have_hca:
        return fail(n.name, "peermem", detail, "modprobe nvidia_peermem (and add it to /etc/modules-load.d)")
    return warn(n.name, "peermem", detail, "load nvidia_peermem once the HCA is present")


def _numa(n: HostNeeds, nodes: list[int], gpu_numa: Mapping[str, int | None]) -> Result:
    by_node: dict[str, list[str]] = {}
    for gpu, node in sorted(gpu_numa.items()):
        by_node.setdefault(str(node), []).append(f"GPU{gpu}")
    layout = "; ".join(f"node {k}: {', '.join(v)}" for k, v in sorted(by_node.items()))
    detail = f"{len(nodes)} NUMA node(s)" + (f"; {layout}" if layout else "")
    unknown = [g for g, node in gpu_numa.items() if node is None or node < 0]
    if len(nodes) > 1 and unknown:
        return warn(n.name, "numa", detail + f"; no NUMA node for GPU {', '.join(unknown)}",
                    "enable NUMA reporting in firmware (ACPI SRAT) so workers can be pinned")
    return ok(n.name, "numa", detail)


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

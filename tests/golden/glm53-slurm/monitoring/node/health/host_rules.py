"""Host verdicts that need nothing but the host's own facts: pure functions, stdlib only.

`preflight` judges its gathered facts with them (through preflight_rules.py, which adds the rules that need the
plan), and the health loop (primectl/checks/health_loop.py) ships this file beside itself and runs the same
rules on every host on a timer, so a disk, GPU or fabric fault between launches reads as it would in preflight.
Nothing here performs I/O or imports outside the standard library (tests/test_health_loop.py runs it without
primectl installed).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

Status = Literal["pass", "warn", "fail", "n/a"]
GB = 1e9

MIN_FREE_BYTES = 2 * GB  # releases, logs, the model bundle and room to roll back
MIN_AVAILABLE_BYTES = 1 * GB  # host memory a running host keeps available (below it the OOM killer is near)
# Minimum CUDA (as the driver reports it) by compute capability x10.
MIN_CUDA = {100: (12, 8), 90: (12, 0)}

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


def check_memory(host: str, mem: Mapping[str, int], need: float) -> Result:
    """Available host memory (MemAvailable) against a floor; n/a where /proc/meminfo gave nothing."""
    total, avail = float(mem.get("total", 0)), float(mem.get("available", 0))
    if not total:
        return na(host, "memory", "no /proc/meminfo")
    detail = f"{gb(avail)} available of {gb(total)}, need {gb(need)}"
    fix = "find what holds host memory (ps aux --sort=-rss) before the OOM killer picks a worker"
    if avail < need:
        return fail(host, "memory", detail, fix)
    if avail < 2 * need:
        return warn(host, "memory", detail + " (less than twice that)", fix)
    return ok(host, "memory", detail)


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

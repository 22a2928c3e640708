#!/usr/bin/env python3
"""A host's health checks on a timer, written as node_exporter textfile metrics (stdlib only; shipped to hosts).

Every `--interval` seconds it gathers the host facts `preflight` gathers (primectl/checks/preflight_host.py: disk
free at the workdir, memory, and on a GPU host nvidia-smi's GPUs, ECC and Xid, NVLink, InfiniBand ports and
peermem), judges them with preflight's own rules (primectl/checks/host_rules.py), and replaces
`<textfile-dir>/primectl_health.prom` atomically. Both modules ship beside this file in the bundle's probes/, so a
host needs only a Python 3.

Metrics (names are a contract: the alert rules read them):
- `primectl_health_check_ok{check, check_host}`: 1 when the check passes or warns, 0 when it fails or raised.
- `primectl_health_check_warn{check, check_host}`: 1 when it passed with a warning, else 0.
- `primectl_health_check_error{check, check_host, error}`: 1, only for a check that raised instead of deciding
  (its `ok` is 0); `error` is the exception, escaped and cut to 200 characters.
- `primectl_health_check_timestamp_seconds`: when this tick ran (Unix time); `time() - it` is the time since the
  last run, which a rule compares with `primectl_health_check_interval_seconds` (the configured interval).
- `primectl_health_check_duration_seconds`: how long this tick's checks took.
- `primectl_gate_ready`: 1 while the deployment's readiness gate answers 200, 0 otherwise (only with `--gate`, or
  with `--gate-file` while a file it matches names the gate: a Slurm job publishes its bound gate that way).

`check` is one of disk, memory, and on a host the plan gives GPUs (`--gpus`): gpu, driver, ecc_xid, nvlink, ib,
peermem, numa. A check that does not apply here (n/a: no NVLink on this host) is not written, so it cannot alert.
Each check's detail is written as a comment line above the samples, for a person reading the file.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primectl.checks import host_rules, preflight_host
else:
    try:  # shipped: the two modules lie beside this file (probes/), where a script's own directory is on sys.path
        import host_rules
        import preflight_host
    except ImportError:  # imported from the primectl package
        from primectl.checks import host_rules, preflight_host

TEXTFILE = "primectl_health.prom"
SEVERITY = {"pass": 0, "warn": 1, "fail": 2}
GPU_CHECKS = tuple(c for c in host_rules.GPU_CHECKS if c != "selftest")  # selftest needs the runtime's torch


@dataclass(frozen=True)
class Verdict:
    """One check's outcome on this tick."""

    check: str
    status: str  # pass, warn, fail (n/a is never written)
    detail: str
    error: str = ""  # the exception, when the check raised instead of deciding


@dataclass(frozen=True)
class Config:
    """What the loop checks and against which thresholds."""

    host: str
    workdir: str
    min_free_bytes: float = host_rules.MIN_FREE_BYTES
    min_available_bytes: float = host_rules.MIN_AVAILABLE_BYTES
    gpus: int = 0
    gpu_name: str = ""
    sm: int = 0
    multi_host: bool = False
    nvlink_expected: bool = False

    def needs(self) -> host_rules.HostNeeds:
        """The HostNeeds the GPU rules read (the plan's view of this host)."""
        return host_rules.HostNeeds(
            name=self.host, address="", workdir=self.workdir, roles=frozenset(), ports={}, runtime_python="",
            runtime_dir="", provisioned=False, expected_stamp=None, gpus=self.gpus, gpu_name=self.gpu_name,
            sm=self.sm, multi_host=self.multi_host, nvlink_expected=self.nvlink_expected)


Check = tuple[tuple[str, ...], Callable[[], list[host_rules.Result]]]


def checks(cfg: Config) -> list[Check]:
    """The checks that apply to this host, each with the check ids it decides (written as failed if it raises)."""
    def disk() -> list[host_rules.Result]:
        facts = preflight_host.disk([cfg.workdir])
        return [host_rules.check_disk(cfg.host, "disk", cfg.workdir, facts.get(cfg.workdir), cfg.min_free_bytes)]

    def memory() -> list[host_rules.Result]:
        return [host_rules.check_memory(cfg.host, preflight_host.meminfo(), cfg.min_available_bytes)]

    def gpu() -> list[host_rules.Result]:
        return host_rules.gpu_checks(cfg.needs(), preflight_host.gpu())

    out: list[Check] = [(("disk",), disk), (("memory",), memory)]
    if cfg.gpus:
        out.append((GPU_CHECKS, gpu))
    return out


def run_checks(todo: list[Check]) -> list[Verdict]:
    """Every check's verdict, one per check id (the worse of two); a check that raises fails each id it decides,
    with the error, and the rest still run."""
    out: dict[str, Verdict] = {}
    for ids, decide in todo:
        try:
            verdicts = [Verdict(r.check, r.status, r.detail) for r in decide() if r.status != "n/a"]
        except Exception as exc:  # a broken check must not stop the others, nor the loop
            verdicts = [Verdict(c, "fail", "the check raised", f"{type(exc).__name__}: {exc}") for c in ids]
        for v in verdicts:
            if v.check not in out or SEVERITY[v.status] > SEVERITY[out[v.check].status]:
                out[v.check] = v
    return list(out.values())


def gate_ready(url: str) -> bool:
    """The readiness gate answers 200 (anything else, or no answer in 3 s, is not ready)."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return bool(resp.status == 200)
    except Exception:  # HTTPError for a 503, URLError, a reset, a malformed answer: all "not ready"
        return False


def label_value(text: str, limit: int = 200) -> str:
    """`text` as a label value in the text exposition format (backslash, quote and newline escaped)."""
    return text[:limit].replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def comment(text: str) -> str:
    """`text` on one comment line (never read as HELP or TYPE)."""
    return "# " + " ".join(text.split())


def _family(name: str, help_text: str, samples: list[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples] if samples else []


def render(verdicts: list[Verdict], host: str, gate: bool | None, now: float, took: float, interval: float) -> str:
    """The textfile's content."""
    h = label_value(host)
    lbl = {v.check: f'check="{label_value(v.check)}",check_host="{h}"' for v in verdicts}
    out = [comment(f"check {v.check}: {v.status}: {v.error or v.detail}") for v in verdicts]
    out += _family("primectl_health_check_ok", "1 when primectl's host check passes or warns, 0 when it fails.",
                   [f"primectl_health_check_ok{{{lbl[v.check]}}} {int(v.status != 'fail')}" for v in verdicts])
    out += _family("primectl_health_check_warn", "1 when primectl's host check passes with a warning.",
                   [f"primectl_health_check_warn{{{lbl[v.check]}}} {int(v.status == 'warn')}" for v in verdicts])
    out += _family("primectl_health_check_error", "1 for a host check that raised instead of deciding (its ok is 0).",
                   [f'primectl_health_check_error{{{lbl[v.check]},error="{label_value(v.error)}"}} 1'
                    for v in verdicts if v.error])
    out += _family("primectl_health_check_timestamp_seconds", "When the host checks last ran (Unix time).",
                   [f"primectl_health_check_timestamp_seconds {now:.3f}"])
    out += _family("primectl_health_check_duration_seconds", "How long the last run of the host checks took.",
                   [f"primectl_health_check_duration_seconds {took:.3f}"])
    out += _family("primectl_health_check_interval_seconds", "How often the host checks run.",
                   [f"primectl_health_check_interval_seconds {interval:g}"])
    if gate is not None:
        out += _family("primectl_gate_ready", "1 while the deployment's readiness gate answers 200.",
                       [f"primectl_gate_ready {int(gate)}"])
    return "\n".join(out) + "\n"


def write(directory: str, text: str) -> None:
    """Replace the textfile atomically (node_exporter never reads half of one)."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{TEXTFILE}.{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, os.path.join(directory, TEXTFILE))


def published_gate(pattern: str) -> str | None:
    """The gate URL in the first file matching `pattern` (a glob), None while none does (no job runs)."""
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path) as f:
                url = f.read().strip()
        except OSError:
            continue  # removed between the glob and the read: the job just ended
        if url:
            return url
    return None


def tick(cfg: Config, gate_url: str | None, interval: float) -> str:
    """One run of every check (and the gate), as the textfile's content."""
    start = time.monotonic()
    now = time.time()
    verdicts = run_checks(checks(cfg))
    gate = gate_ready(gate_url) if gate_url else None
    return render(verdicts, cfg.host, gate, now, time.monotonic() - start, interval)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The loop's command line (components/monitoring.py writes it from the plan)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--textfile-dir", required=True)
    ap.add_argument("--interval", type=float, default=15, help="seconds between runs")
    ap.add_argument("--host", required=True)
    ap.add_argument("--workdir", required=True, help="the disk check's path")
    ap.add_argument("--gate", help="readiness URL: primectl_gate_ready is 1 while it answers 200")
    ap.add_argument("--gate-file", help="a glob: the readiness URL is read from the first file it matches, at "
                                        "every run (no file: no primectl_gate_ready)")
    ap.add_argument("--min-free-gb", type=float, default=host_rules.MIN_FREE_BYTES / host_rules.GB,
                    help="disk fails below this many GB (1e9 bytes) free at the workdir, warns below twice it")
    ap.add_argument("--min-available-gb", type=float, default=host_rules.MIN_AVAILABLE_BYTES / host_rules.GB,
                    help="memory fails below this many GB available, warns below twice it")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs the plan gives this host (0: no GPU checks)")
    ap.add_argument("--gpu-name", default="", help="the GPU model nvidia-smi should report")
    ap.add_argument("--sm", type=int, default=0, help="compute capability x10 (the driver's minimum CUDA)")
    ap.add_argument("--multi-host", action="store_true", help="the deployment spans hosts (no HCA fails)")
    ap.add_argument("--nvlink-expected", action="store_true", help="no NVLink links warns")
    ap.add_argument("--once", action="store_true", help="run once and exit")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    """Run the checks every interval until killed (or once)."""
    args = parse_args(argv)
    cfg = Config(host=args.host, workdir=args.workdir, min_free_bytes=args.min_free_gb * host_rules.GB,
                 min_available_bytes=args.min_available_gb * host_rules.GB, gpus=args.gpus, gpu_name=args.gpu_name,
                 sm=args.sm, multi_host=args.multi_host, nvlink_expected=args.nvlink_expected)
    due = time.monotonic()
    while True:
        try:
            gate = args.gate or (published_gate(args.gate_file) if args.gate_file else None)
            write(args.textfile_dir, tick(cfg, gate, args.interval))
        except Exception as exc:  # a full disk among others: the stale timestamp tells, and the next tick retries
            print(f"health loop: no {args.textfile_dir}/{TEXTFILE} this time: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            if args.once:
                return 1
        if args.once:
            return 0
        due = max(due + args.interval, time.monotonic())  # a slow tick delays the next one, never bunches them
        time.sleep(max(0.0, due - time.monotonic()))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Seconds from a fault to the webhook, on the demo with monitoring (issue #40), worst of N runs per fault.

Brings up its own copy of recipes/demo-monitoring.yaml (workdir and fake InfiniBand sysfs of its own, Alertmanager's
webhook pointed at a receiver in this process), then per run and fault:

- kill-decode: SIGKILL of decode-1; target 20 s to the firing TargetDown notification;
- stop-frontend: SIGKILL of the frontend; target 20 s;
- ib-down: the FAKE InfiniBand port (node_exporter reads a fake sysfs tree: there is no InfiniBand here) goes
  DOWN; target 15 s;
- slow-decode (a gray failure): decode-2 of 3 is restarted as a mocker 10x slower than its peers (its run script's
  --speedup-ratio, then `primectl restart`), under streaming load; target 3 min to WorkerSlowerThanPeers (the
  deployment then runs 3 decode workers, for every fault);
- and for each, from the start of its repair (`primectl up`, which restarts the service and waits for it, or the
  port back ACTIVE) to the resolved notification: target 30 s.

It also counts notifications nobody caused: after the deployment settles, between faults, and over an idle soak
first (`--soak-min 30`), none may arrive.
Prints a table and exits 1 if a target is missed. Run it inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python \\
        .venv/bin/python benchmarks/alert_latency.py --runs 5'
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from primectl.bench.fake_ib import ACTIVE, DOWN, set_state, write_fake_ib  # noqa: E402
from primectl.bench.liveload import LiveLoad  # noqa: E402
from primectl.bench.webhook import Receiver  # noqa: E402
from tests.integration.sshhosts import netns_problem  # noqa: E402

PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python "
            ".venv/bin/python benchmarks/alert_latency.py'")
TARGETS = {"kill-decode": 20.0, "stop-frontend": 20.0, "ib-down": 15.0, "slow-decode": 180.0}
SLOW = "decode-2"  # the worker slow-decode slows (the gray-failure rule compares 3 or more workers of a role)
RESOLVED_TARGET = {"slow-decode": 240.0}  # its rule averages latency over minutes; the others: 30 s
ENDPOINT = "http://127.0.0.1:8000"
# The notification that tells of each fault: (alert, label, value). A killed decode worker's own TargetDown is
# inhibited by its role's WorkersBelowPlan, which is what reaches the receiver.
ALERT = {"kill-decode": ("WorkersBelowPlan", "role", "decode"), "stop-frontend": ("TargetDown", "service", "frontend"),
         "ib-down": ("InfinibandLinkDown", "device", "mlx5_0"),
         "slow-decode": ("WorkerSlowerThanPeers", "worker_type", "decode")}


def cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """primectl, its output kept."""
    return subprocess.run([PRIMECTL, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"COLUMNS": "250", "NO_COLOR": "1"})


def write_recipe(tmp: Path, webhook: str, sysfs: Path, *, slow: bool) -> Path:
    """The demo-monitoring recipe with this run's workdir, receiver and fake sysfs."""
    doc = yaml.safe_load((REPO / "recipes" / "demo-monitoring.yaml").read_text())
    doc["extends"] = str(REPO / "recipes" / "demo.yaml")
    doc["name"] = "alert-latency"
    doc["hosts"][0]["workdir"] = str(tmp / "workdir")
    doc["monitoring"]["alerts"]["webhook"] = webhook
    doc["monitoring"]["sysfs"] = str(sysfs)
    doc["monitoring"]["infiniband"] = True  # the fake port's rules
    if slow:
        doc["decode"] = {**doc.get("decode", {}), "workers": 3}
        doc["ratio"] = "1:3"
    if os.environ.get("PRIMECTL_RUNTIME_PYTHON"):
        doc.setdefault("software", {})["python"] = os.environ["PRIMECTL_RUNTIME_PYTHON"]
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def pid_of(workdir: Path, service: str) -> int:
    """The running service's pid, from the process supervisor's pid file."""
    return int((workdir / "run" / f"{service}.pid").read_text().split()[0])


def settle(recipe: Path, timeout: float = 90) -> None:
    """Until `primectl alerts` says nothing fires (every target scraped up, every rule quiet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cli("alerts", recipe).returncode == 0:
            return
        time.sleep(1)
    raise SystemExit(f"alerts still firing after {timeout:.0f} s:\n{cli('alerts', recipe).stdout}")


def repair_up(recipe: Path) -> Callable[[], None]:
    """The repair of a killed service: `primectl up` starts it again."""
    def run() -> None:
        r = cli("up", recipe, "--skip-preflight")
        if r.returncode != 0:
            raise SystemExit(f"primectl up failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return run


def one(name: str, recipe: Path, workdir: Path, sysfs: Path, rx: Receiver) -> tuple[float | None, float | None]:
    """Inject fault `name`, time its notification, repair, time the resolution."""
    alert, label, value = ALERT[name]
    t0 = time.monotonic()
    load = None
    if name == "ib-down":
        set_state(sysfs, DOWN)
        repair: Callable[[], None] = lambda: set_state(sysfs, ACTIVE)  # noqa: E731
    elif name == "slow-decode":
        load = LiveLoad(ENDPOINT, "demo", clients=4, deadline_s=900).start()
        script = workdir / "current" / "bin" / f"{SLOW}.sh"
        normal = script.read_text()
        script.write_text(normal.replace("--speedup-ratio 10.0", "--speedup-ratio 1.0"))
        restart(recipe, SLOW)
        t0 = time.monotonic()  # the slow worker serves from here

        def repair() -> None:
            script.write_text(normal)
            restart(recipe, SLOW)
    else:
        os.kill(pid_of(workdir, "decode-1" if name == "kill-decode" else "frontend"), signal.SIGKILL)
        repair = repair_up(recipe)
    fired = rx.wait_for(t0, TARGETS[name] * 2, status="firing", alert=alert, labels={label: value})
    t1 = time.monotonic()
    repair()
    resolved = rx.wait_for(t1, 300 if load else 90, status="resolved", alert=alert, labels={label: value})
    if load is not None:
        load.stop()
    return (fired.at - t0 if fired else None), (resolved.at - t1 if resolved else None)


def restart(recipe: Path, service: str) -> None:
    """`primectl restart` of one service (it runs the run script it finds: the edited one, for slow-decode)."""
    r = cli("restart", recipe, service)
    if r.returncode != 0:
        raise SystemExit(f"primectl restart {service} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")


def main() -> int:
    """Run the faults, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--faults", default="kill-decode,stop-frontend,ib-down",
                    help="comma-separated: " + ", ".join(TARGETS) + " (slow-decode takes minutes a run)")
    ap.add_argument("--soak-min", type=float, default=0,
                    help="first leave the deployment idle this many minutes: no notification may arrive")
    args = ap.parse_args()
    problem = netns_problem(RUN_HINT)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    faults = [f for f in args.faults.split(",") if f]
    rx = Receiver().start()
    with tempfile.TemporaryDirectory(prefix="primectl-alert-latency-") as d:
        tmp = Path(d)
        sysfs = tmp / "fake-sysfs"
        write_fake_ib(sysfs)
        recipe = write_recipe(tmp, rx.url, sysfs, slow="slow-decode" in faults)
        workdir = tmp / "workdir"
        try:
            r = cli("up", recipe, timeout=600)
            if r.returncode != 0:
                print(r.stdout[-3000:], r.stderr[-3000:], file=sys.stderr)
                return 1
            settle(recipe)
            quiet_from = time.monotonic()
            soaked = 0
            if args.soak_min:
                time.sleep(args.soak_min * 60)
                soaked = len(rx.since(quiet_from))
                print(f"idle {args.soak_min:g} min: {soaked} notification(s)", flush=True)
                quiet_from = time.monotonic()
            results: dict[str, list[tuple[float | None, float | None]]] = {f: [] for f in faults}
            stray = 0
            for run in range(args.runs):
                for f in faults:
                    stray += len([n for n in rx.since(quiet_from)])
                    results[f].append(one(f, recipe, workdir, sysfs, rx))
                    print(f"run {run + 1} {f}: fired {results[f][-1][0]}, resolved {results[f][-1][1]}", flush=True)
                    settle(recipe)
                    time.sleep(10)  # the resolved group's last flush, then a quiet stretch that must stay quiet
                    quiet_from = time.monotonic()
            stray += len(rx.since(quiet_from)) + soaked
        finally:
            cli("down", recipe, timeout=300)
            rx.stop()
    ok = stray == 0
    print(f"\nalert latency on the demo with monitoring, {args.runs} run(s) per fault (worst of them)")
    print(f"{'fault':<15}{'to firing':>11}{'target':>8}{'to resolved':>13}{'target':>8}  verdict")
    for f, rows in results.items():
        fired = [a for a, _ in rows]
        resolved = [b for _, b in rows]
        worst_f = None if None in fired else max(x for x in fired if x is not None)
        worst_r = None if None in resolved else max(x for x in resolved if x is not None)
        target_r = RESOLVED_TARGET.get(f, 30.0)
        good = worst_f is not None and worst_f <= TARGETS[f] and worst_r is not None and worst_r <= target_r
        ok &= good
        print(f"{f:<15}{_s(worst_f):>11}{TARGETS[f]:>7.0f}s{_s(worst_r):>13}{target_r:>7.0f}s  "
              f"{'ok' if good else 'MISSED'}")
    print(f"notifications nobody caused: {stray}")
    return 0 if ok else 1


def _s(v: float | None) -> str:
    return "never" if v is None else f"{v:.1f}s"


if __name__ == "__main__":
    sys.exit(main())

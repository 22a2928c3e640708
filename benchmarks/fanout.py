"""Fan-out benchmark for `up`: how the apply layer scales from 1 to 18 SSH hosts.

Starts 18 real OpenSSH servers on 127.0.0.2-19 (tests/integration/sshhosts.py; `sshd -r` where it has it) and
times `primectl.pipeline.up` in-process (so CLI start-up and recipe
loading/rendering are NOT counted) for a deployment on 1, 6 and 18 hosts, then a
zero-change `up` on 18 hosts. Services are the FAKE engine runtime
(tests/fakes/fake_python: instantly-ready HTTP servers); etcd (the real
/usr/bin/etcd), the frontend and the prefill worker run on h1, and one decode
worker runs on every host (etcd discovery; file discovery is single-host only).

Targets (issue #24, for 72 simulated hosts on this 2-core machine): the controller's
own CPU <= 5 ms per host for a fresh `up`, T(72)/T(18) <= 2, a zero-change `up` on
18 hosts < 1 s and on 72 hosts <= 1.5 s. The simulated hosts (an sshd plus the agent
per host) share the machine's cores with the controller, so wall times here include
their CPU; the controller's own CPU (getrusage) is the steadier number.

It binds port 22 on loopback addresses, so it refuses to run outside a private
network namespace (PRIMECTL_ALLOW_HOST_NET=1 overrides):

    unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/fanout.py'

Options: --sizes 1,6,18  --repeat 3 (best of)  --profile (per-operation timings of the last up of each size)
--plot PNG (the fresh and zero-change times and the CPU floor per host count, drawn with matplotlib)
--keep-connections S (PRIMECTL_KEEP_CONNECTIONS=S: the connection keeper holds each host's connection and agent
between the `up`s; its CPU counts as the controller's, and what it spends while idle, holding them, is printed).
A zero-change `up` is timed after the fresh ones at every size of 18 hosts or more (and at the biggest).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.sshhosts import (  # noqa: E402
    SSHHosts,
    kill_leftovers,
    netns_problem,
    start_hosts,
    stop_on_sigterm,
)

FAKE_PYTHON = str(REPO / "tests" / "fakes" / "fake_python")
TARGET_RATIO = 2.0  # T(biggest)/T(18)
TARGET_NOOP_S = {18: 1.0, 72: 1.5}
TARGET_CPU_MS_PER_HOST = 5.0


RACK = 18  # GB200 NVL72: 18 compute trays a rack


def recipe(name: str, cluster: SSHHosts, n: int, port_base: int, *, via_heads: bool = False) -> dict[str, Any]:
    """The benchmark's recipe on the first `n` hosts; with `via_heads`, each rack's trays (hosts 2-18 of every 18)
    are reached through its first host, as through a rack's head node."""
    hosts = cluster.hosts[:n]
    entries = []
    for i, h in enumerate(hosts):
        entry = {"name": h.name, "address": h.address, "port": h.port, "user": "root",
                 "identity_file": str(cluster.client_key), "workdir": str(h.workdir(name))}
        if via_heads and i % RACK:
            entry |= {"via": hosts[i - i % RACK].name, "via_identity_file": str(cluster.client_key)}
        entries.append(entry)
    return {
        "name": name,
        "model": {"served_name": "demo", "generate": "demo-tiny", "arch": "demo-tiny", "max_context": 4096},
        "hardware": {"profile": "cpu"},
        "hosts": entries,
        "engine": "mocker",
        "supervisor": "process",
        "frontend": {"host": "h1", "port": port_base},
        "prefill": {"groups": 1, "parallel": "TP1", "hosts": ["h1"], "startup_timeout_s": 30},
        # CPU placement is round-robin by fewest workers: one decode worker on every host.
        "decode": {"workers": n, "parallel": "TP1", "startup_timeout_s": 30},
        "control_plane": {"discovery": "etcd"},
        "software": {"python": FAKE_PYTHON},
        "ports": {"response_stream": port_base + 1, "etcd_client": port_base + 2, "etcd_peer": port_base + 3,
                  "worker_system": port_base + 10, "tcp_rpc": port_base + 20, "bootstrap": port_base + 30,
                  "kv_events": port_base + 40},
        "known_hosts": str(cluster.base / "known_hosts"),
    }


def load(doc: dict[str, Any], path: Path) -> Any:
    """Recipe file -> Plan, as `primectl up` prepares it."""
    import yaml

    from primectl.planner.build import plan_recipe

    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return plan_recipe(path)[1]


IDLE_S = 3.0  # how long the keeper is watched while it only holds its connections


def cpu_busy_s() -> float:
    """Seconds of CPU time this machine has spent busy (all cores, /proc/stat), to compare with wall time."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def keeper_cpu_s() -> float:
    """CPU the connection keeper has used so far (0 when none runs): the controller's too."""
    from primectl.deploy.keeper import keeper_pid

    pid = keeper_pid()
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def controller_s(usage: resource.struct_rusage, keeper: float) -> float:
    """This process's CPU since `usage`, plus the keeper's since `keeper`."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return (now.ru_utime - usage.ru_utime) + (now.ru_stime - usage.ru_stime) + keeper_cpu_s() - keeper


def measured_up(up: Callable[[], Any], profile: StepTimer | None) -> tuple[float, Any, float, float]:
    """One `up`: its wall time, its result, the controller's CPU and the machine's busy CPU (with a `profile`,
    each operation's timings are recorded there)."""
    undo = None
    if profile is not None:
        profile.calls.clear()
        undo = profile.install()
        profile.t0 = time.perf_counter()
    busy0, self0, keep0 = cpu_busy_s(), resource.getrusage(resource.RUSAGE_SELF), keeper_cpu_s()
    try:
        secs, res = timed(up)
    finally:
        if undo:
            undo()
    return secs, res, controller_s(self0, keep0), cpu_busy_s() - busy0


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def quiet(msg: str) -> None:
    pass


class StepTimer:
    """Wraps agent calls and transport operations to see where an `up` spends its time."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float, float]] = []  # (what, host, start, seconds)
        self.t0 = 0.0

    def install(self) -> Callable[[], None]:
        from primectl.deploy.client import HostClient
        from primectl.deploy.cluster import ConnectionPolicy

        orig_call, orig_connect = HostClient.call, ConnectionPolicy.connect
        timer = self

        def call(self: Any, op: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
            s = time.perf_counter()
            try:
                return orig_call(self, op, args, **kw)
            finally:
                timer.calls.append((op, self.name, s - timer.t0, time.perf_counter() - s))

        def connect(self: Any, host: Any, **kw: Any) -> Any:
            s = time.perf_counter()
            try:
                return orig_connect(self, host, **kw)
            finally:
                timer.calls.append(("connect", host.name, s - timer.t0, time.perf_counter() - s))

        HostClient.call, ConnectionPolicy.connect = call, connect  # type: ignore[method-assign]

        def undo() -> None:
            HostClient.call, ConnectionPolicy.connect = orig_call, orig_connect  # type: ignore[method-assign]

        return undo

    def report(self, total: float) -> str:
        lines = [f"  total {total:.3f}s; per operation: calls, sum of call times, first start -> last end"]
        by_op: dict[str, list[tuple[str, float, float]]] = {}
        for op, host, start, secs in self.calls:
            by_op.setdefault(op, []).append((host, start, secs))
        for op, rows in sorted(by_op.items(), key=lambda kv: min(r[1] for r in kv[1])):
            first = min(r[1] for r in rows)
            last = max(r[1] + r[2] for r in rows)
            lines.append(f"  {op:12} x{len(rows):<3} sum {sum(r[2] for r in rows):7.3f}s  "
                         f"median {statistics.median(r[2] for r in rows):.3f}s  window {first:6.3f} -> {last:6.3f}s")
        return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,6,18")
    ap.add_argument("--repeat", type=int, default=3, help="fresh deployments per size; the best time counts")
    ap.add_argument("--profile", action="store_true", help="per-operation timings of the last up of each size")
    ap.add_argument("--via-heads", action="store_true",
                    help="reach each rack's trays (hosts 2-18 of every 18) through its first host (`via:`)")
    ap.add_argument("--keep-connections", type=float, default=0,
                    help="seconds the connection keeper outlives the last up (0: each up connects itself)")
    ap.add_argument("--plot", metavar="PNG",
                    help="draw the fresh and zero-change `up` times and the CPU floor per host count (matplotlib)")
    opts = ap.parse_args()
    problem = netns_problem("unshare --net -- sh -c 'ip link set lo up && .venv/bin/python benchmarks/fanout.py'")
    if problem:
        print(f"fanout: refusing to start sshd: {problem}", file=sys.stderr)
        return 2
    stop_on_sigterm()
    if opts.keep_connections:
        os.environ["PRIMECTL_KEEP_CONNECTIONS"] = str(opts.keep_connections)
    sizes = [int(s) for s in opts.sizes.split(",")]
    biggest = max(sizes)

    from primectl.deploy.access import ssh_options
    from primectl.deploy.cluster import ConnectionPolicy
    from primectl.pipeline import UpOptions, up
    from primectl.targets.ssh import SSHTarget

    with tempfile.TemporaryDirectory(prefix="primectl-fanout-") as tmp:
        base = Path(tmp)
        t_start, cluster = timed(lambda: start_hosts(base / "hosts", biggest))
        cluster.known_hosts(cluster.base / "known_hosts")
        print(f"started {biggest} sshd hosts in {t_start:.2f}s; timing pipeline.up in-process "
              f"(CLI start-up and recipe loading not counted; rendering is part of up); best of {opts.repeat}")
        results: dict[int, float] = {}
        busy_s: dict[int, float] = {}  # the machine's busy CPU during the best fresh up of each size
        hosts_ms: dict[int, float] = {}  # the simulated hosts' CPU per host during it
        cpu_ms: dict[int, float] = {}
        noop: dict[int, list[float]] = {}
        status_s: dict[int, float] = {}
        profile = StepTimer()
        try:
            run = 0
            for n in sizes:
                times: list[float] = []
                for rep in range(opts.repeat):
                    run += 1
                    name = f"fan{n}-r{rep}"
                    plan = load(recipe(name, cluster, n, 10_000 + 100 * run, via_heads=opts.via_heads),
                                base / f"{name}.yaml")
                    # what `up --skip-preflight --no-smoke` does: the apply steps alone
                    options = UpOptions(connection=ConnectionPolicy(known_hosts=ssh_options(plan).known_hosts),
                                        preflight=False, smoke=False)
                    last = n == biggest and rep == opts.repeat - 1
                    profiled = opts.profile and rep == opts.repeat - 1
                    secs, res, controller, busy = measured_up(partial(up, plan, options, quiet),
                                                              profile if profiled else None)
                    assert len(res.started) == len(plan.services), res
                    host_ms = max(0.0, busy - controller) / n * 1000
                    if secs < min(times, default=float("inf")):
                        busy_s[n], hosts_ms[n] = busy, host_ms
                    times.append(secs)
                    cpu_ms[n] = min(cpu_ms.get(n, float("inf")), controller / n * 1000)
                    print(f"  up on {n:2} host(s), {len(plan.services):2} services: {secs:.3f}s; controller CPU "
                          f"{controller:.2f}s ({controller / n * 1000:.1f} ms per host); simulated hosts "
                          f"{host_ms:.0f} ms CPU per host")
                    if profiled:
                        print(profile.report(secs))
                        cores = os.cpu_count() or 1
                        print(f"  machine CPU busy during this up: {busy:.2f}s of {secs * cores:.2f}s ({cores} cores x wall); "
                              f"the controller (primectl) used {controller:.2f}s of it, the simulated hosts the rest")
                    if rep == opts.repeat - 1 and (n >= 18 or last):
                        for i in range(opts.repeat):
                            profiled = opts.profile and i == opts.repeat - 1
                            s, r, cpu, busy = measured_up(partial(up, plan, options, quiet),
                                                          profile if profiled else None)
                            assert not r.started, r
                            noop.setdefault(n, []).append(s)
                            print(f"  zero-change up on {n:2} host(s): {s:.3f}s; controller CPU {cpu:.2f}s")
                            if profiled:
                                print(profile.report(s))
                                print(f"  machine CPU busy during this up: {busy:.2f}s of {s * (os.cpu_count() or 1):.2f}s; "
                                      f"the controller used {cpu:.2f}s of it, the simulated hosts the rest")
                        s, report, cpu, _ = measured_up(partial(SSHTarget().status, plan, options.connection, quiet),
                                                        None)
                        assert report.gate["ok"], report.gate
                        status_s[n] = s
                        print(f"  status on {n:2} host(s): {s:.3f}s; controller CPU {cpu:.2f}s")
                        if opts.keep_connections:  # what holding the connections costs between commands
                            k0 = keeper_cpu_s()
                            time.sleep(IDLE_S)
                            print(f"  keeper idle, holding {n} connections: {(keeper_cpu_s() - k0) / IDLE_S * 1000:.0f} ms "
                                  "of CPU per second")
                    SSHTarget().down(plan, options.connection, quiet, purge=True, break_lock=False)
                results[n] = min(times)
        finally:
            if opts.keep_connections:
                from primectl.deploy.keeper import stop_keeper

                stop_keeper()
            left = kill_leftovers(cluster.base)
            cluster.stop()
            if left:
                print(f"safety net killed {len(left)} leftover process(es)", file=sys.stderr)

    cores = os.cpu_count() or 1
    print()
    print("host count  T(up) best  controller CPU per host  simulated hosts' CPU per host  floor: busy CPU / "
          f"{cores} cores (fresh up, best)")
    for n in sizes:
        print(f"{n:10}  {results[n]:9.3f}s  {cpu_ms[n]:20.1f} ms  {hosts_ms[n]:26.0f} ms  {busy_s[n] / cores:8.3f}s")
    ok = True
    if 1 in results and biggest != 1:
        print(f"T({biggest})/T(1) = {results[biggest] / results[1]:.2f}")
    if 18 in results and biggest > 18:
        ratio = results[biggest] / results[18]
        good = ratio <= TARGET_RATIO
        ok &= good
        print(f"T({biggest})/T(18) = {ratio:.2f}  (target <= {TARGET_RATIO:g}) {'OK' if good else 'MISSED'}")
        # No schedule does the work of an `up` faster than its CPU divided among the cores: that bounds the
        # ratio from below, whatever the controller does, while the simulated hosts share this machine.
        print(f"  on this machine T({biggest}) >= {busy_s[biggest] / cores:.3f}s (its busy CPU / {cores} cores, "
              f"{hosts_ms[biggest]:.0f} ms of it per simulated host), so T({biggest})/T(18) >= "
              f"{busy_s[biggest] / cores / results[18]:.2f} with this T(18)")
    if biggest in cpu_ms:
        good = cpu_ms[biggest] <= TARGET_CPU_MS_PER_HOST
        ok &= good
        print(f"controller CPU per host at {biggest} hosts = {cpu_ms[biggest]:.1f} ms  "
              f"(target <= {TARGET_CPU_MS_PER_HOST:g} ms) {'OK' if good else 'MISSED'}")
    for n, runs in sorted(noop.items()):
        best = min(runs)
        target = TARGET_NOOP_S.get(n)
        verdict = "" if target is None else f"  (target <= {target:g} s) {'OK' if best <= target else 'MISSED'}"
        ok &= target is None or best <= target
        print(f"zero-change up on {n} hosts = {best:.3f}s{verdict}")
    for n, secs in sorted(status_s.items()):
        print(f"status on {n} hosts = {secs:.3f}s (as a zero-change up costs)")
    if opts.plot:
        plot(Path(opts.plot), sizes, results, {n: b / cores for n, b in busy_s.items()},
             {n: min(r) for n, r in noop.items()}, cores, opts.repeat)
        print(f"plot: {opts.plot}")
    return 0 if ok else 1


def plot(path: Path, sizes: list[int], fresh: dict[int, float], floor: dict[int, float], noop: dict[int, float],
         cores: int, repeat: int) -> None:
    """A PNG of the fresh `up` time per host count beside its CPU floor (the machine's busy CPU / cores: no
    schedule finishes that work sooner), and the zero-change `up`s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax.plot(sizes, [fresh[n] for n in sizes], "o-", color="tab:blue", label=f"fresh up (best of {repeat})")
    ax.plot(sizes, [floor[n] for n in sizes], "s--", color="tab:red",
            label=f"floor: the machine's busy CPU / {cores} cores during it")
    quiet_sizes = sorted(noop)
    ax.plot(quiet_sizes, [noop[n] for n in quiet_sizes], "^-", color="tab:green",
            label=f"zero-change up (best of {repeat})")
    if 18 in fresh and max(sizes) > 18:
        ax.axhline(2 * fresh[18], color="grey", linestyle=":",
                   label=f"the goal for T({max(sizes)}): 2 x T(18) = {2 * fresh[18]:.2f}s")
    for n in sizes:
        ax.annotate(f"{fresh[n]:.2f}s", (n, fresh[n]), textcoords="offset points", xytext=(0, 7), ha="center",
                    fontsize=8)
    ax.set_xlabel("simulated hosts (one sshd each, sharing this machine's cores with primectl)")
    ax.set_ylabel("seconds")
    ax.set_xticks(sizes)
    ax.set_ylim(0, max(fresh.values()) * 1.12)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"primectl up on simulated hosts: wall time and its CPU floor ({cores} cores)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

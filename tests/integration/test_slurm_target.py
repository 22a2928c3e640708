"""An operator's day with `target: slurm` on the real Slurm test cluster (slurm-wlm 22.05, three slurmd).

`recipes/demo-slurm.yaml` (demo-multihost.yaml plus `target: slurm`) runs as one
heterogeneous job: the real Dynamo frontend and KV router, mocker workers, a real
Mooncake master and etcd, each a job step on the node its logical host was bound to.
Requests go through the `openai` client. Every failure case must leave no job and no
process behind (the `slurm` fixture fails a test that does). The host runtime is
PRIMECTL_RUNTIME_PYTHON (as for the other demo tests).

Run in a private network namespace:

    unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=/work/main/.runtime/bin/python \\
        exec .venv/bin/pytest tests/integration/test_slurm_target.py -q'
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import cliproc

from .conftest import FAKE_PYTHON, PRIMECTL, REPO, ports_for
from .slurmcluster import SlurmCluster, make_base_dir
from .test_demo_cluster import check_serving, runtime_python

pytestmark = pytest.mark.integration
_index = iter(range(70, 90))


def timing(label: str, seconds: float) -> None:
    """Print a measured time when PRIMECTL_TEST_TIMING is set (run with -s)."""
    if os.environ.get("PRIMECTL_TEST_TIMING"):
        print(f"\n[slurm target] {label}: {seconds:.2f}s")


class SlurmDeployment:
    """One test's demo-slurm deployment: its own job_dir, ports and recipe files, driven through the CLI."""

    def __init__(self, cluster: SlurmCluster, root: Path, index: int):
        self.cluster = cluster
        self.root = root
        self.job_dir = root / "jobs"
        fe_port, ports = ports_for(index)
        self.base: dict[str, Any] = {
            "extends": str(REPO / "recipes" / "demo-slurm.yaml"),
            "software": {"python": runtime_python()},
            "slurm": {"job_dir": str(self.job_dir), "pending_timeout_s": 60},
            "frontend": {"port": fe_port},
            "ports": ports | {"mooncake_rpc": fe_port + 60, "mooncake_metadata": fe_port + 61,
                              "mooncake_metrics": fe_port + 62},
            "prefill": {"startup_timeout_s": 90}, "decode": {"startup_timeout_s": 90},
        }
        self.path = self.write()

    @property
    def deploy_dir(self) -> Path:
        return self.job_dir / "demo-slurm"

    def write(self, changes: dict[str, Any] | None = None, file: str = "recipe.yaml") -> Path:
        """The test recipe (demo-slurm.yaml + this test's paths and ports + `changes`)."""
        from .conftest import deep_merge

        path = self.root / file
        path.write_text(yaml.safe_dump(deep_merge(self.base, changes or {}), sort_keys=False))
        return path

    def env(self) -> dict[str, str]:
        # HF_TOKEN: glm53's secret, for the recipes built on it.
        return os.environ | self.cluster.env | {"COLUMNS": "250", "NO_COLOR": "1", "HF_TOKEN": "hf-test-token"}

    def cli(self, *args: str, recipe: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`primectl CMD RECIPE ARGS...` as the operator runs it (SLURM_CONF set)."""
        argv = [PRIMECTL, args[0], str(recipe or self.path), *args[1:]]
        t0 = time.monotonic()
        r = cliproc.run(argv, timeout=timeout, cwd=REPO, env=self.env())
        timing(f"primectl {' '.join(args)} -> {r.returncode}", time.monotonic() - t0)
        return r

    def popen(self, *args: str, recipe: Path | None = None) -> subprocess.Popen[str]:
        argv = [PRIMECTL, args[0], str(recipe or self.path), *args[1:]]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=self.env())

    def state(self) -> dict[str, Any]:
        f = self.deploy_dir / "state.json"
        return json.loads(f.read_text()) if f.exists() else {}

    def plan(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.cli("plan", "-o", "json").stdout)
        return doc

    def bound_metrics(self) -> dict[str, list[str]]:
        """Worker metrics URLs of the serving job (addresses bound)."""
        hosts = self.state()["hosts"]
        out: dict[str, list[str]] = {"prefill": [], "decode": []}
        for svc in self.plan()["services"]:
            if svc["role"] in out:
                url = svc["metrics_url"]
                for name, h in hosts.items():
                    url = url.replace(f"@node:{name}@", h["address"])
                out[svc["role"]].append(url)
        return out

    def endpoint(self) -> str:
        address = self.state()["hosts"]["h1"]["address"]
        return f"http://{address}:{self.base['frontend']['port']}"


def wait_clean(cluster: SlurmCluster, timeout: float = 30) -> dict[str, list[Any]]:
    """Wait until the cluster has no unfinished job and no step process; what is left at the end."""
    deadline = time.monotonic() + timeout
    while (left := cluster.leftovers()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture
def demo(slurm: SlurmCluster) -> Iterator[SlurmDeployment]:
    """A demo-slurm deployment of its own; afterwards `down` must leave no job and no process."""
    root = make_base_dir("primectl-slurm-target-")
    dep = SlurmDeployment(slurm, root, next(_index))
    try:
        yield dep
    finally:
        down = dep.cli("down", "--break-lock", timeout=120)
        left = wait_clean(slurm)
        shutil.rmtree(root, ignore_errors=True)
        assert down.returncode == 0, f"teardown `down` failed:\n{down.stdout}\n{down.stderr}"
        assert not left, f"left behind after `down`: {left}"


def test_up_runs_the_demo_stack_as_one_job_that_answers_the_openai_client(demo: SlurmDeployment) -> None:
    dry = demo.cli("up", "--dry-run")
    assert dry.returncode == 3, dry.stdout + dry.stderr
    assert "sbatch job.sbatch: 3 component(s), 3 node(s)" in dry.stdout and "+ h3" in dry.stdout, dry.stdout
    assert not demo.cluster.active_jobs() and not (demo.deploy_dir / "releases").exists()
    t0 = time.monotonic()
    up = demo.cli("up")  # with the smoke tests
    timing("up (submit, bind, 3 waves, gate, smoke)", time.monotonic() - t0)
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
    assert "smoke" in up.stdout + up.stderr and "FAILED" not in up.stdout
    state = demo.state()
    job = state["job"]
    # One heterogeneous job: three components, one per logical host, each on its own node.
    records = demo.cluster.jobs(job)
    assert [r["HetJobOffset"] for r in records] == ["0", "1", "2"]
    assert {r["JobState"] for r in records} == {"RUNNING"}
    assert sorted(r["NodeList"] for r in records) == ["n1", "n2", "n3"]
    assert {r["Comment"] for r in records} == {f"primectl:{state['revision']}"}
    assert {h: v["address"] for h, v in state["hosts"].items()} == {
        h: demo.cluster.node(v["node"]).address for h, v in state["hosts"].items()}
    steps = {s["Name"]: s for s in demo.cluster.steps(job)}
    assert set(steps) == {"batch", "etcd", "mooncake-master", "frontend", "prefill-0", "decode-0", "decode-1"}
    assert steps["prefill-0"]["NodeList"] == state["hosts"]["h2"]["node"]
    assert steps["decode-1"]["NodeList"] == state["hosts"]["h3"]["node"]
    # The job serves: chat through the openai client, prefill and decode both count the requests.
    check_serving(demo.endpoint(), demo.bound_metrics())

    status = demo.cli("status", "-o", "json")
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert doc["healthy"] and doc["gate"]["ok"]
    assert {s["service"]: s["host"] for s in doc["services"]}["decode-0"] == state["hosts"]["h3"]["node"]
    assert any(f"job {job} RUNNING" in n for n in doc["notes"])

    logs = demo.cli("logs", "decode-0", "--tail", "500")
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    assert "\x1b[" not in logs.stdout
    # Commands that talk to the deployment reach it where the job bound it, not at the recipe's node slots.
    chat = demo.cli("chat", "Hello", "--max-tokens", "8")
    assert chat.returncode == 0 and f"streamed from {demo.endpoint()}" in chat.stderr + chat.stdout, chat.stderr
    smoke = demo.cli("smoke", "-o", "json")
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    assert json.loads(smoke.stdout)["url"] == demo.endpoint()

    again = demo.cli("up")
    assert again.returncode == 0 and "no changes" in again.stderr, again.stderr
    diff = demo.cli("diff")
    assert diff.returncode == 0 and "no changes" in diff.stdout
    assert demo.state()["job"] == job

    t1 = time.monotonic()
    down = demo.cli("down")
    timing("down (SIGTERM to the steps, job ends)", time.monotonic() - t1)
    assert down.returncode == 0, down.stderr
    assert f"job {job}: COMPLETED" in down.stderr
    assert not wait_clean(demo.cluster)
    timing("down -> no job, no step process", time.monotonic() - t1)
    assert demo.cli("status").returncode == 1


def test_render_writes_the_job_an_operator_can_submit_by_hand(demo: SlurmDeployment, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = demo.cli("render", "-o", str(out))
    assert r.returncode == 0, r.stderr
    script = (out / "job.sbatch").read_text()
    assert script.count("#SBATCH hetjob") == 2
    ok = demo.cluster.run("sbatch", "--test-only", out / "job.sbatch", check=False)
    assert ok.returncode == 0 and "to start at" in ok.stderr, ok.stderr


def test_a_worker_that_exits_fails_up_with_its_log_and_leaves_no_job(demo: SlurmDeployment) -> None:
    # A misconfigured decode worker: its engine-args file does not exist, so dynamo.mocker exits at start.
    recipe = demo.write({"decode": {"extra_args": ["--extra-engine-args", "/nonexistent/engine-args.json"]}})
    t0 = time.monotonic()
    up = demo.cli("up", "--no-smoke", recipe=recipe)
    timing("up with an exiting worker -> failed and cleaned up", time.monotonic() - t0)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "decode-" in up.stderr and "ended with status" in up.stderr, up.stderr
    assert "last lines of decode-" in up.stderr
    assert "cancelling job" in up.stderr
    assert not wait_clean(demo.cluster)
    assert demo.state() == {}


def test_readiness_timeout_cancels_the_job_and_leaves_nothing(demo: SlurmDeployment) -> None:
    # The real mocker reports 503 on /health until told it starts ready: this one never is.
    recipe = demo.write({"decode": {"env": {"DYN_SYSTEM_STARTING_HEALTH_STATUS": "notready"}, "startup_timeout_s": 4}})
    up = demo.cli("up", "--no-smoke", recipe=recipe)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "not ready after 4s" in up.stderr, up.stderr
    assert not wait_clean(demo.cluster)
    assert demo.state() == {}


def test_ctrl_c_during_up_cancels_the_job_and_a_second_up_meanwhile_is_refused(demo: SlurmDeployment) -> None:
    recipe = demo.write({"decode": {"env": {"DYN_SYSTEM_STARTING_HEALTH_STATUS": "notready"}, "startup_timeout_s": 300}})
    proc = demo.popen("up", "--no-smoke", recipe=recipe)
    try:
        deadline = time.monotonic() + 60
        while not any(demo.deploy_dir.glob("jobs/*/pids")):
            assert proc.poll() is None and time.monotonic() < deadline, "up never started services"
            time.sleep(0.1)
        second = demo.cli("up", "--no-smoke")
        assert second.returncode == 1 and "is locked by" in second.stderr, second.stderr
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert "interrupted" in err and "cancelling job" in err, err
    assert not wait_clean(demo.cluster)


def test_a_failed_change_brings_the_previous_job_revision_back(demo: SlurmDeployment) -> None:
    assert demo.cli("up", "--no-smoke").returncode == 0
    before = demo.state()
    bad = demo.write({"decode": {"env": {"DYN_SYSTEM_STARTING_HEALTH_STATUS": "notready"}, "startup_timeout_s": 4}},
                     file="bad.yaml")
    diff = demo.cli("diff", recipe=bad)
    assert diff.returncode == 3 and "decode-0" in diff.stdout and "change" in diff.stdout
    t0 = time.monotonic()
    up = demo.cli("up", "--no-smoke", recipe=bad)
    timing("failed change -> previous revision healthy again", time.monotonic() - t0)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "previous revision is healthy again" in up.stderr, up.stderr
    after = demo.state()
    assert after["revision"] == before["revision"] and after["job"] != before["job"]
    assert {r.get("HetJobId", r["JobId"]) for r in demo.cluster.active_jobs()} == {after["job"]}
    status = demo.cli("status", "-o", "json")
    assert status.returncode == 0 and json.loads(status.stdout)["healthy"], status.stdout
    check_serving(demo.endpoint(), demo.bound_metrics())


def tray_rack(demo: SlurmDeployment, nvlink: str) -> Path:
    """glm53's shape shrunk to the three test nodes: one DEP8 prefill group over two 4-GPU trays, one TP4 decoder.

    The workers are the FAKE engine runtime (tests/fakes/fake_python: health endpoints only); etcd is real.
    """
    fe_port, ports = ports_for(next(_index))
    doc = {
        "extends": str(REPO / "recipes" / "glm53.yaml"), "name": "tray-rack", "target": "slurm",
        "hosts": [{"name": f"t{i}", "address": f"10.0.0.{i}", "labels": {"nvlink_domain": "r1"}} for i in (1, 2, 3)],
        "frontend": {"host": "t3", "port": fe_port}, "ports": ports,
        "prefill": {"groups": 1, "hosts": ["t1", "t2"], "startup_timeout_s": 30},
        "decode": {"workers": 1, "hosts": ["t3"], "startup_timeout_s": 30},
        "ratio": None, "host_tier": None, "software": {"python": FAKE_PYTHON}, "monitoring": {"enabled": False},
        "slurm": {"job_dir": str(demo.job_dir), "nvlink": nvlink, "pending_timeout_s": 60},
    }
    path = demo.root / f"tray-rack-{nvlink}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_dep8_group_is_one_two_node_component_bound_node_by_node_fake_engine(demo: SlurmDeployment) -> None:
    recipe = tray_rack(demo, "switches")
    up = demo.cli("up", "--no-smoke", recipe=recipe)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((demo.job_dir / "tray-rack" / "state.json").read_text())
    job, hosts = state["job"], state["hosts"]
    records = {r["HetJobOffset"]: r for r in demo.cluster.jobs(job)}
    assert sorted(records) == ["0", "1"]
    assert records["0"]["NodeList"] == hosts["t3"]["node"]  # the frontend's tray: component 0, where the batch script runs
    pair = demo.cluster.run("scontrol", "show", "hostnames", records["1"]["NodeList"]).stdout.split()
    assert pair == [hosts["t1"]["node"], hosts["t2"]["node"]]  # the group's trays, in the order the plan placed them
    assert all("gpu:4" in r.get("TresPerNode", "") for r in records.values()), records
    steps = {s["Name"]: s["NodeList"] for s in demo.cluster.steps(job)}
    assert steps["prefill-0-0"] == hosts["t1"]["node"] and steps["prefill-0-1"] == hosts["t2"]["node"]
    # The second tray's share of the group talks to the first tray's address, bound inside the job.
    script = (demo.job_dir / "tray-rack" / "jobs" / job / "release" / "bin" / "prefill-0-1.sh").read_text()
    assert f"--data-parallel-address {hosts['t1']['address']}" in script and "@node:" not in script
    secrets = demo.job_dir / "tray-rack" / "secrets" / "tray-rack.env"
    assert secrets.read_text() == "HF_TOKEN=hf-test-token\n" and secrets.stat().st_mode & 0o777 == 0o600
    assert str(secrets) in script  # the run script sources it
    status = demo.cli("status", "-o", "json", recipe=recipe)
    assert status.returncode == 0 and json.loads(status.stdout)["healthy"], status.stdout
    down = demo.cli("down", recipe=recipe)
    assert down.returncode == 0 and f"job {job}: COMPLETED" in down.stderr, down.stderr
    assert not wait_clean(demo.cluster)


def test_preflight_says_segment_needs_a_newer_slurm_than_this_one(demo: SlurmDeployment) -> None:
    up = demo.cli("up", "--no-smoke", recipe=tray_rack(demo, "segment"))
    assert up.returncode == 1, up.stdout + up.stderr
    assert "unrecognized option '--segment=2'" in up.stderr and "Slurm 24.05+ with topology/block" in up.stderr
    assert "set slurm.nvlink: switches" in up.stderr and "nothing was changed" in up.stderr
    assert not demo.cluster.active_jobs()


def step_pid(cluster: SlurmCluster, job: str, service: str, program: str) -> int:
    """The pid of `program` running as `service`'s step (found by the step id in its environment)."""
    step = next(s["StepId"] for s in cluster.steps(job) if s["Name"] == service)
    step_id = step.split(".")[1]
    for pid, cmd in cluster.step_processes():
        if program not in cmd:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SLURM_STEP_ID={step_id}".encode() in env:
            return pid
    raise AssertionError(f"no {program} process for {service} (step {step})")


def test_a_worker_that_dies_later_ends_the_job_status_says_which_and_up_brings_it_back(demo: SlurmDeployment) -> None:
    assert demo.cli("up", "--no-smoke").returncode == 0
    job = demo.state()["job"]
    os.kill(step_pid(demo.cluster, job, "decode-0", "dynamo_mocker_token_budget_bridge"), signal.SIGKILL)  # the mocker
    demo.cluster.wait_state(job, "FAILED", timeout=30)  # the batch script ends the job, Slurm stops the other steps
    status = demo.cli("status")
    assert status.returncode == 1, status.stdout
    assert f"job {job} FAILED" in status.stdout and "exited decode-0" in status.stdout, status.stdout
    diff = demo.cli("diff")
    assert diff.returncode == 3 and f"job {job} FAILED" in diff.stdout, diff.stdout
    again = demo.cli("up", "--no-smoke")
    assert again.returncode == 0, again.stderr
    assert demo.state()["job"] != job
    assert demo.cli("status").returncode == 0


@pytest.mark.skipif(not os.environ.get("PRIMECTL_SLURM_WHEELHOUSE"),
                    reason="needs a wheelhouse of scripts/runtime-requirements-cpu.txt (PRIMECTL_SLURM_WHEELHOUSE=DIR; "
                           "`pip download --no-deps -r scripts/runtime-requirements-cpu.txt -d DIR`), ~45 s")
def test_up_provisions_the_shared_runtime_on_a_node_from_a_wheelhouse(demo: SlurmDeployment) -> None:
    recipe = demo.write({"software": {"python": None}}, file="provisioned.yaml")
    up = demo.cli("up", "--no-smoke", "--wheelhouse", os.environ["PRIMECTL_SLURM_WHEELHOUSE"], recipe=recipe, timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "installing runtime" in up.stderr and "on one node (srun)" in up.stderr
    runtimes = list((demo.job_dir / "runtime").glob("*/bin/python"))
    assert len(runtimes) == 1
    assert demo.cli("down", recipe=recipe).returncode == 0
    again = demo.cli("up", "--no-smoke", recipe=recipe)
    assert again.returncode == 0 and "reused" in again.stderr, again.stderr


def test_a_job_that_cannot_start_is_cancelled_after_the_pending_timeout(demo: SlurmDeployment, tmp_path: Path) -> None:
    # Another user's job holds one node: the deployment's three whole nodes are not free.
    hog = tmp_path / "hog.sh"
    hog.write_text(f"#!/bin/bash\n#SBATCH --nodes=1 --exclusive --output={tmp_path}/hog.out\nsleep 300\n")
    other = demo.cluster.sbatch(hog)
    try:
        demo.cluster.wait_state(other, "RUNNING")
        recipe = demo.write({"slurm": {"pending_timeout_s": 5}}, file="impatient.yaml")
        up = demo.cli("up", "--no-smoke", recipe=recipe)
        assert up.returncode == 1, up.stdout + up.stderr
        assert "pending (Resources)" in up.stderr and "still PENDING (Resources) after 5s" in up.stderr, up.stderr
        assert {r["JobId"] for r in demo.cluster.active_jobs()} == {other}  # ours is cancelled, the other one untouched
    finally:
        demo.cluster.scancel(other)
        demo.cluster.wait_state(other, "CANCELLED", "COMPLETED")

"""An operator's day on a real Slurm cluster (slurm-wlm 22.05, three slurmd on loopback).

What the Slurm target will rely on, each shown on the real thing: a heterogeneous job whose
components land on their own nodes, steps that serve on their node's address, per-step
output files, states a program can parse, graceful cancellation that leaves no process, a
failing step that fails the job fast, a job past its time limit, and how long scheduling takes.

Run in a private network namespace (see slurmcluster.py); PRIMECTL_TEST_TIMING=1 with -s
prints the measured times.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from primectl.targets.slurm_cli import parse_record

from .slurmcluster import SlurmCluster, parse_exit_code
from .sshhosts import pid_alive

pytestmark = pytest.mark.integration

PY = sys.executable
PAYLOAD = str(Path(__file__).with_name("slurm_payload.py"))
PORT = 7100  # outside the 10000-20000 block the SSH-host tests give their deployments


def timing(label: str, seconds: float) -> None:
    """Print a measured time when PRIMECTL_TEST_TIMING is set (run with -s)."""
    if os.environ.get("PRIMECTL_TEST_TIMING"):
        print(f"\n[slurm timing] {label}: {seconds:.2f}s")


@dataclass(frozen=True)
class Component:
    """One component of a heterogeneous job: one node running one step (the payload)."""

    name: str
    args: str = f"--port {PORT}"
    gpus: int = 0


def het_script(tmp: Path, components: list[Component], *, after: str = "wait", time_limit: str = "5") -> Path:
    """A batch script with one het component per Component, each starting its step in the background."""
    lines = ["#!/bin/bash", "#SBATCH --job-name=primectl-test", f"#SBATCH --output={tmp}/batch.out"]
    for k, c in enumerate(components):
        if k:
            lines.append("#SBATCH hetjob")
        gpus = f" --gpus-per-node={c.gpus}" if c.gpus else ""
        lines.append(f"#SBATCH --nodes=1 --ntasks=1 --time={time_limit}{gpus}")
    lines.append(f"mkdir -p {tmp}/logs")
    for k, c in enumerate(components):
        lines.append(f"srun --het-group={k} --job-name={c.name} --output={tmp}/logs/{c.name}.out "
                     f"{PY} {PAYLOAD} {c.args} &")
    lines.append(after)
    path = tmp / "job.sh"
    path.write_text("\n".join(lines) + "\n")
    return path


# The batch script as a watchdog: the first step to end ends the job, with that step's status.
FAIL_FAST = 'wait -n\nrc=$?\necho "a step ended with status $rc: ending the job"\nexit $rc'


def health(address: str, port: int = PORT, timeout: float = 1) -> dict[str, str] | None:
    """GET /health on address:port; its JSON, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=timeout) as r:
            doc: dict[str, str] = json.loads(r.read())
            return doc
    except OSError:
        return None


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20) -> float:
    """Poll check() until true; the seconds it took (AssertionError on timeout)."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout}s"
        time.sleep(0.02)
    return time.monotonic() - t0


def started(slurm: SlurmCluster, job: str, components: int, timeout: float = 30, skip: frozenset[str] = frozenset()
            ) -> dict[str, dict[str, str]]:
    """Wait until every component runs and its step answers /health; {het offset: health}.

    Components whose offset is in `skip` (steps meant to exit soon) are not waited for.
    """
    recs = slurm.wait_state(job, "RUNNING", timeout=timeout)
    assert len(recs) == components
    out: dict[str, dict[str, str]] = {}

    def all_healthy() -> bool:
        for rec in recs:
            if rec["HetJobOffset"] in skip:
                continue
            addr = slurm.node(rec["NodeList"]).address
            doc = health(addr)
            if doc is None:
                return False
            out[rec["HetJobOffset"]] = doc
        return True

    wait_until(all_healthy, "every step healthy", timeout)
    return out


def test_sinfo_shows_three_idle_nodes_with_their_own_addresses(slurm: SlurmCluster) -> None:
    lines = slurm.run("sinfo", "-h", "-N", "-o", "%N|%T|%c|%G").stdout.split()
    assert sorted(lines) == ["n1|idle|4|gpu:4", "n2|idle|4|gpu:4", "n3|idle|4|gpu:4"]
    nodes = {r["NodeName"]: r for r in (parse_record(slurm.scontrol("show", "node", "-o", n.name)) for n in slurm.nodes)}
    assert {n: r["NodeAddr"] for n, r in nodes.items()} == {"n1": "127.0.0.2", "n2": "127.0.0.3", "n3": "127.0.0.4"}
    assert {r["State"] for r in nodes.values()} == {"IDLE"}
    timing("cluster start (munged + slurmctld + 3 slurmd, all idle)", slurm.timings["start"])


def test_het_job_serves_on_each_nodes_address_and_term_then_stops_every_step(slurm: SlurmCluster, tmp_path: Path) -> None:
    comps = [Component("head"), Component("prefill-0", gpus=4), Component("decode-0", gpus=2)]
    script = het_script(tmp_path, comps)
    t0 = time.monotonic()
    job = slurm.sbatch(script)
    recs = slurm.wait_state(job, "RUNNING")
    timing("het job submit -> RUNNING (bf_interval=1,bf_hetjob_immediate)", time.monotonic() - t0)
    served = started(slurm, job, 3)
    timing("het job submit -> every step answers /health", time.monotonic() - t0)

    # One record per component: the leader's id is the job id, components have their own ids.
    assert [r["HetJobId"] for r in recs] == [job] * 3
    assert [r["HetJobOffset"] for r in recs] == ["0", "1", "2"]
    assert recs[0]["JobId"] == job and len({r["JobId"] for r in recs}) == 3
    assert sorted(r["NodeList"] for r in recs) == ["n1", "n2", "n3"]
    # Each step serves on the address of the node its component got, and sees its own GPUs.
    for rec in recs:
        doc = served[rec["HetJobOffset"]]
        assert doc["node"] == rec["NodeList"]
        assert doc["address"] == slurm.node(rec["NodeList"]).address
        assert doc["job"] == job  # SLURM_JOB_ID in a het step is the leader's id
    assert [served[k]["cuda"] for k in ("0", "1", "2")] == ["", "0,1,2,3", "0,1"]
    # squeue agrees, in a parseable form; the steps are named after the services.
    rows = slurm.run("squeue", "-h", "-j", job, "-o", "%i|%A|%T|%N").stdout.split()
    assert sorted(rows) == sorted(f"{job}+{r['HetJobOffset']}|{r['JobId']}|RUNNING|{r['NodeList']}" for r in recs)
    steps = {s["Name"]: s for s in slurm.steps(job)}
    assert set(steps) == {"batch", "head", "prefill-0", "decode-0"}
    assert {s["State"] for s in steps.values()} == {"RUNNING"}
    by_offset = {r["HetJobOffset"]: r for r in recs}
    for k, c in enumerate(comps):
        assert steps[c.name]["NodeList"] == by_offset[str(k)]["NodeList"]
        assert steps[c.name]["StepId"].split(".")[0] == by_offset[str(k)]["JobId"]
    # Per-step output files.
    for c in comps:
        assert "listening on 127.0.0." in (tmp_path / "logs" / f"{c.name}.out").read_text()
    assert len(slurm.step_processes()) >= 8  # 4 slurmstepd + 3 services + the batch shell (+ sruns)

    # down: SIGTERM to every step (not the batch shell), which then sees its steps end and exits 0.
    t1 = time.monotonic()
    slurm.scancel(job, "--signal=TERM")
    done = slurm.wait_state(job, "COMPLETED", "CANCELLED", "FAILED")
    timing("scancel --signal=TERM -> job finished", time.monotonic() - t1)
    assert [r["JobState"] for r in done] == ["COMPLETED"] * 3
    assert [parse_exit_code(r["ExitCode"]) for r in done] == [(0, 0)] * 3
    wait_until(lambda: not slurm.step_processes(), "every step process gone", 15)
    timing("scancel --signal=TERM -> no step process left", time.monotonic() - t1)
    for c in comps:
        assert "stopping on SIGTERM" in (tmp_path / "logs" / f"{c.name}.out").read_text()
    assert all(health(slurm.node(r["NodeList"]).address) is None for r in recs)
    assert slurm.run("squeue", "-h", "-j", job).stdout.strip() == ""  # finished jobs leave squeue's default view
    assert [r["JobState"] for r in slurm.jobs(job)] == ["COMPLETED"] * 3  # but scontrol keeps them (MinJobAge)


def head_script(tmp: Path, srun_options: str) -> Path:
    """Three head services as three steps of one single-task component, plus one worker component."""
    lines = ["#!/bin/bash", f"#SBATCH --output={tmp}/batch.out", "#SBATCH --nodes=1 --ntasks=1", "#SBATCH hetjob",
             "#SBATCH --nodes=1 --ntasks=1", f"mkdir -p {tmp}/logs"]
    for i, svc in enumerate(("etcd", "nats", "frontend")):
        lines.append(f"srun --het-group=0 {srun_options} --job-name={svc} --output={tmp}/logs/{svc}.out "
                     f"{PY} {PAYLOAD} --port {PORT + 1 + i} &")
    lines += [f"srun --het-group=1 --job-name=worker --output={tmp}/logs/worker.out {PY} {PAYLOAD} --port {PORT} &",
              "wait"]
    path = tmp / "head.sh"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_head_services_share_one_component_only_with_overlap(slurm: SlurmCluster, tmp_path: Path) -> None:
    # Without --overlap each step holds the component's one task slot: one head service runs, the
    # others wait as pending steps (listed with Name=(null)) and would start once the first one ends.
    job = slurm.sbatch(head_script(tmp_path, ""))
    slurm.wait_state(job, "RUNNING")
    wait_until(lambda: len(slurm.steps(job)) == 5, "five steps listed (running or pending)")
    time.sleep(1)
    names = sorted(s["Name"] for s in slurm.steps(job))
    assert names.count("(null)") == 2 and "worker" in names and "batch" in names
    slurm.scancel(job)  # cancels pending steps too; after --signal=TERM alone they started one by one
    slurm.wait_state(job, "CANCELLED")
    wait_until(lambda: not slurm.step_processes(), "steps gone", 15)

    overlap = tmp_path / "overlap"
    overlap.mkdir()
    job = slurm.sbatch(head_script(overlap, "--overlap"))
    recs = slurm.wait_state(job, "RUNNING")
    head = slurm.node(recs[0]["NodeList"]).address
    wait_until(lambda: all(health(head, PORT + 1 + i) for i in range(3)), "all three head services serve")
    assert sorted(s["Name"] for s in slurm.steps(job)) == ["batch", "etcd", "frontend", "nats", "worker"]
    slurm.scancel(job, "--signal=TERM")
    slurm.wait_state(job, "COMPLETED")
    wait_until(lambda: not slurm.step_processes(), "steps gone", 15)


def test_scancel_kills_a_step_that_ignores_term_after_killwait(slurm: SlurmCluster, tmp_path: Path) -> None:
    comps = [Component("head"), Component("stubborn", args=f"--port {PORT} --ignore-term")]
    job = slurm.sbatch(het_script(tmp_path, comps))
    served = started(slurm, job, 2)
    stubborn_pid = int(served["1"]["pid"])
    slurm.scancel(job, "--signal=TERM")
    wait_until(lambda: [s["Name"] for s in slurm.steps(job)] in (["batch", "stubborn"], ["stubborn", "batch"]),
               "the polite step gone, the stubborn one left", 10)
    time.sleep(0.5)
    assert pid_alive(stubborn_pid)
    assert {r["JobState"] for r in slurm.jobs(job)} == {"RUNNING"}

    # Plain scancel: SIGCONT+SIGTERM to the batch shell and every step, SIGKILL KillWait (3 s here) later.
    # (`scancel --signal=KILL [--full]` takes the same path: it cancels the job, it does not SIGKILL at once.)
    t0 = time.monotonic()
    slurm.scancel(job)
    killed = wait_until(lambda: not pid_alive(stubborn_pid), "the stubborn step killed", 20)
    timing(f"scancel -> TERM-ignoring step killed (KillWait={slurm.kill_wait})", killed)
    assert slurm.kill_wait - 0.2 <= killed <= slurm.kill_wait + 15  # ~KillWait + 1.7 s on an idle machine
    wait_until(lambda: not slurm.step_processes(), "every step process gone (slurmstepd too)", 20)
    timing("scancel -> no step process left", time.monotonic() - t0)
    # Until slurmctld hears every step is gone, components may show COMPLETING (not yet a final state).
    assert [r["JobState"] for r in slurm.wait_state(job, "CANCELLED")] == ["CANCELLED"] * 2
    assert "CANCELLED AT" in (tmp_path / "logs" / "stubborn.out").read_text()


def test_failed_step_fails_the_job_fast_when_the_batch_script_watches(slurm: SlurmCluster, tmp_path: Path) -> None:
    comps = [Component("head"), Component("decode-0", args=f"--port {PORT} --exit-after 1.5 --exit-code 3"),
             Component("decode-1")]
    job = slurm.sbatch(het_script(tmp_path, comps, after=FAIL_FAST))
    started(slurm, job, 3, skip=frozenset({"1"}))
    log = tmp_path / "logs" / "decode-0.out"
    wait_until(lambda: log.exists() and "exiting with 3" in log.read_text(), "decode-0 exits with 3")
    t0 = time.monotonic()
    recs = slurm.wait_state(job, "FAILED", "COMPLETED", "CANCELLED", timeout=15)
    timing("step exits 3 -> job FAILED (wait -n watchdog)", time.monotonic() - t0)
    assert time.monotonic() - t0 < 10
    # Every component carries the batch script's status.
    assert [(r["HetJobOffset"], r["JobState"], r["Reason"], parse_exit_code(r["ExitCode"])) for r in recs] == [
        (str(k), "FAILED", "NonZeroExitCode", (3, 0)) for k in range(3)]
    wait_until(lambda: not slurm.step_processes(), "the healthy steps killed with the job", 15)
    timing("step exits 3 -> every other step gone", time.monotonic() - t0)
    batch = (tmp_path / "batch.out").read_text()
    assert "a step ended with status 3" in batch
    assert "exiting with 3" in (tmp_path / "logs" / "decode-0.out").read_text()


def test_failed_step_leaves_the_job_running_when_the_batch_script_waits_for_all(slurm: SlurmCluster, tmp_path: Path) -> None:
    comps = [Component("head"), Component("decode-0", args=f"--port {PORT} --exit-after 1 --exit-code 3")]
    job = slurm.sbatch(het_script(tmp_path, comps))
    started(slurm, job, 2, skip=frozenset({"1"}))
    # The step vanishes from the step list; the job stays RUNNING: only the missing step tells.
    wait_until(lambda: "decode-0" not in {s["Name"] for s in slurm.steps(job)}, "failed step leaves the list", 10)
    assert {r["JobState"] for r in slurm.jobs(job)} == {"RUNNING"}
    assert "srun: error: n" in (tmp_path / "batch.out").read_text()
    assert "Exited with exit code 3" in (tmp_path / "batch.out").read_text()
    slurm.scancel(job)
    slurm.wait_state(job, "CANCELLED")
    wait_until(lambda: not slurm.step_processes(), "steps gone after scancel", 15)


def test_job_past_its_time_limit_is_timeout_and_its_steps_are_killed(slurm: SlurmCluster, tmp_path: Path) -> None:
    comps = [Component("head"), Component("decode-0")]
    job = slurm.sbatch(het_script(tmp_path, comps, time_limit="1"))
    started(slurm, job, 2)
    recs = slurm.jobs(job)
    assert [r["TimeLimit"] for r in recs] == ["00:01:00"] * 2
    # slurmctld enforces limits every 30 s (PERIODIC_TIMEOUT, compiled in): a 1-minute job ends 60-90 s
    # after it starts. To keep CI short, bring the end forward as an operator can (root may shorten it).
    t0 = time.monotonic()
    for r in recs:
        slurm.scontrol("update", f"JobId={r['JobId']}", f"EndTime={time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(time.time() + 2))}")
    recs = slurm.wait_state(job, "TIMEOUT", "COMPLETED", "FAILED", "CANCELLED", timeout=45)
    timing("end time reached -> job TIMEOUT (30 s check period)", time.monotonic() - t0)
    assert [(r["JobState"], r["Reason"]) for r in recs] == [("TIMEOUT", "TimeLimit")] * 2
    wait_until(lambda: not slurm.step_processes(), "steps gone after the time limit", 15)
    timing("end time reached -> steps gone", time.monotonic() - t0)
    assert "DUE TO TIME LIMIT" in (tmp_path / "logs" / "head.out").read_text()
    assert "stopping on SIGTERM" in (tmp_path / "logs" / "head.out").read_text()  # TERM first, KILL after KillWait


@pytest.mark.skipif(os.environ.get("PRIMECTL_SLURM_SLOW") != "1", reason="takes ~30 s; PRIMECTL_SLURM_SLOW=1 runs it")
def test_het_job_waits_for_the_backfill_pass_without_the_settings(slurm: SlurmCluster, tmp_path: Path) -> None:
    comps = [Component("head"), Component("decode-0")]
    slurm.reconfigure(scheduler_parameters="")  # Slurm's defaults: bf_interval=30, no bf_hetjob_immediate
    try:
        t0 = time.monotonic()
        job = slurm.sbatch(het_script(tmp_path, comps))
        slurm.wait_state(job, "RUNNING", timeout=60)
        took = time.monotonic() - t0
        timing("het job submit -> RUNNING (default scheduler parameters)", took)
        assert took > 2
        single = tmp_path / "single.sh"
        single.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/single.out\nsrun {PY} -c 'import time; time.sleep(60)'\n")
        t1 = time.monotonic()
        one = slurm.sbatch(single)
        slurm.wait_state(one, "RUNNING", timeout=60)
        timing("plain job submit -> RUNNING (default scheduler parameters)", time.monotonic() - t1)
        for j in (job, one):
            slurm.scancel(j)
        slurm.wait_state(job, "CANCELLED")
        slurm.wait_state(one, "CANCELLED")
    finally:
        slurm.reconfigure(scheduler_parameters="bf_interval=1,bf_hetjob_immediate")
    wait_until(lambda: not slurm.step_processes(), "steps gone", 15)

"""Observing a Slurm deployment's job: `status`, `logs`, and how `up` follows the job it submitted.

Everything here reads and changes nothing: squeue/scontrol (slurm_cli), and the job's files on the
shared filesystem (slurm_files): its events (what the batch script and bin/primectl-wait wrote),
bound.json, the batch log and each step's output. `up` (targets/slurm.py) submits and cancels jobs;
while it waits it asks a `JobWatch` how the job is doing, and a job that ended or a service that failed
comes back as one StartFailed naming the service and carrying its log's tail.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from primectl.deploy.fanout import parallel
from primectl.deploy.status import ServiceStatus, StatusReport
from primectl.host.logs import readable
from primectl.host.probes import probe_once, run_probe
from primectl.plan.model import Plan, Probe
from primectl.targets.base import Say, StartFailed
from primectl.targets.slurm_cli import JobView, SlurmClient
from primectl.targets.slurm_files import DeploymentFiles, bind
from primectl.targets.slurm_job import deploy_dir, job_name

LOG_TAIL_LINES = 40
BIND_TIMEOUT_S = 120
POLL_S = 0.1  # files on the shared filesystem (events, bound.json)
SCONTROL_POLL_S = 0.5  # slurmctld: a waiting job must not cost it ten RPCs a second
FAILURE_EVENTS = ("exited", "timeout", "failed")


class JobWatch:
    """How `up` follows a job of one deployment: until it runs and binds, each wave, the serving event, the gate."""

    def __init__(self, client: SlurmClient, files: DeploymentFiles, say: Say):
        self.client = client
        self.files = files
        self.say = say

    def await_binding(self, job: str, plan: Plan, pending_timeout_s: float) -> Plan:
        """Wait until the job runs and has written bound.json; `plan` bound to it."""
        t0 = time.monotonic()
        deadline = t0 + pending_timeout_s
        said = ""
        while True:
            view = self.client.job(job)
            if view.state == "RUNNING":
                break
            if view.final or (not view.components and time.monotonic() - t0 > 10):
                raise self.failed(job, view, "before it ran")
            if view.state == "PENDING" and view.reason != said:
                said = view.reason
                self.say(f"job {job} pending ({said})")
            if time.monotonic() > deadline:
                raise StartFailed(f"job {job} still {view.state} ({view.reason}) after {pending_timeout_s}s "
                                  "(slurm.pending_timeout_s): the cluster has no room for it now")
            time.sleep(SCONTROL_POLL_S)
        self.say(f"job {job} running on {view.nodes} after {time.monotonic() - t0:.1f}s")
        deadline = time.monotonic() + BIND_TIMEOUT_S
        while (hosts := self.files.bound(job)) is None:
            view = self.client.job(job)
            if any(e.kind == "failed" for e in self.files.events(job)) or view.final:
                raise self.failed(job, view, "while binding its nodes")
            if time.monotonic() > deadline:
                raise StartFailed(f"job {job} did not bind its nodes within {BIND_TIMEOUT_S}s",
                                  log_tail=self.files.tail(self.files.batch_log(job)), service="job")
            time.sleep(POLL_S)
        self.say("bound: " + ", ".join(f"{h}={v['node']} ({v['address']})" for h, v in hosts.items()))
        return bind(plan, job, hosts)

    def await_wave(self, job: str, plan: Plan, wave: list[str]) -> None:
        """Follow the job while its batch script starts `wave` and waits for its readiness."""
        limit = max(plan.service(n).ready.timeout_s for n in wave) + 30
        deadline = time.monotonic() + limit
        checked = 0.0
        while True:
            events = self.files.events(job)
            ready = {e.service for e in events if e.kind == "ready"}
            if all(n in ready for n in wave):
                return
            if any(e.kind in FAILURE_EVENTS for e in events):
                raise self.failed(job, self.client.job(job), "before it was ready")
            now = time.monotonic()
            if now - checked > 0.5:
                checked = now
                view = self.client.job(job)
                if view.state != "RUNNING":
                    time.sleep(0.5)  # the batch script writes its last event just before it exits
                    raise self.failed(job, self.client.job(job), f"while starting {', '.join(wave)}")
            if now > deadline:
                pending = [n for n in wave if n not in ready]
                raise StartFailed(f"{pending[0]} not ready after {limit:g}s (job {job} still starting it)",
                                  service=pending[0], log_tail=self.service_tail(job, pending[0]))
            time.sleep(POLL_S)

    def await_serving(self, job: str, plan: Plan) -> None:
        """Wait until the job's batch script has started every wave (its `serving` event)."""
        limit = sum(max(plan.service(n).ready.timeout_s for n in w) for w in plan.start_waves()) + 60
        deadline = time.monotonic() + limit
        while True:
            kinds = {e.kind for e in self.files.events(job)}
            if "serving" in kinds:
                return
            view = self.client.job(job)
            if kinds & set(FAILURE_EVENTS) or view.state != "RUNNING":
                raise self.failed(job, view, "before it was serving")
            if time.monotonic() > deadline:
                raise StartFailed(f"job {job} not serving after {limit:g}s")
            time.sleep(0.2)

    def await_gate(self, job: str, g: Probe) -> None:
        """The deployment's readiness gate, probed from this machine (the job must keep running)."""
        deadline = time.monotonic() + g.timeout_s
        delay = 0.05
        while True:
            ok, detail = probe_once(g.model_dump(mode="json"))  # type: ignore[arg-type]
            if ok:
                return
            view = self.client.job(job)
            if view.state != "RUNNING":
                raise self.failed(job, view, "while waiting for the gate", service="frontend")
            if time.monotonic() > deadline:
                raise StartFailed(f"readiness gate {g.url}: not ready after {g.timeout_s:g}s ({detail})", service="frontend",
                                  log_tail=self.service_tail(job, "frontend"))
            time.sleep(delay)
            delay = min(delay * 1.5, g.interval_s)

    def failed(self, job: str, view: JobView, when: str, service: str | None = None) -> StartFailed:
        """Why the job (or the service it was starting) failed `when`, from its events, with the log to read."""
        events = self.files.events(job)
        bad = next((e for e in events if e.kind in FAILURE_EVENTS), None)
        if bad is not None and bad.kind == "exited":
            status = bad.detail.split()[0] if bad.detail else "?"
            return StartFailed(f"{bad.service} ended with status {status} {when} ({view.describe()})",
                               service=bad.service, log_tail=self.service_tail(job, bad.service))
        if bad is not None and bad.kind == "timeout":
            return StartFailed(f"{bad.service} {bad.detail}", service=bad.service, log_tail=self.service_tail(job, bad.service))
        what = f": {' '.join(w for w in (bad.service, bad.detail) if w and w != '-')}" if bad is not None else ""
        if view.reason == "JobLaunchFailure":
            what += (f"; Slurm could not start the batch script: {self.files.path('jobs')} must exist and be writable "
                     "on the nodes (slurm.job_dir on a shared filesystem)")
        return StartFailed(f"{view.describe()} {when}{what}", service=service or "job",
                           log_tail=self.files.tail(self.files.batch_log(job), LOG_TAIL_LINES))

    def service_tail(self, job: str, service: str) -> str:
        """The end of a service's step output, and the batch log's last srun errors."""
        tail = self.files.tail(self.files.log(job, service), LOG_TAIL_LINES)
        batch = [line for line in self.files.tail(self.files.batch_log(job), 200).splitlines() if "srun: error" in line]
        return "\n".join([tail, *batch[-3:]]).strip()


def status(plan: Plan, client: SlurmClient) -> StatusReport:
    """squeue/scontrol for the job and its steps, plus every service's probe at its bound address."""
    files = DeploymentFiles(deploy_dir(plan))
    state = files.state()
    job = str(state.get("job") or "")
    view = client.job(job) if job else JobView("", [])
    hosts = files.bound(job) if job else None
    bound = bind(plan, job, hosts) if hosts else plan
    running = view.state == "RUNNING"
    steps = {s.get("Name", ""): s for s in client.steps(view)} if running else {}
    recorded = set(state.get("services", {}))
    release = files.path("jobs", job, "release")

    def probe(name: str) -> tuple[bool, str]:
        return run_probe(bound.service(name).ready.model_dump(mode="json"), release)  # type: ignore[arg-type]

    live = [s.name for s in bound.services if s.name in steps]
    results = parallel(probe, live)
    rows = []
    for svc in bound.services:
        step = steps.get(svc.name)
        res = results.get(svc.name)
        ok, detail = res if isinstance(res, tuple) else (False, str(res) if res else "")
        if not job:
            detail = "no job recorded (primectl up)"
        elif not running:
            detail = view.describe() if view.components else f"job {job} is gone"
        elif step is None:
            detail = "no step running (it ended)"
        node = (hosts or {}).get(svc.host, {}).get("node", svc.host)
        rows.append(ServiceStatus(
            svc.name, node, svc.role, svc.name in recorded and bool(job), step is not None and step.get("State") == "RUNNING",
            ok and step is not None, None, state.get("revision"), detail,
            state=f"step {step.get('StepId')} {step.get('State')}" if step else view.state.lower(),
        ))
    gate: dict[str, Any] = {"ok": False, "detail": view.describe() if job else "no job recorded"}
    if running:
        ok, detail = probe_once(bound.gate.model_dump(mode="json"))  # type: ignore[arg-type]
        gate = {"ok": ok, "detail": detail}
    if running:
        from primectl.checks.registration import listing_probes, mark_unlisted, run_here

        rows = mark_unlisted(rows, run_here(listing_probes(bound, [w.name for w in bound.workers()])))
    report = StatusReport(plan.name, rows, gate, bound.gate.url or "")
    report.notes = status_notes(client, files, plan, job, view, state)
    if running:
        from primectl.checks.workers import worker_sections

        sections, notes = worker_sections(bound)
        report.sections = sections
        report.notes += notes
    return report


def status_notes(client: SlurmClient, files: DeploymentFiles, plan: Plan, job: str, view: JobView,
                 state: dict[str, Any]) -> list[str]:
    """The job's lines under the status table: how it runs, what failed in it or in a newer one, other jobs."""
    notes = []
    if job:
        comps = view.components
        when = f", started {comps[0].get('StartTime')}" if comps and comps[0].get("StartTime") else ""
        left = f", time limit {comps[0].get('TimeLimit')}" if comps and comps[0].get("TimeLimit") not in (None, "UNLIMITED") else ""
        notes.append(f"{view.describe() if comps else f'job {job} is gone'}"
                     + (f" on {view.nodes}" if view.nodes else "") + when + left + f", revision {state.get('revision')}")
        bad = next((e for e in files.events(job) if e.kind in FAILURE_EVENTS), None)
        if bad is not None:
            notes.append(f"job {job}: {bad.kind} {bad.service} {bad.detail}".rstrip()
                         + f" (primectl logs RECIPE {bad.service})")
    newest = next(reversed(files.jobs_seen()), "")
    if newest and newest != job:
        bad = next((e for e in files.events(newest) if e.kind in FAILURE_EVENTS), None)
        if bad is not None:
            notes.append(f"the newest job, {newest}, did not serve: {bad.kind} {bad.service} {bad.detail}".rstrip()
                         + f" (primectl logs RECIPE {bad.service})")
    others = [f"{j} {s}" for j, s in client.active_jobs(job_name(plan)) if j != job]
    if others:
        notes.append(f"other unfinished job(s) named {job_name(plan)}: {', '.join(others)} (`primectl down` stops them)")
    return notes


def logs(plan: Plan, service: str, *, follow: bool, tail: int) -> int:
    """The service's step output from the recorded job (or the newest job that ran), escape codes removed."""
    files = DeploymentFiles(deploy_dir(plan))
    job = str(files.state().get("job") or "") or next(reversed(files.jobs_seen()), "")
    path = files.log(job, service) if job else ""
    if not job or not os.path.exists(path):
        sys.stderr.write(f"no log of {service}" + (f" in job {job} ({path})" if job else ": no job has run") + "\n")
        return 1
    sys.stdout.write(files.tail(path, tail) + "\n")
    sys.stdout.flush()
    if not follow:
        return 0
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        try:
            while True:
                chunk = f.read()
                if chunk:
                    sys.stdout.write(readable(chunk.decode(errors="replace")))
                    sys.stdout.flush()
                else:
                    time.sleep(0.5)
        except KeyboardInterrupt:
            return 0

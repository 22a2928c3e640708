"""The Slurm target: the whole deployment as one (heterogeneous) batch job.

Binding. A Slurm recipe's hosts are logical node slots: the plan carries
`@node:HOST@` where an address goes and `@job@` where the job id goes
(plan_hosts). The job's batch script binds each logical host to a node of its
het component, resolves the node's address there (NodeAddr, or an interface
on the node), writes jobs/<id>/bound.json and a copy of the release with the
values in place, and starts the services from that copy. `up`, `status` and
`logs` read bound.json back and work on the bound plan (bind()).

Waves. The batch script starts the services as job steps wave by wave and
waits for each wave's readiness probes before the next (bin/primectl-wait,
run inside the job), like srt-slurm's orchestrator: the job comes up the same
whether or not primectl still watches (requeue, a lost terminal). `up` follows
each wave through the job's events file and fails fast, naming the service,
when a step ends or a probe times out; gate and smoke run from this machine,
as with SSH.

Rollout. The job is the unit: any change to how a service runs, or to the
job's shape, replaces the job (handover `replace`): `activate` stops the
running job (SIGTERM to its steps, then scancel), submits the new one and
waits until it runs; on failure or Ctrl-C the new job is cancelled and, if a
job was serving before, its revision is submitted again and waited for until
healthy. A change of expectations only (readiness, start order) is recorded
without touching the running job. A whole-rack deployment cannot run twice,
so there is no overlap of old and new.

Observing. `status`, `logs`, and how `up` follows the job it submitted (until it runs and binds its nodes,
each wave, the gate) live in targets/slurm_observe.py: they read squeue/scontrol and the job's files only.

Lock. An exclusive flock on <job_dir>/<name>/lock for the whole `up`/`down`
(released by the kernel when primectl dies); every unfinished job named
primectl-<name> of this user counts as the deployment's, recorded or not, so
an `up` interrupted after sbatch leaves nothing the next `up` or `down` misses.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primectl.deploy.changes import Action, Change, diff_services, file_diff, script_path, secrets_hash
from primectl.deploy.status import StatusReport
from primectl.errors import DeployError
from primectl.plan.model import HostPlan, Plan, Runtime, node_marker
from primectl.recipe.model import EngineBlock, Recipe
from primectl.render.bundle import Bundle
from primectl.targets import slurm_observe
from primectl.targets.base import PlannedHosts, Say, StepPlan
from primectl.targets.slurm_cli import JobView, SlurmClient
from primectl.targets.slurm_files import STATE_SCHEMA, DeploymentFiles, DeploymentLock, bind
from primectl.targets.slurm_head import Head
from primectl.targets.slurm_job import JOB_SCRIPT, components, deploy_dir, job_name, options, render_release
from primectl.targets.slurm_monitoring import head_monitoring, job_plan
from primectl.targets.slurm_recipe import Slurm

if TYPE_CHECKING:  # provision imports the SSH cluster code, which a Slurm `up` loads only to provision
    from primectl.deploy.provision import Install
    from primectl.targets.base import Target
from primectl.targets.slurm_observe import JobWatch


def _client(options: SlurmClient | None) -> SlurmClient:
    """The given clients, or this machine's (None, or what another target built, reaches this one untyped)."""
    return options if isinstance(options, SlurmClient) else SlurmClient()


def _stop_timeout(plan: Plan) -> float:
    return float(max((s.stop_timeout_s for s in plan.services), default=30))


def stop_jobs(client: SlurmClient, files: DeploymentFiles, jobs: list[str], timeout: float, say: Say) -> dict[str, JobView]:
    """Stop jobs gracefully: SIGTERM to their steps, wait up to `timeout`, then scancel (SIGKILL after KillWait).

    Each job's batch script is told first (jobs/<id>/stopping), so it ends with status 0 instead of
    taking the stopped services for a failure. Returns each job's final view.
    """
    if not jobs:
        return {}
    for j in jobs:
        files.mark_stopping(j)
    for j in jobs:
        view = client.job(j)
        if view.state in ("PENDING", "CONFIGURING", "SUSPENDED", "REQUEUED"):
            client.cancel(j)  # nothing runs yet: a signal would not reach anything
        else:
            client.cancel(j, "--signal=TERM")
    deadline = time.monotonic() + timeout
    views = {j: client.wait_final(j, max(0.0, deadline - time.monotonic())) for j in jobs}
    stubborn = [j for j, v in views.items() if v.components and not v.final]
    for j in stubborn:
        say(f"job {j} did not stop within {timeout:g}s of SIGTERM: cancelling it (SIGKILL after KillWait)")
        client.cancel(j)
    for j in stubborn:
        views[j] = client.wait_final(j, client.kill_wait() + 30)
        if views[j].components and not views[j].final:
            raise DeployError(f"job {j} is still {views[j].state} after scancel; see `scontrol show job {j}`")
    return views


class SlurmRollout:
    """One `up` as a Slurm job: what the deployment directory and squeue said, and what the pipeline decided."""

    def __init__(self, plan: Plan, client: SlurmClient, say: Say):
        job = job_plan(plan)  # monitoring runs outside the job (slurm_monitoring.py); the release carries it
        self.plan = job  # bound to the job's addresses once it runs (activate)
        self.unbound = job
        self.client = client
        self.say = say
        self.options = options(plan)
        self.files = DeploymentFiles(deploy_dir(plan))
        # The plan a release ran with travels with it, so a rollback can wait for exactly that job.
        self.release: Bundle = _with_plan(render_release(plan), job)
        # Prometheus and Alertmanager on this machine (the head), brought to the release's monitoring/head/ files
        self.head = Head(plan, self.release.files) if plan.monitoring is not None else None
        self.state = self.files.state()
        self.active = self.client.active_jobs(job_name(plan))
        recorded = str(self.state.get("job") or "")
        self.recorded_view = client.job(recorded) if recorded else JobView("", [])
        self.serving = self.recorded_view.state == "RUNNING" and self.state.get("schema") == STATE_SCHEMA
        self.lock_ = DeploymentLock(self.files.path("lock"), plan.name)
        self.watch = JobWatch(client, self.files, say)
        self.changes: list[Change] = []
        self.replace = True
        self.why = ""
        self.secrets_hash = ""
        self.stale_secrets = False
        self.job: str | None = None
        self.started: list[str] = []

    # -- lock and diff ----------------------------------------------------------------------------------
    def lock(self, *, break_lock: bool) -> None:
        """flock <job_dir>/<name>/lock for this `up`."""
        self.lock_.acquire("up", break_lock=break_lock, say=self.say)

    def unlock(self) -> None:
        """Release the flock."""
        self.lock_.release()

    def diff(self, secrets: str | None, *, detail: bool = False) -> list[Change]:
        """Per service against the serving job's record; the job is replaced unless only expectations changed."""
        want: dict[str, Any] = self.release.services
        have: dict[str, Any] = dict(self.state.get("services", {})) if self.state.get("schema") == STATE_SCHEMA else {}
        job = str(self.state.get("job") or "")
        # Whether the services run is the job's question, not each one's: alive=None, judged below.
        lines = diff_services(want, have, detail=self._script_diff if detail else None)
        runs = any(c.action in ("add", "change", "remove") for c in lines)
        shape = self.state.get("job_hash") != self.release.manifest["job_hash"] and bool(have)
        if shape:
            lines.append(Change("slurm", JOB_SCRIPT, "change", "job shape or sbatch options changed",
                                self._file_diff(JOB_SCRIPT) if detail else ""))
        others = [j for j, _ in self.active if j != job]
        if not self.serving:
            self.why = (f"{self.recorded_view.describe()}" if job and self.recorded_view.components
                        else f"job {job} is gone" if job else "no job runs")
        elif runs or shape:
            self.why = "the job is replaced (every service restarts in the new job)"
        self.replace = not self.serving or runs or shape
        if self.replace:  # a new job starts every service, whatever else changed of it
            lines = [dataclasses.replace(c, action="restart", reason=self.why) if c.action in ("keep", "update") else c for c in lines]
        lines += self._head_changes()
        if others:
            self.say(f"WARNING: job(s) {', '.join(others)} of {self.plan.name} are not recorded (an interrupted `up`?): "
                     "`up` replaces them, `down` stops them")
        if secrets is not None:
            self.secrets_hash = secrets_hash(self.plan.name, secrets)
            self.stale_secrets = self.state.get("secrets_hash") != self.secrets_hash
            if self.stale_secrets and not self.replace and self.state.get("secrets_hash"):
                self.say("secrets changed: the running job keeps the values it started with until it is replaced")
        self.changes = lines
        return lines

    def _head_changes(self) -> list[Change]:
        """One line per process of the head's monitoring: start (add), restart (change), reload (update) or keep."""
        if self.head is None:
            return []
        shown: dict[str, Action] = {"start": "add", "restart": "change", "reload": "update", "keep": "keep"}
        return [Change("head", name, shown[action], why)
                for name, (action, why) in self.head.plan().items()]

    def _file_diff(self, rel: str) -> str:
        """One file of the serving job's release (on the shared filesystem) against the new release."""
        old_rev = str(self.state.get("revision") or "")
        try:
            with open(os.path.join(self.files.release(old_rev), rel)) as f:
                old = f.read()
        except OSError:
            old = ""
        return file_diff(rel, old, self.release.files.get(rel, b"").decode(), old_rev, self.release.revision)

    def _script_diff(self, service: str) -> str:
        return self._file_diff(script_path(service))

    def nothing_to_do(self) -> bool:
        """The serving job runs this revision and the secrets are current."""
        return not self.replace and all(c.action == "keep" for c in self.changes) and not self.stale_secrets

    def describe(self, *, preflight: bool, smoke: bool) -> list[StepPlan]:
        """What each step of `up` would do now."""
        plan, o = self.plan, self.options
        todo = [c for c in self.changes if c.action != "keep"]
        idle = self.nothing_to_do()
        skip = "skipped: nothing to change"
        comps = components(self.unbound)
        runtimes = sorted({f"{r.flavour} {r.key}" for r in plan.serving.runtime.values() if r.provisioned})
        job = str(self.state.get("job") or "")
        waves = [f"{i}: {', '.join(w)}" for i, w in enumerate(self.waves(), 1)]
        return [
            StepPlan("connect", f"Slurm clients; {self.recorded_view.describe() if job else 'no job recorded'}"
                     + (f"; unfinished jobs named {job_name(plan)}: {', '.join(j for j, _ in self.active)}" if self.active else "")),
            StepPlan("lock", f"flock {self.files.path('lock')}"),
            StepPlan("diff", f"{len(todo)} to change, {len(self.changes) - len(todo)} unchanged"
                     + (f"; {self.why}" if self.replace and self.why else ""),
                     [f"{c.action} {c.service}: {c.reason}" for c in todo]),
            StepPlan("preflight", skip if idle else ("Slurm clients, partition, sbatch --test-only of the job"
                                                      if preflight else "skipped (--skip-preflight)")),
            StepPlan("provision", skip if idle else (f"create or reuse runtime {', '.join(runtimes)} under {o.job_dir}/runtime "
                                                      "(srun on one node)" if runtimes else "skipped: software.python is given")),
            StepPlan("ports", "skipped: the job's nodes are its own"),
            StepPlan("push", skip if idle else f"write {self.files.release(self.release.revision)}" + (
                f"; check the head's Prometheus and Alertmanager files and bring them to them in {self.head.dir}"
                if self.head is not None else "")),
            StepPlan("activate", skip if idle else (
                (f"stop job(s) {', '.join(j for j, _ in self.active)}, then " if self.active else "")
                + f"sbatch {JOB_SCRIPT}: {len(comps)} component(s), {sum(len(c.hosts) for c in comps)} node(s); "
                  f"wait until it runs (up to {o.pending_timeout_s}s) and read its node addresses"
                if self.replace else "keep the running job" + ("; write secrets" if self.stale_secrets else ""))),
            StepPlan("stop removed", "nothing: the new job replaces the old one" if self.replace else "nothing to remove"),
            StepPlan("waves", "; ".join(waves) or "nothing to start", [
                f"rollout: the job is resubmitted whole: every service stops with job(s) "
                f"{', '.join(j for j, _ in self.active)} and starts in the new one, so clients have no endpoint "
                f"until it is ready (up to {plan.gate.timeout_s:g}s); a job's nodes hold one revision at a time, "
                "so there is no surge, batch or drain here"] if self.replace and self.active and not idle else []),
            StepPlan("gate", skip if idle else f"GET {plan.gate.url} == 200 (up to {plan.gate.timeout_s:g}s)"),
            StepPlan("smoke", skip if idle else ("run the endpoint checks" if smoke else "skipped (--no-smoke)")),
            StepPlan("record", skip if idle else f"write {self.files.path('state.json')}"),
            StepPlan("retire", "prune old releases and job directories"),
        ]

    # -- steps before anything changes -----------------------------------------------------------------
    def preflight(self) -> None:
        """Clients present, the cluster answers, the partition is up, and sbatch --test-only accepts the job."""
        c = self.client
        missing = c.missing()
        if missing:
            raise DeployError(f"Slurm clients missing on this machine: {', '.join(missing)}; nothing was changed")
        version = c.version()
        if self.options.partition:
            state = c.partition(self.options.partition)
            if state is None:
                raise DeployError(f"partition {self.options.partition!r} does not exist (sinfo); nothing was changed")
            if state != "up":
                raise DeployError(f"partition {self.options.partition!r} is {state}; nothing was changed")
        scratch = self.files.path(".preflight")
        os.makedirs(scratch, exist_ok=True)
        try:
            with open(os.path.join(scratch, JOB_SCRIPT), "wb") as f:
                f.write(self.release.files[JOB_SCRIPT])
            ok, said = c.test_only(JOB_SCRIPT, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if not ok:
            hint = ""
            if "--segment" in said:
                hint = (f"; this cluster runs {version}: --segment needs Slurm 24.05+ with topology/block, "
                        "set slurm.nvlink: switches (topology/tree) or none")
            elif "gres" in said.lower() or "gpus-per-node" in said:
                hint = "; try slurm.gpu_request: gres (or none)"
            raise DeployError(f"sbatch --test-only refuses the job ({version}): {said}{hint}; nothing was changed")
        self.say(f"preflight: {version}; {said.removeprefix('sbatch: ')}")

    def provision(self, wheelhouse: Path | None) -> None:
        """Create (or reuse) the shared runtime venv under <job_dir>/runtime, installing on a node with srun."""
        runtime = next((r for r in self.plan.serving.runtime.values() if r.provisioned), None)
        if runtime is None:
            return
        from primectl.deploy.provision import install_runtime

        if install_runtime(_SharedRuntime(self, runtime), runtime, wheelhouse) == "reused":
            self.say(f"runtime {runtime.key} reused at {runtime.dir}")

    def check_ports(self) -> None:
        """Nothing to check: the job's nodes are allocated to it (exclusive by default)."""

    def push(self) -> None:
        """Write releases/<revision>/ on the shared filesystem; with monitoring, bring the head's Prometheus and
        Alertmanager to the release's files (checked first: a bad file stops `up` with nothing replaced)."""
        if self.files.write_release(self.release.revision, self.release.files, self.release.modes):
            self.say(f"wrote release {self.release.revision} ({len(self.release.files)} files) to {self.files.path('releases')}")
        if self.head is not None:  # before the job: a bad file is refused with nothing replaced
            self.head.apply(self.say)

    # -- steps that change what runs ---------------------------------------------------------------------
    def activate(self, secrets: str) -> None:
        """Stop the running job(s), submit the new one, wait until it runs and has bound its nodes."""
        if self.plan.secret_names or self.stale_secrets:
            self.files.write_secrets(self.plan.name, secrets)
        if not self.replace:
            job = str(self.state["job"])
            self.job = None
            self.plan = self._bound(job)
            return
        running = [j for j, _ in self.active]
        if running:
            self.say(f"stopping job(s) {', '.join(running)} (SIGTERM, then scancel after {_stop_timeout(self.plan):g}s)")
            stop_jobs(self.client, self.files, running, _stop_timeout(self.plan), self.say)
        self.job = self.submit(self.release.revision)
        self.plan = self.watch.await_binding(self.job, self.unbound, self.options.pending_timeout_s)

    def submit(self, revision: str) -> str:
        """sbatch the release's job script from its directory; the job id."""
        os.makedirs(self.files.path("jobs"), exist_ok=True)  # slurmstepd opens jobs/<id>.out there: it must exist
        job = self.client.submit(JOB_SCRIPT, self.files.release(revision), f"--comment=primectl:{revision}")
        self.say(f"submitted job {job} (revision {revision})")
        return job

    def _bound(self, job: str) -> Plan:
        hosts = self.files.bound(job)
        if hosts is None:
            raise DeployError(f"job {job} has no bound.json in {self.files.job(job)}")
        return bind(self.unbound, job, hosts)

    def stop_removed(self) -> None:
        """Nothing: the new job does not run removed services, and the old job is stopped."""

    def waves(self) -> list[list[str]]:
        """The plan's start waves when the job is replaced (the job script starts them), else none."""
        return self.unbound.start_waves() if self.replace else []

    def start(self, wave: list[str]) -> None:
        """Follow the job while its batch script starts `wave` and waits for its readiness."""
        assert self.job is not None
        self.started += wave
        self.watch.await_wave(self.job, self.plan, wave)

    def gate(self) -> None:
        """The deployment's readiness gate, probed from this machine (the job must keep running)."""
        self.watch.await_gate(self.job or str(self.state.get("job") or ""), self.plan.gate)

    def rollback(self) -> None:
        """Cancel the new job (and any other of this deployment); bring the job that served before back."""
        if not self.replace:
            self.say("the running job was not changed")
            return
        jobs = sorted({j for j, _ in self.client.active_jobs(job_name(self.plan))} | ({self.job} if self.job else set()),
                      key=int)
        if jobs:
            self.say(f"cancelling job(s) {', '.join(jobs)}")
            stop_jobs(self.client, self.files, jobs, _stop_timeout(self.plan), self.say)
        prev = str(self.state.get("revision") or "")
        if not (self.serving and prev and os.path.isdir(self.files.release(prev))):
            return
        self.say(f"submitting the previous revision {prev} again (it ran as job {self.state.get('job')})")
        job = ""
        try:
            job = self.submit(prev)
            previous_plan = self._plan_of_release(prev)
            self.job, self.plan = job, self.watch.await_binding(job, previous_plan, self.options.pending_timeout_s)
            self.watch.await_serving(job, previous_plan)
            self.gate()
        except (DeployError, KeyboardInterrupt) as exc:
            self.say(f"WARNING: the previous revision did not come back healthy: {exc}; cancelling job {job}")
            if job:
                stop_jobs(self.client, self.files, [job], _stop_timeout(self.unbound), self.say)
            return
        self.files.write_state({**self.state, "job": job, "updated": time.time(), "hosts": self.files.bound(job)})
        self.say(f"previous revision is healthy again (job {job})")

    def _plan_of_release(self, revision: str) -> Plan:
        """The plan a recorded release ran: its readiness and start order come from its ready/ files and manifest."""
        import json

        with open(os.path.join(self.files.release(revision), "plan.json")) as f:
            return Plan.model_validate(json.load(f))

    def record(self) -> None:
        """Write state.json: the job that serves, its revision, and what each service runs."""
        prev = {"job": self.state.get("job"), "revision": self.state.get("revision")} if self.state else None
        job = self.job or str(self.state.get("job") or "")
        state = {
            "schema": STATE_SCHEMA, "deployment": self.plan.name, "target": "slurm", "job": job,
            "revision": self.release.revision, "job_hash": self.release.manifest["job_hash"],
            "secrets_hash": self.secrets_hash, "services": self.release.services, "hosts": self.files.bound(job),
            "previous": prev if self.replace else self.state.get("previous"), "updated": time.time(),
        }
        self.files.write_state(state)

    def retire(self) -> None:
        """Prune old releases and job directories (the serving one and unfinished jobs are kept)."""
        keep_jobs = {j for j, _ in self.client.active_jobs(job_name(self.plan))}
        if self.job:
            keep_jobs.add(self.job)
        keep_revs = {self.release.revision, str(self.state.get("revision") or "")}
        self.files.prune(keep_revs, keep_jobs)

    def summary(self) -> str:
        """One line: which job serves and what started."""
        if not self.replace:
            return f"job {self.state.get('job')} kept, {len(self.changes)} services unchanged"
        return f"job {self.job}: {len(self.started)} services started"


class _SharedRuntime:
    """The one runtime of a Slurm deployment (deploy.provision.InstallSite): files on the shared filesystem,
    wheels under <job_dir>/wheelhouse, the install run by srun on one node of the partition."""

    label = ""

    def __init__(self, rollout: SlurmRollout, runtime: Runtime):
        self.rollout = rollout
        self.wheelhouse = os.path.join(rollout.options.job_dir, "wheelhouse")
        self.where = f" at {runtime.dir} on one node (srun)"

    def read(self, path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    def mkdir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def names(self, directory: str) -> set[str]:
        os.makedirs(directory, exist_ok=True)
        return set(os.listdir(directory))

    def put(self, src: Path, path: str, mode: int) -> None:
        shutil.copyfile(src, path)
        os.chmod(path, mode)

    def say(self, text: str) -> None:
        self.rollout.say(text)

    def install(self, job: Install) -> tuple[int, str]:
        from primectl.deploy.provision import INSTALL_TIMEOUT_S

        r, o = self.rollout, self.rollout.options
        where = [f"--partition={o.partition}"] if o.partition else []
        where += [f"--account={o.account}"] if o.account else []
        done = r.client.run("srun", "--nodes=1", "--ntasks=1", f"--job-name={job_name(r.plan)}-provision", *where,
                            "env", *(f"{k}={v}" for k, v in job.env.items()), *job.argv,
                            check=False, timeout=INSTALL_TIMEOUT_S)
        return done.returncode, done.stdout + done.stderr


class SlurmTarget:
    """`target: slurm`."""

    name = "slurm"

    def recipe_block(self) -> EngineBlock:
        """The recipe's `slurm:` block (None where the recipe leaves it out)."""
        return "slurm", Slurm
    surges = False

    def plan_hosts(self, recipe: Recipe, hosts: list[HostPlan]) -> PlannedHosts:
        """Logical node slots: addresses bound in the job, workdirs per job on the shared filesystem."""
        o = getattr(recipe, "slurm", None) or Slurm()
        root = os.path.join(o.job_dir, recipe.name)
        planned = [h.model_copy(update={"address": node_marker(h.name), "workdir": f"{root}/jobs/@job@/{h.name}"})
                   for h in hosts]
        return PlannedHosts(planned, runtime_root=os.path.join(o.job_dir, "runtime"), options=o.model_dump(mode="json"))

    def bind(self, plan: Plan) -> Plan:
        """The plan bound to the recorded job's nodes (unchanged when no job has bound them)."""
        files = DeploymentFiles(deploy_dir(plan))
        job = str(files.state().get("job") or "")
        hosts = files.bound(job) if job else None
        plan = plan.model_copy(update={"monitoring": head_monitoring(plan)})  # the head's, on this machine
        return bind(plan, job, hosts) if hosts else plan

    def render(self, plan: Plan) -> dict[str, bytes]:
        """The release directory `up` submits from: job.sbatch, run scripts, probes, configs, model, manifest."""
        return _with_plan(render_release(plan), job_plan(plan)).files

    @contextmanager
    def apply(self, plan: Plan, options: SlurmClient | None, say: Say) -> Iterator[SlurmRollout]:
        """Read the deployment directory and squeue; yield the rollout the pipeline drives."""
        yield SlurmRollout(plan, _client(options), say)

    def status(self, plan: Plan, options: SlurmClient | None, say: Say) -> StatusReport:
        """squeue/scontrol for the job and its steps, plus every service's probe at its bound address."""
        return slurm_observe.status(job_plan(plan), _client(options))

    def logs(self, plan: Plan, service: str, options: SlurmClient | None, *, follow: bool, tail: int, journal: bool = False) -> int:
        """The service's step output from the recorded job (or the newest job that ran), escape codes removed."""
        if journal:
            raise DeployError("`logs --journal` reads systemd's journal; on the slurm target services are job steps, "
                              "not units, and the step's output is the whole log (drop --journal)")
        return slurm_observe.logs(job_plan(plan), service, follow=follow, tail=tail)

    def down(self, plan: Plan, options: SlurmClient | None, say: Say, *, purge: bool, break_lock: bool) -> list[str]:
        """Stop every job of the deployment: SIGTERM to the services, scancel after their stop timeout; then the
        head's Prometheus and Alertmanager (`purge`: their files and data too)."""
        head = Head(plan) if plan.monitoring is not None else None
        plan = job_plan(plan)
        client = _client(options)
        files = DeploymentFiles(deploy_dir(plan))
        lock = DeploymentLock(files.path("lock"), plan.name)
        lock.acquire("down", break_lock=break_lock, say=say)
        try:
            state = files.state()
            jobs = [j for j, _ in client.active_jobs(job_name(plan))]
            stopped: list[str] = []
            if str(state.get("job") or "") in jobs:
                order = [n for wave in plan.start_waves() for n in wave]
                stopped = [n for n in reversed(order) if n in state.get("services", {})]
            views = stop_jobs(client, files, jobs, _stop_timeout(plan), say)
            for j, v in views.items():
                say(f"job {j}: {v.state if v.components else 'gone'}")
            if head is not None:
                head.stop(say, purge=purge)
            if purge:
                shutil.rmtree(files.root, ignore_errors=True)
            say(f"stopped {len(stopped)} service(s) in {len(jobs)} job(s)" + ("; files removed" if purge else ""))
            return stopped
        finally:
            lock.release()

    def unlock(self, plan: Plan, options: SlurmClient | None, say: Say) -> str:
        """Remove the lock file, whoever holds it (a holder that still runs keeps a lock nobody else sees)."""
        path = DeploymentFiles(deploy_dir(plan)).path("lock")
        if os.path.exists(path):
            os.unlink(path)
        return path


def _plan_json(plan: Plan) -> bytes:
    return (plan.model_dump_json(indent=2) + "\n").encode()


def _with_plan(release: Bundle, plan: Plan) -> Bundle:
    """The release plus plan.json (what a rollback resubmits and waits for)."""
    files = {**release.files, "plan.json": _plan_json(plan)}
    modes = {**release.modes, "plan.json": 0o644}
    return Bundle(release.host, files, modes, release.revision, release.manifest)


if TYPE_CHECKING:  # mypy checks the target against the protocol, with its options (the Slurm clients it runs)
    _target: Target[SlurmClient] = SlurmTarget()

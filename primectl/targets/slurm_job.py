"""Plan -> one Slurm job: its components, its sbatch script and the release directory it runs from.

The plan's hosts are logical node slots (targets/slurm.py plans them with
late-bound addresses). Hosts that make up one multi-node instance (a DEP
prefill group of two trays) form one het-job component of that many nodes,
kept inside one NVLink domain; every other host is a one-node component; the
component holding the frontend's host comes first, so the batch script runs
on the head node. Inside the job, the script binds each logical host to a
node of its component, resolves that node's address, writes a copy of the
release with the addresses in place, and starts the services as job steps
wave by wave, waiting for each wave's readiness before the next.

The release is byte-identical for the same plan; its revision is the hash of
its files (addresses and the job id are markers until the job runs).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
from dataclasses import dataclass, field
from typing import Literal

from primectl.deploy.shipping import zipapp
from primectl.plan.model import Plan
from primectl.render.bundle import MANIFEST, Bundle, hash_files, render_host, template
from primectl.targets import slurm_monitoring
from primectl.targets.slurm_recipe import Slurm

JOB_SCRIPT = "job.sbatch"
WAITER = "bin/primectl-wait"
SEGMENT_NOTE = ("--segment needs Slurm 24.05+ with TopologyPlugin=topology/block (an NVL72 rack is one block of 18 "
                "trays); on topology/tree clusters (any version, e.g. 22.05) set slurm.nvlink: switches")
Kind = Literal["head", "prefill", "decode"]


def options(plan: Plan) -> Slurm:
    """The recipe's `slurm:` block as planned (defaults when the recipe has none)."""
    return Slurm.model_validate(plan.target.options)


def deploy_dir(plan: Plan) -> str:
    """Where this deployment's releases, jobs, state and lock live (on the shared filesystem)."""
    return posixpath.join(options(plan).job_dir, plan.name)


def job_name(plan: Plan) -> str:
    """The Slurm job name of the deployment (how primectl finds its jobs in squeue)."""
    return f"primectl-{plan.name}"


@dataclass(frozen=True)
class Component:
    """One component of the (heterogeneous) job: whole nodes, one per logical host, in order."""

    index: int
    kind: Kind
    label: str
    hosts: list[str]
    gpus_per_node: int
    one_domain: bool
    services: list[str] = field(default_factory=list)


def components(plan: Plan) -> list[Component]:
    """The job's components: the frontend's host first, then in the order the plan places services."""
    order: list[str] = []
    for svc in sorted(plan.services, key=lambda s: s.host != plan.head):
        if svc.host not in order:
            order.append(svc.host)
    groups: dict[str, list[str]] = {}
    group_of: dict[str, str] = {}
    for slot in plan.slots:
        if slot.group and slot.hosts_per_instance > 1:
            groups.setdefault(slot.group, [])
            if slot.host not in groups[slot.group]:
                groups[slot.group].append(slot.host)
            group_of[slot.host] = slot.group
    out: list[Component] = []
    seen: set[str] = set()
    for host in order:
        if host in seen:
            continue
        hosts = groups[group_of[host]] if host in group_of else [host]
        seen.update(hosts)
        services = [s for s in plan.services if s.host in hosts]
        workers = [s for s in services if s.role in ("prefill", "decode")]
        kind: Kind = "head" if plan.head in hosts or not workers else workers[0].role  # type: ignore[assignment]
        gpus = max((plan.host(h).gpus for h in hosts), default=0) if any(s.gpus for s in services) else 0
        if host in group_of:
            slot = next(s for s in plan.slots if s.group == group_of[host])
            label = f"{group_of[host]}: {slot.parallel} over {len(hosts)} nodes"
            one_domain = any(s.domain for s in plan.slots if s.group == group_of[host])
        else:
            label = ", ".join(s.name for s in services)
            one_domain = False
        out.append(Component(len(out), kind, label, hosts, gpus, one_domain, [s.name for s in services]))
    return out


def directives(plan: Plan, c: Component) -> list[str]:
    """The #SBATCH options of one component (one line of placement, then one line per extra option)."""
    o = options(plan)
    words = [f"--nodes={len(c.hosts)}", "--ntasks-per-node=1"]
    if o.partition:
        words.append(f"--partition={o.partition}")
    if o.account:
        words.append(f"--account={o.account}")
    if o.time_limit:
        words.append(f"--time={o.time_limit}")
    if o.exclusive:
        words += ["--exclusive", "--mem=0"]
    if c.gpus_per_node and o.gpu_request == "gpus-per-node":
        words.append(f"--gpus-per-node={c.gpus_per_node}")
    elif c.gpus_per_node and o.gpu_request == "gres":
        words.append(f"--gres=gpu:{c.gpus_per_node}")
    if c.one_domain and o.nvlink == "segment":
        words.append(f"--segment={len(c.hosts)}")
    elif c.one_domain and o.nvlink == "switches":
        words.append("--switches=1" + (f"@{o.switches_wait}" if o.switches_wait else ""))
    lines = [" ".join(words)]
    lines += list(o.extra_sbatch) + list(getattr(o.component_sbatch, c.kind))
    return lines


def job_hash(plan: Plan) -> str:
    """What makes the job itself differ (its components and their sbatch options, the services on them, where it
    keeps its files, how steps start), not readiness or start order and not how long `up` waits."""
    o = options(plan)
    doc = {"job_dir": o.job_dir, "interface": o.interface, "srun_args": o.srun_args, "components": [
        {"hosts": c.hosts, "gpus": c.gpus_per_node, "domain": c.one_domain, "services": c.services,
         "directives": directives(plan, c)} for c in components(plan)]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def job_script(plan: Plan) -> str:
    """The sbatch script: header per component, then bind, start in waves, and watch."""
    o = options(plan)
    comps = components(plan)
    host_of = {s.name: s.host for s in plan.services}
    comp_of = {h: c.index for c in comps for h in c.hosts}
    runtimes = sorted({plan.serving.runtime[h].python for h in plan.deployed_hosts()})
    return template("slurm-job.sh.j2").render(
        plan=plan, o=o, comps=comps, het=len(comps) > 1, deploy=deploy_dir(plan), job_name=job_name(plan),
        directives={c.index: directives(plan, c) for c in comps}, waves=plan.start_waves(), host_of=host_of,
        comp_of=comp_of, q=shlex.quote, srun_args=" ".join(o.srun_args), runtimes=runtimes,
        segment_note=SEGMENT_NOTE if any(c.one_domain for c in comps) and o.nvlink == "segment" else "",
        workdirs=sorted({plan.host(h).workdir for h in plan.deployed_hosts()}),
        sd_dir=slurm_monitoring.sd_dir(deploy_dir(plan)) if plan.monitoring else "",
        targets=slurm_monitoring.TARGETS,
        gate=slurm_monitoring.GATE if plan.monitoring else "",
    )


def waiter_source() -> bytes:
    """bin/primectl-wait: host/slurm_wait.py (with the probes the host agent runs) as a zip application, stdlib
    only."""
    return zipapp("primectl.host.slurm_wait")


def render_release(plan: Plan) -> Bundle:
    """The job's release directory: job.sbatch, run scripts, readiness probes, configs, model, manifest; and
    for a monitored plan, what runs outside the job (monitoring/, targets/slurm_monitoring.py)."""
    deploy = deploy_dir(plan)
    outside = slurm_monitoring.render(plan, deploy)
    plan = slurm_monitoring.job_plan(plan)
    files: dict[str, bytes] = dict(outside)
    modes = {path: 0o644 for path in outside}
    services: dict[str, object] = {}
    for host_name in plan.deployed_hosts():
        # Secrets are written once per deployment, next to its releases (the run scripts source them).
        host = plan.host(host_name).model_copy(update={"workdir": deploy})
        bundle = render_host(plan, host)
        for path, data in bundle.files.items():
            if path == MANIFEST or path.startswith("systemd/"):
                continue
            if path in files and files[path] != data:
                raise ValueError(f"two services write different {path}")
            files[path] = data
            modes[path] = bundle.modes.get(path, 0o644)
        for name, entry in bundle.services.items():
            services[name] = {**entry, "host": host_name}
    for svc in plan.services:
        files[f"ready/{svc.name}.json"] = (json.dumps(svc.ready.model_dump(mode="json"), indent=2, sort_keys=True)
                                           + "\n").encode()
        modes[f"ready/{svc.name}.json"] = 0o644
    files[WAITER] = waiter_source()
    modes[WAITER] = 0o755
    files[JOB_SCRIPT] = job_script(plan).encode()
    modes[JOB_SCRIPT] = 0o755
    revision = hash_files(files)[:16]
    manifest: dict[str, object] = {
        "deployment": plan.name, "namespace": plan.namespace, "target": "slurm", "revision": revision,
        "job_hash": job_hash(plan), "runtime_key": plan.runtime_key, "services": services,
        "files": {p: hashlib.sha256(b).hexdigest() for p, b in sorted(files.items())},
    }
    files[MANIFEST] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    modes[MANIFEST] = 0o644
    return Bundle("job", files, modes, revision, manifest)

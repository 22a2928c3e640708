"""A monitored recipe on Slurm: exporters as node daemons, Prometheus and Alertmanager on the head, the job's
scrape targets as Prometheus file_sd files.

The Monitoring component plans its services for hosts that run them all the time. On Slurm the job is not such a
host: a GPU must be watched between jobs, and Prometheus must outlive the job it watches. So none of them is a
job step (`job_plan`); the release carries instead, under monitoring/ (`render`):

    node/primectl-node-exporter.service, node/primectl-dcgm-exporter.service, node/dcgm-counters.csv,
    node/primectl-health.service, node/primectl-health-gpu.service, node/health/*.py
                          systemd units for every node (dcgm-exporter: GPU nodes), from the planned argv with the
                          node's own address left to the unit (all addresses): the health loop writes the node's
                          checks into node_exporter's textfile directory, and the readiness gate of the job that
                          runs (gate.url, which the job publishes) while one does
    gate.url              the planned readiness gate, node marker and all: the job binds it and publishes it to
                          `sd_dir` as gate.<job id>.url once it serves, until it ends
    head/prometheus.yml, head/primectl.rules.yml, head/alertmanager.yml, head/primectl-<name>-*.service
                          Prometheus and Alertmanager for the head; prometheus.yml reads the job's targets from
                          file_sd files and scrapes itself and Alertmanager on localhost
    targets/<scrape job>.json
                          the planned static targets of each scrape job, node markers and all: the job's batch
                          script binds them like the rest of the release, writes them to `sd_dir` as
                          <scrape job>.<job id>.json once every service is ready and removes them when it ends
    README.txt            what to install where

Labels are the planned ones (deployment, service, host = the logical host, role), so the head evaluates the same
rule file as a bare-metal Prometheus.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from typing import Any

import yaml

from primectl.components import monitoring as mon
from primectl.monitoring import scrape
from primectl.plan.model import MonitoringPlan, Plan, Service
from primectl.render.bundle import template
from primectl.targets.slurm_recipe import Slurm

OUTSIDE_JOB = mon.SERVICE_COMPONENTS
ON_HEAD = ("prometheus", "alertmanager")
NODE_DAEMONS = ("node-exporter", "dcgm-exporter")
TARGETS = "monitoring/targets"  # in the release, one file per scrape job (the job binds and publishes them)
HEAD_HOST = "slurm-head"  # the host label of Prometheus's and Alertmanager's own targets
NODE_COUNTERS = "/etc/primectl/dcgm-counters.csv"
NODE_HEALTH = "/etc/primectl/health"  # the health loop and the two modules it imports, on every node
NODE_TEXTFILES = "/var/lib/primectl/textfiles"  # the health loop writes here, the node's node_exporter reads it
NODE_PYTHON = "/usr/bin/python3"
GATE = "monitoring/gate.url"  # in the release: the planned gate, bound and published by the job


def job_plan(plan: Plan) -> Plan:
    """The plan the job runs: without the monitoring services, and with Prometheus and Alertmanager where they
    answer on Slurm (the head, on the machine primectl runs on). The plan itself when it does not monitor."""
    if plan.monitoring is None:
        return plan
    services = [s for s in plan.services if s.component not in OUTSIDE_JOB]
    gone = {s.name for s in plan.services} - {s.name for s in services}
    needing = [f"{s.name} -> {d}" for s in services for d in s.depends_on if d in gone]
    if needing:
        raise ValueError(f"job services depend on monitoring services, which do not run in the job: {needing}")
    return plan.model_copy(update={"services": services, "monitoring": head_monitoring(plan)})


def sd_dir(deploy_dir: str) -> str:
    """Where the jobs publish their targets and the head's Prometheus reads them (the shared filesystem)."""
    return posixpath.join(deploy_dir, "monitoring", "targets")


def head_dir(plan: Plan) -> str:
    """Where the head keeps the deployment's Prometheus and Alertmanager configuration (`slurm.head_dir`)."""
    return posixpath.join(Slurm.model_validate(plan.target.options).head_dir, plan.name)


def data_dir(plan: Plan) -> str:
    """Where the head's Prometheus and Alertmanager keep their data (`slurm.head_data_dir`)."""
    return posixpath.join(Slurm.model_validate(plan.target.options).head_data_dir, plan.name)


def head_monitoring(plan: Plan) -> MonitoringPlan | None:
    """Where the head's Prometheus and Alertmanager answer (this machine), None when the plan does not monitor."""
    if plan.monitoring is None or not any(s.component == "prometheus" for s in plan.services):
        return plan.monitoring  # none, or a job's plan, whose monitoring is the head's already
    return plan.monitoring.model_copy(update={
        "host": HEAD_HOST, "prometheus_url": f"http://127.0.0.1:{component_port(plan, 'prometheus')}",
        "alertmanager_url": f"http://127.0.0.1:{component_port(plan, 'alertmanager')}"})


def _service(plan: Plan, component: str) -> Service:
    return next(s for s in plan.services if s.component == component)


def component_port(plan: Plan, component: str) -> int:
    """The port the planned service of `component` listens on (the head's Prometheus and Alertmanager, a node's
    exporters)."""
    return next(iter(_service(plan, component).ports.values()))


def _file(svc: Service, path: str) -> str:
    return next(f.content for f in svc.files if f.path == path)


def _rewrite(argv: list[str], flags: dict[str, str | None]) -> list[str]:
    """`--flag=value` arguments with the values `flags` gives (None: the argument dropped); others as they are."""
    out = [argv[0]]
    for arg in argv[1:]:
        name = arg.split("=", 1)[0]
        if name in flags:
            if flags[name] is not None:
                out.append(f"{name}={flags[name]}")
        else:
            out.append(arg)
    return out


def _swap(argv: list[str], values: dict[str, str]) -> list[str]:
    """`-f VALUE` style arguments with the values `values` gives."""
    return [values.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]


HOSTNAME = "%H"  # systemd's specifier for the node's host name: the one argument whose `%` it may expand


def _word(arg: str) -> str:
    """One ExecStart argument as systemd reads it: `%` kept from its specifiers (but HOSTNAME), double-quoted (C
    escapes) where it is empty or holds a blank or a quote."""
    if "\n" in arg or "$" in arg:
        raise ValueError(f"a unit argument cannot hold a newline or `$`: {arg!r}")
    if arg == HOSTNAME:
        return arg
    arg = arg.replace("%", "%%")
    if arg and not any(c in arg for c in " \t\"'\\"):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unit(description: str, argv: list[str], *, mounts: str = "") -> bytes:
    exec_start = " ".join(_word(a) for a in argv)
    return template("monitoring-unit.service.j2").render(description=description, exec_start=exec_start,
                                                         mounts=mounts).encode()


def _health_loops(plan: Plan) -> dict[str, Service]:
    """The planned health loops a node unit is made from, by unit name: primectl-health (a node without GPUs) and
    primectl-health-gpu (a GPU node: the GPU, ECC/Xid, NVLink and InfiniBand checks too)."""
    loops = [s for s in plan.services if s.component == "health-check"]
    out = {}
    for name, gpu in (("primectl-health", False), ("primectl-health-gpu", True)):
        loop = next((s for s in loops if ("--gpus" in s.argv) == gpu), None)
        if loop is not None:
            out[name] = loop
    return out


def _health_argv(loop: Service, deploy_dir: str) -> list[str]:
    """A node's health loop: the planned one with the node's own files and host name (systemd's %H), and the
    gate the running job published instead of a planned one (none between jobs)."""
    planned = [a for i, a in enumerate(loop.argv) if a != "--gate" and loop.argv[i - 1] != "--gate"]
    args = _swap(planned, {"--textfile-dir": NODE_TEXTFILES, "--host": HOSTNAME, "--workdir": deploy_dir})[2:]
    return [NODE_PYTHON, posixpath.join(NODE_HEALTH, posixpath.basename(mon.HEALTH_LOOP)), *args,
            "--gate-file", posixpath.join(sd_dir(deploy_dir), "gate.*.url")]


def _node_units(plan: Plan, deploy_dir: str) -> dict[str, bytes]:
    units: dict[str, Callable[[Service], list[str]]] = {
        "node-exporter": lambda s: _rewrite(s.argv, {"--web.listen-address": f":{component_port(plan, 'node-exporter')}",
                                                     "--collector.textfile.directory": NODE_TEXTFILES}),
        "dcgm-exporter": lambda s: _swap(s.argv, {"-f": NODE_COUNTERS, "-a": f":{component_port(plan, 'dcgm-exporter')}"}),
    }
    out = {}
    for component, argv in units.items():
        planned = [s for s in plan.services if s.component == component]
        if planned:
            out[f"monitoring/node/primectl-{component}.service"] = _unit(f"{component} (node daemon)", argv(planned[0]))
    if "monitoring/node/primectl-dcgm-exporter.service" in out:
        out["monitoring/node/dcgm-counters.csv"] = _file(_service(plan, "dcgm-exporter"), mon.DCGM_COUNTERS).encode()
    for name, loop in _health_loops(plan).items():
        out[f"monitoring/node/{name}.service"] = _unit("health checks (node daemon)", _health_argv(loop, deploy_dir),
                                                       mounts=deploy_dir)  # the gate file and the disk checked
        out.update({f"monitoring/node/health/{posixpath.basename(f.path)}": f.content.encode() for f in loop.files})
    gate = next((s.argv[s.argv.index("--gate") + 1] for s in plan.services
                 if s.component == "health-check" and "--gate" in s.argv), None)
    if gate:
        out[GATE] = f"{gate}\n".encode()
    return out


def head_argv(plan: Plan) -> dict[str, list[str]]:
    """How the head runs Prometheus and Alertmanager ({component: argv}): the planned argv with the head's files,
    data and port."""
    home, data = head_dir(plan), data_dir(plan)
    prom, am = _service(plan, "prometheus"), _service(plan, "alertmanager")
    return {
        "prometheus": _rewrite(prom.argv, {
            "--config.file": f"{home}/prometheus.yml", "--storage.tsdb.path": f"{data}/prometheus",
            "--web.listen-address": f":{component_port(plan, 'prometheus')}", "--web.external-url": None}),
        "alertmanager": _rewrite(am.argv, {
            "--config.file": f"{home}/alertmanager.yml", "--storage.path": f"{data}/alertmanager",
            "--web.listen-address": f":{component_port(plan, 'alertmanager')}", "--web.external-url": None}),
    }


# the files under monitoring/head/ each of the head's components reads
HEAD_FILES = {"prometheus": ("prometheus.yml", posixpath.basename(mon.RULES)),
              "alertmanager": (posixpath.basename(mon.ALERTMANAGER_CONFIG),)}


def _head_units(plan: Plan) -> dict[str, bytes]:
    names = {"prometheus": "Prometheus", "alertmanager": "Alertmanager"}
    return {f"monitoring/head/primectl-{plan.name}-{c}.service": _unit(f"{names[c]} of deployment {plan.name}", argv)
            for c, argv in head_argv(plan).items()}


def head_config(plan: Plan, targets_dir: str) -> str:
    """The head's prometheus.yml: the planned one, with the job's targets read from `targets_dir` (file_sd) and
    Prometheus and Alertmanager on localhost."""
    planned = yaml.safe_load(_file(_service(plan, "prometheus"), mon.PROMETHEUS_CONFIG))
    jobs: list[dict[str, Any]] = []
    for job in planned["scrape_configs"]:
        name = job["job_name"]
        if name in ON_HEAD:
            static = [{"targets": [f"localhost:{component_port(plan, name)}"], "labels": {**t["labels"], "host": HEAD_HOST}}
                      for t in job["static_configs"]]
            jobs.append({"job_name": name, "static_configs": static})
        else:
            jobs.append({"job_name": name, "file_sd_configs": [{"files": [posixpath.join(targets_dir, f"{name}.*.json")]}]})
    g = planned["global"]
    return scrape.prometheus_config(jobs=jobs, scrape_interval=g["scrape_interval"],
                                    evaluation_interval=g["evaluation_interval"],
                                    alertmanager=f"localhost:{component_port(plan, 'alertmanager')}",
                                    rule_files=planned["rule_files"], deployment=plan.name)


def target_files(plan: Plan) -> dict[str, bytes]:
    """monitoring/targets/<scrape job>.json: each job's planned static targets (node markers unbound)."""
    planned = yaml.safe_load(_file(_service(plan, "prometheus"), mon.PROMETHEUS_CONFIG))
    return {f"{TARGETS}/{job['job_name']}.json": (json.dumps(job["static_configs"], indent=2) + "\n").encode()
            for job in planned["scrape_configs"] if job["job_name"] not in ON_HEAD}


def render(plan: Plan, deploy_dir: str) -> dict[str, bytes]:
    """Everything under monitoring/ in the release ({} when the recipe does not monitor)."""
    if plan.monitoring is None:
        return {}
    prom = _service(plan, "prometheus")
    home = head_dir(plan)
    files = {
        **target_files(plan), **_node_units(plan, deploy_dir), **_head_units(plan),
        "monitoring/head/prometheus.yml": head_config(plan, sd_dir(deploy_dir)).encode(),
        f"monitoring/head/{posixpath.basename(mon.RULES)}": _file(prom, mon.RULES).encode(),
        f"monitoring/head/{posixpath.basename(mon.ALERTMANAGER_CONFIG)}":
            _file(_service(plan, "alertmanager"), mon.ALERTMANAGER_CONFIG).encode(),
    }
    node_units = sorted(p for p in files if p.startswith("monitoring/node/") and p.endswith(".service"))
    head_units = sorted(p for p in files if p.startswith("monitoring/head/") and p.endswith(".service"))
    files["monitoring/README.txt"] = template("slurm-monitoring.txt.j2").render(
        name=plan.name, sd_dir=sd_dir(deploy_dir), head_dir=home, head_host=HEAD_HOST,
        dcgm="monitoring/node/dcgm-counters.csv" in files, counters=NODE_COUNTERS,
        counters_name=posixpath.basename(NODE_COUNTERS),
        node_units=[p.removeprefix("monitoring/") for p in node_units],
        cpu_units=[n for n in ("primectl-node-exporter", "primectl-health") if f"monitoring/node/{n}.service" in files],
        gpu_units=[n for n in ("primectl-node-exporter", "primectl-dcgm-exporter", "primectl-health-gpu")
                   if f"monitoring/node/{n}.service" in files],
        health=NODE_HEALTH if any(p.startswith("monitoring/node/health/") for p in files) else "",
        textfiles=NODE_TEXTFILES,
        head_configs=[f"head/{n}" for n in ("prometheus.yml", posixpath.basename(mon.RULES),
                                            posixpath.basename(mon.ALERTMANAGER_CONFIG))],
        head_units=[p.removeprefix("monitoring/") for p in head_units],
        head_unit_names=[posixpath.basename(p).removesuffix(".service") for p in head_units],
        prometheus_port=component_port(plan, "prometheus"), alertmanager_port=component_port(plan, "alertmanager"),
    ).encode()
    return files

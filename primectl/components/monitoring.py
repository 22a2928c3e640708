"""Monitoring (`monitoring:`): Prometheus, Alertmanager, node_exporter and a health-check loop on every host, and
dcgm-exporter on every GPU host, planned after everything they watch.

Prometheus scrapes every planned service that has a metrics URL (primectl/monitoring/scrape.py) and evaluates
primectl's rules (primectl/monitoring/rules.py); Alertmanager routes what fires to the recipe's receivers. Both
take a change of their files by SIGHUP after the new files pass `promtool` / `amtool`, so a plan change (a worker
more) reloads them without losing their data. The health loop runs the host checks every `health_interval` and
writes node_exporter textfile metrics, so a check that fails between launches fires an alert.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from primectl.components.base import NotRendered
from primectl.engines.base import PlanContext
from primectl.errors import Finding
from primectl.monitoring import alertmanager as am
from primectl.monitoring import rules as rules_mod
from primectl.monitoring import scrape
from primectl.monitoring.model import KEY, MonitoringBlock, duration_s
from primectl.plan.model import RELEASE, WORKER_ROLES, FileSpec, HardwareFacts, HostPlan, Probe, Reload, Service
from primectl.recipe.model import Recipe

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
AMTOOL = "/usr/bin/amtool"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
DCGM_EXPORTER = "/usr/bin/dcgm-exporter"
PROMETHEUS_CONFIG = "config/prometheus.yml"
RULES = "config/primectl.rules.yml"
ALERTMANAGER_CONFIG = "config/alertmanager.yml"
HEALTH_LOOP = "probes/health_loop.py"
DCGM_COUNTERS = "config/dcgm-counters.csv"
# The `component` of every service this component plans (a target tells them from the deployment's own).
SERVICE_COMPONENTS = ("node-exporter", "health-check", "dcgm-exporter", "alertmanager", "prometheus")


@dataclass(frozen=True)
class Watched:
    """What monitoring is planned for: a deployment (or a fleet's gateway tier), its hosts with their GPUs, each
    host's runtime Python, its hardware, its readiness gate and the host Prometheus runs on by default."""

    name: str
    hosts: dict[str, HostPlan]
    pythons: dict[str, str]
    hw: HardwareFacts
    gate: str
    home: str

    @classmethod
    def of(cls, ctx: PlanContext) -> Watched:
        """A deployment's, from its plan context: its gate is the served model's readiness at the frontend."""
        fe = ctx.recipe.frontend
        gate = f"http://{ctx.hosts[fe.host].address}:{fe.port}/v1/models/{ctx.recipe.model.served_name}/ready"
        hw = HardwareFacts(profile=ctx.recipe.hardware.profile, gpu=ctx.hw.gpu, sm=ctx.hw.sm,
                           gpus_per_host=ctx.hw.gpus_per_host, hosts_per_nvlink_domain=ctx.hw.hosts_per_nvlink_domain)
        return cls(name=ctx.recipe.name, hosts=ctx.hosts, pythons={h: ctx.python(h) for h in ctx.hosts}, hw=hw,
                   gate=gate, home=fe.host)

    def python(self, host: str) -> str:
        """The Python interpreter of the host runtime."""
        return self.pythons[host]


def block(ctx: PlanContext) -> MonitoringBlock | None:
    """The recipe's monitoring block, when it is on."""
    mon = getattr(ctx.recipe, KEY, None)
    return mon if isinstance(mon, MonitoringBlock) and mon.enabled else None


def textfile_dir(workdir: str) -> str:
    """Where the health loop writes, and node_exporter reads, textfile metrics (kept across releases)."""
    return posixpath.join(workdir, "run", "textfile")


def node_exporter(w: Watched, mon: MonitoringBlock, host: str) -> Service:
    """node_exporter on `host`: host metrics, InfiniBand ports (from `sysfs`) and the health loop's textfiles."""
    addr = w.hosts[host].address
    port = mon.ports.node_exporter
    textfiles = textfile_dir(w.hosts[host].workdir)
    return Service(
        name=f"node-exporter-{host}", role="auxiliary", component="node-exporter", host=host, address=addr,
        argv=[NODE_EXPORTER, f"--web.listen-address={addr}:{port}", f"--path.sysfs={mon.sysfs}",
              f"--collector.textfile.directory={textfiles}", "--collector.infiniband"],
        dirs=[textfiles], ports={"metrics": port}, listens=[port],
        ready=Probe(kind="http", url=f"http://{addr}:{port}/metrics", timeout_s=30),
        metrics_url=f"http://{addr}:{port}/metrics",
    )


def health_loop(w: Watched, mon: MonitoringBlock, host: str, gate: str | None) -> Service:
    """The host's health checks on a timer, written as textfile metrics for node_exporter: preflight's host facts
    and rules (shipped beside the loop), with the GPU checks where the plan gives the host GPUs."""
    from importlib.resources import files

    workdir = w.hosts[host].workdir
    hw = w.hw
    gpus = w.hosts[host].gpus if (hw.gpus_per_host or hw.gpu) else 0  # as preflight's host_needs counts them
    argv = [w.python(host), f"{RELEASE}/{HEALTH_LOOP}", "--textfile-dir", textfile_dir(workdir),
            "--interval", str(duration_s(mon.health_interval)), "--host", host, "--workdir", workdir]
    if gpus:
        argv += ["--gpus", str(gpus), "--gpu-name", hw.gpu, "--sm", str(hw.sm)]
        argv += ["--multi-host"] if len(w.hosts) > 1 else []
        argv += ["--nvlink-expected"] if hw.hosts_per_nvlink_domain > 1 or hw.gpus_per_host > 1 else []
    if gate:
        argv += ["--gate", gate]
    shipped = [FileSpec(path=HEALTH_LOOP, content=files("primectl.checks").joinpath("health_loop.py").read_text(),
                        mode=0o755)]
    shipped += [FileSpec(path=posixpath.join(posixpath.dirname(HEALTH_LOOP), name),  # stdlib only; the loop imports them
                         content=files("primectl.checks").joinpath(name).read_text())
                for name in ("preflight_host.py", "host_rules.py")]
    return Service(
        name=f"health-{host}", role="auxiliary", component="health-check", host=host, address=w.hosts[host].address,
        argv=argv, dirs=[textfile_dir(workdir)], files=shipped,
        ready=Probe(kind="command", command=["test", "-s", posixpath.join(textfile_dir(workdir), "primectl_health.prom")],
                    timeout_s=60),
    )


def dcgm_exporter(w: Watched, mon: MonitoringBlock, host: str) -> Service:
    """dcgm-exporter on a GPU host, collecting primectl's counters every `dcgm_interval_ms`."""
    from primectl.monitoring.dcgm import counters_csv

    addr = w.hosts[host].address
    port = mon.ports.dcgm_exporter
    return Service(
        name=f"dcgm-exporter-{host}", role="auxiliary", component="dcgm-exporter", host=host, address=addr,
        argv=[DCGM_EXPORTER, "-f", f"{RELEASE}/{DCGM_COUNTERS}", "-c", str(mon.dcgm_interval_ms),
              "-a", f"{addr}:{port}"],
        files=[FileSpec(path=DCGM_COUNTERS, content=counters_csv())],
        ports={"metrics": port}, listens=[port],
        ready=Probe(kind="http", url=f"http://{addr}:{port}/metrics", timeout_s=60),
        metrics_url=f"http://{addr}:{port}/metrics",
    )


def alertmanager(w: Watched, mon: MonitoringBlock, host: str) -> Service:
    """Alertmanager, alone (no cluster), its silences under the workdir."""
    addr = w.hosts[host].address
    port = mon.ports.alertmanager
    workdir = w.hosts[host].workdir
    current = posixpath.join(workdir, "current", ALERTMANAGER_CONFIG)
    return Service(
        name="alertmanager", role="auxiliary", component="alertmanager", host=host, address=addr,
        argv=[ALERTMANAGER, f"--config.file={current}", f"--storage.path={posixpath.join(workdir, 'data', 'alertmanager')}",
              f"--web.listen-address={addr}:{port}", "--cluster.listen-address=", f"--web.external-url=http://{addr}:{port}"],
        files=[FileSpec(path=ALERTMANAGER_CONFIG, content=am.alertmanager_config(mon.alerts, w.name))],
        ports={"http": port}, listens=[port],
        ready=Probe(kind="http", url=f"http://{addr}:{port}/-/ready", timeout_s=30),
        metrics_url=f"http://{addr}:{port}/metrics",
        reload=Reload(signal="SIGHUP", check=[AMTOOL, "check-config", current]),
    )


def prometheus(w: Watched, mon: MonitoringBlock, host: str, planned: list[Service], am_svc: Service) -> Service:
    """Prometheus scraping every planned service with metrics (itself and Alertmanager included)."""
    addr = w.hosts[host].address
    port = mon.ports.prometheus
    workdir = w.hosts[host].workdir
    current = posixpath.join(workdir, "current", PROMETHEUS_CONFIG)
    me = f"http://{addr}:{port}"
    placeholder = Service(name="prometheus", role="auxiliary", component="prometheus", host=host, address=addr,
                          argv=[], ready=Probe(kind="tcp"), metrics_url=f"{me}/metrics")
    scraped = [*planned, placeholder]
    facts = rules_mod.RuleFacts(
        deployment=w.name, slo=mon.slo, scrape_interval=mon.scrape_interval,
        workers={role: sum(1 for s in planned if s.role == role) for role in WORKER_ROLES
                 if any(s.role == role for s in planned)},
        roles=tuple(sorted({s.role for s in scraped if s.metrics_url})),
        components=tuple(sorted({s.component for s in scraped if s.metrics_url})),
        health_interval=mon.health_interval,
        infiniband=mon.infiniband if mon.infiniband is not None else w.hw.gpus_per_host > 0,
        nvlink_domain=w.hw.hosts_per_nvlink_domain > 1,
        gateway_replicas=sum(1 for s in planned if s.component == rules_mod.GATEWAY_JOB))
    config = scrape.prometheus_config(
        jobs=scrape.scrape_jobs(scraped, w.name), scrape_interval=mon.scrape_interval,
        evaluation_interval=mon.evaluation_interval, alertmanager=f"{am_svc.address}:{am_svc.ports['http']}",
        rule_files=[posixpath.basename(RULES)], deployment=w.name)  # read beside the config
    return Service(
        name="prometheus", role="auxiliary", component="prometheus", host=host, address=addr,
        argv=[PROMETHEUS, f"--config.file={current}", f"--storage.tsdb.path={posixpath.join(workdir, 'data', 'prometheus')}",
              f"--storage.tsdb.retention.time={mon.retention}", f"--web.listen-address={addr}:{port}",
              f"--web.external-url={me}"],
        files=[FileSpec(path=PROMETHEUS_CONFIG, content=config), FileSpec(path=RULES, content=rules_mod.rules_yaml(facts))],
        # after everything it watches: a first `up` has started and waited for all of it before the first scrape
        ports={"http": port}, listens=[port], depends_on=[s.name for s in planned],
        ready=Probe(kind="http", url=f"{me}/-/ready", timeout_s=60),
        metrics_url=f"{me}/metrics",
        reload=Reload(signal="SIGHUP", check=[PROMTOOL, "check", "config", current]),
    )


def monitor(w: Watched, mon: MonitoringBlock, planned: list[Service]) -> list[Service]:
    """`planned`, then exporters and the health loop on every host, then Alertmanager and Prometheus on the
    monitoring host (`mon.host`, default `w.home`) watching all of it."""
    home = mon.host or w.home
    added: list[Service] = []
    for host in w.hosts:
        added.append(node_exporter(w, mon, host))
        added.append(health_loop(w, mon, host, w.gate if host == home else None))
        if w.hosts[host].gpus:
            added.append(dcgm_exporter(w, mon, host))
    am_svc = alertmanager(w, mon, home)
    return [*planned, *added, am_svc, prometheus(w, mon, home, [*planned, *added, am_svc], am_svc)]


class Monitoring:
    """The monitoring services, when the recipe's `monitoring:` block is on."""

    name = KEY
    stage = "edge"

    def recipe_block(self) -> tuple[str, type[MonitoringBlock]]:
        """`monitoring:`."""
        return KEY, MonitoringBlock

    def validate(self, recipe: Recipe) -> list[Finding]:
        """Prometheus's host must be one of the recipe's."""
        mon = getattr(recipe, KEY, None)
        hosts = [h.name for h in recipe.host_list()]
        if isinstance(mon, MonitoringBlock) and mon.enabled and mon.host is not None and mon.host not in hosts:
            return [Finding((KEY, "host"), f"{mon.host!r} is not a host of this recipe; allowed: {', '.join(hosts)}")]
        return []

    def extend(self, ctx: PlanContext, planned: list[Service]) -> list[Service]:
        """Exporters and the health loop on every host, then Alertmanager and Prometheus on the monitoring host."""
        mon = block(ctx)
        return planned if mon is None else monitor(Watched.of(ctx), mon, planned)

    def kubernetes(self, service: Service) -> NotRendered:
        """Not rendered as DGD components: the cluster's Prometheus operator scrapes the PodMonitor and loads the
        PrometheusRule the target writes beside the DGD; the cluster runs its own node exporters."""
        if service.component in ("node-exporter", "dcgm-exporter"):
            return NotRendered("the cluster runs its own on every node (e.g. kube-prometheus-stack's node-exporter, "
                               "the GPU operator's dcgm-exporter)")
        if service.component == "health-check":
            return NotRendered("host checks of a machine primectl runs on; the operator probes every pod")
        return NotRendered("the cluster's Prometheus operator scrapes the PodMonitor and evaluates the PrometheusRule "
                           "of monitoring.yaml")

"""A fleet recipe -> its deployments' Plans and the gateway tier's Plan, without I/O on any host.

The gateway tier is planned as a deployment of its own (its own state, lock and release history on its hosts)
so that `up`, `diff`, `status` and `down` drive it through the same pipeline and target as any deployment:
its etcd first, then the replicas, then HAProxy in front of them (the fleet's public endpoint), rolled one
replica at a time through HAProxy when their configuration changes.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from primectl.components.etcd import EtcdMember, etcd_cluster, solo_etcd
from primectl.components.haproxy import TLS_CERT, drain_behind, haproxy_service, request_buffer, tls_files
from primectl.components.monitoring import Watched, monitor
from primectl.deploy.access import SSHOptions, with_access
from primectl.errors import Problem, RecipeError
from primectl.fleet.model import FleetRecipe
from primectl.monitoring.rules import GATEWAY_JOB
from primectl.monitoring.where import monitoring_plan
from primectl.plan.layout import Layout
from primectl.plan.model import (
    RELEASE,
    FileSpec,
    HardwareFacts,
    HostPlan,
    Plan,
    Probe,
    RoleRollout,
    Runtime,
    Service,
    TargetSpec,
)
from primectl.recipe.kind import recipe_kind
from primectl.recipe.yamlpos import Path as YamlPath
from primectl.recipe.yamlpos import Position, load_yaml

# A replica is the package primectl.fleet.gateway, shipped as `fleet_gateway` in a directory that Python runs
# through its __main__.py: with -I, a script's own directory is not on sys.path, but a directory run that way is.
REPLICA_DIR = "gateway-replica"
REPLICA_PACKAGE = "fleet_gateway"
REPLICA_MAIN = f"from {REPLICA_PACKAGE}.replica import main\n\nmain()\n"
# The gateway's hosts, as monitoring sees them: no GPU to watch, whatever its deployments run on.
NO_GPU = HardwareFacts(profile="cpu", gpu="", sm=0, gpus_per_host=0, hosts_per_nvlink_domain=1)
TLS_READY_SCRIPT = "gateway/tls_ready.py"
PREFIX = "/primectl/fleet"
# The gateway etcd sends a watch that asks for it a progress notification this often; a replica whose watch hears
# nothing for three of them moves it to the next member (one it can no longer reach drops packets, refuses nothing).
WATCH_PROGRESS_S = 2


class Member(BaseModel):
    """One deployment of the fleet, as the gateway routes to it."""

    name: str
    recipe: str
    weight: int
    role: str
    capacity: int
    endpoint: str
    served_model: str


class FleetPlan(BaseModel):
    """Everything the fleet commands need: the members (with their Plans) and the gateway tier's Plan."""

    name: str
    endpoint: str
    served_model: str
    prefix: str
    etcd: list[str]
    members: list[Member]
    plans: list[Plan]
    gateway: Plan


@dataclass
class LoadedFleet:
    """A validated fleet recipe, where each of its nodes was written."""

    recipe: FleetRecipe
    file: str
    positions: dict[YamlPath, Position]

    def problem(self, path: YamlPath, message: str) -> Problem:
        """A problem pinned to the nearest written node of `path`."""
        from primectl.planner.load import to_problem

        return to_problem(path, message, self.file, self.positions)


def load_fleet(path: str | Path) -> LoadedFleet:
    """Parse and validate a fleet recipe (RecipeError with every problem, pinned to its line)."""
    from primectl.planner.load import _pydantic_problems, read_text

    file = str(path)
    data, positions = load_yaml(read_text(Path(path)), file)
    try:
        recipe = FleetRecipe.model_validate(data)
    except ValidationError as exc:
        raise RecipeError(_pydantic_problems(exc, data, file, positions, FleetRecipe)) from None  # type: ignore[arg-type]
    loaded = LoadedFleet(recipe, file, positions)
    hosts = [h.name for h in recipe.hosts]
    for where, host in [(("gateway", "host"), recipe.gateway.host),
                        (("monitoring", "host"), recipe.monitoring.host if recipe.monitoring else None)]:
        if host is not None and host not in hosts:
            raise RecipeError([loaded.problem(where, f"{host!r} is not one of `hosts:`; allowed: {', '.join(hosts)}")])
    problems = etcd_host_problems(loaded)
    if problems:
        raise RecipeError(problems)
    tls = recipe.gateway.tls
    if tls is not None:
        from primectl.fleet.tls import check_pair

        base = Path(path).resolve().parent
        tls_problems = check_pair(base / tls.cert, base / tls.key)
        if tls_problems:
            raise RecipeError([loaded.problem(("gateway", "tls", f), m) for f, m in sorted(tls_problems.items())])
    return loaded


def etcd_hosts(r: FleetRecipe) -> list[str]:
    """The hosts of the gateway's etcd members, in recipe order (default: the gateway's host)."""
    return r.gateway.etcd_hosts or [r.gateway.host]


def etcd_host_problems(loaded: LoadedFleet) -> list[Problem]:
    """What is wrong with `gateway.etcd_hosts`: a name not of `hosts:`, a host or address named twice (two members
    would bind the same ports), an even count (a quorum is a majority: an even cluster outlives no more losses than
    the odd one below it)."""
    r = loaded.recipe
    named = r.gateway.etcd_hosts
    if named is None:
        return []
    address = {h.name: h.address for h in r.hosts}
    out: list[Problem] = []
    seen: dict[str, str] = {}
    for i, name in enumerate(named):
        where = ("gateway", "etcd_hosts", i)
        if name not in address:
            out.append(loaded.problem(where, f"{name!r} is not one of `hosts:`; allowed: {', '.join(address)}"))
        elif name in named[:i]:
            out.append(loaded.problem(where, f"{name!r} is named twice: one etcd member per host"))
        elif address[name] in seen:
            out.append(loaded.problem(where, f"{name!r} is at {address[name]}, as {seen[address[name]]!r} is: one "
                                             "etcd member per address"))
        else:
            seen[address[name]] = name
    if len(named) % 2 == 0:
        out.append(loaded.problem(("gateway", "etcd_hosts"), f"{len(named)} etcd hosts: use an odd number (1, 3, 5 "
                                                             "or 7); a majority of them must be up"))
    return out


def plan_fleet(path: str | Path) -> FleetPlan:
    """Load the fleet and every deployment it names, and plan the gateway tier (RecipeError on bad input)."""
    from primectl.planner.build import plan_recipe

    loaded = load_fleet(path)
    r = loaded.recipe
    base_dir = Path(path).resolve().parent
    problems: list[Problem] = []
    plans: list[Plan] = []
    members: list[Member] = []
    for i, m in enumerate(r.deployments):
        where = ("deployments", i)
        file = (base_dir / m.recipe).resolve()
        if not file.is_file():
            problems.append(loaded.problem((*where, "recipe"), f"no such recipe file: {file}"))
            continue
        if recipe_kind(file) != "deployment":
            problems.append(loaded.problem((*where, "recipe"), f"{file} is a {recipe_kind(file)}, not a deployment"))
            continue
        try:
            dep_loaded, plan = plan_recipe(file)
        except RecipeError as exc:
            problems += exc.problems
            continue
        capacity = m.capacity
        decode = dep_loaded.recipe.decode
        if capacity is None and decode.max_num_seqs:
            capacity = decode.workers * decode.max_num_seqs
        if capacity is None:
            problems.append(loaded.problem((*where,), "no capacity: set `capacity:` here or decode.max_num_seqs in "
                                                      f"{file}"))
            continue
        if plan.name in [p.name for p in plans]:
            problems.append(loaded.problem((*where, "recipe"), f"deployment {plan.name!r} is named twice"))
            continue
        plans.append(plan)
        members.append(Member(name=plan.name, recipe=str(file), weight=m.weight, role=m.role, capacity=capacity,
                              endpoint=plan.endpoint, served_model=plan.served_model))
    served = sorted({m.served_model for m in members})
    if len(served) > 1:
        problems.append(loaded.problem(("deployments",), f"the deployments serve different models ({', '.join(served)}); "
                                                         "a fleet serves one model name"))
    if not any(m.role == "primary" and m.weight > 0 for m in members) and members:
        problems.append(loaded.problem(("deployments",), "no primary deployment with a weight above 0 takes traffic"))
    if problems:
        raise RecipeError(problems)
    gateway = gateway_plan(r, plans[0], members, base_dir)
    clashes = port_clashes([*plans, gateway], own=gateway)
    if clashes:
        raise RecipeError([loaded.problem(("gateway", "ports"), c) for c in clashes])
    return FleetPlan(name=r.name, endpoint=gateway.endpoint, served_model=members[0].served_model,
                     prefix=f"{PREFIX}/{r.name}", etcd=etcd_endpoints(gateway.services), members=members, plans=plans,
                     gateway=gateway)


def etcd_endpoints(services: list[Service]) -> list[str]:
    """The client URL of every etcd member among `services`, in their order."""
    return [f"http://{s.address}:{s.ports['client']}" for s in services if s.component == "etcd"]


def port_clashes(plans: list[Plan], own: Plan | None = None) -> list[str]:
    """Ports two services of the fleet (its deployments' and its gateway's, surge twins included) would both bind
    on one address: between plans, and within `own` (the gateway's; each deployment checked its own)."""
    owner: dict[tuple[str, int], str] = {}
    out: list[str] = []
    for plan in plans:
        for svc in [*plan.services, *(s.twin for s in plan.services if s.twin)]:
            for port in set(svc.listens):
                key = (svc.address, port)
                who = f"{plan.name}/{svc.name}"
                if key in owner and (owner[key].split("/")[0] != plan.name or plan is own):
                    out.append(f"port {port} on {svc.address} is used by both {owner[key]} and {who}")
                owner.setdefault(key, who)
    return out


def _hosts(r: FleetRecipe) -> list[HostPlan]:
    """The gateway's hosts, each with how SSH reaches it (the fleet recipe's `hosts:` are SSH hosts)."""
    return with_access([HostPlan(name=h.name, address=h.address, workdir=h.workdir, gpus=0, labels=dict(h.labels))
                        for h in r.hosts], r.hosts)


def _target(r: FleetRecipe, base: Plan) -> TargetSpec:
    """The gateway's target: its first deployment's, checking SSH host keys against the fleet recipe's
    known_hosts."""
    if base.target.kind != "ssh":
        return base.target
    return TargetSpec(kind="ssh", options=SSHOptions(known_hosts=r.known_hosts).model_dump(mode="json"))


def _runtime(base: Plan, host: HostPlan) -> Runtime:
    """The gateway host's runtime: the same pinned set as the first deployment's, in this host's workdir."""
    like = next(iter(base.serving.runtime.values()))
    if not like.provisioned:
        return like
    return like.model_copy(update={"python": posixpath.join(Layout(host.workdir).runtime(like.key), "bin", "python")})


def replica_config(r: FleetRecipe, name: str, host: HostPlan, port: int, members: list[Member], etcd: list[str]
                   ) -> dict[str, Any]:
    """What one replica reads at start (no secret: keys live hashed in etcd, whose every member is listed)."""
    g = r.gateway
    return {
        "fleet": r.name, "replica": name, "listen": {"host": host.address, "port": port},
        "etcd": etcd, "prefix": f"{PREFIX}/{r.name}",
        "lease_ttl_s": g.admission.lease_ttl_s, "retry_after_s": g.admission.retry_after_s,
        "block": g.admission.block, "batch_reserve": g.admission.batch_reserve,
        "queue": {"size": g.admission.queue, "timeout_s": g.admission.queue_timeout_s},
        "teams": {t: lim.model_dump(exclude_none=True) for t, lim in sorted(g.teams.items())},
        "breaker": {"failures": g.breaker.failures, "cooldown_s": g.breaker.cooldown_s},
        "deadline_s": g.deadline_s, "stall_s": g.stall_s, "drain_s": g.drain_timeout_s,
        "etcd_progress_s": WATCH_PROGRESS_S,
        "usage_db": posixpath.join(host.workdir, "data", name, "usage.sqlite"),
        "deployments": [{"name": m.name, "url": m.endpoint, "weight": m.weight, "role": m.role,
                         "capacity": m.capacity, "block": g.admission.block} for m in members],
    }


def edge_tls(r: FleetRecipe, python: str, address: str, recipe_dir: Path) -> tuple[list[FileSpec], Probe] | None:
    """The edge's TLS files (its certificate, its key as a secret read when the bundle is made, and the probe
    script) and its readiness probe over TLS, trusting that certificate; None where the recipe sets no `tls`."""
    from primectl.fleet.tls import key_digest

    tls = r.gateway.tls
    if tls is None:
        return None
    cert, key = recipe_dir / tls.cert, recipe_dir / tls.key
    url = f"https://{address}:{r.gateway.port}/-/ready"
    script = files("primectl.fleet").joinpath("tls_ready.py").read_text()
    shipped = [*tls_files(cert.read_text(encoding="ascii", errors="replace"), str(key.resolve()), key_digest(key)),
               FileSpec(path=TLS_READY_SCRIPT, content=script)]
    probe = Probe(kind="command", url=url, timeout_s=60,
                  command=[python, "-I", f"{RELEASE}/{TLS_READY_SCRIPT}", url, f"{RELEASE}/{TLS_CERT}"])
    return shipped, probe


def replica_files() -> list[FileSpec]:
    """The replica's files in the release: `gateway-replica/__main__.py`, and the modules of primectl.fleet.gateway
    as the package `fleet_gateway` beside it."""
    package = files("primectl.fleet.gateway")
    modules = sorted(f.name for f in package.iterdir() if f.name.endswith(".py"))
    return [FileSpec(path=f"{REPLICA_DIR}/__main__.py", content=REPLICA_MAIN),
            *(FileSpec(path=f"{REPLICA_DIR}/{REPLICA_PACKAGE}/{name}", content=package.joinpath(name).read_text())
              for name in modules)]


def gateway_plan(r: FleetRecipe, base: Plan, members: list[Member], recipe_dir: Path) -> Plan:
    """The gateway tier as a Plan: etcd, the replicas, HAProxy in front (the public endpoint, over TLS where the
    recipe gives a certificate; `recipe_dir`: where its paths are relative to)."""
    g = r.gateway
    mon = r.monitoring if r.monitoring and r.monitoring.enabled else None
    hosts = _hosts(r)
    host = next(h for h in hosts if h.name == g.host)
    runtime = {h.name: _runtime(base, h) for h in hosts}
    etcd = gateway_etcd(r, hosts)
    etcd_urls = etcd_endpoints(etcd)
    shipped = replica_files()
    replicas: list[Service] = []
    for i in range(g.replicas):
        name = f"gateway-{i}"
        port = g.ports.replica + i
        config = f"config/{name}.json"
        svc = Service(
            name=name, role="gateway", component=GATEWAY_JOB, host=host.name, address=host.address,
            argv=[runtime[host.name].python, "-I", f"{RELEASE}/{REPLICA_DIR}", "--config", f"{RELEASE}/{config}"],
            files=[*shipped,
                   FileSpec(path=config, content=json.dumps(replica_config(r, name, host, port, members, etcd_urls),
                                                            indent=2, sort_keys=True) + "\n")],
            dirs=[posixpath.join(host.workdir, "data", name)],
            ports={"http": port}, listens=[port], depends_on=[s.name for s in etcd],
            ready=Probe(kind="http", url=f"http://{host.address}:{port}/-/ready", timeout_s=60),
            metrics_url=f"http://{host.address}:{port}/metrics", stop_timeout_s=g.drain_timeout_s + 30,
        )
        replicas.append(svc.model_copy(update={"drain": drain_behind(host.workdir, svc, g.drain_timeout_s)}))
    tls = edge_tls(r, runtime[host.name].python, host.address, recipe_dir)
    edge = haproxy_service(deployment=r.name, host=host.name, address=host.address, port=g.port, workdir=host.workdir,
                           replicas=replicas, spares=[], check="/-/ready",
                           bufsize=request_buffer(base.serving.model.max_context), name="edge",
                           fronts=f"the gateway replicas of fleet {r.name}", metrics_port=mon.ports.balancer if mon else None,
                           tls=tls[0] if tls else None, ready=tls[1] if tls else None)
    endpoint = f"{'https' if tls else 'http'}://{host.address}:{g.port}"
    services = [*etcd, *replicas, edge]
    if mon:
        services = monitor(Watched(name=f"{r.name}-gateway", hosts={h.name: h for h in hosts},
                                   pythons={h: rt.python for h, rt in runtime.items()}, hw=NO_GPU,
                                   gate=f"{endpoint}/-/ready", home=host.name), mon, services)
    blob = json.dumps([s.model_dump(mode="json") for s in services], sort_keys=True)
    return base.model_copy(update={
        "name": f"{r.name}-gateway", "namespace": f"{r.name}-gateway", "supervisor": r.supervisor,
        "recipe_hash": hashlib.sha256(blob.encode()).hexdigest()[:16], "hosts": hosts, "head": host.name,
        "slots": [], "services": services, "endpoint": endpoint, "worker_listing_url": None,
        "gate": edge.ready,
        "serving": base.serving.model_copy(update={"runtime": runtime, "tier": None}),
        "secret_names": [], "secret_sources": {}, "target": _target(r, base), "defaults": {},
        "rollouts": [RoleRollout(role="gateway", instances=[[s.name] for s in replicas], max_unavailable=1),
                     *([RoleRollout(role="control", instances=[[s.name] for s in etcd], max_unavailable=1)]
                       if len(etcd) > 1 else [])],
        "monitoring": monitoring_plan(services, mon) if mon else None,
    })


def gateway_etcd(r: FleetRecipe, hosts: list[HostPlan]) -> list[Service]:
    """The gateway's own etcd: one member on the gateway's host (`gateway-etcd`), or a cluster of one member per
    `gateway.etcd_hosts` (`gateway-etcd-0`...)."""
    g = r.gateway
    on = [next(h for h in hosts if h.name == name) for name in etcd_hosts(r)]
    if len(on) == 1:
        return [solo_etcd(name="gateway-etcd", member=f"{r.name}-gateway-etcd", host=on[0].name,
                          address=on[0].address, workdir=on[0].workdir, client_port=g.ports.etcd_client,
                          peer_port=g.ports.etcd_peer, progress_s=WATCH_PROGRESS_S)]
    members = [EtcdMember(name=f"gateway-etcd-{i}", member=f"{r.name}-gateway-etcd-{i}", host=h.name,
                          address=h.address, workdir=h.workdir) for i, h in enumerate(on)]
    return etcd_cluster(members, token=f"{r.name}-gateway-etcd", client_port=g.ports.etcd_client,
                        peer_port=g.ports.etcd_peer, progress_s=WATCH_PROGRESS_S)

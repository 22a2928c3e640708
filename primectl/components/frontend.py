"""Dynamo frontend (`python -m dynamo.frontend`): OpenAI API plus the KV-aware router."""

from __future__ import annotations

from primectl.components.base import KubernetesForm, NotRendered
from primectl.engines.base import PlanContext
from primectl.errors import Finding, PlanError
from primectl.plan.model import Probe, Service
from primectl.recipe.model import Recipe

WORKER_ROLES = ("prefill", "decode")

# How long a killed worker stays registered: the file store's entry TTL, Dynamo's default etcd lease TTL.
FILE_DISCOVERY_TTL_S = 10
ETCD_DEFAULT_LEASE_TTL_S = 30


def inhibited_duration_s(recipe: Recipe) -> int:
    """DYN_RUNTIME_INHIBITED_DURATION_SECS for the frontend: twice as long as discovery keeps a dead worker.

    A request that fails to reach a worker makes the frontend drop it from its routing set, but Dynamo 1.6.1
    puts every discovered worker back each time the endpoint's discovery has been quiet this long (5 s by
    default), so a killed worker that discovery still lists is picked again and the requests sent to it fail
    again. Longer than the registration's TTL, that reset rarely falls before discovery drops the worker.
    """
    cp = recipe.control_plane
    ttl = FILE_DISCOVERY_TTL_S if cp.discovery == "file" else (cp.etcd_lease_ttl_s or ETCD_DEFAULT_LEASE_TTL_S)
    return max(30, 2 * ttl)


def frontend_service(ctx: PlanContext, host: str, depends_on: list[str], replica: int | None = None,
                     namespace_prefix: str | None = None, name: str | None = None) -> Service:
    """The frontend bound to the host's address, with router and admission settings (`replica`: one of several
    behind the balancer, on ports of its own, named `frontend` for the first and `frontend-<replica>` for the others,
    so that going from one frontend to several keeps the one that runs; `namespace_prefix`: it serves workers of
    every generation; `name`: another name)."""
    r = ctx.recipe
    fe = r.frontend
    addr = ctx.hosts[host].address
    name = name or ("frontend" if not replica else f"frontend-{replica}")
    http_port = fe.port if replica is None else r.ports.frontend_replica + replica
    stream_port = r.ports.response_stream + (replica or 0)
    argv = [
        ctx.python(host), "-m", "dynamo.frontend",
        *(["--namespace-prefix", namespace_prefix] if namespace_prefix else ["--namespace", r.dynamo_namespace]),
        "--http-host", addr,
        "--http-port", str(http_port),
        "--router-mode", fe.router_mode,
        "--kv-cache-block-size", str(r.kv.block_size),
        "--migration-limit", str(fe.migration_limit),
    ]
    if fe.router_mode == "kv":
        argv.append("--router-kv-events" if fe.kv_events else "--no-router-kv-events")
        if fe.host_cache_hit_weight is not None:
            argv += ["--router-host-cache-hit-weight", str(fe.host_cache_hit_weight)]
    if fe.session_affinity:
        argv += [
            "--router-session-affinity-ttl-secs", str(fe.session_affinity.ttl_secs),
            "--router-session-affinity-mode", fe.session_affinity.mode,
        ]
    for flag, value in fe.busy.model_dump().items():
        if value is not None:
            argv += ["--" + flag.replace("_", "-"), str(value)]
    env = ctx.dynamo_env(host)
    # The frontend caches model cards under $HOME/.cache/dynamo (it ignores XDG_CACHE_HOME): keep it in the workdir.
    scratch = f"{ctx.hosts[host].workdir}/data/{name}"
    env["HOME"] = f"{scratch}/home"
    env["XDG_CACHE_HOME"] = f"{scratch}/cache"
    env["DYN_TCP_RESPONSE_STREAM_HOST"] = addr
    env["DYN_TCP_RESPONSE_STREAM_PORT"] = str(stream_port)
    env["DYN_RUNTIME_INHIBITED_DURATION_SECS"] = str(inhibited_duration_s(r))
    base = f"http://{addr}:{http_port}"
    return Service(
        name=name, role="frontend", component="dynamo-frontend", host=host, address=addr,
        argv=argv, env=env, dirs=[env["HOME"], env["XDG_CACHE_HOME"]],
        ports={"http": http_port, "response_stream": stream_port},
        listens=[http_port, stream_port],
        depends_on=depends_on,
        ready=Probe(kind="http", url=f"{base}/health", timeout_s=120),
        metrics_url=f"{base}/metrics",
    )


def registered_probe(ctx: PlanContext, endpoint: str, namespace: str, role: str, count: int, timeout_s: float) -> Probe:
    """Passes once the frontend counts `count` workers of `role` in `namespace` (its /ready answer:
    `namespaces.<ns>.worker_types.<role>.workers`), i.e. a restarted instance has registered again."""
    from urllib.parse import quote

    return Probe(kind="http", url=f"{endpoint}/v1/models/{quote(ctx.recipe.model.served_name, safe='')}/ready",
                 json_path=f"namespaces.{namespace}.worker_types.{role}.workers", json_expect=count,
                 timeout_s=timeout_s)


class DynamoFrontend:
    """The OpenAI endpoint and KV router: one frontend, or several replicas behind a balancer. Behind a balancer on
    a target that starts surge twins, one frontend has a twin (`frontend-surge`) that takes its traffic while a
    change restarts it."""

    name = "dynamo-frontend"
    stage = "edge"

    def extend(self, ctx: PlanContext, planned: list[Service]) -> list[Service]:
        """The frontend(s), depending on everything planned before them; they serve every generation's workers."""
        r = ctx.recipe
        host = r.frontend.host
        replicas = r.frontend.replicas
        if replicas > 1 and not ctx.surges:
            raise PlanError([Finding(("frontend", "replicas"), (
                f"{replicas} replicas behind a balancer are rendered for target ssh only; target "
                f"{r.target} runs one frontend (allowed here: 1)"))])
        deps = [s.name for s in planned]
        generations = any(s.generation for s in planned if s.role in WORKER_ROLES)
        prefix = f"{r.dynamo_namespace}-gen-" if generations else None
        if not ctx.balanced:
            return [*planned, frontend_service(ctx, host, deps, namespace_prefix=prefix)]
        if replicas == 1:
            twin = frontend_service(ctx, host, deps, replica=1, namespace_prefix=prefix, name="frontend-surge")
            single = frontend_service(ctx, host, deps, replica=0, namespace_prefix=prefix)
            return [*planned, single.model_copy(update={"twin": twin})]
        return [*planned, *(frontend_service(ctx, host, deps, replica=i, namespace_prefix=prefix)
                            for i in range(replicas))]

    def kubernetes(self, service: Service) -> KubernetesForm | NotRendered:
        """The DGD's Frontend component."""
        return KubernetesForm(component="Frontend", type="frontend")

"""Dynamo frontend (`python -m dynamo.frontend`): OpenAI API plus the KV-aware router."""

from __future__ import annotations

from primectl.engines.base import PlanContext
from primectl.plan.model import Probe, Service


def frontend_service(ctx: PlanContext, host: str, depends_on: list[str]) -> Service:
    """The frontend bound to the host's address, with router and admission settings."""
    r = ctx.recipe
    fe = r.frontend
    addr = ctx.hosts[host].address
    argv = [
        ctx.python(host), "-m", "dynamo.frontend",
        "--namespace", r.dynamo_namespace,
        "--http-host", addr,
        "--http-port", str(fe.port),
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
    scratch = f"{ctx.hosts[host].workdir}/data/frontend"
    env["HOME"] = f"{scratch}/home"
    env["XDG_CACHE_HOME"] = f"{scratch}/cache"
    env["DYN_TCP_RESPONSE_STREAM_HOST"] = addr
    env["DYN_TCP_RESPONSE_STREAM_PORT"] = str(r.ports.response_stream)
    base = f"http://{addr}:{fe.port}"
    return Service(
        name="frontend", role="frontend", component="dynamo-frontend", host=host, address=addr,
        argv=argv, env=env, dirs=[env["HOME"], env["XDG_CACHE_HOME"]],
        ports={"http": fe.port, "response_stream": r.ports.response_stream},
        listens=[fe.port, r.ports.response_stream],
        depends_on=depends_on,
        ready=Probe(kind="http", url=f"{base}/health", timeout_s=120),
        metrics_url=f"{base}/metrics",
    )

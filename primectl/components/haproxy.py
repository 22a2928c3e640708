"""HAProxy (Debian's haproxy 2.6) in front of the frontend replicas: the endpoint clients use.

It health-checks each replica's readiness for the model (`/v1/models/<model>/ready`
says `"ready": true` once the replica has discovered a full set of workers; `/health`
answers before that, and a replica routed to then answers 404), sends a request again when a replica
refused it or answered a 5xx before any byte of a response (a request Dynamo
could not migrate off a dead worker before its stream began), and takes a
replica out of rotation through its admin socket (`set server ... state drain`)
so a frontend change rolls through the replicas without cutting a stream.

A change of the replica set alone is a reload, not a restart: HAProxy 2.6 in
master-worker mode (`-W`) re-executes on SIGUSR2 with the configuration it was
started with, read through the `current` link (so the new release's), and its
new worker takes the listening sockets over from the old one (`expose-fd
listeners`), which finishes the streams it holds: no connection is refused.
"""

from __future__ import annotations

import hashlib
import posixpath
from urllib.parse import quote, unquote

from primectl.components.base import CheckMove, KubernetesForm, NotRendered
from primectl.engines.base import PlanContext
from primectl.plan.model import Drain, FileSpec, Plan, Probe, Reload, Service

HAPROXY_BINARY = "/usr/sbin/haproxy"
BACKEND = "frontends"
MODELS = "/v1/models/"  # a replica's readiness for a model is MODELS<model>/ready
CONFIG = "config/balancer.haproxy.cfg"
MAXCONN = 4096
# sockaddr_un.sun_path holds 108 bytes with its NUL, and HAProxy binds `<path>.<pid>.tmp` first, then renames it
SOCKET_PATH_MAX = 90
# HAProxy resends only a request it holds whole in one buffer (tune.bufsize; its default of 16 KiB never holds an
# agent turn). The buffer is sized for a prompt at the model's context limit, in JSON, at this many bytes a token.
BYTES_PER_TOKEN = 8
DEFAULT_BUFSIZE = 16 << 10
MAX_BUFSIZE = 128 << 20  # HAProxy refuses 256 MB and more with HTTP
# Each stream holds a request and a response buffer, allocated while it runs: the connection cap keeps the
# worst case (every connection busy at once) within this much memory.
BUFFER_MEMORY = 2 << 30
# Where a balancer that terminates TLS reads its certificate; HAProxy 2.6 loads the key from `<cert>.key` when
# the certificate's file holds none (ssl-load-extra-files' default), so the key ships as a file of its own.
TLS_CERT = "config/balancer-tls.pem"


def request_buffer(max_context: int | None) -> int:
    """tune.bufsize for prompts up to `max_context` tokens: a power of two, at least HAProxy's default."""
    want = (max_context or 0) * BYTES_PER_TOKEN
    size = DEFAULT_BUFSIZE
    while size < want and size < MAX_BUFSIZE:
        size *= 2
    return size


def keep_buffers(bufsize: int) -> list[str]:
    """HAProxy's option that keeps freed buffers in its shared pool (`-dMglobal`), for buffers larger than its
    default. Debian's build frees a buffer larger than its per-thread cache (512 KiB) back to malloc after each
    request, and getting one again costs time in proportion to its size (benchmarks/haproxy_buffers.py; the figures
    are in docs/fleet.md). The memory kept is what the busiest moment needed, up to the connection cap's bound."""
    return ["-dMglobal"] if bufsize > DEFAULT_BUFSIZE else []


def connection_cap(bufsize: int) -> int:
    """maxconn: MAXCONN, or fewer where every connection's two buffers would pass BUFFER_MEMORY."""
    return max(64, min(MAXCONN, BUFFER_MEMORY // (2 * bufsize)))


def admin_socket(workdir: str) -> str:
    """The admin socket of the balancer of the deployment in `workdir`: under it (so it survives a release switch),
    or, where that path is too long for a Unix socket's address (HAProxy refuses the configuration), a short one in
    /tmp named after it."""
    path = f"{workdir}/run/balancer.haproxy.sock"
    if len(path.encode()) <= SOCKET_PATH_MAX:
        return path
    return f"/tmp/primectl-{hashlib.sha256(path.encode()).hexdigest()[:16]}.haproxy.sock"


def socket_path(ctx: PlanContext, host: str) -> str:
    """The admin socket of the balancer on `host`."""
    return admin_socket(ctx.hosts[host].workdir)


def check_uri(model: str) -> str:
    """The path the balancer health-checks each replica at: its readiness for the served model."""
    return f"{MODELS}{quote(model, safe='')}/ready"


def checked_model(url: str) -> str | None:
    """The served model a health check at `url` asks about (None: one that names none, as balancers recorded before
    their check named the model)."""
    return unquote(url.split(MODELS, 1)[1].rsplit("/", 1)[0]) if MODELS in url else None


def state_file(workdir: str) -> str:
    """Where the balancer's server states are saved before a reload (HAProxy's server-state-file)."""
    return f"{workdir}/run/balancer.haproxy.state"


def replica_drain(ctx: PlanContext, balancer_host: str, replica: Service) -> Drain:
    """How a frontend replica leaves rotation (see `drain_behind`)."""
    return drain_behind(ctx.hosts[balancer_host].workdir, replica, ctx.recipe.frontend.drain_timeout_s)


def drain_behind(workdir: str, replica: Service, timeout_s: float) -> Drain:
    """How a service behind the balancer of the host whose workdir is `workdir` leaves rotation: the balancer
    stops sending it work and its streams finish; when it is back, the balancer reaches it at its (possibly new)
    address and port."""
    return Drain(how="balancer", socket=admin_socket(workdir), server=f"{BACKEND}/{replica.name}",
                 address=f"{replica.address}:{replica.ports['http']}", timeout_s=timeout_s)


def tls_files(cert: str, key_source: str, key_digest: str) -> list[FileSpec]:
    """The files of a balancer that terminates TLS: its certificate (public: `cert` is its text), and its key, a
    secret read from `key_source` on the control machine when the bundle is made (the plan holds `key_digest`),
    readable by its owner alone."""
    return [FileSpec(path=TLS_CERT, content=cert),
            FileSpec(path=TLS_CERT + ".key", content=key_digest, source=key_source, mode=0o600)]


def balancer_service(ctx: PlanContext, host: str, replicas: list[Service], spares: list[Service] | None = None
                     ) -> Service:
    """HAProxy bound to the frontend's address and port, one health-checked server per replica, and one per spare
    (a surge twin), in maintenance until a change starts the twin and puts it in rotation."""
    fe = ctx.recipe.frontend
    return haproxy_service(
        deployment=ctx.recipe.name, host=host, address=ctx.hosts[host].address, port=fe.port,
        workdir=ctx.hosts[host].workdir, replicas=replicas, spares=spares or [],
        check=check_uri(ctx.recipe.model.served_name),
        bufsize=request_buffer(ctx.recipe.model.max_context or ctx.arch.max_context), metrics_port=metrics_port(ctx))


def metrics_port(ctx: PlanContext) -> int | None:
    """Where the balancer serves its own /metrics: only where the recipe turns monitoring on."""
    from primectl.components.monitoring import block

    mon = block(ctx)
    return mon.ports.balancer if mon is not None else None


def haproxy_service(*, deployment: str, host: str, address: str, port: int, workdir: str, replicas: list[Service],
                    spares: list[Service], check: str, bufsize: int, name: str = "balancer",
                    fronts: str | None = None, metrics_port: int | None = None, tls: list[FileSpec] | None = None,
                    ready: Probe | None = None) -> Service:
    """HAProxy on `address:port` in front of `replicas` (each reached on its `http` port, UP while `check`
    answers `"ready": true`) and `spares` (servers in maintenance until a change puts them in rotation); it is
    ready once `check` answers through it. `fronts`: what the config's header says it stands in front of.
    `tls` (`tls_files`): it terminates TLS on `port` with that certificate, and `ready` says how to probe it."""
    from primectl.render.bundle import template

    # through `current`, not the release it started from: a reload re-reads the release switched to
    current = posixpath.join(workdir, "current", CONFIG)
    config = template("haproxy.cfg.j2").render(
        name=name, deployment=deployment, fronts=fronts, maxconn=connection_cap(bufsize), bufsize=bufsize,
        socket=admin_socket(workdir), state_file=state_file(workdir), check_uri=check,
        stream_timeout_s=600, address=address, port=port, metrics_port=metrics_port,
        crt=posixpath.join(workdir, "current", TLS_CERT) if tls else None,
        servers=[{"name": r.name, "address": r.address, "port": r.ports["http"], "spare": False} for r in replicas]
        + [{"name": r.name, "address": r.address, "port": r.ports["http"], "spare": True} for r in spares],
    )
    argv = [HAPROXY_BINARY, "-W", "-db", *keep_buffers(bufsize), "-f", current]
    return Service(
        name=name, role="balancer", component="haproxy", host=host, address=address,
        argv=argv, env={}, files=[FileSpec(path=CONFIG, content=config), *(tls or [])],
        ports={"http": port, **({"metrics": metrics_port} if metrics_port else {})},
        listens=[port, *([metrics_port] if metrics_port else [])],
        depends_on=[r.name for r in replicas],
        metrics_url=f"http://{address}:{metrics_port}/metrics" if metrics_port else None,
        # ready once the model is ready through it: a balancer whose check follows a renamed model then says when
        # it has taken the new name (the rollout reloads it as soon as the new workers serve: rollout/strategy.py)
        ready=ready or Probe(kind="http", url=f"http://{address}:{port}{check}", timeout_s=60),
        reload=Reload(signal="SIGUSR2", socket=admin_socket(workdir), backend=BACKEND,
                      servers=[r.name for r in [*replicas, *spares]], state_file=state_file(workdir),
                      check=[HAPROXY_BINARY, "-c", "-q", "-f", current]),
    )


class Balancer:
    """HAProxy in front of the frontends, where the recipe puts them behind one (several replicas, or a target that
    starts surge twins): every frontend and its twin get the drain through it."""

    name = "haproxy"
    stage = "edge"

    def extend(self, ctx: PlanContext, planned: list[Service]) -> list[Service]:
        """The planned services with each frontend's drain set, and the balancer after them."""
        if not ctx.balanced:
            return planned
        host = ctx.recipe.frontend.host

        def behind(svc: Service) -> Service:
            return svc.model_copy(update={"drain": replica_drain(ctx, host, svc)})

        out = [behind(s).model_copy(update={"twin": behind(s.twin) if s.twin else None}) if s.role == "frontend"
               else s for s in planned]
        replicas = [s for s in out if s.role == "frontend"]
        spares = [s.twin for s in replicas if s.twin]
        return [*out, balancer_service(ctx, host, replicas, spares=spares)]

    def check_move(self, plan: Plan, service: Service, was: str) -> CheckMove:
        """Its health check follows the served model: a renamed model, or a check recorded before it named one."""
        old = checked_model(was)
        if old is None:
            return CheckMove("its health check moves to the model's readiness", "expected loss 0")
        new = plan.served_model
        return CheckMove(f"the served model is renamed ('{old}' -> '{new}'); its health check follows",
                         f"clients must ask for '{new}': the old name answers 404 once its workers have drained")

    def kubernetes(self, service: Service) -> KubernetesForm | NotRendered:
        """Not rendered: the kubernetes target runs one frontend, behind the operator's Service."""
        return NotRendered("the operator's Frontend Service fronts the frontend; there is no balancer to run")

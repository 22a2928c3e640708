"""Mooncake: the master of the host-DRAM KV tier (the store config workers read is engines/mooncake_store.py)."""

from __future__ import annotations

from primectl.components.base import KubernetesForm, NotRendered
from primectl.engines.base import PlanContext
from primectl.plan.model import RELEASE, FileSpec, Probe, Service


def master_argv(binary: str, address: str, rpc: int, metadata: int, metrics: int) -> list[str]:
    """The mooncake_master command line (also used by preflight for a temporary master)."""
    return [
        binary,
        f"--rpc_address={address}",
        f"--rpc_port={rpc}",
        "--enable_http_metadata_server=true",
        f"--http_metadata_server_host={address}",
        f"--http_metadata_server_port={metadata}",
        f"--metrics_host={address}",
        f"--metrics_port={metrics}",
    ]


def master_service(ctx: PlanContext, host: str, *, workers_use_store: bool) -> Service:
    """`mooncake_master` with its HTTP metadata server, bound to the host's address."""
    addr = ctx.hosts[host].address
    p = ctx.recipe.ports
    argv = master_argv(ctx.runtime_bin(host, "mooncake_master"), addr, p.mooncake_rpc, p.mooncake_metadata,
                       p.mooncake_metrics)
    probe = Probe(kind="http", url=f"http://{addr}:{p.mooncake_metrics}/health", timeout_s=60)
    files: list[FileSpec] = []
    if not workers_use_store:
        # No worker exercises the store (e.g. the mocker engine), so readiness
        # proves it with a put/get round trip through the master.
        probe = Probe(
            kind="command",
            command=[
                ctx.python(host), f"{RELEASE}/probes/mooncake_roundtrip.py",
                "--master", f"{addr}:{p.mooncake_rpc}",
                "--metadata", f"http://{addr}:{p.mooncake_metadata}/metadata",
                "--local-hostname", addr,
            ],
            timeout_s=60,
        )
        files.append(FileSpec(path="probes/mooncake_roundtrip.py", content=_probe_script(), mode=0o755))
    return Service(
        name="mooncake-master", role="cache", component="mooncake-master", host=host, address=addr,
        argv=argv, env={}, files=files,
        ports={"rpc": p.mooncake_rpc, "metadata": p.mooncake_metadata, "metrics": p.mooncake_metrics},
        listens=[p.mooncake_rpc, p.mooncake_metadata, p.mooncake_metrics],
        ready=probe, metrics_url=f"http://{addr}:{p.mooncake_metrics}/metrics",
    )


def _probe_script() -> str:
    from importlib.resources import files

    return files("primectl.components").joinpath("mooncake_roundtrip.py").read_text()


class MooncakeMaster:
    """The host tier's master, when the recipe enables a host tier."""

    name = "mooncake-master"
    stage = "control"

    def extend(self, ctx: PlanContext, planned: list[Service]) -> list[Service]:
        """The master, on the tier's master host."""
        if ctx.tier is None:
            return planned
        uses_store = bool(ctx.capabilities and ctx.capabilities.exercises_host_tier)
        return [*planned, master_service(ctx, ctx.tier.master_host, workers_use_store=uses_store)]

    def kubernetes(self, service: Service) -> KubernetesForm | NotRendered:
        """A component of its own, with no type: the operator adds only its base env, no Dynamo ports or probes."""
        return KubernetesForm(component=self.name, type=None)

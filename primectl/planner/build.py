"""Recipe -> Plan, without I/O."""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from primectl import registry
from primectl.components import base as components
from primectl.components.frontend import registered_probe
from primectl.engines.base import Engine, PlanContext, drained_worker
from primectl.engines.base import get as get_engine
from primectl.errors import Finding, PlanError, Problem, RecipeError
from primectl.monitoring.where import monitoring_plan
from primectl.plan.layout import Layout
from primectl.plan.model import (
    RELEASE,
    Capacity,
    HardwareFacts,
    HostPlan,
    ModelSource,
    Plan,
    Probe,
    RoleCapacity,
    RoleRollout,
    Runtime,
    Service,
    Serving,
    Slot,
    TargetSpec,
    Tier,
)
from primectl.planner.load import LoadedRecipe, load_recipe
from primectl.planner.placement import Placement, place_workers, surge_slots
from primectl.recipe.capacity import (
    GB,
    indexer_bytes_per_token,
    kv_bytes_per_token,
    kv_row_bytes,
    parse_parallel,
    role_memory,
)
from primectl.recipe.catalog import MODELS, Architecture, Hardware
from primectl.recipe.model import Decode, Prefill, Recipe, hardware_profile
from primectl.targets.base import get as get_target

SESSION_CONTEXT_TOKENS = 146_000
GENERATED_MODEL_CONTEXT = 32768  # what a generated model declares when the recipe sets no max_context


def plan_recipe(path: str | Path, *, target: str | None = None) -> tuple[LoadedRecipe, Plan]:
    """Load, validate and plan a recipe file: RecipeError (every problem, pinned to its line) or the Plan.

    `target`: plan for this target instead of the recipe's (`primectl render --target`).
    """
    loaded = load_recipe(path)
    if target is not None and target != loaded.recipe.target:
        from primectl.recipe.suggest import did_you_mean

        if not registry.known("target", target):
            choices = registry.names("target")
            raise RecipeError([Problem(loaded.file, 0, 0, "--target", f"{target!r} is not a target"
                                       f"{did_you_mean(target, choices)}; allowed: {', '.join(choices)}")])
        loaded = LoadedRecipe(loaded.recipe.model_copy(update={"target": target}), loaded.file, loaded.positions)
    try:
        return loaded, build_plan(loaded.recipe)
    except PlanError as exc:
        raise RecipeError([loaded.problem(f) for f in exc.findings]) from None


def architecture(recipe: Recipe) -> Architecture:
    """The model's architecture: explicit fields, or the catalog entry."""
    if recipe.model.architecture is not None:
        return recipe.model.architecture
    assert recipe.model.arch is not None
    return MODELS[recipe.model.arch]


def host_plans(recipe: Recipe, hw: Hardware) -> list[HostPlan]:
    """Hosts with defaults applied (GPU count from the profile); how one is reached is its target's (plan_hosts)."""
    return [HostPlan(name=h.name, address=h.address, workdir=h.workdir,
                     gpus=h.gpus if h.gpus is not None else hw.gpus_per_host, labels=dict(h.labels))
            for h in recipe.host_list()]


def runtimes(recipe: Recipe, hw: Hardware, engine: Engine, hosts: list[HostPlan], root: str | None = None
             ) -> tuple[str, dict[str, Runtime]]:
    """The runtime key (pins + flavour) and each host's runtime interpreter (under `root`, else under its workdir)."""
    flavour = engine.runtime_flavour(hw)
    blob = json.dumps({"pins": engine.pins(recipe), "flavour": flavour.name}, sort_keys=True)
    key = hashlib.sha256(blob.encode()).hexdigest()[:12]
    own = recipe.software.python

    def venv(h: HostPlan) -> str:
        return posixpath.join(root, key) if root else Layout(h.workdir).runtime(key)

    out = {
        h.name: Runtime(python=own or posixpath.join(venv(h), "bin", "python"), provisioned=not own,
                        flavour=flavour.name, lock=flavour.lock, key=key, install_flags=list(flavour.install_flags))
        for h in hosts
    }
    return key, out


def _defaults(model: BaseModel, prefix: str = "") -> dict[str, Any]:
    """Every field the recipe left out, with the value it resolved to."""
    out: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        path = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            out |= _defaults(value, path + ".")
        elif name not in model.model_fields_set:
            out[path] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return out


def build_plan(recipe: Recipe) -> Plan:
    """Place every service, derive ports, argv, env, serving facts and capacity. Raises PlanError."""
    try:
        engine = get_engine(recipe.engine)
        target = get_target(recipe.target)
    except registry.PluginError as exc:  # a plugin that cannot be loaded: pinned to the field that names it
        raise PlanError([Finding((exc.kind,), str(exc))]) from None
    arch = architecture(recipe)
    hw = hardware_profile(recipe)
    planned = target.plan_hosts(recipe, host_plans(recipe, hw))
    hosts = planned.hosts
    by_name = {h.name: h for h in hosts}
    fe_host = recipe.frontend.host
    cp_host = recipe.control_plane.etcd_host or fe_host
    p = recipe.ports
    etcd = f"http://{by_name[cp_host].address}:{p.etcd_client}" if recipe.control_plane.discovery == "etcd" else None
    key, runtime = runtimes(recipe, hw, engine, hosts, planned.runtime_root)
    served = engine.serving(recipe, arch, hw)
    balanced = target.surges or recipe.frontend.replicas > 1
    ctx = PlanContext(
        recipe=recipe, arch=arch, hw=hw, hosts=by_name, runtime=runtime, model=model_source(recipe),
        tier=tier(recipe, by_name),
        etcd_endpoint=etcd,
        discovery_dir=(
            posixpath.join(by_name[fe_host].workdir, "discovery", recipe.dynamo_namespace)
            if recipe.control_plane.discovery == "file" else None
        ),
        watches=bool(getattr(target, "watches", False)),
        # behind a balancer the first frontend listens on the first replica port
        frontend_url=f"http://{by_name[fe_host].address}:{p.frontend_replica if balanced else recipe.frontend.port}",
        capabilities=served.capabilities, surges=target.surges, balanced=balanced,
    )
    placement = place_workers(recipe, hw, hosts)
    if placement.findings:
        raise PlanError(placement.findings)

    try:
        used = components.in_recipe(recipe)
    except registry.PluginError as exc:
        raise PlanError([Finding((exc.name,), str(exc))]) from None
    services: list[Service] = []
    for component in used:
        if component.stage == "control":
            services = component.extend(ctx, services)
    services += workers(ctx, engine, recipe, placement, hosts, [s.name for s in services])
    for component in used:
        if component.stage == "edge":
            services = component.extend(ctx, services)

    fe = by_name[fe_host]
    endpoint = f"http://{fe.address}:{recipe.frontend.port}"
    gate = Probe(
        kind="http", url=f"{endpoint}/v1/models/{quote(recipe.model.served_name, safe='')}/ready",
        timeout_s=max(s.ready.timeout_s for s in services),
    )
    rollouts = role_rollouts(ctx, recipe, services, endpoint)
    serving = Serving(
        engine=engine.name, context_limit=served.context_limit, prefill_budget=served.prefill_budget,
        block_size=recipe.kv.block_size, kv_dtype=recipe.kv.dtype, model=ctx.model, tier=ctx.tier,
        capabilities=served.capabilities, runtime=runtime, kv_tokens_per_worker=served.kv_tokens_per_worker or {},
        image=served.image,
    )
    plan = Plan(
        name=recipe.name, namespace=recipe.dynamo_namespace, engine=engine.name, supervisor=recipe.supervisor,
        restart_delay_s=recipe.restart_delay_s,
        target=TargetSpec(kind=recipe.target, options=planned.options), served_model=recipe.model.served_name,
        recipe_hash=hashlib.sha256(recipe.model_dump_json().encode()).hexdigest()[:16],
        runtime_key=key, pins=engine.pins(recipe),
        hardware=HardwareFacts(profile=recipe.hardware.profile, gpu=hw.gpu, sm=hw.sm, gpus_per_host=hw.gpus_per_host,
                               hosts_per_nvlink_domain=hw.hosts_per_nvlink_domain),
        hosts=hosts, head=fe_host, slots=placement.slots, services=services, gate=gate,
        endpoint=endpoint, worker_listing_url=ctx.worker_listing_url, serving=serving,
        capacity=capacity(recipe, arch, hw, hosts, placement),
        secret_names=sorted(recipe.secrets), secret_sources=dict(sorted(recipe.secrets.items())),
        defaults=_defaults(recipe), rollouts=rollouts,
        monitoring=monitoring_plan(services, getattr(recipe, "monitoring", None)),
    )
    port_findings = check_ports(plan)
    if port_findings:
        raise PlanError(port_findings)
    return plan


def workers(ctx: PlanContext, engine: Engine, recipe: Recipe, placement: Placement, hosts: list[HostPlan],
            control: list[str]) -> list[Service]:
    """The engine's worker in every slot, each depending on the `control` services, with its surge twin where the
    target starts them. Where every worker has a twin, the workers register in a generation's namespace of their
    own, so a change can start the new generation beside the old one (Dynamo rejects workers whose model card
    differs)."""
    twin_slots: list[Slot | None] = (surge_slots(recipe, placement.slots, hosts) if ctx.surges
                                      else [None] * len(placement.slots))
    pairs: list[tuple[Service, Service | None]] = []
    for slot, twin_slot in zip(placement.slots, twin_slots, strict=True):
        spec: Prefill | Decode = recipe.prefill if slot.role == "prefill" else recipe.decode
        pairs.append((drained_worker(engine.worker(ctx, slot, spec, list(control)), spec),
                      drained_worker(engine.worker(ctx, twin_slot, spec, list(control)), spec) if twin_slot else None))
    if pairs and all(twin is not None for _, twin in pairs):
        generation = f"{recipe.dynamo_namespace}-gen-" + generation_id([svc for svc, _ in pairs], recipe)
        pairs = [(in_generation(svc, generation), in_generation(twin, generation) if twin else None)
                 for svc, twin in pairs]
    return [svc.model_copy(update={"twin": twin}) for svc, twin in pairs]


def generation_id(workers: list[Service], recipe: Recipe) -> str:
    """What names a generation: a hash of the first instance of each role as primectl derives it from the
    recipe's serving fields (argv, and the env it sets: the KV layout is there), which scaling a role leaves
    alone. The role's own `env:` entries are not in it: a change there keeps the generation (and the model
    card), so it rolls in place."""
    firsts: dict[str, Service] = {}
    for svc in workers:
        firsts.setdefault(svc.role, svc)
    extra = {"prefill": set(recipe.prefill.env), "decode": set(recipe.decode.env)}
    doc = {role: {"argv": s.argv, "env": {k: v for k, v in s.env.items() if k not in extra.get(role, set())}}
           for role, s in firsts.items()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:8]


def in_generation(svc: Service, namespace: str) -> Service:
    """A worker registered in its generation's Dynamo namespace."""
    return svc.model_copy(update={"generation": namespace, "env": svc.env | {"DYN_NAMESPACE": namespace}})


def role_rollouts(ctx: PlanContext, recipe: Recipe, services: list[Service], endpoint: str) -> list[RoleRollout]:
    """Per role with instances to roll through: its instances (a multi-host one as all its services), the batch
    size, and for workers the probe that says the router counts all of them again."""
    out: list[RoleRollout] = []
    for role, spec in (("prefill", recipe.prefill), ("decode", recipe.decode)):
        instances: dict[str, list[str]] = {}
        for svc in services:
            if svc.role == role:
                instances.setdefault(svc.group or svc.name, []).append(svc.name)
        timeout = max((s.ready.timeout_s for s in services if s.role == role), default=60)
        namespace = next((s.generation for s in services if s.role == role and s.generation), recipe.dynamo_namespace)
        out.append(RoleRollout(role=role, instances=list(instances.values()), max_unavailable=spec.rollout.max_unavailable,
                               registered=registered_probe(ctx, endpoint, namespace, role, len(instances), timeout)))
    replicas = [[s.name] for s in services if s.role == "frontend"]
    if len(replicas) > 1:
        out.append(RoleRollout(role="frontend", instances=replicas, max_unavailable=1))
    return out


def model_source(recipe: Recipe) -> ModelSource:
    """Where workers find the model: the recipe's path, or the directory primectl generates into the bundle (kept
    outside the releases too where the target replaces workers one by one, so a restarted one names the same path
    as those still running)."""
    m = recipe.model
    context = m.max_context or GENERATED_MODEL_CONTEXT
    shared = None
    if m.generate and get_target(recipe.target).surges:
        shared = hashlib.sha256(f"{m.generate}:{m.served_name}:{context}".encode()).hexdigest()[:12]
    return ModelSource(served_name=m.served_name, path=f"{RELEASE}/model" if m.generate else m.path,
                       generate=m.generate, max_context=context, weights_gb=m.weights_gb, shared_name=shared)


def tier(recipe: Recipe, hosts: dict[str, HostPlan]) -> Tier | None:
    """The Mooncake tier's endpoints, when the recipe enables one."""
    t = recipe.host_tier
    if t is None or not t.enabled:
        return None
    master = hosts[t.master_host]
    p = recipe.ports
    return Tier(master_host=t.master_host, master=f"{master.address}:{p.mooncake_rpc}",
                metadata=f"http://{master.address}:{p.mooncake_metadata}/metadata", protocol=t.protocol,
                device_name=t.device_name, dram_gb_per_host=t.dram_gb_per_host)


def check_ports(plan: Plan) -> list[Finding]:
    """No two services on one host may bind the same port."""
    owner: dict[tuple[str, int], str] = {}
    findings: list[Finding] = []
    for svc in [*plan.services, *(s.twin for s in plan.services if s.twin)]:
        for port in svc.listens:
            key = (svc.host, port)
            if key in owner:
                # Listens keep duplicates, so two of one service's port bases meeting is caught too.
                users = f"twice by {svc.name}" if owner[key] == svc.name else f"by both {owner[key]} and {svc.name}"
                findings.append(Finding(("ports",), f"port {port} on host {svc.host} is used {users}"))
            owner.setdefault(key, svc.name)
    return findings


def _role_capacity(
    recipe: Recipe, arch: Architecture, hw: Hardware, spec: Prefill | Decode, instances: int,
    tier_tokens_per_instance: int,
) -> RoleCapacity:
    par = parse_parallel(spec.parallel)
    dcp = getattr(spec, "dcp", 1)
    mem = role_memory(arch, hw, recipe.model.weights, par, recipe.kv.dtype, spec.gpu_memory_utilization, spec.reserve_gb,
                      dcp)
    per_session = SESSION_CONTEXT_TOKENS
    return RoleCapacity(
        instances=instances, gpus_per_instance=par.size, parallel=spec.parallel, hbm_gb=hw.hbm_gb,
        usable_gb=round(mem.usable_gb, 2), weights_gb=round(mem.weights_gb, 2), reserve_gb=mem.reserve_gb,
        kv_budget_gb=round(mem.kv_budget_gb, 2), kv_bytes_per_token=mem.kv_bytes_per_token,
        kv_tokens_per_gpu=mem.kv_tokens_per_gpu, kv_tokens_per_instance=mem.kv_tokens_per_instance,
        dcp=dcp, kv_shards=mem.kv_shards,
        sessions_in_hbm=mem.kv_tokens_per_instance // per_session,
        host_tier_tokens_per_instance=tier_tokens_per_instance,
        sessions_with_host_tier=(mem.kv_tokens_per_instance + tier_tokens_per_instance) // per_session,
    )


def topology_notes(recipe: Recipe, arch: Architecture, hw: Hardware) -> list[str]:
    """What the MLA copies cost a TP/TEP role, against DEP of the same GPUs; what DCP gives back."""
    out: list[str] = []
    for role in ("prefill", "decode"):
        spec: Prefill | Decode = getattr(recipe, role)
        par = parse_parallel(spec.parallel)
        dcp = getattr(spec, "dcp", 1)
        args = (arch, hw, recipe.model.weights)
        mem = role_memory(*args, par, recipe.kv.dtype, spec.gpu_memory_utilization, spec.reserve_gb, dcp)
        if par.tp > 1 and par.tp > dcp and mem.kv_tokens_per_instance:
            dep = role_memory(*args, parse_parallel(f"DEP{par.size}"), recipe.kv.dtype, spec.gpu_memory_utilization,
                              spec.reserve_gb)
            out.append(
                f"{role} {spec.parallel}{f' + DCP{dcp}' if dcp > 1 else ''}: {par.tp // dcp} ranks hold each copy of the "
                f"KV ({mem.kv_tokens_per_instance / 1e6:.2f}M tokens per instance); DEP{par.size} on the same GPUs would "
                f"hold {dep.kv_tokens_per_instance / 1e6:.2f}M "
                f"({dep.kv_tokens_per_instance / mem.kv_tokens_per_instance:.1f}x: {par.size} ranks with their own KV, "
                f"less the dense weights each DEP rank keeps whole)")
        if dcp > 1:
            out.append(f"{role} DCP{dcp}: KV sharded over {dcp} of the {par.tp} TP ranks (token i on rank i mod {dcp}): "
                       f"{dcp}x the tokens per instance of plain {spec.parallel}")
    return out


def _fp8_ds_mla_note(recipe: Recipe, arch: Architecture, hw: Hardware) -> str:
    """Sparse-MLA FP8 caches are stored as fp8_ds_mla rows; say what that does to the figure above."""
    from primectl_kernels import mla_storage_row_bytes

    par = parse_parallel(recipe.decode.parallel)
    mem = role_memory(arch, hw, recipe.model.weights, par, "fp8", recipe.decode.gpu_memory_utilization,
                      recipe.decode.reserve_gb)
    stored = mla_storage_row_bytes("fp8", arch.kv_lora_rank, arch.rope_dim) * arch.layers + indexer_bytes_per_token(arch)
    tokens = int(mem.kv_budget_gb * GB // stored)
    return (f"FP8 figures count 576-byte MLA rows (the reference deployment's basis); vLLM's sparse-MLA backend "
            f"stores fp8 as fp8_ds_mla rows of {mla_storage_row_bytes('fp8')} bytes (FP32 scales, bf16 rope), "
            f"which would hold {tokens / 1e6:.2f}M tokens per decoder on the same budget")


def capacity(recipe: Recipe, arch: Architecture, hw: Hardware, hosts: list[HostPlan], placement: Placement) -> Capacity:
    """KV capacity per role; on CPU profiles only the GPU count (there is no HBM to plan)."""
    total = sum(h.gpus for h in hosts)
    row = kv_row_bytes(arch, recipe.kv.dtype) if arch.attention == "mla" else 0
    if not hw.hbm_gb:
        return Capacity(
            session_context_tokens=SESSION_CONTEXT_TOKENS, kv_dtype=recipe.kv.dtype, kv_row_bytes=row,
            prefill=None, decode=None, gpus_used=0, gpus_total=total,
            notes=["hardware profile has no GPUs: capacity is simulated by the mocker"],
        )
    tier = recipe.host_tier if recipe.host_tier and recipe.host_tier.enabled else None
    prefill_tier_tokens = 0
    if tier:
        # The tier serves prefill workers (MooncakeStoreConnector); decode reads via NIXL.
        par = parse_parallel(recipe.prefill.parallel)
        per_token = kv_bytes_per_token(arch, recipe.kv.dtype, par.tp)
        hosts_per_instance = max(1, par.size // max(hw.gpus_per_host, 1))
        prefill_tier_tokens = int(tier.dram_gb_per_host * GB * hosts_per_instance // per_token)
    notes = []
    if arch.attention == "mla":
        notes.append("MLA keeps one latent KV head: every TP rank holds a full copy of its requests' KV")
        notes += topology_notes(recipe, arch, hw)
    if arch.attention == "mla" and arch.index_topk and recipe.kv.dtype == "fp8":
        notes.append(_fp8_ds_mla_note(recipe, arch, hw))
    return Capacity(
        session_context_tokens=SESSION_CONTEXT_TOKENS, kv_dtype=recipe.kv.dtype, kv_row_bytes=row,
        prefill=_role_capacity(recipe, arch, hw, recipe.prefill, recipe.prefill.groups, prefill_tier_tokens),
        decode=_role_capacity(recipe, arch, hw, recipe.decode, recipe.decode.workers, 0),
        gpus_used=placement.gpus_used, gpus_total=total, notes=notes,
    )


def check_service_name(plan: Plan, service: str, file: str) -> None:
    """RecipeError (exit 2) naming the plan's services when `service` is not one of them."""
    from primectl.recipe.suggest import did_you_mean

    names = [s.name for s in plan.services]
    if service not in names:
        raise RecipeError([Problem(file, 0, 0, "service",
                                   f"no service {service!r}{did_you_mean(service, names)}; services: {', '.join(names)}")])

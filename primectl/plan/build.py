"""Recipe -> Plan, without I/O."""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Any

from pydantic import BaseModel

from primectl.engines.base import Deployment
from primectl.engines.etcd import etcd_service
from primectl.engines.frontend import frontend_service
from primectl.engines.mocker_worker import mocker_worker_service
from primectl.engines.mooncake import master_service
from primectl.engines.vllm_worker import vllm_worker_service
from primectl.plan.capacity import (
    GB,
    indexer_bytes_per_token,
    kv_bytes_per_token,
    kv_row_bytes,
    parse_parallel,
    role_memory,
)
from primectl.plan.model import RELEASE, Capacity, HostPlan, Plan, Probe, RoleCapacity, Service
from primectl.plan.placement import Placement, place_workers
from primectl.recipe.catalog import MODELS, Architecture, Hardware
from primectl.recipe.load import Finding
from primectl.recipe.model import Decode, Prefill, Recipe, hardware_profile

SESSION_CONTEXT_TOKENS = 146_000


class PlanError(Exception):
    """The recipe parsed but cannot be planned; carries findings to pin to YAML lines."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("; ".join(f.message for f in findings))


def architecture(recipe: Recipe) -> Architecture:
    """The model's architecture: explicit fields, or the catalog entry."""
    if recipe.model.architecture is not None:
        return recipe.model.architecture
    assert recipe.model.arch is not None
    return MODELS[recipe.model.arch]


def host_plans(recipe: Recipe, hw: Hardware) -> list[HostPlan]:
    """Hosts with defaults applied (GPU count from the profile)."""
    return [
        HostPlan(
            name=h.name, address=h.address, port=h.port, user=h.user, identity_file=h.identity_file,
            connection=h.connection, workdir=h.workdir,
            gpus=h.gpus if h.gpus is not None else hw.gpus_per_host, labels=dict(h.labels),
        )
        for h in recipe.host_list()
    ]


def pins(recipe: Recipe) -> dict[str, str]:
    """The pinned version set for the host runtime."""
    s = recipe.software
    out = {"ai-dynamo": s.dynamo, "ai-dynamo-runtime": s.dynamo, "nixl": s.nixl, "mooncake-transfer-engine": s.mooncake}
    if recipe.engine == "vllm":
        out |= {"vllm": s.vllm, "flashinfer-python": s.flashinfer}
    return out


def runtime_key(recipe: Recipe, hw: Hardware) -> str:
    """Names the runtime venv: same pins and CPU/GPU flavour, same venv."""
    flavour = "cuda" if hw.sm else "cpu"
    blob = json.dumps({"pins": pins(recipe), "flavour": flavour}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


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
    """Place every service, derive ports, argv, env and capacity. Raises PlanError."""
    arch = architecture(recipe)
    hw = hardware_profile(recipe)
    hosts = host_plans(recipe, hw)
    by_name = {h.name: h for h in hosts}
    fe_host = recipe.frontend.host
    cp_host = recipe.control_plane.etcd_host or fe_host
    tier = recipe.host_tier if recipe.host_tier and recipe.host_tier.enabled else None
    p = recipe.ports
    etcd = f"http://{by_name[cp_host].address}:{p.etcd_client}" if recipe.control_plane.discovery == "etcd" else None
    dep = Deployment(
        recipe=recipe, arch=arch, hw=hw, runtime_key=runtime_key(recipe, hw), hosts=by_name,
        etcd_endpoint=etcd,
        mooncake_master=f"{by_name[tier.master_host].address}:{p.mooncake_rpc}" if tier else None,
        mooncake_metadata=f"http://{by_name[tier.master_host].address}:{p.mooncake_metadata}/metadata" if tier else None,
        discovery_dir=(
            posixpath.join(by_name[fe_host].workdir, "discovery", recipe.dynamo_namespace)
            if recipe.control_plane.discovery == "file" else None
        ),
        model_path=f"{RELEASE}/model" if recipe.model.generate else recipe.model.path,
    )
    placement = place_workers(recipe, hw, hosts)
    if placement.findings:
        raise PlanError(placement.findings)

    services: list[Service] = []
    control: list[str] = []
    if etcd:
        services.append(etcd_service(dep, cp_host))
        control.append("etcd")
    if tier:
        services.append(master_service(dep, tier.master_host))
        control.append("mooncake-master")
    workers: list[str] = []
    for slot in placement.slots:
        spec: Prefill | Decode = recipe.prefill if slot.role == "prefill" else recipe.decode
        make = mocker_worker_service if recipe.engine == "mocker" else vllm_worker_service
        services.append(make(dep, slot, spec, list(control)))
        workers.append(slot.name)
    services.append(frontend_service(dep, fe_host, control + workers))

    fe = by_name[fe_host]
    endpoint = f"http://{fe.address}:{recipe.frontend.port}"
    gate = Probe(
        kind="http", url=f"{endpoint}/v1/models/{recipe.model.served_name}/ready",
        timeout_s=max(s.ready.timeout_s for s in services),
    )
    plan = Plan(
        name=recipe.name, namespace=recipe.dynamo_namespace, engine=recipe.engine, supervisor=recipe.supervisor,
        served_model=recipe.model.served_name,
        recipe_hash=hashlib.sha256(recipe.model_dump_json().encode()).hexdigest()[:16],
        runtime_key=dep.runtime_key, pins=pins(recipe), hosts=hosts, services=services, gate=gate,
        endpoint=endpoint, capacity=capacity(recipe, arch, hw, hosts, placement),
        secret_names=sorted(recipe.secrets), defaults=_defaults(recipe),
    )
    port_findings = check_ports(plan)
    if port_findings:
        raise PlanError(port_findings)
    return plan


def check_ports(plan: Plan) -> list[Finding]:
    """No two services on one host may bind the same port."""
    owner: dict[tuple[str, int], str] = {}
    findings: list[Finding] = []
    for svc in plan.services:
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
    mem = role_memory(arch, hw, recipe.model.weights, par, recipe.kv.dtype, spec.gpu_memory_utilization, spec.reserve_gb)
    per_session = SESSION_CONTEXT_TOKENS
    return RoleCapacity(
        instances=instances, gpus_per_instance=par.size, parallel=spec.parallel, hbm_gb=hw.hbm_gb,
        usable_gb=round(mem.usable_gb, 2), weights_gb=round(mem.weights_gb, 2), reserve_gb=mem.reserve_gb,
        kv_budget_gb=round(mem.kv_budget_gb, 2), kv_bytes_per_token=mem.kv_bytes_per_token,
        kv_tokens_per_gpu=mem.kv_tokens_per_gpu, kv_tokens_per_instance=mem.kv_tokens_per_instance,
        sessions_in_hbm=mem.kv_tokens_per_instance // per_session,
        host_tier_tokens_per_instance=tier_tokens_per_instance,
        sessions_with_host_tier=(mem.kv_tokens_per_instance + tier_tokens_per_instance) // per_session,
    )


def _fp8_ds_mla_note(recipe: Recipe, arch: Architecture, hw: Hardware) -> str:
    """Sparse-MLA FP8 caches are stored as fp8_ds_mla rows; say what that does to the figure above."""
    from kernels import mla_storage_row_bytes

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
    if arch.attention == "mla" and arch.index_topk and recipe.kv.dtype == "fp8":
        notes.append(_fp8_ds_mla_note(recipe, arch, hw))
    return Capacity(
        session_context_tokens=SESSION_CONTEXT_TOKENS, kv_dtype=recipe.kv.dtype, kv_row_bytes=row,
        prefill=_role_capacity(recipe, arch, hw, recipe.prefill, recipe.prefill.groups, prefill_tier_tokens),
        decode=_role_capacity(recipe, arch, hw, recipe.decode, recipe.decode.workers, 0),
        gpus_used=placement.gpus_used, gpus_total=total, notes=notes,
    )

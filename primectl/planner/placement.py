"""Which worker runs on which host and GPUs, with which ports.

Prefill groups are placed first, then decode instances; first fit in host
order, so the result is deterministic. An instance larger than a host takes
whole hosts inside one NVLink domain (hosts' `labels.nvlink_domain`): a DEP
group as one process per host with its share of the DP ranks, a TP/TEP
instance as one process per host with its node rank (vLLM's multi-node
launch, node rank 0 the engine, the others headless). TP and TEP shard every
layer over NVLink, so they never span hosts that do not share a domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from primectl.errors import Finding
from primectl.plan.model import DataParallel, HostPlan, Slot, TensorNodes
from primectl.recipe.capacity import Parallel, parse_parallel
from primectl.recipe.catalog import Hardware
from primectl.recipe.model import Decode, Prefill, Recipe


@dataclass
class _HostGpus:
    plan: HostPlan
    free: list[int]
    domain: str
    workers: int = 0

    @property
    def whole(self) -> bool:
        return len(self.free) == self.plan.gpus and self.plan.gpus > 0


@dataclass
class Placement:
    """Worker slots in plan order, or the reasons they could not be placed."""

    slots: list[Slot] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    gpus_used: int = 0


def _domain(host: HostPlan, hw: Hardware) -> str:
    for key in ("nvlink_domain", "rack"):
        if key in host.labels:
            return host.labels[key]
    # Unlabelled hosts share one domain only where the profile has multi-host NVLink.
    return "default" if hw.hosts_per_nvlink_domain > 1 else host.name


def port_block(recipe: Recipe) -> int:
    """Ports reserved per worker for per-rank listeners (KV events, NIXL side channel)."""
    biggest = max(parse_parallel(recipe.prefill.parallel).dp, parse_parallel(recipe.decode.parallel).dp)
    block = 16
    while block < biggest:
        block *= 2
    return block


def _ports(recipe: Recipe, k: int, block: int) -> dict[str, int]:
    p = recipe.ports
    ports = {
        "system": p.worker_system + k,
        "tcp_rpc": p.tcp_rpc + k,
        "nixl": p.nixl_side_channel + block * k,
        "bootstrap": p.bootstrap + k,
        "dp_rpc": p.dp_rpc + k,
    }
    if recipe.frontend.router_mode == "kv" and recipe.frontend.kv_events:
        ports["kv_events"] = p.kv_events + block * k
    return ports


def place_workers(recipe: Recipe, hw: Hardware, hosts: list[HostPlan]) -> Placement:
    """Assign every prefill and decode instance to hosts and GPUs."""
    state = {h.name: _HostGpus(h, list(range(h.gpus)), _domain(h, hw)) for h in hosts}
    out = Placement()
    block = port_block(recipe)
    roles: list[tuple[str, Prefill | Decode, int]] = [
        ("prefill", recipe.prefill, recipe.prefill.groups),
        ("decode", recipe.decode, recipe.decode.workers),
    ]
    for role, spec, count in roles:
        par = parse_parallel(spec.parallel)
        names = spec.hosts or [h.name for h in hosts]
        candidates = [state[n] for n in names if n in state]
        gpu_hosts = [c for c in candidates if c.plan.gpus > 0]
        widest = max((c.plan.gpus for c in gpu_hosts), default=0)
        if gpu_hosts and par.dp == 1 and par.size > widest:
            refusal = _tensor_span_refusal(spec.parallel, par, gpu_hosts, widest, hw)
            if refusal:
                out.findings.append(Finding((role, "parallel"), refusal))
                continue
        for i in range(count):
            if not gpu_hosts:
                _place_cpu(recipe, role, i, par, candidates, out, block)
                continue
            if not _place_gpu(recipe, role, i, par, gpu_hosts, out, block):
                need = count * par.size
                free = sum(len(c.free) for c in gpu_hosts)
                out.findings.append(Finding(
                    (role, "groups" if role == "prefill" else "workers"),
                    f"cannot place {role} instance {i + 1} of {count} ({spec.parallel} needs {par.size} GPUs"
                    f"{' on whole hosts of one NVLink domain' if par.size > max(c.plan.gpus for c in gpu_hosts) else ' on one host'}); "
                    f"{role} needs {need} GPUs in all and {free} were free when it ran out",
                ))
                break
    return out


def _tensor_span_refusal(spec: str, par: Parallel, hosts: list[_HostGpus], widest: int, hw: Hardware) -> str | None:
    """Why a TP/TEP instance wider than a host cannot be placed on these hosts (None: it can, if GPUs are free).

    Tensor parallelism all-reduces every layer over NVLink: its hosts must be whole hosts of one NVLink domain.
    """
    span = par.size // widest
    if par.size % widest:
        return (f"{spec} cannot span hosts of {widest} GPUs: a tensor-parallel instance takes whole hosts; "
                f"use a multiple of {widest}, TP{widest} or less")
    if hw.hosts_per_nvlink_domain < span:
        return (f"{spec} cannot span hosts: tensor parallelism needs {span} hosts of {widest} GPUs in one NVLink domain "
                f"and a {hw.gpu} profile has NVLink inside {hw.hosts_per_nvlink_domain} host(s) only; "
                f"use TP{widest} or less, or DEP{par.size} across whole hosts")
    sizes: dict[str, int] = {}
    for h in hosts:
        if h.plan.gpus == widest:
            sizes[h.domain] = sizes.get(h.domain, 0) + 1
    if max(sizes.values()) < span:
        shown = ", ".join(f"{d}: {n}" for d, n in sizes.items())
        return (f"{spec} cannot span hosts that share no NVLink domain: tensor parallelism needs {span} hosts of "
                f"{widest} GPUs with one `labels.nvlink_domain`, and the largest domain here has {max(sizes.values())} "
                f"(hosts per domain: {shown}); label trays of one NVL72 rack with the same nvlink_domain, "
                f"or use TP{widest} or less, or DEP{par.size}")
    return None


def _name(role: str, i: int, part: int | None) -> str:
    return f"{role}-{i}" if part is None else f"{role}-{i}-{part}"


def _slot(role: str, i: int, part: int | None, par: Parallel, h: _HostGpus, gpus: list[int], dp: DataParallel | None,
          ports: dict[str, int], *, span: int = 1, domain: str | None = None, cpus: list[int] | None = None,
          tensor_nodes: TensorNodes | None = None) -> Slot:
    return Slot(
        name=_name(role, i, part), role=role, parallel=f"{par.kind}{par.size}", gpus=gpus, cpus=cpus or [],
        data_parallel=dp, tensor_nodes=tensor_nodes,
        group=_name(role, i, None) if part is not None else None, hosts_per_instance=span, domain=domain,
        host=h.plan.name, ports=ports,
    )


def _place_cpu(
    recipe: Recipe, role: str, i: int, par: Parallel, candidates: list[_HostGpus], out: Placement, block: int,
) -> None:
    """No GPUs (CPU profile): one process per instance, round-robin over hosts."""
    pool = [c for c in candidates if c.plan.gpus == 0] or candidates
    target = min(pool, key=lambda c: c.workers)  # stable: first host with fewest workers
    k = target.workers
    target.workers += 1
    dp = DataParallel(size=par.dp, local=par.dp, start_rank=0, address=target.plan.address) if par.dp > 1 else None
    # one process per core: the host's k-th worker gets core k (engines pin their threads to it)
    out.slots.append(_slot(role, i, None, par, target, [], dp, _ports(recipe, k, block), cpus=[k]))


def _place_gpu(
    recipe: Recipe, role: str, i: int, par: Parallel, hosts: list[_HostGpus], out: Placement, block: int,
) -> bool:
    for h in hosts:
        if len(h.free) >= par.size:
            gpus = tuple(h.free[: par.size])
            del h.free[: par.size]
            k = h.workers
            h.workers += 1
            dp = DataParallel(size=par.dp, local=par.dp, start_rank=0, address=h.plan.address) if par.dp > 1 else None
            out.slots.append(_slot(role, i, None, par, h, list(gpus), dp, _ports(recipe, k, block)))
            out.gpus_used += par.size
            return True
    per_host = max(h.plan.gpus for h in hosts)
    if par.size <= per_host or par.size % per_host:
        return False  # an instance spans only whole hosts
    span = par.size // per_host
    by_domain: dict[str, list[_HostGpus]] = {}
    for h in hosts:
        if h.whole and h.plan.gpus == per_host:
            by_domain.setdefault(h.domain, []).append(h)
    for members in by_domain.values():
        if len(members) < span:
            continue
        chosen = members[:span]
        head = chosen[0]
        # Every host of the instance meets at the first host's ports: DP RPC (DEP) or torch.distributed (TP/TEP).
        if par.dp > 1:
            shared = {"dp_rpc": _ports(recipe, head.workers, block)["dp_rpc"]}
        else:
            shared = {"tp_master": recipe.ports.tp_master + head.workers}
        for part, h in enumerate(chosen):
            gpus = tuple(h.free)
            h.free.clear()
            k = h.workers
            h.workers += 1
            dp = tn = None
            if par.dp > 1:
                dp = DataParallel(size=par.dp, local=per_host, start_rank=part * per_host, address=head.plan.address)
            else:
                tn = TensorNodes(nnodes=span, node_rank=part, master_addr=head.plan.address,
                                 master_port=shared["tp_master"])
            ports = _ports(recipe, k, block) | shared
            out.slots.append(_slot(role, i, part, par, h, list(gpus), dp, ports, span=span, domain=h.domain,
                                   tensor_nodes=tn))
        out.gpus_used += par.size
        return True
    return False


# Instance offset of the port block a surge twin takes (beside its instance, never over another one's).
SURGE_PORT_OFFSET = 64


def surge_slots(recipe: Recipe, slots: list[Slot], hosts: list[HostPlan]) -> list[Slot | None]:
    """Where a second instance of each slot can run beside it during a change (None: no room for one).

    Hosts without GPUs have room (ports and memory are all it takes on the CPU demo). A GPU instance's twin
    takes GPUs of its own host that no planned worker uses, first fit in slot order, so two twins never share
    one; an instance that spans hosts has no twin.
    """
    used: dict[str, set[int]] = {}
    for slot in slots:
        used.setdefault(slot.host, set()).update(slot.gpus)
    spare = {h.name: [g for g in range(h.gpus) if g not in used.get(h.name, set())] for h in hosts}
    out: list[Slot | None] = []
    for slot in slots:
        pool = spare.get(slot.host, [])
        if slot.hosts_per_instance > 1 or len(pool) < len(slot.gpus):
            out.append(None)
            continue
        gpus, spare[slot.host] = pool[:len(slot.gpus)], pool[len(slot.gpus):]
        out.append(_twin(recipe, slot, gpus))
    return out


def _twin(recipe: Recipe, slot: Slot, gpus: list[int]) -> Slot:
    block = port_block(recipe)
    k = slot.ports["system"] - recipe.ports.worker_system + SURGE_PORT_OFFSET
    ports = _ports(recipe, k, block)
    if "dp_rpc" in slot.ports:
        ports["dp_rpc"] = slot.ports["dp_rpc"] + SURGE_PORT_OFFSET
    return slot.model_copy(update={"name": f"{slot.name}-surge", "ports": ports, "gpus": gpus})

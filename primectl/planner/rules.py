"""Semantic rules: what the schema alone cannot say about a recipe.

Each rule returns findings (recipe path + message); all of them run so the
user sees every problem at once. Engine-specific rules live with the engine
(`Engine.validate`, called from here); GPU accounting and ports are checked by
the planner on the very placement `up` would use (`planner.build.plan_recipe`).
"""

from __future__ import annotations

from math import gcd

from primectl.engines.base import get as get_engine
from primectl.errors import Finding
from primectl.recipe.catalog import MODELS, Architecture
from primectl.recipe.compat import check_software
from primectl.recipe.model import Recipe, hardware_profile
from primectl.recipe.suggest import did_you_mean
from primectl.registry import PluginError


def _model_rules(r: Recipe) -> list[Finding]:
    out: list[Finding] = []
    m = r.model
    if (m.arch is None) == (m.architecture is None):
        out.append(Finding(("model", "arch"), "set exactly one of `arch` (catalog) or `architecture` (explicit fields)"))
    elif m.arch is not None and m.arch not in MODELS:
        out.append(Finding(("model", "arch"), f"unknown architecture {m.arch!r}{did_you_mean(m.arch, list(MODELS))}; "
                           f"allowed: {', '.join(MODELS)}"))
    if m.generate and m.path:
        out.append(Finding(("model", "path"), "`path` and `generate` exclude each other"))
    if not m.generate and not m.path:
        out.append(Finding(("model", "path"), "required: the weights directory on the hosts (or `generate: demo-tiny`)"))
    return out


def _host_rules(r: Recipe) -> list[Finding]:
    out: list[Finding] = []
    hosts = r.host_list()
    names = [h.name for h in hosts]
    if not hosts:
        out.append(Finding(("hosts",), "at least one host is required"))
    for i, h in enumerate(hosts):
        if names.index(h.name) != i:
            out.append(Finding(("hosts", i, "name"), f"host name {h.name!r} is used twice"))
    refs: list[tuple[tuple[str | int, ...], str]] = [(("frontend", "host"), r.frontend.host)]
    if r.host_tier:
        refs.append((("host_tier", "master_host"), r.host_tier.master_host))
    if r.control_plane.etcd_host:
        refs.append((("control_plane", "etcd_host"), r.control_plane.etcd_host))
    for role in ("prefill", "decode"):
        for i, name in enumerate(getattr(r, role).hosts or []):
            refs.append(((role, "hosts", i), name))
    for path, name in refs:
        if name not in names:
            out.append(Finding(path, f"no host named {name!r}{did_you_mean(name, names)}; hosts: {', '.join(names)}"))
    by_name = {h.name: h for h in hosts}
    for i, h in enumerate(hosts):
        if h.via is None:
            if h.via_identity_file is not None:
                out.append(Finding(("hosts", i, "via_identity_file"), "only with `via` (the key is on that host)"))
            continue
        head = by_name.get(h.via)
        if head is None:
            out.append(Finding(("hosts", i, "via"), f"no host named {h.via!r}{did_you_mean(h.via, names)}; "
                               f"hosts: {', '.join(names)}"))
        elif head.name == h.name:
            out.append(Finding(("hosts", i, "via"), "a host cannot be reached through itself"))
        elif head.via is not None:
            out.append(Finding(("hosts", i, "via"), f"{head.name!r} is itself reached through {head.via!r}: name a "
                               "host primectl connects to directly (one hop)"))
        elif "local" in (h.connection, head.connection):
            out.append(Finding(("hosts", i, "via"), "both hosts must use `connection: ssh`"))
    if r.control_plane.discovery == "file" and len({h.address for h in hosts}) > 1:
        out.append(Finding(("control_plane", "discovery"),
                           "file discovery works on one host only (inotify); use `etcd` for several hosts"))
    return out


def _topology_rules(r: Recipe) -> list[Finding]:
    out: list[Finding] = []
    if r.ratio:
        want_p, want_d = (int(x) for x in r.ratio.split(":"))
        g = gcd(r.prefill.groups, r.decode.workers)
        have = (r.prefill.groups // g, r.decode.workers // g)
        if have != (want_p // gcd(want_p, want_d), want_d // gcd(want_p, want_d)):
            out.append(Finding(("ratio",), f"ratio {r.ratio} disagrees with prefill.groups={r.prefill.groups} and "
                               f"decode.workers={r.decode.workers} ({have[0]}:{have[1]})"))
    out += _dcp_rules(r)
    hw = hardware_profile(r)
    if r.host_tier and r.host_tier.protocol == "rdma" and not hw.sm:
        out.append(Finding(("host_tier", "protocol"), "rdma needs RDMA NICs; on a cpu profile use `tcp`"))
    return out


def _dcp_rules(r: Recipe) -> list[Finding]:
    """DCP reuses the TP ranks (vLLM ParallelConfig: tp_size must be divisible by dcp_size)."""
    from primectl.recipe.capacity import parse_parallel

    dcp = r.decode.dcp
    if dcp == 1:
        return []
    par = parse_parallel(r.decode.parallel)
    if par.tp == 1:
        return [Finding(("decode", "dcp"), f"dcp {dcp} needs tensor parallelism to shard over, but decode.parallel is "
                        f"{r.decode.parallel} (one rank per attention instance); use TPn or TEPn with n >= {dcp}, "
                        "or dcp: 1")]
    if par.tp % dcp:
        return [Finding(("decode", "dcp"), f"dcp {dcp} must divide the TP size of {r.decode.parallel} ({par.tp}); "
                        f"allowed: {', '.join(str(d) for d in (1, 2, 4, 8, 16, 32, 64) if d <= par.tp)}")]
    return []


def _memory_rules(r: Recipe, arch: Architecture) -> list[Finding]:
    from primectl.recipe.capacity import kv_bytes_per_token, parse_parallel, role_memory

    hw = hardware_profile(r)
    if not hw.hbm_gb:
        return []
    out: list[Finding] = []
    context = r.model.max_context or arch.max_context
    for role in ("prefill", "decode"):
        spec = getattr(r, role)
        par = parse_parallel(spec.parallel)
        dcp = getattr(spec, "dcp", 1)
        mem = role_memory(arch, hw, r.model.weights, par, r.kv.dtype, spec.gpu_memory_utilization, spec.reserve_gb, dcp)
        need_kv = context * kv_bytes_per_token(arch, r.kv.dtype, par.tp) / dcp / 1e9
        if mem.kv_budget_gb < need_kv:
            out.append(Finding((role, "parallel"), (
                f"{spec.parallel} does not fit: per GPU {hw.hbm_gb:g} GB x {spec.gpu_memory_utilization} = "
                f"{mem.usable_gb:.1f} GB usable, weights {mem.weights_gb:.1f} GB + reserve {mem.reserve_gb:.1f} GB "
                f"leave {mem.kv_budget_gb:.1f} GB for KV, but one {context}-token request needs {need_kv:.1f} GB; "
                "use more GPUs per instance, a smaller KV dtype or a lower max_context")))
    return out


def _component_rules(r: Recipe) -> list[Finding]:
    """What each component the recipe uses finds wrong with it; a plugin that cannot be loaded, at its block."""
    from primectl.components import base as components

    out: list[Finding] = []
    for name in components.used_by(list(type(r).model_fields)):
        try:
            out += components.validate(components.get(name), r)
        except PluginError as exc:
            out.append(Finding((name,), str(exc)))
    return out


def check_recipe(r: Recipe) -> list[Finding]:
    """Every semantic problem in the recipe the planner does not find itself; empty: it can be planned."""
    findings = _model_rules(r) + _host_rules(r) + _topology_rules(r)
    arch = r.model.architecture or MODELS.get(r.model.arch or "")
    try:
        findings += get_engine(r.engine).validate(r, arch, hardware_profile(r))
    except PluginError as exc:  # a plugin that cannot be loaded: reported with the recipe's other problems
        findings.append(Finding(("engine",), str(exc)))
    findings += _component_rules(r)
    findings += [Finding(("software", field), msg) for field, msg in check_software(r.software)]
    if findings or arch is None:
        return findings
    return _memory_rules(r, arch)

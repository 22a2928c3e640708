"""Memory and KV-cache arithmetic (facts.md, "KV cache arithmetic").

Pure functions of the model architecture, hardware profile and topology; no
figure is stored, every one is derived.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from primectl.recipe.catalog import WEIGHT_BYTES_PER_PARAM, Architecture, Hardware
from primectl.recipe.model import PARALLEL_RE
from primectl_kernels import mla_row_bytes

GB = 1e9
# The DSA indexer caches one FP8 key of head_dim values plus one FP32 scale per token per layer.
INDEXER_SCALE_BYTES = 4
DTYPE_BYTES = {"bf16": 2, "auto": 2, "fp8": 1}


@dataclass(frozen=True)
class Parallel:
    """A parallel spec such as DEP8, decoded."""

    kind: str
    size: int

    @property
    def tp(self) -> int:
        """Tensor-parallel degree (attention and dense weights sharded this many ways)."""
        return self.size if self.kind in ("TP", "TEP") else 1

    @property
    def dp(self) -> int:
        """Data-parallel ranks (each holds its own requests' KV)."""
        return self.size if self.kind in ("DEP", "DP") else 1

    @property
    def ep(self) -> int:
        """Expert-parallel degree (routed experts sharded this many ways)."""
        return self.size if self.kind in ("DEP", "TEP") else self.tp

    @property
    def expert_parallel(self) -> bool:
        """Whether vLLM's --enable-expert-parallel is on."""
        return self.kind in ("DEP", "TEP")


def parse_parallel(spec: str) -> Parallel:
    """Decode `DEP8` into kind and size (the recipe validator has checked it)."""
    m = PARALLEL_RE.match(spec)
    if not m:
        raise ValueError(f"not a parallel spec: {spec!r}")
    return Parallel(m.group(1), int(m.group(2)))


def kv_row_bytes(arch: Architecture, dtype: str) -> int:
    """Bytes one token occupies in one layer's main KV cache (without the indexer)."""
    if arch.attention == "mla":
        return mla_row_bytes("bf16" if dtype == "auto" else dtype, kv_lora_rank=arch.kv_lora_rank, rope_dim=arch.rope_dim)
    per_value = DTYPE_BYTES.get(dtype, 0.5 if dtype == "nvfp4" else 2)
    return int(2 * arch.kv_heads * arch.head_dim * per_value)


def kv_bytes_per_token(arch: Architecture, dtype: str, tp: int = 1) -> int:
    """KV bytes per token across all layers held by one GPU.

    MLA caches one latent head, so every TP rank keeps a full copy; MHA/GQA
    splits KV heads across TP ranks. The sparse indexer's keys are cached on
    `indexer_layers` layers in FP8 with an FP32 scale.
    """
    main = kv_row_bytes(arch, dtype) * arch.layers
    if arch.attention != "mla":
        main //= min(tp, arch.kv_heads)
    return main + indexer_bytes_per_token(arch)


def indexer_bytes_per_token(arch: Architecture) -> int:
    """Sparse-attention indexer cache per token across its layers (0 without an indexer)."""
    return (arch.indexer_head_dim + INDEXER_SCALE_BYTES) * arch.indexer_layers if arch.indexer_heads else 0


def weights_gb_per_gpu(arch: Architecture, weights: Mapping[Any, str], par: Parallel) -> float:
    """Weight bytes one GPU holds: dense parts split by TP, routed experts split by EP."""
    expert_b = arch.routed_expert_params_b * WEIGHT_BYTES_PER_PARAM[weights.get("experts", "fp8")]
    dense_b = arch.dense_params_b * WEIGHT_BYTES_PER_PARAM[weights.get("dense", "fp8")]
    return dense_b / par.tp + expert_b / par.ep


@dataclass(frozen=True)
class RoleMemory:
    """Per-GPU memory split for one role."""

    usable_gb: float
    weights_gb: float
    reserve_gb: float
    kv_budget_gb: float
    kv_bytes_per_token: int
    kv_tokens_per_gpu: int
    kv_tokens_per_instance: int
    kv_shards: int = 1


def kv_shards(par: Parallel, dcp: int = 1) -> int:
    """Ranks of one instance that hold distinct KV: each DP rank its own requests, each DCP rank every dcp-th token.

    The other TP ranks of an MLA model hold copies (one latent head cannot be split by heads).
    """
    return par.dp * dcp


def role_memory(
    arch: Architecture, hw: Hardware, weights: Mapping[Any, str], par: Parallel,
    kv_dtype: str, utilisation: float, reserve_gb: float, dcp: int = 1,
) -> RoleMemory:
    """KV budget per GPU = HBM x utilisation - weights share - reserve; tokens follow.

    `dcp`: decode context parallelism; vLLM stores token i's KV (MLA rows and indexer keys alike, one block
    table of block_size x dcp virtual blocks) on DCP rank i mod dcp, so a GPU holds as many tokens as without
    DCP but an instance holds dcp times as many distinct ones.
    """
    usable = hw.hbm_gb * utilisation
    w = weights_gb_per_gpu(arch, weights, par)
    budget = usable - w - reserve_gb
    per_token = kv_bytes_per_token(arch, kv_dtype, par.tp)
    tokens = max(int(budget * GB // per_token), 0) if per_token else 0
    shards = kv_shards(par, dcp)
    return RoleMemory(usable, w, reserve_gb, budget, per_token, tokens, tokens * shards, shards)

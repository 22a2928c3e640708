"""Built-in model architectures and hardware profiles (facts.md).

Numbers here are public facts; every capacity figure is derived from them by
the planner, never stored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Architecture(BaseModel):
    """Shape of a model, as far as placement and KV arithmetic need it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attention: str = Field("mla", description="Attention kind: `mla` (latent KV, one head) or `mha`.")
    layers: int = Field(..., gt=0, description="Transformer layers that hold KV cache (MTP layers excluded).")
    hidden_size: int = Field(..., gt=0)
    kv_lora_rank: int = Field(512, ge=0, description="MLA latent width (values per cached row).")
    rope_dim: int = Field(64, ge=0, description="MLA rope part per cached row.")
    kv_heads: int = Field(1, gt=0, description="KV heads (MHA/GQA only; MLA caches one latent head).")
    head_dim: int = Field(128, gt=0, description="Per-head width (MHA/GQA only).")
    indexer_heads: int = Field(0, ge=0, description="Sparse-attention indexer heads (0 = no indexer).")
    indexer_head_dim: int = Field(0, ge=0)
    indexer_layers: int = Field(0, ge=0, description="Layers that keep an indexer key cache.")
    index_topk: int = Field(0, ge=0, description="Rows read per query by sparse attention (0 = dense).")
    routed_experts: int = Field(0, ge=0)
    experts_per_token: int = Field(0, ge=0)
    shared_experts: int = Field(0, ge=0)
    moe_intermediate_size: int = Field(0, ge=0)
    first_k_dense: int = Field(0, ge=0, description="Leading layers with a dense MLP instead of experts.")
    total_params_b: float = Field(..., gt=0, description="All parameters, billions.")
    active_params_b: float = Field(..., gt=0, description="Parameters used per token, billions.")
    max_context: int = Field(..., gt=0, description="max_position_embeddings.")
    vocab_size: int = Field(..., gt=0)

    @property
    def routed_expert_params_b(self) -> float:
        """Routed-expert parameters in billions: experts x 3 matrices x hidden x moe width x MoE layers."""
        moe_layers = max(self.layers - self.first_k_dense, 0)
        per_expert = 3 * self.hidden_size * self.moe_intermediate_size
        return self.routed_experts * per_expert * moe_layers / 1e9

    @property
    def dense_params_b(self) -> float:
        """Everything that is not a routed expert (attention, embeddings, dense MLPs, shared experts)."""
        return self.total_params_b - self.routed_expert_params_b


class Hardware(BaseModel):
    """One kind of host: GPUs per host, memory per GPU, and how hosts group."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str = Field(..., description="GPU model name as nvidia-smi reports it (empty for CPU hosts).")
    sm: int = Field(0, ge=0, description="Compute capability x10 (100 = SM100 Blackwell, 90 = Hopper, 0 = none).")
    gpus_per_host: int = Field(..., ge=0)
    hbm_gb: float = Field(..., ge=0, description="Memory per GPU in GB (1e9 bytes).")
    hbm_tb_s: float = Field(0, ge=0, description="Memory bandwidth per GPU, TB/s.")
    hosts_per_nvlink_domain: int = Field(1, ge=1, description="Hosts that share one NVLink domain.")
    host_dram_gb: float = Field(0, ge=0, description="Host memory per host, GB.")


MODELS: dict[str, Architecture] = {
    "glm-5.3": Architecture(
        layers=78, hidden_size=6144, kv_lora_rank=512, rope_dim=64,
        # GLM-5.3 computes indexer keys on 21 layers and shares them on 57, but vLLM 0.33
        # allocates the indexer cache on all 78 layers; capacity follows the runtime.
        indexer_heads=32, indexer_head_dim=128, indexer_layers=78, index_topk=2048,
        routed_experts=256, experts_per_token=8, shared_experts=1, moe_intermediate_size=2048,
        first_k_dense=3, total_params_b=744, active_params_b=40, max_context=1048576, vocab_size=154880,
    ),
    "deepseek-v3.2": Architecture(
        layers=61, hidden_size=7168, kv_lora_rank=512, rope_dim=64,
        indexer_heads=64, indexer_head_dim=128, indexer_layers=61, index_topk=2048,
        routed_experts=256, experts_per_token=8, shared_experts=1, moe_intermediate_size=2048,
        first_k_dense=3, total_params_b=671, active_params_b=37, max_context=163840, vocab_size=129280,
    ),
    "demo-tiny": Architecture(
        attention="mha", layers=2, hidden_size=64, kv_lora_rank=0, rope_dim=0, kv_heads=2, head_dim=32,
        total_params_b=0.001, active_params_b=0.001, max_context=32768, vocab_size=2048,
    ),
    # primectl.tiny_model: the random-weight Qwen2 real vLLM serves on CPU (float32 weights and KV).
    "tiny-qwen2": Architecture(
        attention="mha", layers=2, hidden_size=128, kv_lora_rank=0, rope_dim=0, kv_heads=2, head_dim=32,
        total_params_b=0.0004, active_params_b=0.0004, max_context=2048, vocab_size=1088,
    ),
}

HARDWARE: dict[str, Hardware] = {
    "gb200-nvl72": Hardware(
        gpu="NVIDIA GB200", sm=100, gpus_per_host=4, hbm_gb=186, hbm_tb_s=8.0,
        hosts_per_nvlink_domain=18, host_dram_gb=960,
    ),
    "h200-hgx": Hardware(
        gpu="NVIDIA H200", sm=90, gpus_per_host=8, hbm_gb=141, hbm_tb_s=4.8,
        hosts_per_nvlink_domain=1, host_dram_gb=2048,
    ),
    "cpu": Hardware(gpu="", sm=0, gpus_per_host=0, hbm_gb=0, hbm_tb_s=0, hosts_per_nvlink_domain=1, host_dram_gb=16),
}

# Bytes per parameter for weight storage formats (NVFP4 counts its E4M3 scale per 16 values).
WEIGHT_BYTES_PER_PARAM: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5625}

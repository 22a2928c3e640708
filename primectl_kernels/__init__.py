"""primectl kernels: NVFP4 / FP8 packed MLA KV-cache codecs and sparse MLA decode.

Importing this package is dependency-free (pure Python): the row-size constants
and layout helpers below are the single source of truth for the planner.  The
torch/triton parts live in ``primectl_kernels.reference``, ``primectl_kernels.codec`` and
``primectl_kernels.decode`` and are imported only on demand.
"""

import os

from primectl_kernels.layout import (
    BF16_MLA_TOKEN_BYTES,
    FP8_DS_MLA_ROW_BYTES,
    FP8_E4M3_MAX,
    FP8_LATENT_BYTES,
    FP8_LATENT_OFFSET,
    FP8_MLA_TOKEN_BYTES,
    FP8_NUM_SCALES,
    FP8_ROPE_BYTES,
    FP8_ROPE_OFFSET,
    FP8_SCALE_BYTES,
    FP8_SCALE_GROUP,
    FP8_SCALE_OFFSET,
    HEAD_DIM_QK,
    HEAD_DIM_V,
    KV_LORA_RANK,
    NVFP4_BLOCK,
    NVFP4_DS_MLA_ROW_BYTES,
    NVFP4_E2M1_MAX,
    NVFP4_LATENT_BYTES,
    NVFP4_LATENT_OFFSET,
    NVFP4_MIN_SCALE,
    NVFP4_MLA_TOKEN_BYTES,
    NVFP4_NUM_SCALES,
    NVFP4_ROPE_BYTES,
    NVFP4_ROPE_OFFSET,
    NVFP4_SCALE_BYTES,
    NVFP4_SCALE_OFFSET,
    ROPE_DIM,
    SUPPORTED_DTYPES,
    decode_read_bytes,
    mla_row_bytes,
    mla_storage_row_bytes,
    nvfp4_scale_block,
    nvfp4_scale_offset,
)

__all__ = [
    "BF16_MLA_TOKEN_BYTES",
    "FP8_DS_MLA_ROW_BYTES",
    "FP8_E4M3_MAX",
    "FP8_LATENT_BYTES",
    "FP8_LATENT_OFFSET",
    "FP8_MLA_TOKEN_BYTES",
    "FP8_NUM_SCALES",
    "FP8_ROPE_BYTES",
    "FP8_ROPE_OFFSET",
    "FP8_SCALE_BYTES",
    "FP8_SCALE_GROUP",
    "FP8_SCALE_OFFSET",
    "HEAD_DIM_QK",
    "HEAD_DIM_V",
    "KV_LORA_RANK",
    "NVFP4_BLOCK",
    "NVFP4_DS_MLA_ROW_BYTES",
    "NVFP4_E2M1_MAX",
    "NVFP4_LATENT_BYTES",
    "NVFP4_LATENT_OFFSET",
    "NVFP4_MIN_SCALE",
    "NVFP4_MLA_TOKEN_BYTES",
    "NVFP4_NUM_SCALES",
    "NVFP4_ROPE_BYTES",
    "NVFP4_ROPE_OFFSET",
    "NVFP4_SCALE_BYTES",
    "NVFP4_SCALE_OFFSET",
    "ROPE_DIM",
    "SUPPORTED_DTYPES",
    "compiled_gpu",
    "decode_read_bytes",
    "mla_row_bytes",
    "mla_storage_row_bytes",
    "nvfp4_scale_block",
    "nvfp4_scale_offset",
]


def compiled_gpu() -> bool:
    """True when the Triton kernels will be compiled for a CUDA GPU: torch is installed and sees
    one, and ``TRITON_INTERPRET=1`` does not send them to the interpreter."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())

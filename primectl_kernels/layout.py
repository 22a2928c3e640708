"""Byte layouts of the packed MLA KV-cache rows (pure Python, no torch/triton).

This module is the single source of truth for row sizes and byte offsets.
The planner imports it without pulling in torch or triton, so keep it free of
third-party imports.

Two packed row formats are defined (one row = one token of one layer, the
single latent KV head of MLA):

``fp8_ds_mla`` (656 bytes)::

    [0, 512)    512 x e4m3 latent values
    [512, 528)  4 x float32 scales, one per 128 latent values (little endian)
    [528, 656)  64 x bfloat16 rope values (little endian)

``nvfp4_ds_mla`` (352 bytes)::

    [0, 256)    512 x E2M1 latent values, two per byte, low nibble = even element
    [256, 320)  64 x e4m3 rope values
    [320, 352)  32 x e4m3 block scales (one per 16 latent values), permuted:
                the scale of block s lives at byte 320 + 8*(s & 3) + (s >> 2)

Capacity arithmetic (``mla_row_bytes``) uses the MLA payload per token as in the
project's KV-cache arithmetic: fp8 = latent 512 + rope 64 = 576 B, nvfp4 =
256 + 32 + 64 = 352 B, bf16 = 2 * (512 + 64) = 1152 B.  The *stored* fp8_ds_mla
row is larger (656 B, FP32 scales and bf16 rope); ``mla_storage_row_bytes``
returns the stored size.
"""

from __future__ import annotations

from typing import Final

# ---------------------------------------------------------------- model shape
KV_LORA_RANK: Final[int] = 512
ROPE_DIM: Final[int] = 64
HEAD_DIM_QK: Final[int] = KV_LORA_RANK + ROPE_DIM  # 576
HEAD_DIM_V: Final[int] = KV_LORA_RANK  # 512

# ---------------------------------------------------------------- fp8_ds_mla
FP8_DS_MLA_ROW_BYTES: Final[int] = 656
FP8_LATENT_OFFSET: Final[int] = 0
FP8_LATENT_BYTES: Final[int] = 512
FP8_SCALE_OFFSET: Final[int] = 512
FP8_SCALE_GROUP: Final[int] = 128  # latent values per FP32 scale
FP8_NUM_SCALES: Final[int] = 4
FP8_SCALE_BYTES: Final[int] = 16
FP8_ROPE_OFFSET: Final[int] = 528
FP8_ROPE_BYTES: Final[int] = 128  # 64 x bf16
FP8_E4M3_MAX: Final[float] = 448.0

# ---------------------------------------------------------------- nvfp4_ds_mla
NVFP4_DS_MLA_ROW_BYTES: Final[int] = 352
NVFP4_LATENT_OFFSET: Final[int] = 0
NVFP4_LATENT_BYTES: Final[int] = 256
NVFP4_ROPE_OFFSET: Final[int] = 256
NVFP4_ROPE_BYTES: Final[int] = 64  # 64 x e4m3
NVFP4_SCALE_OFFSET: Final[int] = 320
NVFP4_SCALE_BYTES: Final[int] = 32
NVFP4_BLOCK: Final[int] = 16  # latent values per e4m3 scale
NVFP4_NUM_SCALES: Final[int] = 32
NVFP4_E2M1_MAX: Final[float] = 6.0
NVFP4_MIN_SCALE: Final[float] = 2.0**-9  # smallest positive e4m3 (subnormal)

# ---------------------------------------------------------------- capacity
FP8_MLA_TOKEN_BYTES: Final[int] = KV_LORA_RANK + ROPE_DIM  # 576
NVFP4_MLA_TOKEN_BYTES: Final[int] = KV_LORA_RANK // 2 + KV_LORA_RANK // 16 + ROPE_DIM  # 352
BF16_MLA_TOKEN_BYTES: Final[int] = 2 * (KV_LORA_RANK + ROPE_DIM)  # 1152

SUPPORTED_DTYPES: Final[tuple[str, ...]] = ("fp8", "nvfp4", "bf16")


def nvfp4_scale_offset(s: int) -> int:
    """Return the byte offset inside an ``nvfp4_ds_mla`` row of block scale ``s``.

    Block ``s`` covers latent values ``[16*s, 16*s + 16)``; ``0 <= s < 32``.
    """
    if not 0 <= s < NVFP4_NUM_SCALES:
        raise ValueError(f"nvfp4 scale index must be in [0, 32), got {s}")
    return NVFP4_SCALE_OFFSET + 8 * (s & 3) + (s >> 2)


def nvfp4_scale_block(offset: int) -> int:
    """Inverse of :func:`nvfp4_scale_offset`: which block's scale sits at ``offset``."""
    rel = offset - NVFP4_SCALE_OFFSET
    if not 0 <= rel < NVFP4_SCALE_BYTES:
        raise ValueError(f"offset {offset} is not in the nvfp4 scale area [320, 352)")
    return 4 * (rel % 8) + rel // 8


def _check_dtype(dtype: str) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported MLA cache dtype {dtype!r}; expected one of {SUPPORTED_DTYPES}")


def _check_dims(kv_lora_rank: int, rope_dim: int) -> None:
    if kv_lora_rank <= 0 or rope_dim < 0:
        raise ValueError(f"invalid MLA dims kv_lora_rank={kv_lora_rank} rope_dim={rope_dim}")


def mla_row_bytes(dtype: str, kv_lora_rank: int = KV_LORA_RANK, rope_dim: int = ROPE_DIM) -> int:
    """Per-token, per-layer MLA cache bytes used for capacity planning.

    * ``"fp8"``:   ``kv_lora_rank + rope_dim`` (576 for 512 + 64)
    * ``"nvfp4"``: ``kv_lora_rank/2 + kv_lora_rank/16 + rope_dim`` (352); only
      defined for ``kv_lora_rank == 512`` and ``rope_dim == 64``
    * ``"bf16"``:  ``2 * (kv_lora_rank + rope_dim)`` (1152)

    Raises ``ValueError`` for unknown dtypes and unsupported nvfp4 shapes.
    """
    _check_dtype(dtype)
    _check_dims(kv_lora_rank, rope_dim)
    if dtype == "fp8":
        return kv_lora_rank + rope_dim
    if dtype == "bf16":
        return 2 * (kv_lora_rank + rope_dim)
    if kv_lora_rank != KV_LORA_RANK or rope_dim != ROPE_DIM:
        raise ValueError(
            f"nvfp4_ds_mla requires kv_lora_rank={KV_LORA_RANK} and rope_dim={ROPE_DIM}, "
            f"got {kv_lora_rank} and {rope_dim}"
        )
    return NVFP4_MLA_TOKEN_BYTES


def mla_storage_row_bytes(dtype: str, kv_lora_rank: int = KV_LORA_RANK, rope_dim: int = ROPE_DIM) -> int:
    """Bytes of one *stored* packed row: 656 (fp8_ds_mla), 352 (nvfp4_ds_mla), 1152 (bf16).

    The packed fp8/nvfp4 layouts exist only for ``kv_lora_rank == 512`` and
    ``rope_dim == 64``; other shapes raise ``ValueError`` (bf16 accepts any).
    """
    _check_dtype(dtype)
    _check_dims(kv_lora_rank, rope_dim)
    if dtype == "bf16":
        return 2 * (kv_lora_rank + rope_dim)
    if kv_lora_rank != KV_LORA_RANK or rope_dim != ROPE_DIM:
        raise ValueError(
            f"{dtype}_ds_mla requires kv_lora_rank={KV_LORA_RANK} and rope_dim={ROPE_DIM}, "
            f"got {kv_lora_rank} and {rope_dim}"
        )
    return FP8_DS_MLA_ROW_BYTES if dtype == "fp8" else NVFP4_DS_MLA_ROW_BYTES


def decode_read_bytes(dtype: str, num_rows: int) -> int:
    """Bytes a sparse decode must read for ``num_rows`` selected stored rows (cache only)."""
    return num_rows * mla_storage_row_bytes(dtype)

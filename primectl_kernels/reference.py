"""Plain PyTorch reference for the packed MLA cache formats and sparse MLA decode.

Everything here is written for clarity, not speed, and uses an implementation
that is independent of the Triton kernels (torch's own float8 cast and
``torch.round`` instead of bit tricks), so tests compare two formulations.

Rounding rules (see ``primectl_kernels/README.md``):

* e4m3 values (nvfp4 rope, fp8 latent): round-to-nearest-even, saturating at
  +-448; the sign of zero is kept (``-0.0`` -> ``0x80``).
* nvfp4 block scale: ``target = max(amax16 / 6, 2**-9)``; ``sf = e4m3_rne(target)``,
  bumped to the next e4m3 value when it fell below ``target`` (so ``|x|/sf <= 6``).
* E2M1 latent: ``q = rne_e2m1(x / sf)`` saturating at 6; sign taken from the
  sign bit of ``x / sf`` (so ``-0.0`` and small negatives that round to zero
  encode as nibble ``0x8``).
* fp8_ds_mla scale: one FP32 scale per 128 latent values, ``scale = amax / 448``
  (``1.0`` when the group is all zero); latent byte = ``e4m3_rne(x / scale)``.
  Rope is stored as bf16 (round-to-nearest-even from FP32).
"""

from __future__ import annotations

import math

import torch

from primectl_kernels.layout import (
    FP8_DS_MLA_ROW_BYTES,
    FP8_E4M3_MAX,
    FP8_ROPE_OFFSET,
    FP8_SCALE_GROUP,
    FP8_SCALE_OFFSET,
    KV_LORA_RANK,
    NVFP4_BLOCK,
    NVFP4_DS_MLA_ROW_BYTES,
    NVFP4_E2M1_MAX,
    NVFP4_LATENT_BYTES,
    NVFP4_MIN_SCALE,
    NVFP4_NUM_SCALES,
    NVFP4_ROPE_OFFSET,
    NVFP4_SCALE_OFFSET,
    ROPE_DIM,
    nvfp4_scale_offset,
)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# Permutation: NVFP4_SCALE_PERM[s] = byte offset (relative to 320) of block s's scale.
NVFP4_SCALE_PERM: tuple[int, ...] = tuple(nvfp4_scale_offset(s) - NVFP4_SCALE_OFFSET for s in range(NVFP4_NUM_SCALES))


# ------------------------------------------------------------------ scalar codecs
def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> e4m3 byte codes (uint8), round-to-nearest-even, saturating at +-448."""
    x = x.float()
    return x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 byte codes (uint8) -> FP32 values."""
    return codes.contiguous().view(torch.float8_e4m3fn).float()


def e2m1_encode(y: torch.Tensor) -> torch.Tensor:
    """FP32 -> E2M1 nibbles (uint8 in [0, 16)), round-to-nearest-even, saturating at 6.

    Uses ``torch.round`` (half to even) on the value grid of each binade:
    step 0.5 below 2, step 1 in [2, 4), step 2 from 4 up.
    """
    y = y.float()
    a = y.abs()
    v = torch.where(
        a < 2.0,
        torch.round(a * 2.0) / 2.0,
        torch.where(a < 4.0, torch.round(a), torch.round(a / 2.0) * 2.0),
    ).clamp(max=NVFP4_E2M1_MAX)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=y.device)
    mag = (v.unsqueeze(-1) == table).to(torch.uint8).argmax(dim=-1).to(torch.uint8)
    sign = torch.signbit(y).to(torch.uint8) << 3
    return mag | sign


def e2m1_decode(nibbles: torch.Tensor) -> torch.Tensor:
    """E2M1 nibbles (integer tensor, values in [0, 16)) -> FP32 values."""
    n = nibbles.to(torch.int64)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=nibbles.device)
    mag = table[n & 7]
    return torch.where((n & 8) != 0, -mag, mag)


def nvfp4_block_scale(amax: torch.Tensor) -> torch.Tensor:
    """e4m3 codes of the nvfp4 block scales for block maxima ``amax`` (FP32)."""
    target = torch.clamp(amax.float() / NVFP4_E2M1_MAX, min=NVFP4_MIN_SCALE)
    code = e4m3_encode(target)
    below = (e4m3_decode(code) < target) & (code < 126)
    return torch.where(below, code + 1, code).to(torch.uint8)


def bf16_bytes(x: torch.Tensor) -> torch.Tensor:
    """FP32 -> bf16 (RNE) as little-endian bytes, shape ``[..., 2*n]``."""
    return x.float().to(torch.bfloat16).contiguous().view(torch.uint8)


# ------------------------------------------------------------------ row codecs
def _check_inputs(latent: torch.Tensor, rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if latent.shape[-1] != KV_LORA_RANK or rope.shape[-1] != ROPE_DIM:
        raise ValueError(
            f"expected latent [..., 512] and rope [..., 64], got {tuple(latent.shape)} {tuple(rope.shape)}"
        )
    if latent.shape[:-1] != rope.shape[:-1]:
        raise ValueError("latent and rope must have the same leading shape")
    return latent.float().reshape(-1, KV_LORA_RANK), rope.float().reshape(-1, ROPE_DIM)


def quantize_nvfp4_ref(latent: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Quantise latent ``[..., 512]`` + rope ``[..., 64]`` to ``nvfp4_ds_mla`` rows ``[..., 352]`` (uint8)."""
    lead = latent.shape[:-1]
    x, r = _check_inputs(latent, rope)
    n = x.shape[0]
    blocks = x.view(n, NVFP4_NUM_SCALES, NVFP4_BLOCK)
    sf_code = nvfp4_block_scale(blocks.abs().amax(dim=-1))  # [n, 32]
    sf = e4m3_decode(sf_code)
    nib = e2m1_encode(blocks / sf.unsqueeze(-1)).view(n, KV_LORA_RANK)
    packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
    out = torch.zeros(n, NVFP4_DS_MLA_ROW_BYTES, dtype=torch.uint8, device=x.device)
    out[:, :NVFP4_LATENT_BYTES] = packed
    out[:, NVFP4_ROPE_OFFSET : NVFP4_ROPE_OFFSET + ROPE_DIM] = e4m3_encode(r)
    perm = torch.tensor(NVFP4_SCALE_PERM, device=x.device) + NVFP4_SCALE_OFFSET
    out[:, perm] = sf_code
    return out.view(*lead, NVFP4_DS_MLA_ROW_BYTES)


def dequantize_nvfp4_ref(rows: torch.Tensor) -> torch.Tensor:
    """``nvfp4_ds_mla`` rows ``[..., 352]`` (uint8) -> FP32 ``[..., 576]`` (latent then rope)."""
    if rows.shape[-1] != NVFP4_DS_MLA_ROW_BYTES:
        raise ValueError(f"expected rows of {NVFP4_DS_MLA_ROW_BYTES} bytes, got {rows.shape[-1]}")
    lead = rows.shape[:-1]
    b = rows.reshape(-1, NVFP4_DS_MLA_ROW_BYTES)
    n = b.shape[0]
    packed = b[:, :NVFP4_LATENT_BYTES].to(torch.int64)
    nib = torch.stack([packed & 15, packed >> 4], dim=-1).view(n, KV_LORA_RANK)
    perm = torch.tensor(NVFP4_SCALE_PERM, device=rows.device) + NVFP4_SCALE_OFFSET
    sf = e4m3_decode(b[:, perm])  # [n, 32]
    lat = (e2m1_decode(nib).view(n, NVFP4_NUM_SCALES, NVFP4_BLOCK) * sf.unsqueeze(-1)).view(n, KV_LORA_RANK)
    rope = e4m3_decode(b[:, NVFP4_ROPE_OFFSET : NVFP4_ROPE_OFFSET + ROPE_DIM])
    return torch.cat([lat, rope], dim=-1).view(*lead, KV_LORA_RANK + ROPE_DIM)


def fp8_group_scale(amax: torch.Tensor) -> torch.Tensor:
    """FP32 scale of each 128-value fp8_ds_mla group: ``amax / 448`` (1.0 if that is 0)."""
    s = amax.float() / FP8_E4M3_MAX
    return torch.where(s > 0, s, torch.ones_like(s))


def quantize_fp8_ref(latent: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Quantise latent ``[..., 512]`` + rope ``[..., 64]`` to ``fp8_ds_mla`` rows ``[..., 656]`` (uint8)."""
    lead = latent.shape[:-1]
    x, r = _check_inputs(latent, rope)
    n = x.shape[0]
    groups = x.view(n, 4, FP8_SCALE_GROUP)
    scale = fp8_group_scale(groups.abs().amax(dim=-1))  # [n, 4]
    codes = e4m3_encode(groups / scale.unsqueeze(-1)).view(n, KV_LORA_RANK)
    out = torch.zeros(n, FP8_DS_MLA_ROW_BYTES, dtype=torch.uint8, device=x.device)
    out[:, :KV_LORA_RANK] = codes
    out[:, FP8_SCALE_OFFSET:FP8_ROPE_OFFSET] = scale.contiguous().view(torch.uint8)
    out[:, FP8_ROPE_OFFSET:] = bf16_bytes(r)
    return out.view(*lead, FP8_DS_MLA_ROW_BYTES)


def dequantize_fp8_ref(rows: torch.Tensor) -> torch.Tensor:
    """``fp8_ds_mla`` rows ``[..., 656]`` (uint8) -> FP32 ``[..., 576]`` (latent then rope)."""
    if rows.shape[-1] != FP8_DS_MLA_ROW_BYTES:
        raise ValueError(f"expected rows of {FP8_DS_MLA_ROW_BYTES} bytes, got {rows.shape[-1]}")
    lead = rows.shape[:-1]
    b = rows.reshape(-1, FP8_DS_MLA_ROW_BYTES).contiguous()
    n = b.shape[0]
    scale = b[:, FP8_SCALE_OFFSET:FP8_ROPE_OFFSET].contiguous().view(torch.float32)  # [n, 4]
    lat = (e4m3_decode(b[:, :KV_LORA_RANK]).view(n, 4, FP8_SCALE_GROUP) * scale.unsqueeze(-1)).view(n, KV_LORA_RANK)
    rope = b[:, FP8_ROPE_OFFSET:].contiguous().view(torch.bfloat16).float()
    return torch.cat([lat, rope], dim=-1).view(*lead, KV_LORA_RANK + ROPE_DIM)


def dequantize_rows_ref(rows: torch.Tensor, fmt: str) -> torch.Tensor:
    """Dequantise rows of format ``"nvfp4"`` or ``"fp8"`` to FP32 ``[..., 576]``."""
    if fmt == "nvfp4":
        return dequantize_nvfp4_ref(rows)
    if fmt == "fp8":
        return dequantize_fp8_ref(rows)
    raise ValueError(f"unknown row format {fmt!r}")


def restage_nvfp4_to_fp8_ref(rows: torch.Tensor) -> torch.Tensor:
    """What the staged path does: dequantise nvfp4 rows and re-quantise them as fp8_ds_mla."""
    kv = dequantize_nvfp4_ref(rows)
    return quantize_fp8_ref(kv[..., :KV_LORA_RANK], kv[..., KV_LORA_RANK:])


# ------------------------------------------------------------------ decode
def sparse_mla_decode_ref(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    fmt: str,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference sparse MLA decode (FP32).

    Args:
        q: queries ``[T, H, 576]`` (latent-absorbed nope part then rope part).
        cache: paged packed rows, uint8 ``[num_blocks, block_size, row_bytes]``.
        indices: ``[T, topk]`` global row ids (``block * block_size + offset``);
            ``-1`` marks an empty slot, which is skipped (never read).
        sm_scale: softmax scale applied to ``q . k``.
        fmt: ``"nvfp4"`` or ``"fp8"``.
        return_lse: also return the natural-log sum-exp ``[T, H]`` of the scaled scores.

    Returns:
        ``out [T, H, 512]`` FP32 = ``softmax(sm_scale * q k^T) @ v`` with ``k`` the
        dequantised 576-dim row and ``v`` its first 512 values.  A query with no
        valid slot yields zeros (and ``lse = -inf``).
    """
    t_count, h_count, _ = q.shape
    flat = cache.reshape(-1, cache.shape[-1])
    out = torch.zeros(t_count, h_count, KV_LORA_RANK, dtype=torch.float32, device=q.device)
    lse = torch.full((t_count, h_count), -math.inf, dtype=torch.float32, device=q.device)
    for t in range(t_count):
        idx = indices[t].to(torch.int64)
        idx = idx[(idx >= 0) & (idx < flat.shape[0])]
        if idx.numel() == 0:
            continue
        kv = dequantize_rows_ref(flat[idx], fmt)  # [n, 576]
        s = (q[t].float() @ kv.T) * sm_scale  # [H, n]
        lse[t] = torch.logsumexp(s, dim=-1)
        out[t] = torch.softmax(s, dim=-1) @ kv[:, :KV_LORA_RANK]
    if return_lse:
        return out, lse
    return out

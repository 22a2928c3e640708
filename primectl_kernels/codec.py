"""Triton kernels: quantise / dequantise the ``nvfp4_ds_mla`` and ``fp8_ds_mla`` rows.

The scalar encoders are written with integer bit manipulation so the result is
bit-identical on a GPU and under ``TRITON_INTERPRET=1`` (the interpreter's
``fp32 -> float8e4nv`` cast is neither round-to-nearest-even nor saturating,
and Triton's default fp32 ``/`` is approximate on GPUs, so ``div_rn`` is used).

Latents are processed as even/odd halves ``[BLOCK_T, 256]`` so that one packed
nvfp4 byte (two E2M1 nibbles) maps to one lane.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from primectl_kernels.layout import (
    FP8_DS_MLA_ROW_BYTES,
    KV_LORA_RANK,
    NVFP4_DS_MLA_ROW_BYTES,
    ROPE_DIM,
)

# ``triton.jit`` with a declared type, so mypy (strict) does not flag every
# kernel as "untyped decorator"; kernels keep untyped parameters (Triton reads
# the annotations) and carry ``# type: ignore[no-untyped-def]``.
jit: Callable[[Callable[..., Any]], Any] = triton.jit

# ----------------------------------------------------------------------------
# scalar helpers (inlined into every kernel)
# ----------------------------------------------------------------------------


@jit
def e4m3_encode(x):  # type: ignore[no-untyped-def]
    """FP32 -> e4m3 code (int32 in [0, 256)): RNE, saturating at 448, sign of zero kept."""
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    # clamp magnitude at 448.0 (0x43E00000): saturates, also maps inf/nan to 448
    u = tl.minimum(bits & 0x7FFFFFFF, 0x43E00000)
    e = u >> 23
    # normal e4m3 (|x| >= 2^-6): round the fp32 mantissa to 3 bits, rebias 127 -> 7
    normal = ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - 960
    # subnormal e4m3 (|x| < 2^-6): code = RNE(|x| / 2^-9) = RNE(M * 2^(e - 141))
    m = (u & 0x7FFFFF) | 0x800000
    sh = tl.maximum(tl.minimum(141 - e, 31), 1)
    sub = (m + (1 << (sh - 1)) - 1 + ((m >> sh) & 1)) >> sh
    code = tl.where(e >= 121, normal, sub)
    return code | sign


@jit
def e4m3_decode(code):  # type: ignore[no-untyped-def]
    """e4m3 code (any integer tensor, low 8 bits used) -> FP32."""
    return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@jit
def e2m1_encode(y):  # type: ignore[no-untyped-def]
    """FP32 -> E2M1 nibble (int32 in [0, 16)): RNE, saturating at 6, sign bit kept."""
    sign = (y.to(tl.int32, bitcast=True) >> 28) & 0x8
    a = tl.abs(y)
    mag = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    return mag | sign


@jit
def e2m1_decode_f16(n):  # type: ignore[no-untyped-def]
    """E2M1 nibble (int32, low 4 bits) -> FP16, exact (fp16 bit pattern scaled by 2^14)."""
    h = ((n & 8) << 12) | ((n & 7) << 9)
    return h.to(tl.int16).to(tl.float16, bitcast=True) * 16384.0


@jit
def nvfp4_gather(row, mask):  # type: ignore[no-untyped-def]
    """Raw bytes of the nvfp4_ds_mla rows at byte pointers ``row [R]`` (rows where ``mask`` is
    false are not read): (packed latent [R, 256], scale codes [R, 32] in block order, rope codes [R, 64])."""
    j = tl.arange(0, 256)
    r = tl.arange(0, 64)
    s = tl.arange(0, 32)
    m2 = mask[:, None]
    packed = tl.load(row[:, None] + j[None, :], mask=m2, other=0)
    sc = tl.load(row[:, None] + (320 + 8 * (s & 3) + (s >> 2))[None, :], mask=m2, other=0)
    pe = tl.load(row[:, None] + 256 + r[None, :], mask=m2, other=0)
    return packed, sc, pe


@jit
def nvfp4_dequant_halves(packed, sc, ROWS: tl.constexpr, DTYPE: tl.constexpr):  # type: ignore[no-untyped-def]
    """Even/odd latent halves ``[ROWS, 256]`` in ``DTYPE`` from packed E2M1 bytes and e4m3 block-scale
    codes (E2M1 x e4m3 products are exact in FP16 as well as FP32)."""
    p32 = packed.to(tl.int32)
    sf = e4m3_decode(sc).to(DTYPE)
    sf_b = tl.reshape(tl.broadcast_to(sf[:, :, None], (ROWS, 32, 8)), (ROWS, 256))
    lo = e2m1_decode_f16(p32 & 15).to(DTYPE) * sf_b
    hi = e2m1_decode_f16(p32 >> 4).to(DTYPE) * sf_b
    return lo, hi


@jit
def e2m1x8_to_f16x8(u):  # type: ignore[no-untyped-def]
    """uint32 words of 8 E2M1 nibbles -> 4 uint32 words of two FP16 bit patterns each, worth the
    E2M1 values x 2^-14 (magnitude bits to bits 9-11, sign to bit 15 of each half):
    word ``k`` holds nibble ``k`` (low half) and nibble ``k + 4`` (high half)."""
    f0 = ((u & 0x00070007) << 9) | ((u & 0x00080008) << 12)
    f1 = ((u & 0x00700070) << 5) | ((u & 0x00800080) << 8)
    f2 = ((u & 0x07000700) << 1) | ((u & 0x08000800) << 4)
    f3 = ((u >> 3) & 0x0E000E00) | (u & 0x80008000)
    return f0, f1, f2, f3


@jit
def f16_halves(x):  # type: ignore[no-untyped-def]
    """uint32 holding two FP16 bit patterns -> (low, high) FP16 tensors."""
    return x.to(tl.uint16).to(tl.float16, bitcast=True), (x >> 16).to(tl.uint16).to(tl.float16, bitcast=True)


@jit
def nvfp4_k_slices(words, sc, ROWS: tl.constexpr):  # type: ignore[no-untyped-def]
    """Eight FP16 slices ``[ROWS, 64]`` of the latent, slice ``k`` = element ``8w + k`` of each row,
    scaled by 2^-7, from packed latent words ``[ROWS, 64]`` (int32) and e4m3 block-scale codes
    ``[ROWS, 32]`` in block order (word ``w`` lies in block ``w // 2``).

    Exact: E2M1 x 2^-14 is an FP16 bit pattern; scale x 2^7 is an FP16 value in
    [2^-2, 57344]; their product E2M1 x scale x 2^-7 has at most 6 significant bits,
    is a multiple of 2^-17 and at most 21, so FP16 holds it without rounding.
    """
    f0, f1, f2, f3 = e2m1x8_to_f16x8(words.to(tl.uint32, bitcast=True))
    sf_w = sc.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16) * 128.0
    k0, k4 = f16_halves(f0)
    k1, k5 = f16_halves(f1)
    k2, k6 = f16_halves(f2)
    k3, k7 = f16_halves(f3)
    return k0 * sf_w, k1 * sf_w, k2 * sf_w, k3 * sf_w, k4 * sf_w, k5 * sf_w, k6 * sf_w, k7 * sf_w


@jit
def bf16_rne_bits(x):  # type: ignore[no-untyped-def]
    """FP32 -> bf16 bit pattern (int32 in [0, 65536)), round-to-nearest-even."""
    u = x.to(tl.int32, bitcast=True)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


@jit
def bf16_bits_to_f32(h):  # type: ignore[no-untyped-def]
    """bf16 bit pattern (int16/int32 tensor) -> FP32."""
    return (h.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@jit
def nvfp4_quant_store(row_ptr, lo, hi, rope, mask, BLOCK_T: tl.constexpr):  # type: ignore[no-untyped-def]
    """Quantise even/odd latent halves ``[BLOCK_T, 256]`` + rope ``[BLOCK_T, 64]`` into
    nvfp4_ds_mla rows at byte pointers ``row_ptr [BLOCK_T]``."""
    j = tl.arange(0, 256)
    r = tl.arange(0, 64)
    s = tl.arange(0, 32)
    a = tl.maximum(tl.abs(lo), tl.abs(hi))
    amax = tl.max(tl.reshape(a, (BLOCK_T, 32, 8)), axis=2)
    target = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 6.0, tl.float32)), 0.001953125)
    code = e4m3_encode(target)
    code = tl.where((e4m3_decode(code) < target) & (code < 126), code + 1, code)
    sf = e4m3_decode(code)
    sf_b = tl.reshape(tl.broadcast_to(sf[:, :, None], (BLOCK_T, 32, 8)), (BLOCK_T, 256))
    q_lo = e2m1_encode(tl.math.div_rn(lo, sf_b))
    q_hi = e2m1_encode(tl.math.div_rn(hi, sf_b))
    m2 = mask[:, None]
    tl.store(row_ptr[:, None] + j[None, :], (q_lo | (q_hi << 4)).to(tl.uint8), mask=m2)
    tl.store(row_ptr[:, None] + 256 + r[None, :], e4m3_encode(rope).to(tl.uint8), mask=m2)
    sc_off = 320 + 8 * (s & 3) + (s >> 2)
    tl.store(row_ptr[:, None] + sc_off[None, :], code.to(tl.uint8), mask=m2)


@jit
def fp8_quant_store(row_ptr, row_f32_ptr, row_i16_ptr, lo, hi, rope, mask, BLOCK_T: tl.constexpr):  # type: ignore[no-untyped-def]
    """Quantise even/odd latent halves + rope into fp8_ds_mla rows.

    ``row_ptr`` / ``row_f32_ptr`` / ``row_i16_ptr`` point at the start of each
    row through uint8 / float32 / int16 views of the same buffer.
    """
    r = tl.arange(0, 64)
    c = tl.arange(0, 4)
    a = tl.maximum(tl.abs(lo), tl.abs(hi))
    amax = tl.max(tl.reshape(a, (BLOCK_T, 4, 64)), axis=2)  # [BT, 4]
    scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    scale = tl.where(scale > 0, scale, 1.0)
    sc_b = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_T, 4, 64)), (BLOCK_T, 256))
    c_lo = e4m3_encode(tl.math.div_rn(lo, sc_b)).to(tl.uint8)
    c_hi = e4m3_encode(tl.math.div_rn(hi, sc_b)).to(tl.uint8)
    codes = tl.reshape(tl.join(c_lo, c_hi), (BLOCK_T, 512))
    m2 = mask[:, None]
    d = tl.arange(0, 512)
    tl.store(row_ptr[:, None] + d[None, :], codes, mask=m2)
    tl.store(row_f32_ptr[:, None] + 128 + c[None, :], scale, mask=m2)
    tl.store(row_i16_ptr[:, None] + 264 + r[None, :], bf16_rne_bits(rope).to(tl.int16), mask=m2)


# ----------------------------------------------------------------------------
# kernels
# ----------------------------------------------------------------------------


@jit
def _quant_kernel(  # type: ignore[no-untyped-def]
    lat_ptr,
    rope_ptr,
    out_ptr,
    out_f32_ptr,
    out_i16_ptr,
    slot_ptr,
    N,
    stride_lat,
    stride_rope,
    HAS_SLOTS: tl.constexpr,
    FMT_NVFP4: tl.constexpr,
    ROW_BYTES: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    mask = tok < N
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + tok, mask=mask, other=-1).to(tl.int64)
        mask = mask & (slot >= 0)
    else:
        slot = tok.to(tl.int64)
    j = tl.arange(0, 256)
    r = tl.arange(0, 64)
    tok64 = tok.to(tl.int64)
    lat_row = lat_ptr + tok64[:, None] * stride_lat
    m2 = mask[:, None]
    lo = tl.load(lat_row + 2 * j[None, :], mask=m2, other=0.0).to(tl.float32)
    hi = tl.load(lat_row + 2 * j[None, :] + 1, mask=m2, other=0.0).to(tl.float32)
    rope = tl.load(rope_ptr + tok64[:, None] * stride_rope + r[None, :], mask=m2, other=0.0).to(tl.float32)
    slot = tl.where(mask, slot, 0)
    if FMT_NVFP4:
        nvfp4_quant_store(out_ptr + slot * ROW_BYTES, lo, hi, rope, mask, BLOCK_T)
    else:
        fp8_quant_store(
            out_ptr + slot * ROW_BYTES,
            out_f32_ptr + slot * (ROW_BYTES // 4),
            out_i16_ptr + slot * (ROW_BYTES // 2),
            lo,
            hi,
            rope,
            mask,
            BLOCK_T,
        )


@jit
def _dequant_nvfp4_kernel(rows_ptr, out_ptr, N, BLOCK_T: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    mask = tok < N
    m2 = mask[:, None]
    tok64 = tok.to(tl.int64)
    packed, sc, pe = nvfp4_gather(rows_ptr + tok64 * 352, mask)
    v_lo, v_hi = nvfp4_dequant_halves(packed, sc, BLOCK_T, tl.float32)
    lat = tl.reshape(tl.join(v_lo, v_hi), (BLOCK_T, 512))
    out_row = out_ptr + tok64 * 576
    d = tl.arange(0, 512)
    r = tl.arange(0, 64)
    tl.store(out_row[:, None] + d[None, :], lat, mask=m2)
    tl.store(out_row[:, None] + 512 + r[None, :], e4m3_decode(pe), mask=m2)


@jit
def _dequant_fp8_kernel(rows_ptr, rows_f32_ptr, rows_i16_ptr, out_ptr, N, BLOCK_T: tl.constexpr):  # type: ignore[no-untyped-def]
    pid = tl.program_id(0)
    tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    mask = tok < N
    m2 = mask[:, None]
    tok64 = tok.to(tl.int64)
    d = tl.arange(0, 512)
    r = tl.arange(0, 64)
    c = tl.arange(0, 4)
    raw = e4m3_decode(tl.load(rows_ptr + tok64[:, None] * 656 + d[None, :], mask=m2, other=0))
    scale = tl.load(rows_f32_ptr + tok64[:, None] * 164 + 128 + c[None, :], mask=m2, other=0.0)
    lat = tl.reshape(tl.reshape(raw, (BLOCK_T, 4, 128)) * scale[:, :, None], (BLOCK_T, 512))
    out_row = out_ptr + tok64 * 576
    tl.store(out_row[:, None] + d[None, :], lat, mask=m2)
    rope = bf16_bits_to_f32(tl.load(rows_i16_ptr + tok64[:, None] * 328 + 264 + r[None, :], mask=m2, other=0))
    tl.store(out_row[:, None] + 512 + r[None, :], rope, mask=m2)


# ----------------------------------------------------------------------------
# wrappers
# ----------------------------------------------------------------------------

DEFAULT_BLOCK_T = 8


def _prep_inputs(latent: torch.Tensor, rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if latent.shape[-1] != KV_LORA_RANK or rope.shape[-1] != ROPE_DIM:
        raise ValueError(
            f"expected latent [..., 512] and rope [..., 64], got {tuple(latent.shape)} {tuple(rope.shape)}"
        )
    lat2 = latent.reshape(-1, KV_LORA_RANK)
    rope2 = rope.reshape(-1, ROPE_DIM)
    if lat2.shape[0] != rope2.shape[0]:
        raise ValueError("latent and rope must have the same number of tokens")
    if lat2.stride(-1) != 1:
        lat2 = lat2.contiguous()
    if rope2.stride(-1) != 1:
        rope2 = rope2.contiguous()
    return lat2, rope2


def _flat_rows(buf: torch.Tensor, row_bytes: int) -> torch.Tensor:
    if buf.dtype != torch.uint8 or buf.shape[-1] != row_bytes or not buf.is_contiguous():
        raise ValueError(f"expected a contiguous uint8 buffer [..., {row_bytes}], got {buf.dtype} {tuple(buf.shape)}")
    return buf.view(-1, row_bytes)


def _quantize(
    fmt_nvfp4: bool,
    latent: torch.Tensor,
    rope: torch.Tensor,
    out: torch.Tensor | None,
    slot_mapping: torch.Tensor | None,
    block_t: int,
) -> torch.Tensor:
    row_bytes = NVFP4_DS_MLA_ROW_BYTES if fmt_nvfp4 else FP8_DS_MLA_ROW_BYTES
    lat2, rope2 = _prep_inputs(latent, rope)
    n = lat2.shape[0]
    if out is None:
        if slot_mapping is not None:
            raise ValueError("slot_mapping needs an explicit out (cache) tensor")
        out = torch.zeros(*latent.shape[:-1], row_bytes, dtype=torch.uint8, device=latent.device)
    flat = _flat_rows(out, row_bytes)
    slots = slot_mapping.reshape(-1).to(torch.int64) if slot_mapping is not None else flat
    if slot_mapping is not None and slots.shape[0] != n:
        raise ValueError("slot_mapping must have one entry per token")
    if n == 0:
        return out
    grid = (triton.cdiv(n, block_t),)
    _quant_kernel[grid](
        lat2,
        rope2,
        flat,
        flat.view(torch.float32),
        flat.view(torch.int16),
        slots,
        n,
        lat2.stride(0),
        rope2.stride(0),
        HAS_SLOTS=slot_mapping is not None,
        FMT_NVFP4=fmt_nvfp4,
        ROW_BYTES=row_bytes,
        BLOCK_T=block_t,
    )
    return out


def quantize_nvfp4(
    latent: torch.Tensor,
    rope: torch.Tensor,
    out: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    block_t: int = DEFAULT_BLOCK_T,
) -> torch.Tensor:
    """Quantise latent ``[..., 512]`` + rope ``[..., 64]`` (bf16/fp16/fp32) into nvfp4_ds_mla rows.

    Without ``out`` returns new rows ``[..., 352]`` (uint8).  With ``out`` (a
    contiguous uint8 cache ``[..., 352]``, e.g. ``[num_blocks, block_size, 352]``)
    and ``slot_mapping`` (``[N]`` global row ids, ``-1`` = skip) writes into the cache.
    """
    return _quantize(True, latent, rope, out, slot_mapping, block_t)


def quantize_fp8(
    latent: torch.Tensor,
    rope: torch.Tensor,
    out: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    block_t: int = DEFAULT_BLOCK_T,
) -> torch.Tensor:
    """Quantise latent ``[..., 512]`` + rope ``[..., 64]`` into fp8_ds_mla rows ``[..., 656]``.

    Same calling convention as :func:`quantize_nvfp4`.
    """
    return _quantize(False, latent, rope, out, slot_mapping, block_t)


def dequantize_nvfp4(rows: torch.Tensor, block_t: int = DEFAULT_BLOCK_T) -> torch.Tensor:
    """nvfp4_ds_mla rows ``[..., 352]`` (uint8) -> FP32 ``[..., 576]``."""
    flat = _flat_rows(rows.contiguous(), NVFP4_DS_MLA_ROW_BYTES)
    n = flat.shape[0]
    out = torch.empty(n, KV_LORA_RANK + ROPE_DIM, dtype=torch.float32, device=rows.device)
    if n:
        _dequant_nvfp4_kernel[(triton.cdiv(n, block_t),)](flat, out, n, BLOCK_T=block_t)
    return out.view(*rows.shape[:-1], KV_LORA_RANK + ROPE_DIM)


def dequantize_fp8(rows: torch.Tensor, block_t: int = DEFAULT_BLOCK_T) -> torch.Tensor:
    """fp8_ds_mla rows ``[..., 656]`` (uint8) -> FP32 ``[..., 576]``."""
    flat = _flat_rows(rows.contiguous(), FP8_DS_MLA_ROW_BYTES)
    n = flat.shape[0]
    out = torch.empty(n, KV_LORA_RANK + ROPE_DIM, dtype=torch.float32, device=rows.device)
    if n:
        _dequant_fp8_kernel[(triton.cdiv(n, block_t),)](
            flat, flat.view(torch.float32), flat.view(torch.int16), out, n, BLOCK_T=block_t
        )
    return out.view(*rows.shape[:-1], KV_LORA_RANK + ROPE_DIM)

"""Triton sparse MLA decode over packed KV-cache rows (split-K + log-sum-exp merge).

Three variants share one launch structure:

* ``decode_nvfp4_native``: loads the selected 352-byte nvfp4_ds_mla rows and
  dequantises them in registers (E2M1 x e4m3 products are exact in FP16).
* ``decode_nvfp4_staged``: first dequantises the selected nvfp4 rows into a
  temporary fp8_ds_mla buffer (656-byte rows), then runs the FP8 kernel.
* ``decode_fp8``: loads 656-byte fp8_ds_mla rows.

Grid of the main kernel: ``(T, num_splits, cdiv(H, BLOCK_H))``.  Each program
takes one query token, a block of heads and a contiguous slice of that token's
top-k slots, walks it in tiles of ``BLOCK_N`` rows (online softmax, FP16 dot
operands, FP32 accumulation) and writes its partial output, normalised by its
own softmax sum, plus its log2-sum-exp.  Slots with index ``-1`` (or out of range) are masked:
their rows are never loaded.  With compaction (the default), a token's valid
slots are ranked first and only those are split over the programs, so no tile is
spent on empty slots.  A second small kernel merges the splits.

The nvfp4 kernel reads the latent as int32 words of 8 E2M1 nibbles and turns
each word into FP16 pairs with integer operations (E2M1 x 2^-14 is an FP16 bit
pattern), multiplied by the block scale x 2^7: that is exact in FP16, and the
2^7 goes into the softmax scale and the output.  The latent is kept as eight
slices (slice k = element 8w + k), the query and the output are split the same
way, so no value moves between threads before the MMAs.  The FP8
kernel works in four 128-wide chunks of raw e4m3 values (exact in FP16),
applying each chunk's FP32 scale to the scores and to the probabilities instead
of to the 512-wide rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from primectl_kernels.codec import (
    bf16_bits_to_f32,
    e4m3_decode,
    fp8_quant_store,
    jit,
    nvfp4_dequant_halves,
    nvfp4_gather,
    nvfp4_k_slices,
)
from primectl_kernels.layout import (
    FP8_DS_MLA_ROW_BYTES,
    HEAD_DIM_QK,
    KV_LORA_RANK,
    NVFP4_DS_MLA_ROW_BYTES,
)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------


@jit
def _row_byte_offset(idx, block_size, stride_block, ROW_BYTES: tl.constexpr, PAGED: tl.constexpr):  # type: ignore[no-untyped-def]
    """int64 byte offset of global rows ``idx`` (int32, >= 0).

    Rows of a cache whose blocks are packed back to back sit at ``idx * ROW_BYTES``;
    only a padded block stride (``PAGED``) needs the division by the block size, and
    that one is done in 32 bits (ptxas turns a 64-bit division into a ~90-instruction
    subroutine call per row).
    """
    if PAGED:
        return (idx // block_size).to(tl.int64) * stride_block + (idx % block_size).to(tl.int64) * ROW_BYTES
    return idx.to(tl.int64) * ROW_BYTES


@jit
def _row_offsets(idx_ptr, n, end, num_rows, block_size, stride_block, ROW_BYTES: tl.constexpr, PAGED: tl.constexpr):  # type: ignore[no-untyped-def]
    """Load slot indices ``n`` and return (valid mask, int64 byte offset of each row)."""
    idx = tl.load(idx_ptr + n, mask=n < end, other=-1)
    valid = (idx >= 0) & (idx < num_rows)
    off = _row_byte_offset(tl.where(valid, idx, 0), block_size, stride_block, ROW_BYTES, PAGED)
    return valid, off


@jit
def _program_heads(H, BLOCK_H: tl.constexpr):  # type: ignore[no-untyped-def]
    """This program's (token, split, split count, head ids [BLOCK_H], head mask)."""
    t = tl.program_id(0)
    sp = tl.program_id(1)
    hb = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    return t, sp, tl.num_programs(1), heads, heads < H


@jit
def _count_valid(idx_row, TOPK, num_rows, SCAN: tl.constexpr):  # type: ignore[no-untyped-def]
    """How many of the token's ``TOPK`` slots hold a row (not ``-1``, not out of range)."""
    cnt = 0
    for c0 in range(0, TOPK, SCAN):
        n = c0 + tl.arange(0, SCAN)
        idx = tl.load(idx_row + n, mask=n < TOPK, other=-1)
        cnt += tl.sum(((idx >= 0) & (idx < num_rows)).to(tl.int32), axis=0)
    return cnt


@jit
def _slot_list(  # type: ignore[no-untyped-def]
    idx_ptr, stride_it, scratch_ptr, t, sp, num_splits, rows_per_split, TOPK, num_rows,
    BLOCK_N: tl.constexpr, SCAN: tl.constexpr, COMPACT: tl.constexpr,
):
    """This program's list of slots to walk: (pointer to its first slot index, how many).

    Without empty slots (or without ``COMPACT``) that is the split's own stretch of the
    token's top-k list.  With ``COMPACT`` and at least one empty or out-of-range slot,
    the token's valid slots are ranked (a prefix sum over the list, in this program) and
    split evenly over the splits; each program writes its share, in order, into its
    ``scratch`` row and walks that instead.  So no tile is spent on empty slots, work
    stays balanced when the empties are bunched (e.g. a tail of ``-1``), and the loop
    over tiles keeps no branch that would stop Triton from pipelining it.
    """
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    start = sp * rows_per_split
    lst = idx_row + start
    length = tl.minimum(TOPK - start, rows_per_split)
    if COMPACT:
        cnt = _count_valid(idx_row, TOPK, num_rows, SCAN)
        if cnt < TOPK:
            per = tl.cdiv(tl.cdiv(cnt, num_splits), BLOCK_N) * BLOCK_N
            lo = sp * per
            hi = tl.maximum(tl.minimum(lo + per, cnt), lo)
            base = 0
            for c0 in range(0, TOPK, SCAN):
                n = c0 + tl.arange(0, SCAN)
                idx = tl.load(idx_row + n, mask=n < TOPK, other=-1)
                v = ((idx >= 0) & (idx < num_rows)).to(tl.int32)
                rank = base + tl.cumsum(v, axis=0) - v
                tl.store(scratch_ptr + (rank - lo), idx, mask=(v > 0) & (rank >= lo) & (rank < hi))
                base += tl.sum(v, axis=0)
            tl.debug_barrier()  # the list is written and read by different threads
            lst = scratch_ptr
            length = hi - lo
    return lst, length


@jit
def _scratch_row(scratch_ptr, t, sp, num_splits, H, BLOCK_H: tl.constexpr, rows_per_split):  # type: ignore[no-untyped-def]
    """This program's row of the compaction scratch buffer ``[T, splits, head blocks, rows_per_split]``."""
    prog = (t.to(tl.int64) * num_splits + sp) * tl.cdiv(H, BLOCK_H) + tl.program_id(2)
    return scratch_ptr + prog * rows_per_split


@jit
def _split_result(m_i, l_i, t, sp, num_splits, H, heads):  # type: ignore[no-untyped-def]
    """(partial-row index per head, l with empty splits as 1, log2-sum-exp) at the end of a split."""
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    return (t * num_splits + sp) * H + heads, l_safe, lse


@jit
def _softmax_update(s, valid, m_i, l_i, qk_scale):  # type: ignore[no-untyped-def]
    """Online softmax step in the log2 domain; returns (p, alpha, m_new, l_new)."""
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, axis=1)
    return p, alpha, m_new, l_new


@jit
def _scaled_pv(p, sc, k, acc):  # type: ignore[no-untyped-def]
    """``acc + (p * sc) @ k`` with FP16 operands.

    The per-row FP32 scales are folded into P relative to the tile's largest
    scale, so P stays in FP16's normal range (``p * sc`` alone can be ~1e-6 and
    would lose bits as an FP16 subnormal); the tile maximum is applied in FP32.
    """
    smax = tl.max(sc, axis=0)
    smax = tl.where(smax > 0, smax, 1.0)
    pf = (p * (sc / smax)[None, :]).to(tl.float16)
    return acc + tl.dot(pf, k) * smax


@jit
def _load_q16(ptrs, mask):  # type: ignore[no-untyped-def]
    """Query values at ``ptrs`` as FP16 (through FP32: the interpreter cannot compute on bf16)."""
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32).to(tl.float16)


@jit
def _interleave8(a0, a1, a2, a3, a4, a5, a6, a7, ROWS: tl.constexpr):  # type: ignore[no-untyped-def]
    """``[ROWS, 64]`` x 8 -> ``[ROWS, 512]`` with ``a_k[:, w]`` at column ``8w + k``."""
    x = tl.join(tl.join(tl.join(a0, a4), tl.join(a2, a6)), tl.join(tl.join(a1, a5), tl.join(a3, a7)))
    return tl.reshape(x, (ROWS, 512))


@jit
def _load_nvfp4_tile(cache_ptr, cache_i32_ptr, idx_row, n, end, num_rows, block_size, stride_block, PAGED: tl.constexpr):  # type: ignore[no-untyped-def]
    """Gather the raw bytes of one tile of nvfp4 rows: (valid, latent words [N, 64] int32, the scale code of
    each word's block [N, 64], rope codes [N, 64]).  Loading the scale once per word (rather than once per
    block and broadcasting) keeps every tensor of the tile in one register layout: no shared-memory shuffle."""
    valid, off = _row_offsets(idx_row, n, end, num_rows, block_size, stride_block, 352, PAGED)
    m2 = valid[:, None]
    w = tl.arange(0, 64)
    row = cache_ptr + off
    words = tl.load(cache_i32_ptr + (off >> 2)[:, None] + w[None, :], mask=m2, other=0)
    b = w // 2  # the block of latent word w: its scale code is loaded once per word
    sc = tl.load(row[:, None] + (320 + 8 * (b & 3) + (b >> 2))[None, :], mask=m2, other=0)
    pe = tl.load(row[:, None] + 256 + w[None, :], mask=m2, other=0)
    return valid, words, sc, pe


@jit
def _load_fp8_tile(cache_ptr, cache_f32_ptr, cache_i16_ptr, idx_row, n, end, num_rows, block_size, stride_block, PAGED: tl.constexpr):  # type: ignore[no-untyped-def]
    """Gather the raw bytes of one tile of fp8 rows: (valid, 4 latent chunks, 4 scales, rope bits)."""
    valid, off = _row_offsets(idx_row, n, end, num_rows, block_size, stride_block, 656, PAGED)
    d = tl.arange(0, 128)
    r = tl.arange(0, 64)
    row = cache_ptr + off
    v2 = valid[:, None]
    c0 = tl.load(row[:, None] + d[None, :], mask=v2, other=0)
    c1 = tl.load(row[:, None] + 128 + d[None, :], mask=v2, other=0)
    c2 = tl.load(row[:, None] + 256 + d[None, :], mask=v2, other=0)
    c3 = tl.load(row[:, None] + 384 + d[None, :], mask=v2, other=0)
    srow = cache_f32_ptr + off // 4 + 128
    sc0 = tl.load(srow, mask=valid, other=0.0)
    sc1 = tl.load(srow + 1, mask=valid, other=0.0)
    sc2 = tl.load(srow + 2, mask=valid, other=0.0)
    sc3 = tl.load(srow + 3, mask=valid, other=0.0)
    pe_bits = tl.load(cache_i16_ptr + (off // 2 + 264)[:, None] + r[None, :], mask=v2, other=0)
    return valid, c0, c1, c2, c3, sc0, sc1, sc2, sc3, pe_bits


# ----------------------------------------------------------------------------
# main kernels
# ----------------------------------------------------------------------------


@jit
def _decode_nvfp4_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    cache_ptr,
    cache_i32_ptr,
    idx_ptr,
    scratch_ptr,
    o_ptr,
    lse_ptr,
    H,
    TOPK,
    num_rows,
    block_size,
    stride_block,
    rows_per_split,
    stride_qt,
    stride_qh,
    stride_it,
    qk_scale,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMPACT: tl.constexpr,
    SCAN: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
    PREFETCH: tl.constexpr,
    PAGED: tl.constexpr,
):
    t, sp, num_splits, heads, hmask = _program_heads(H, BLOCK_H)
    w = tl.arange(0, 64)

    # latent element 8w + k of the query (k = 0..7), to match the K slices below
    q_row = q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    hm2 = hmask[:, None]
    q0 = _load_q16(q_row + 8 * w[None, :] + 0, hm2)
    q1 = _load_q16(q_row + 8 * w[None, :] + 1, hm2)
    q2 = _load_q16(q_row + 8 * w[None, :] + 2, hm2)
    q3 = _load_q16(q_row + 8 * w[None, :] + 3, hm2)
    q4 = _load_q16(q_row + 8 * w[None, :] + 4, hm2)
    q5 = _load_q16(q_row + 8 * w[None, :] + 5, hm2)
    q6 = _load_q16(q_row + 8 * w[None, :] + 6, hm2)
    q7 = _load_q16(q_row + 8 * w[None, :] + 7, hm2)
    q_pe = _load_q16(q_row + 512 + w[None, :], hm2)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    a0 = tl.zeros([BLOCK_H, 64], tl.float32)
    a1 = tl.zeros([BLOCK_H, 64], tl.float32)
    a2 = tl.zeros([BLOCK_H, 64], tl.float32)
    a3 = tl.zeros([BLOCK_H, 64], tl.float32)
    a4 = tl.zeros([BLOCK_H, 64], tl.float32)
    a5 = tl.zeros([BLOCK_H, 64], tl.float32)
    a6 = tl.zeros([BLOCK_H, 64], tl.float32)
    a7 = tl.zeros([BLOCK_H, 64], tl.float32)

    lst, end = _slot_list(idx_ptr, stride_it, _scratch_row(scratch_ptr, t, sp, num_splits, H, BLOCK_H, rows_per_split),
                          t, sp, num_splits, rows_per_split, TOPK, num_rows, BLOCK_N, SCAN, COMPACT)
    nb = tl.arange(0, BLOCK_N)
    cache = (cache_ptr, cache_i32_ptr)
    valid, words, sc, pe = _load_nvfp4_tile(*cache, lst, nb, end, num_rows, block_size, stride_block, PAGED)
    for n0 in range(0, end, BLOCK_N):
        if PREFETCH:  # issue the next tile's gathers before this tile's math
            nxt = _load_nvfp4_tile(*cache, lst, n0 + BLOCK_N + nb, end, num_rows, block_size, stride_block, PAGED)
        # with compaction only a split's last tile can hold empty slots; the branch is there for
        # register allocation (fp8 on sm_100 spills in the loop without it, see compile_check)
        if (not SKIP_EMPTY) or tl.max(valid.to(tl.int32), axis=0) > 0:
            # K slice k = latent element 8w + k of each row, x 2^-7 (exact in FP16, see nvfp4_k_slices)
            k0, k1, k2, k3, k4, k5, k6, k7 = nvfp4_k_slices(words, sc, BLOCK_N)
            k_pe = pe.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16) * 0.0078125
            s = tl.dot(q1, tl.trans(k1), tl.dot(q0, tl.trans(k0)))
            s += tl.dot(q3, tl.trans(k3), tl.dot(q2, tl.trans(k2)))
            s += tl.dot(q5, tl.trans(k5), tl.dot(q4, tl.trans(k4)))
            s += tl.dot(q7, tl.trans(k7), tl.dot(q6, tl.trans(k6), tl.dot(q_pe, tl.trans(k_pe))))
            p, alpha, m_i, l_i = _softmax_update(s, valid, m_i, l_i, qk_scale * 128.0)
            pf = p.to(tl.float16)
            a2d = alpha[:, None]
            a0 = tl.dot(pf, k0, a0 * a2d)
            a1 = tl.dot(pf, k1, a1 * a2d)
            a2 = tl.dot(pf, k2, a2 * a2d)
            a3 = tl.dot(pf, k3, a3 * a2d)
            a4 = tl.dot(pf, k4, a4 * a2d)
            a5 = tl.dot(pf, k5, a5 * a2d)
            a6 = tl.dot(pf, k6, a6 * a2d)
            a7 = tl.dot(pf, k7, a7 * a2d)
        if not PREFETCH:
            nxt = _load_nvfp4_tile(*cache, lst, n0 + BLOCK_N + nb, end, num_rows, block_size, stride_block, PAGED)
        valid, words, sc, pe = nxt

    part, l_safe, lse = _split_result(m_i, l_i, t, sp, num_splits, H, heads)
    inv = (128.0 / l_safe)[:, None]  # the latent went through the MMAs scaled by 2^-7
    out = _interleave8(a0 * inv, a1 * inv, a2 * inv, a3 * inv, a4 * inv, a5 * inv, a6 * inv, a7 * inv, BLOCK_H)
    d = tl.arange(0, 512)
    tl.store(o_ptr + part.to(tl.int64)[:, None] * 512 + d[None, :], out, mask=hm2)
    tl.store(lse_ptr + part, lse, mask=hmask)


@jit
def _decode_fp8_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    cache_ptr,
    cache_f32_ptr,
    cache_i16_ptr,
    idx_ptr,
    scratch_ptr,
    o_ptr,
    lse_ptr,
    H,
    TOPK,
    num_rows,
    block_size,
    stride_block,
    rows_per_split,
    stride_qt,
    stride_qh,
    stride_it,
    qk_scale,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMPACT: tl.constexpr,
    SCAN: tl.constexpr,
    SKIP_EMPTY: tl.constexpr,
    PREFETCH: tl.constexpr,
    PAGED: tl.constexpr,
):
    t, sp, num_splits, heads, hmask = _program_heads(H, BLOCK_H)
    d = tl.arange(0, 128)
    r = tl.arange(0, 64)

    q_row = q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    hm2 = hmask[:, None]
    q0 = tl.load(q_row + d[None, :], mask=hm2, other=0.0).to(tl.float32).to(tl.float16)
    q1 = tl.load(q_row + 128 + d[None, :], mask=hm2, other=0.0).to(tl.float32).to(tl.float16)
    q2 = tl.load(q_row + 256 + d[None, :], mask=hm2, other=0.0).to(tl.float32).to(tl.float16)
    q3 = tl.load(q_row + 384 + d[None, :], mask=hm2, other=0.0).to(tl.float32).to(tl.float16)
    q_pe = tl.load(q_row + 512 + r[None, :], mask=hm2, other=0.0).to(tl.float32).to(tl.float16)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc1 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc2 = tl.zeros([BLOCK_H, 128], tl.float32)
    acc3 = tl.zeros([BLOCK_H, 128], tl.float32)

    lst, end = _slot_list(idx_ptr, stride_it, _scratch_row(scratch_ptr, t, sp, num_splits, H, BLOCK_H, rows_per_split),
                          t, sp, num_splits, rows_per_split, TOPK, num_rows, BLOCK_N, SCAN, COMPACT)
    nb = tl.arange(0, BLOCK_N)
    cache = (cache_ptr, cache_f32_ptr, cache_i16_ptr)
    valid, c0, c1, c2, c3, sc0, sc1, sc2, sc3, pe_bits = _load_fp8_tile(
        *cache, lst, nb, end, num_rows, block_size, stride_block, PAGED
    )
    for n0 in range(0, end, BLOCK_N):
        if PREFETCH:  # issue the next tile's gathers before this tile's math
            nxt = _load_fp8_tile(*cache, lst, n0 + BLOCK_N + nb, end, num_rows, block_size, stride_block, PAGED)
        # with compaction only a split's last tile can hold empty slots; the branch is there for
        # register allocation (fp8 on sm_100 spills in the loop without it, see compile_check)
        if (not SKIP_EMPTY) or tl.max(valid.to(tl.int32), axis=0) > 0:
            k0 = e4m3_decode(c0).to(tl.float16)
            k1 = e4m3_decode(c1).to(tl.float16)
            k2 = e4m3_decode(c2).to(tl.float16)
            k3 = e4m3_decode(c3).to(tl.float16)
            k_pe = bf16_bits_to_f32(pe_bits).to(tl.float16)
            s = tl.dot(q0, tl.trans(k0)) * sc0[None, :]
            s += tl.dot(q1, tl.trans(k1)) * sc1[None, :]
            s += tl.dot(q2, tl.trans(k2)) * sc2[None, :]
            s += tl.dot(q3, tl.trans(k3)) * sc3[None, :]
            s = tl.dot(q_pe, tl.trans(k_pe), s)
            p, alpha, m_i, l_i = _softmax_update(s, valid, m_i, l_i, qk_scale)
            a2 = alpha[:, None]
            acc0 = _scaled_pv(p, sc0, k0, acc0 * a2)
            acc1 = _scaled_pv(p, sc1, k1, acc1 * a2)
            acc2 = _scaled_pv(p, sc2, k2, acc2 * a2)
            acc3 = _scaled_pv(p, sc3, k3, acc3 * a2)
        if not PREFETCH:
            nxt = _load_fp8_tile(*cache, lst, n0 + BLOCK_N + nb, end, num_rows, block_size, stride_block, PAGED)
        valid, c0, c1, c2, c3, sc0, sc1, sc2, sc3, pe_bits = nxt

    part, l_safe, lse = _split_result(m_i, l_i, t, sp, num_splits, H, heads)
    inv = (1.0 / l_safe)[:, None]
    o_row = o_ptr + part.to(tl.int64)[:, None] * 512
    tl.store(o_row + d[None, :], acc0 * inv, mask=hm2)
    tl.store(o_row + 128 + d[None, :], acc1 * inv, mask=hm2)
    tl.store(o_row + 256 + d[None, :], acc2 * inv, mask=hm2)
    tl.store(o_row + 384 + d[None, :], acc3 * inv, mask=hm2)
    tl.store(lse_ptr + part, lse, mask=hmask)


@jit
def _merge_kernel(  # type: ignore[no-untyped-def]
    o_part_ptr,
    lse_part_ptr,
    out_ptr,
    lse_out_ptr,
    H,
    NUM_SPLITS,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Combine split partials of one (token, head, BLOCK_D-chunk) by log-sum-exp weights.

    All partials of the chunk are gathered in one masked load (splits without a
    valid row, weight 0, are not read), so the merge costs one memory round trip
    whatever the split count.
    """
    t = tl.program_id(0)
    h = tl.program_id(1)
    dc = tl.program_id(2)
    sidx = tl.arange(0, BLOCK_S)
    smask = sidx < NUM_SPLITS
    part = (t * NUM_SPLITS + sidx) * H + h
    lse = tl.load(lse_part_ptr + part, mask=smask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)
    w_sum = tl.sum(w, axis=0)
    inv = tl.where(w_sum > 0, 1.0 / tl.where(w_sum > 0, w_sum, 1.0), 0.0)
    d = dc * BLOCK_D + tl.arange(0, BLOCK_D)
    o = tl.load(
        o_part_ptr + part.to(tl.int64)[:, None] * 512 + d[None, :], mask=(smask & (w > 0))[:, None], other=0.0
    )
    acc = tl.sum(o * w[:, None], axis=0)
    tl.store(out_ptr + (t * H + h).to(tl.int64) * 512 + d, acc * inv)
    log2_sum = tl.log2(tl.where(w_sum > 0, w_sum, 1.0))
    lse_nat = tl.where(w_sum > 0, (m_safe + log2_sum) * 0.6931471805599453, float("-inf"))
    tl.store(lse_out_ptr + t * H + h, lse_nat, mask=dc == 0)


@jit
def _stage_nvfp4_to_fp8_kernel(  # type: ignore[no-untyped-def]
    cache_ptr,
    idx_ptr,
    stage_ptr,
    stage_f32_ptr,
    stage_i16_ptr,
    new_idx_ptr,
    N,
    num_rows,
    block_size,
    stride_block,
    BLOCK_T: tl.constexpr,
    PAGED: tl.constexpr,
):
    """Dequantise selected nvfp4 rows and re-quantise them into a dense fp8_ds_mla buffer."""
    pid = tl.program_id(0)
    slot = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    inb = slot < N
    idx = tl.load(idx_ptr + slot, mask=inb, other=-1)
    valid = inb & (idx >= 0) & (idx < num_rows)
    tl.store(new_idx_ptr + slot, tl.where(valid, slot, -1), mask=inb)
    row = cache_ptr + _row_byte_offset(tl.where(valid, idx, 0), block_size, stride_block, 352, PAGED)
    packed, sc, pe = nvfp4_gather(row, valid)
    lo, hi = nvfp4_dequant_halves(packed, sc, BLOCK_T, tl.float32)
    rope = e4m3_decode(pe)
    s64 = slot.to(tl.int64)
    fp8_quant_store(stage_ptr + s64 * 656, stage_f32_ptr + s64 * 164, stage_i16_ptr + s64 * 328, lo, hi, rope, valid, BLOCK_T)


# ----------------------------------------------------------------------------
# wrappers
# ----------------------------------------------------------------------------

BLOCK_H = 16
BLOCK_N = 32
MERGE_BLOCK_D = 128


@dataclass(frozen=True)
class DecodeTuning:
    """Launch parameters of the decode kernels (they change speed, never the result beyond rounding).

    ``block_n``: rows per tile (power of two, >= 16).  ``num_warps`` / ``num_stages``:
    Triton launch options (``num_stages=None`` = Triton's default).  ``compact``:
    when a token has empty (``-1``) or out-of-range slots, rank its valid slots first
    and split only those evenly over the programs (no tile is spent on empty slots and
    the tile loop stays branch-free; a token without empty slots costs one extra pass
    over its index list).  ``skip_empty_tiles``: branch over a tile whose slots are
    all empty (without compaction that saves work at low fill, but the branch keeps
    Triton from pipelining the loop; with it, it changes only register allocation).
    ``prefetch``: gather
    the next tile's rows before this tile's math, so the memory latency overlaps
    the compute (a register double buffer of the raw bytes).  ``max_registers``:
    cap registers per thread (ptxas ``maxnreg``) so more programs fit on an SM.
    ``programs_per_sm``: how many programs of this launch an SM holds at once
    (registers / shared memory, see ``primectl_kernels.compile_check``); the split
    heuristic fills exactly one wave of them.
    """

    block_n: int = BLOCK_N
    num_warps: int = 8
    num_stages: int | None = None
    compact: bool = True
    skip_empty_tiles: bool = False
    prefetch: bool = True
    max_registers: int | None = None
    programs_per_sm: int = 1

    def launch_options(self) -> dict[str, int]:
        """Keyword launch options for a Triton kernel call."""
        opts = {"num_warps": self.num_warps}
        if self.num_stages is not None:
            opts["num_stages"] = self.num_stages
        if self.max_registers is not None:
            opts["maxnreg"] = self.max_registers
        return opts


# the fastest launches at T=15 x 2,048 x 16 heads on an H200 (primectl_kernels/RESULTS.md)
DEFAULT_TUNINGS: dict[str, DecodeTuning] = {
    "nvfp4": DecodeTuning(block_n=64, num_warps=8, num_stages=2, prefetch=True),
    "fp8": DecodeTuning(block_n=32, num_warps=4, skip_empty_tiles=True, prefetch=False, programs_per_sm=2),
}

# what ``python -m primectl_kernels.bench --tune`` tries (and ``primectl_kernels.compile_check --all-tunings`` compiles)
TUNING_CANDIDATES: tuple[DecodeTuning, ...] = (
    # the two winners of the previous H200 runs (fp8, nvfp4), and both without compaction
    DecodeTuning(block_n=32, num_warps=4, skip_empty_tiles=True, prefetch=False),
    DecodeTuning(block_n=64, num_warps=8, num_stages=2, prefetch=True),
    DecodeTuning(block_n=32, num_warps=4, skip_empty_tiles=True, prefetch=False, compact=False),
    DecodeTuning(block_n=64, num_warps=8, num_stages=2, prefetch=True, compact=False),
    # after the nvfp4 rework (compile_check): 64 rows without prefetch (177 registers),
    # 32 rows x 4 warps (203-209 registers: two programs per SM)
    DecodeTuning(block_n=64, num_warps=8, prefetch=False),
    DecodeTuning(block_n=32, num_warps=4, prefetch=True),
    DecodeTuning(block_n=16, num_warps=4, prefetch=False),
    # capped registers: two 8-warp or three 4-warp programs per SM
    DecodeTuning(block_n=16, num_warps=8, prefetch=False, max_registers=128),
    DecodeTuning(block_n=32, num_warps=8, prefetch=False, max_registers=128),
    DecodeTuning(block_n=32, num_warps=8, prefetch=True, max_registers=128),
    DecodeTuning(block_n=16, num_warps=4, prefetch=False, max_registers=168),
    DecodeTuning(block_n=32, num_warps=4, prefetch=False, max_registers=168),
)


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 1


def choose_num_splits(t: int, h: int, topk: int, device: torch.device, tuning: DecodeTuning) -> int:
    """Split count that fills exactly one wave of programs (a second, part-empty wave
    cost up to 40% on the H200), with at least one tile per split."""
    if topk <= 0:
        return 1
    programs = t * triton.cdiv(h, BLOCK_H)
    max_splits = triton.cdiv(topk, tuning.block_n)
    want = (tuning.programs_per_sm * _num_sms(device)) // max(programs, 1)
    return int(max(1, min(max_splits, want, 64)))


def _paged(cache: torch.Tensor, row_bytes: int) -> bool:
    """True when the cache's blocks are not packed back to back (row offsets need the block size)."""
    return int(cache.stride(0)) != int(cache.shape[1]) * row_bytes


def _check(q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, row_bytes: int) -> None:
    if q.dim() != 3 or q.shape[-1] != HEAD_DIM_QK:
        raise ValueError(f"q must be [T, H, 576], got {tuple(q.shape)}")
    if q.stride(-1) != 1:
        raise ValueError("q must be contiguous in its last dimension")
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[-1] != row_bytes:
        raise ValueError(f"cache must be uint8 [num_blocks, block_size, {row_bytes}], got {cache.dtype} {tuple(cache.shape)}")
    if cache.stride(2) != 1 or cache.stride(1) != row_bytes or cache.stride(0) % 16 != 0:
        raise ValueError("cache rows must be contiguous within a block and blocks 16-byte aligned")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"indices must be [T, topk], got {tuple(indices.shape)}")


def _run(
    fmt: str,
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    num_splits: int | None,
    tuning: DecodeTuning | None,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    tune = tuning or DEFAULT_TUNINGS[fmt]
    block_n = tune.block_n
    row_bytes = NVFP4_DS_MLA_ROW_BYTES if fmt == "nvfp4" else FP8_DS_MLA_ROW_BYTES
    _check(q, cache, indices, row_bytes)
    t, h, _ = q.shape
    topk = indices.shape[1]
    idx = indices.to(torch.int32).contiguous()
    splits = num_splits or choose_num_splits(t, h, topk, q.device, tune)
    splits = max(1, min(splits, max(1, triton.cdiv(topk, block_n))))
    rows_per_split = triton.cdiv(triton.cdiv(max(topk, 1), splits), block_n) * block_n
    splits = max(1, triton.cdiv(max(topk, 1), rows_per_split))
    num_rows = cache.shape[0] * cache.shape[1]
    o_part = torch.empty(t, splits, h, KV_LORA_RANK, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(t, splits, h, dtype=torch.float32, device=q.device)
    out = torch.empty(t, h, KV_LORA_RANK, dtype=torch.float32, device=q.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    if t == 0:
        return (out, lse) if return_lse else out
    grid = (t, splits, triton.cdiv(h, BLOCK_H))
    # compaction: each program's share of a token's valid slots (never more than rows_per_split)
    scratch = torch.empty(t * splits * grid[2] * rows_per_split if tune.compact else 1, dtype=torch.int32, device=q.device)
    common = (
        h,
        topk,
        num_rows,
        cache.shape[1],
        cache.stride(0),
        rows_per_split,
        q.stride(0),
        q.stride(1),
        idx.stride(0),
        sm_scale * LOG2E,
    )
    caches: tuple[torch.Tensor, ...]
    if fmt == "nvfp4":  # the latent is read as int32 words (8 E2M1 values each)
        kernel, caches = _decode_nvfp4_kernel, (cache, cache.view(torch.int32))
    else:  # the fp8 kernel also reads the scales and rope through float32 / int16 views of the rows
        kernel, caches = _decode_fp8_kernel, (cache, cache.view(torch.float32), cache.view(torch.int16))
    kernel[grid](
        q,
        *caches,
        idx,
        scratch,
        o_part,
        lse_part,
        *common,
        BLOCK_H=BLOCK_H,
        BLOCK_N=block_n,
        COMPACT=tune.compact,
        SCAN=min(triton.next_power_of_2(max(topk, 1)), 2048),
        SKIP_EMPTY=tune.skip_empty_tiles,
        PREFETCH=tune.prefetch,
        PAGED=_paged(cache, row_bytes),
        **tune.launch_options(),
    )
    _merge_kernel[(t, h, KV_LORA_RANK // MERGE_BLOCK_D)](
        o_part,
        lse_part,
        out,
        lse,
        h,
        splits,
        BLOCK_S=triton.next_power_of_2(splits),
        BLOCK_D=MERGE_BLOCK_D,
    )
    return (out, lse) if return_lse else out


def decode_nvfp4_native(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,
    tuning: DecodeTuning | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode reading nvfp4_ds_mla rows directly (dequantised in registers).

    Args:
        q: ``[T, H, 576]`` queries (bf16/fp16/fp32, last dim contiguous).
        cache: uint8 ``[num_blocks, block_size, 352]`` paged cache.
        indices: ``[T, topk]`` global row ids (``block * block_size + offset``), ``-1`` = empty.
        sm_scale: softmax scale.
        num_splits: split-K factor (default: heuristic from the SM count).
        tuning: tile size and launch options (default :data:`DEFAULT_TUNINGS` for the format).
        return_lse: also return the natural-log LSE ``[T, H]``.

    Returns FP32 ``[T, H, 512]`` (and the LSE).
    """
    return _run("nvfp4", q, cache, indices, sm_scale, num_splits, tuning, return_lse)


def decode_fp8(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,
    tuning: DecodeTuning | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode over fp8_ds_mla rows (uint8 ``[num_blocks, block_size, 656]``).

    Same arguments and result as :func:`decode_nvfp4_native`.
    """
    return _run("fp8", q, cache, indices, sm_scale, num_splits, tuning, return_lse)


def stage_nvfp4_to_fp8(cache: torch.Tensor, indices: torch.Tensor, block_t: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantise the rows selected by ``indices [T, topk]`` from an nvfp4 cache into a
    temporary fp8_ds_mla buffer ``[1, T*topk, 656]``; returns (buffer, remapped indices)."""
    if cache.dtype != torch.uint8 or cache.dim() != 3 or cache.shape[-1] != NVFP4_DS_MLA_ROW_BYTES:
        raise ValueError("cache must be uint8 [num_blocks, block_size, 352]")
    t, topk = indices.shape
    n = t * topk
    idx = indices.to(torch.int32).contiguous().view(-1)
    stage = torch.empty(1, max(n, 1), FP8_DS_MLA_ROW_BYTES, dtype=torch.uint8, device=cache.device)
    new_idx = torch.empty(t, topk, dtype=torch.int32, device=cache.device)
    if n:
        flat = stage.view(-1)
        _stage_nvfp4_to_fp8_kernel[(triton.cdiv(n, block_t),)](
            cache,
            idx,
            stage,
            flat.view(torch.float32),
            flat.view(torch.int16),
            new_idx,
            n,
            cache.shape[0] * cache.shape[1],
            cache.shape[1],
            cache.stride(0),
            BLOCK_T=block_t,
            PAGED=_paged(cache, NVFP4_DS_MLA_ROW_BYTES),
        )
    return stage, new_idx


def decode_nvfp4_staged(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,
    tuning: DecodeTuning | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Staged nvfp4 decode: :func:`stage_nvfp4_to_fp8` then :func:`decode_fp8`.

    Numerically this is the FP8 decode of the re-quantised rows (two rounding steps).
    """
    stage, new_idx = stage_nvfp4_to_fp8(cache, indices)
    return decode_fp8(q, stage, new_idx, sm_scale, num_splits, tuning, return_lse)


def sparse_mla_decode(
    q: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float | None = None,
    variant: str = "nvfp4",
    num_splits: int | None = None,
    return_lse: bool = False,
    tuning: DecodeTuning | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Dispatch on ``variant`` in {"nvfp4", "nvfp4_staged", "fp8"}; ``sm_scale`` defaults to 1/sqrt(576)."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(HEAD_DIM_QK)
    if variant == "nvfp4":
        return decode_nvfp4_native(q, cache, indices, scale, num_splits, tuning, return_lse)
    if variant == "nvfp4_staged":
        return decode_nvfp4_staged(q, cache, indices, scale, num_splits, tuning, return_lse)
    if variant == "fp8":
        return decode_fp8(q, cache, indices, scale, num_splits, tuning, return_lse)
    raise ValueError(f"unknown decode variant {variant!r}")

"""A kernel that does only the sparse decode's memory access, to measure it on its own.

Each program gathers its split of a query token's selected rows, tile by tile,
exactly as the decode kernels do (same row offsets, same masking of ``-1``
slots), and reduces the bytes to one checksum so the loads cannot be dropped.
Used by ``python -m primectl_kernels.ablation``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from primectl_kernels.codec import jit
from primectl_kernels.decode import _paged, _row_offsets


@jit
def _gather_kernel(  # type: ignore[no-untyped-def]
    cache_ptr,
    idx_ptr,
    out_ptr,
    TOPK,
    num_rows,
    block_size,
    stride_block,
    rows_per_split,
    stride_it,
    ROW_BYTES: tl.constexpr,
    ROW_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
):
    t = tl.program_id(0)
    sp = tl.program_id(1)
    start = sp * rows_per_split
    end = tl.minimum(start + rows_per_split, TOPK)
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    b = tl.arange(0, ROW_PAD)
    acc = tl.zeros([BLOCK_N, ROW_PAD], tl.int32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        valid, off = _row_offsets(idx_row, n, end, num_rows, block_size, stride_block, ROW_BYTES, PAGED)
        m = valid[:, None] & (b[None, :] < ROW_BYTES)
        acc += tl.load(cache_ptr + off[:, None] + b[None, :], mask=m, other=0).to(tl.int32)
    tl.store(out_ptr + t * tl.num_programs(1) + sp, tl.sum(tl.sum(acc, axis=1), axis=0))


def gather_only(
    cache: torch.Tensor, indices: torch.Tensor, row_bytes: int, splits: int, block_n: int, num_warps: int
) -> torch.Tensor:
    """Gather every selected row of ``cache [blocks, block_size, row_bytes]`` with the decode's split
    layout; returns one int32 checksum per (token, split) program (the sum of the bytes it read)."""
    t, topk = indices.shape
    rows_per_split = triton.cdiv(triton.cdiv(max(topk, 1), splits), block_n) * block_n
    splits = max(1, triton.cdiv(max(topk, 1), rows_per_split))
    out = torch.empty(t * splits, dtype=torch.int32, device=cache.device)
    _gather_kernel[(t, splits)](
        cache,
        indices,
        out,
        topk,
        cache.shape[0] * cache.shape[1],
        cache.shape[1],
        cache.stride(0),
        rows_per_split,
        indices.stride(0),
        ROW_BYTES=row_bytes,
        ROW_PAD=triton.next_power_of_2(row_bytes),
        BLOCK_N=block_n,
        PAGED=_paged(cache, row_bytes),
        num_warps=num_warps,
    )
    return out

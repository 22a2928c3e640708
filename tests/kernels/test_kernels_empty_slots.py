"""Empty (-1) slots: compaction of the valid slots, results, and that no empty slot's row is read."""

from __future__ import annotations

import math
import os
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed; kernel tests need torch + triton")
pytest.importorskip("triton", reason="triton is not installed")

import torch
import triton
import triton.language as tl

from primectl_kernels import codec, decode, reference

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available() else "cuda"
SM_SCALE = 1.0 / math.sqrt(576)
TOPK = 160
NUM_BLOCKS, BLOCK_SIZE = 8, 32  # 256 rows


@codec.jit
def _lists_kernel(  # type: ignore[no-untyped-def]
    idx_ptr, scratch_ptr, out_ptr, len_ptr, TOPK, num_rows, rows_per_split, stride_it, BLOCK_N: tl.constexpr, SCAN: tl.constexpr
):
    """Writes what decode._slot_list hands each (token, split) program: its slot list and length."""
    t = tl.program_id(0)
    sp = tl.program_id(1)
    ns = tl.num_programs(1)
    prog = t * ns + sp
    lst, length = decode._slot_list(
        idx_ptr, stride_it, scratch_ptr + prog * rows_per_split, t, sp, ns, rows_per_split, TOPK, num_rows, BLOCK_N, SCAN, True
    )
    n = tl.arange(0, SCAN)
    tl.store(out_ptr + prog * SCAN + n, tl.load(lst + n, mask=n < length, other=-2))
    tl.store(len_ptr + prog, length)


def _lists(idx: torch.Tensor, num_rows: int, splits: int, block_n: int) -> tuple[list[list[list[int]]], list[list[int]]]:
    t, topk = idx.shape
    rows_per_split = triton.cdiv(triton.cdiv(topk, splits), block_n) * block_n
    scan = triton.next_power_of_2(topk)
    scratch = torch.full((t * splits * rows_per_split,), -3, dtype=torch.int32, device=DEVICE)
    out = torch.empty(t * splits * scan, dtype=torch.int32, device=DEVICE)
    lens = torch.empty(t * splits, dtype=torch.int32, device=DEVICE)
    idx_d = idx.to(torch.int32).to(DEVICE)
    _lists_kernel[(t, splits)](idx_d, scratch, out, lens, topk, num_rows, rows_per_split, idx_d.stride(0), BLOCK_N=block_n, SCAN=scan)
    out_l = out.cpu().view(t, splits, scan).tolist()
    lens_l = lens.cpu().view(t, splits).tolist()
    return [[out_l[i][s][: lens_l[i][s]] for s in range(splits)] for i in range(t)], lens_l


def _patterns() -> torch.Tensor:
    """One token per empty-slot pattern, over 256 rows, top-k 160.  Row 0 is never selected: a masked
    slot that were still read would most likely read row 0 (its offset is clamped there)."""
    g = torch.Generator().manual_seed(31)
    idx = torch.stack([torch.randperm(NUM_BLOCKS * BLOCK_SIZE - 1, generator=g)[:TOPK] + 1 for _ in range(6)]).to(torch.int32)
    idx[0, 0:64] = -1  # whole tiles empty (64-row and 32-row tiles) ...
    idx[0, 96:160] = -1  # ... on both sides of 32 valid slots
    idx[1, torch.rand(TOPK, generator=g) < 0.6] = -1  # scattered: most tiles partly empty
    idx[2, 37:] = -1  # a tail of -1 (a context shorter than top-k)
    idx[3, :] = -1  # nothing valid
    idx[4, ::7] = 1000  # out of range counts as empty
    # token 5: every slot valid (the list is the split's own stretch, no compaction)
    return idx


@pytest.mark.parametrize("splits,block_n", [(1, 64), (3, 32), (4, 16)])
def test_each_program_gets_an_even_share_of_the_valid_slots(splits: int, block_n: int) -> None:
    idx = _patterns()
    lists, lens = _lists(idx, NUM_BLOCKS * BLOCK_SIZE, splits, block_n)
    rows_per_split = triton.cdiv(triton.cdiv(TOPK, splits), block_n) * block_n
    for i, row in enumerate(idx.tolist()):
        valid = [x for x in row if 0 <= x < NUM_BLOCKS * BLOCK_SIZE]
        walked = [x for share in lists[i] for x in share]
        if len(valid) == TOPK:  # nothing to compact: each split walks its stretch of the list
            assert lists[i] == [row[s * rows_per_split : (s + 1) * rows_per_split] for s in range(splits)]
            continue
        assert walked == valid  # every valid slot once, in order; no empty slot is ever handed out
        per = triton.cdiv(triton.cdiv(len(valid), splits), block_n) * block_n if valid else 0
        assert lens[i] == [max(0, min(per, len(valid) - s * per)) for s in range(splits)]


def _poison_unselected(cache: torch.Tensor, fmt: str, idx: torch.Tensor) -> torch.Tensor:
    """A copy of ``cache`` where every row that no valid slot selects holds NaN scales and huge values."""
    flat = cache.clone().view(-1, cache.shape[-1])
    unused = torch.ones(flat.shape[0], dtype=torch.bool)
    sel = idx[(idx >= 0) & (idx < flat.shape[0])].long()
    unused[sel] = False
    if fmt == "nvfp4":
        flat[unused, :320] = 0x77  # E2M1 6.0 everywhere, e4m3 rope 240
        flat[unused, 320:] = 0x7F  # NaN scales
    else:
        flat[unused, :512] = 0x7E
        flat[unused, 512:528] = torch.tensor([float("nan")] * 4).view(torch.uint8)
        flat[unused, 528:] = 0x7F
    return flat.view(cache.shape)


def _cache(fmt: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(41)
    lat = torch.randn(NUM_BLOCKS * BLOCK_SIZE, 512, generator=g) * 1.5
    rope = torch.randn(NUM_BLOCKS * BLOCK_SIZE, 64, generator=g)
    rows = reference.quantize_nvfp4_ref(lat, rope) if fmt == "nvfp4" else reference.quantize_fp8_ref(lat, rope)
    return rows.view(NUM_BLOCKS, BLOCK_SIZE, -1)


TUNINGS = [
    decode.DecodeTuning(block_n=32, num_warps=4),
    decode.DecodeTuning(block_n=32, num_warps=4, compact=False),
    decode.DecodeTuning(block_n=32, num_warps=4, compact=False, skip_empty_tiles=True),
]
TUNING_IDS = ["compact", "no-compact", "no-compact-skip"]


def _watch_loads(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """From now on, the byte addresses of every masked load the Triton interpreter performs (appended per load)."""
    import numpy as np
    from triton.runtime import interpreter

    seen: list[Any] = []
    load = interpreter.InterpreterBuilder.create_masked_load

    def watched(self, ptrs, mask, other, cache_policy, is_volatile):  # type: ignore[no-untyped-def]
        seen.append(np.asarray(ptrs.data, dtype=np.uint64)[np.broadcast_to(mask.data, ptrs.data.shape)].ravel())
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_masked_load", watched)
    return seen


def _rows_loaded(seen: list[Any], cache: torch.Tensor) -> set[int]:
    """The cache rows that the watched loads touched (addresses outside the cache are other tensors)."""
    import numpy as np

    addrs = np.concatenate(seen)
    base, size, row_bytes = cache.data_ptr(), cache.numel(), cache.shape[-1]
    return set(((addrs[(addrs >= base) & (addrs < base + size)] - base) // row_bytes).tolist())


@pytest.mark.parametrize("tuning", TUNINGS, ids=TUNING_IDS)
@pytest.mark.parametrize("variant", ["nvfp4", "fp8", "nvfp4_staged"])
def test_empty_slots_skipped_and_never_read(monkeypatch: pytest.MonkeyPatch, variant: str, tuning: decode.DecodeTuning) -> None:
    """Whole / partly / all-empty tiles, a -1 tail and out-of-range slots in one launch: the result matches
    the reference on a clean cache although every row that no valid slot selects is poisoned.

    Under the Triton interpreter the same launch also shows that every byte address the kernels load from the
    cache lies in a row some valid slot selects, and that every selected row is read. (The poisoned cache cannot
    show this for nvfp4 on the CPU: the interpreter decodes e4m3 0x7F as 480, not NaN, and a finite row that a
    masked slot pulled in would drop out of the softmax unseen.)"""
    fmt = "fp8" if variant == "fp8" else "nvfp4"
    cache = _cache(fmt)
    idx = _patterns()
    q = (torch.randn(idx.shape[0], 16, 576, generator=torch.Generator().manual_seed(43)) * 2).to(torch.bfloat16)
    poisoned = _poison_unselected(cache, fmt, idx).to(DEVICE)
    seen = _watch_loads(monkeypatch) if os.environ.get("TRITON_INTERPRET") == "1" else None
    got = decode.sparse_mla_decode(
        q.to(DEVICE), poisoned, idx.to(DEVICE), SM_SCALE, variant=variant, num_splits=3, return_lse=True, tuning=tuning
    )
    assert isinstance(got, tuple)
    out, lse = got[0].cpu(), got[1].cpu()
    ref_idx = torch.where((idx >= 0) & (idx < NUM_BLOCKS * BLOCK_SIZE), idx, -1)
    ref_cache = reference.restage_nvfp4_to_fp8_ref(cache) if variant == "nvfp4_staged" else cache
    res = reference.sparse_mla_decode_ref(q, ref_cache, ref_idx, SM_SCALE, "fp8" if variant != "nvfp4" else "nvfp4", return_lse=True)
    assert isinstance(res, tuple)
    ref_out, ref_lse = res
    assert bool((out[3] == 0).all()) and bool(torch.isneginf(lse[3]).all())  # the all-empty token
    keep = [0, 1, 2, 4, 5]
    assert bool(torch.isfinite(out[keep]).all()) and bool(torch.isfinite(lse[keep]).all())
    torch.testing.assert_close(out, ref_out, atol=4e-3, rtol=1e-2)
    torch.testing.assert_close(lse[keep], ref_lse[keep], atol=1e-3, rtol=1e-4)
    if seen is not None:
        rows, selected = _rows_loaded(seen, poisoned), set(ref_idx[ref_idx >= 0].tolist())
        assert rows == selected, (sorted(rows - selected)[:10], sorted(selected - rows)[:10])

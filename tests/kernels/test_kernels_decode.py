"""Sparse MLA decode kernels vs the PyTorch reference (small shapes for the interpreter)."""

from __future__ import annotations

import math
import os

import pytest

pytest.importorskip("torch", reason="torch is not installed; kernel tests need torch + triton")
pytest.importorskip("triton", reason="triton is not installed")

import torch

from primectl_kernels import decode, reference

DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available() else "cuda"

SM_SCALE = 1.0 / math.sqrt(576)
# FP16 dot operands (P rounded to fp16) and FP32 accumulation: outputs are
# convex combinations of O(1..5) latents, so 4e-3 absolute is ~10x the observed error.
ATOL = 4e-3
RTOL = 1e-2


def _make_cache(fmt: str, num_blocks: int, block_size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = num_blocks * block_size
    lat = torch.randn(n, 512, generator=g) * 1.5
    rope = torch.randn(n, 64, generator=g)
    if fmt == "fp8":
        rows = reference.quantize_fp8_ref(lat, rope)
    else:
        rows = reference.quantize_nvfp4_ref(lat, rope)
    return rows.view(num_blocks, block_size, -1)


def _make_indices(t: int, topk: int, num_rows: int, fill: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.stack([torch.randperm(num_rows, generator=g)[:topk] for _ in range(t)]).to(torch.int32)
    keep = torch.rand(t, topk, generator=g) < fill
    return torch.where(keep, idx, torch.full_like(idx, -1))


def _run(variant: str, q: torch.Tensor, cache: torch.Tensor, idx: torch.Tensor, splits: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    out = decode.sparse_mla_decode(
        q.to(DEVICE), cache.to(DEVICE), idx.to(DEVICE), SM_SCALE, variant=variant, num_splits=splits, return_lse=True
    )
    assert isinstance(out, tuple)
    return out[0].cpu(), out[1].cpu()


def _reference(variant: str, q: torch.Tensor, cache: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if variant == "nvfp4_staged":
        staged = reference.restage_nvfp4_to_fp8_ref(cache)
        res = reference.sparse_mla_decode_ref(q, staged, idx, SM_SCALE, "fp8", return_lse=True)
    else:
        res = reference.sparse_mla_decode_ref(q, cache, idx, SM_SCALE, variant, return_lse=True)
    assert isinstance(res, tuple)
    return res


def _assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


CASES = [
    # variant, T, H, topk, fill, splits, block_size
    ("nvfp4", 1, 16, 64, 1.0, 1, 16),
    ("nvfp4", 3, 16, 96, 0.5, 2, 16),
    ("nvfp4", 2, 20, 50, 0.8, 3, 8),  # H not a multiple of 16, topk not a multiple of BLOCK_N
    ("nvfp4", 4, 4, 128, 0.1, 4, 32),  # sparse fill: many empty tiles skipped
    ("fp8", 1, 16, 64, 1.0, 1, 16),
    ("fp8", 3, 8, 96, 0.5, 2, 16),
    ("fp8", 2, 20, 50, 0.8, 3, 8),
    ("nvfp4_staged", 2, 16, 64, 0.7, 2, 16),
]


@pytest.mark.parametrize("variant,t,h,topk,fill,splits,block_size", CASES)
def test_decode_matches_reference(variant: str, t: int, h: int, topk: int, fill: float, splits: int, block_size: int) -> None:
    fmt = "fp8" if variant == "fp8" else "nvfp4"
    cache = _make_cache(fmt, 8, block_size, seed=t * 100 + h)
    num_rows = cache.shape[0] * cache.shape[1]
    idx = _make_indices(t, min(topk, num_rows), num_rows, fill, seed=topk)
    g = torch.Generator().manual_seed(11)
    q = (torch.randn(t, h, 576, generator=g) * 2).to(torch.bfloat16)
    out, lse = _run(variant, q, cache, idx, splits)
    ref_out, ref_lse = _reference(variant, q, cache, idx)
    _assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


def test_split_count_does_not_change_result() -> None:
    cache = _make_cache("nvfp4", 4, 32, seed=3)
    idx = _make_indices(2, 128, 128, 0.9, seed=4)
    q = torch.randn(2, 16, 576).to(torch.bfloat16)
    outs = [_run("nvfp4", q, cache, idx, s)[0] for s in (1, 4)]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("variant", ["nvfp4", "fp8", "nvfp4_staged"])
def test_empty_slots_never_read(variant: str) -> None:
    """Row 0 holds NaN scales and huge values; -1 slots must not pull it in."""
    fmt = "fp8" if variant == "fp8" else "nvfp4"
    cache = _make_cache(fmt, 2, 16, seed=9)
    poisoned = cache.clone()
    if fmt == "nvfp4":
        poisoned[0, 0, :] = 0x77  # E2M1 6.0 everywhere, e4m3 rope 0x77 = 240
        poisoned[0, 0, 320:352] = 0x7F  # NaN scales
    else:
        poisoned[0, 0, :512] = 0x7E  # 448 everywhere
        poisoned[0, 0, 512:528] = torch.tensor([float("nan")] * 4).view(torch.uint8)
        poisoned[0, 0, 528:] = 0x7F  # bf16 0x7F7F ~ 3.4e38
    idx = torch.tensor(
        [
            [-1, 5, -1, 7, -1, -1, 9, -1, 31, -1, -1, -1],
            [-1] * 12,  # no valid slot at all: output 0, lse -inf
            [3, -1, 4, 5, 6, 7, 8, 9, 10, 11, 12, -1],
        ],
        dtype=torch.int32,
    )
    q = torch.randn(3, 16, 576).to(torch.bfloat16)
    out, lse = _run(variant, q, poisoned, idx, 2)
    ref_out, _ = _reference(variant, q, cache, idx)  # clean cache: row 0 never matters
    _assert_close(out, ref_out)
    assert bool((out[1] == 0).all())
    assert bool(torch.isneginf(lse[1]).all())
    assert bool(torch.isfinite(lse[0]).all()) and bool(torch.isfinite(lse[2]).all())


def test_row_zero_is_used_when_selected() -> None:
    """Control for the test above: selecting row 0 explicitly does change the output."""
    cache = _make_cache("nvfp4", 2, 16, seed=9)
    q = torch.randn(1, 16, 576).to(torch.bfloat16)
    a, _ = _run("nvfp4", q, cache, torch.tensor([[0, 5, 7, -1]], dtype=torch.int32), 1)
    b, _ = _run("nvfp4", q, cache, torch.tensor([[-1, 5, 7, -1]], dtype=torch.int32), 1)
    assert not torch.allclose(a, b)
    ref_a = reference.sparse_mla_decode_ref(q, cache, torch.tensor([[0, 5, 7, -1]]), SM_SCALE, "nvfp4")
    assert isinstance(ref_a, torch.Tensor)
    _assert_close(a, ref_a)


def test_out_of_range_indices_are_skipped() -> None:
    cache = _make_cache("fp8", 2, 8, seed=2)
    idx = torch.tensor([[1, 16, 2, 1000, 3, -1, 15, -7]], dtype=torch.int32)
    q = torch.randn(1, 16, 576).to(torch.bfloat16)
    out, _ = _run("fp8", q, cache, idx, 1)
    ref_out, _ = _reference("fp8", q, cache, torch.tensor([[1, -1, 2, -1, 3, -1, 15, -1]]))
    _assert_close(out, ref_out)


def test_paged_cache_with_padded_block_stride() -> None:
    """Blocks need not be packed back to back (block stride > block_size * row_bytes)."""
    dense = _make_cache("nvfp4", 4, 8, seed=5)
    padded = torch.zeros(4, 9, 352, dtype=torch.uint8)
    padded[:, :8] = dense
    padded[:, 8] = 0x7F  # garbage in the padding row
    view = padded[:, :8]
    assert view.stride(0) == 9 * 352
    idx = _make_indices(2, 24, 32, 0.8, seed=6)
    q = torch.randn(2, 16, 576).to(torch.bfloat16)
    out, _ = _run("nvfp4", q, view, idx, 2)
    ref_out, _ = _reference("nvfp4", q, dense, idx)
    _assert_close(out, ref_out)


def test_stage_buffer_bit_exact() -> None:
    cache = _make_cache("nvfp4", 2, 16, seed=12)
    idx = torch.tensor([[3, -1, 17], [31, 0, -1]], dtype=torch.int32)
    stage, new_idx = decode.stage_nvfp4_to_fp8(cache.to(DEVICE), idx.to(DEVICE))
    stage, new_idx = stage.cpu(), new_idx.cpu()
    assert new_idx.tolist() == [[0, -1, 2], [3, 4, -1]]
    want = reference.restage_nvfp4_to_fp8_ref(cache.view(-1, 352))
    flat = idx.view(-1)
    for slot, row in enumerate(flat.tolist()):
        if row >= 0:
            assert torch.equal(stage[0, slot], want[row])


def test_bad_shapes_raise() -> None:
    cache = _make_cache("nvfp4", 1, 16, seed=1)
    q = torch.randn(1, 16, 512)
    with pytest.raises(ValueError):
        decode.decode_nvfp4_native(q, cache, torch.zeros(1, 4, dtype=torch.int32), SM_SCALE)
    with pytest.raises(ValueError):
        decode.decode_fp8(torch.randn(1, 16, 576), cache, torch.zeros(1, 4, dtype=torch.int32), SM_SCALE)
    with pytest.raises(ValueError):
        decode.sparse_mla_decode(torch.randn(1, 16, 576), cache, torch.zeros(1, 4, dtype=torch.int32), variant="int4")


@pytest.mark.parametrize(
    "tuning",
    [
        decode.DecodeTuning(block_n=16, num_warps=4, skip_empty_tiles=True),
        decode.DecodeTuning(block_n=64, num_warps=8, num_stages=2, compact=False),
        decode.DecodeTuning(block_n=32, num_warps=8, prefetch=False, max_registers=128),
    ],
    ids=["n16-compact-skip", "n64-nocompact", "n32-noprefetch-r128"],
)
@pytest.mark.parametrize("variant", ["nvfp4", "fp8"])
def test_tuning_changes_speed_not_result(variant: str, tuning: decode.DecodeTuning) -> None:
    """Every tuning the benchmark may pick computes the same function (low fill: whole tiles are empty)."""
    fmt = "fp8" if variant == "fp8" else "nvfp4"
    cache = _make_cache(fmt, 8, 16, seed=21)
    idx = _make_indices(2, 128, 128, 0.2, seed=22)
    idx[0, :64] = -1  # the first tiles of token 0 hold no valid slot at all
    q = (torch.randn(2, 16, 576, generator=torch.Generator().manual_seed(23)) * 2).to(torch.bfloat16)
    got = decode.sparse_mla_decode(q.to(DEVICE), cache.to(DEVICE), idx.to(DEVICE), SM_SCALE, variant=variant, num_splits=2, tuning=tuning)
    assert isinstance(got, torch.Tensor)
    ref_out, _ = _reference(variant, q, cache, idx)
    _assert_close(got.cpu(), ref_out)

"""Layout constants and helpers (pure Python, no torch needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import primectl_kernels
from primectl_kernels import layout


def test_row_sizes() -> None:
    assert primectl_kernels.FP8_DS_MLA_ROW_BYTES == 656
    assert primectl_kernels.NVFP4_DS_MLA_ROW_BYTES == 352
    assert primectl_kernels.FP8_MLA_TOKEN_BYTES == 576
    assert primectl_kernels.NVFP4_MLA_TOKEN_BYTES == 352
    assert primectl_kernels.BF16_MLA_TOKEN_BYTES == 1152
    # fp8_ds_mla areas tile the row
    assert layout.FP8_LATENT_BYTES + layout.FP8_SCALE_BYTES + layout.FP8_ROPE_BYTES == 656
    assert layout.FP8_SCALE_OFFSET == 512 and layout.FP8_ROPE_OFFSET == 528
    # nvfp4_ds_mla areas tile the row
    assert layout.NVFP4_LATENT_BYTES + layout.NVFP4_ROPE_BYTES + layout.NVFP4_SCALE_BYTES == 352
    assert layout.NVFP4_ROPE_OFFSET == 256 and layout.NVFP4_SCALE_OFFSET == 320


def test_mla_row_bytes() -> None:
    assert primectl_kernels.mla_row_bytes("fp8") == 576
    assert primectl_kernels.mla_row_bytes("nvfp4") == 352
    assert primectl_kernels.mla_row_bytes("bf16") == 1152
    assert primectl_kernels.mla_row_bytes("fp8", 256, 32) == 288
    assert primectl_kernels.mla_row_bytes("bf16", 256, 32) == 576
    assert primectl_kernels.mla_row_bytes("nvfp4", 512, 64) == 352
    # facts.md: MLA rows only, 78 layers
    assert 78 * primectl_kernels.mla_row_bytes("fp8") == 44_928
    assert 78 * primectl_kernels.mla_row_bytes("nvfp4") == 27_456


@pytest.mark.parametrize("rank,rope", [(256, 64), (512, 32), (1024, 64)])
def test_mla_row_bytes_nvfp4_needs_512_64(rank: int, rope: int) -> None:
    with pytest.raises(ValueError):
        primectl_kernels.mla_row_bytes("nvfp4", rank, rope)


def test_mla_row_bytes_bad_dtype() -> None:
    with pytest.raises(ValueError):
        primectl_kernels.mla_row_bytes("int4")
    with pytest.raises(ValueError):
        primectl_kernels.mla_row_bytes("fp8", 0, 64)


def test_storage_row_bytes() -> None:
    assert primectl_kernels.mla_storage_row_bytes("fp8") == 656
    assert primectl_kernels.mla_storage_row_bytes("nvfp4") == 352
    assert primectl_kernels.mla_storage_row_bytes("bf16") == 1152
    with pytest.raises(ValueError):
        primectl_kernels.mla_storage_row_bytes("fp8", 256, 64)
    assert primectl_kernels.decode_read_bytes("nvfp4", 2048) == 2048 * 352


def test_nvfp4_scale_offset() -> None:
    assert primectl_kernels.nvfp4_scale_offset(0) == 320
    assert primectl_kernels.nvfp4_scale_offset(1) == 328
    assert primectl_kernels.nvfp4_scale_offset(2) == 336
    assert primectl_kernels.nvfp4_scale_offset(3) == 344
    assert primectl_kernels.nvfp4_scale_offset(4) == 321
    assert primectl_kernels.nvfp4_scale_offset(5) == 329
    assert primectl_kernels.nvfp4_scale_offset(31) == 351
    offs = [primectl_kernels.nvfp4_scale_offset(s) for s in range(32)]
    assert sorted(offs) == list(range(320, 352))
    for s in range(32):
        assert primectl_kernels.nvfp4_scale_block(primectl_kernels.nvfp4_scale_offset(s)) == s
    with pytest.raises(ValueError):
        primectl_kernels.nvfp4_scale_offset(32)
    with pytest.raises(ValueError):
        primectl_kernels.nvfp4_scale_block(319)


def test_import_is_dependency_free() -> None:
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; import primectl_kernels, primectl_kernels.layout; "
        "bad = [m for m in ('torch', 'triton', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)

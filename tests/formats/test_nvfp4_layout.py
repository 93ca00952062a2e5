"""The NVFP4 execution layout on the host: builder, inverse, code and scale positions, row sums."""

from __future__ import annotations

import numpy as np
import pytest

from q2gemv.formats import nvfp4_layout as lay
from q2gemv.formats.nvfp4 import Nvfp4Weight
from q2gemv.reference import exact as rex

# n: one row, one past a tile, two tiles and one; k: partial last steps and whole ones
SHAPES = [(1, 16), (17, 48), (33, 80), (17, 144), (1, 64), (33, 192), (16, 64), (5, 144)]


def _weight(rng, n, k, nan_at=()):
    """A random weight: every code, scale bytes of every kind (NaN ones only at ``nan_at``)."""
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 256, (n, k // 16), dtype=np.uint8)
    scales[(scales & 0x7F) == 0x7F] = 0x3F  # no NaN unless asked
    for r, j in nan_at:
        scales[r, j] = 0x7F if (r + j) % 2 else 0xFF
    return Nvfp4Weight(packed, scales, 1.0)


def _want_scale_units(s):
    mant, exp, isnan = rex.e4m3_scale_parts(s)
    return np.where(isnan, 0, mant * 2.0 ** (exp + 9)).astype(np.int64)  # mant << (max(e,1)-1)


def test_scale_units_every_byte():
    b = np.arange(256)
    assert lay.scale_units(b).dtype == np.int64
    np.testing.assert_array_equal(lay.scale_units(b), _want_scale_units(b))
    assert lay.scale_units(np.array([0x7F, 0xFF, 0x7E, 0xFE, 0x01, 0x80])).tolist() == [
        0,
        0,
        14 << 14,
        -(14 << 14),
        1,
        0,
    ]


def test_constants_and_sizes():
    from q2gemv.dispatch import registry as kernels

    assert lay.TILE_ROWS == kernels.get("w4a16_gemv_exact").rows_per_cta == 16
    assert (lay.STEP, lay.BLOCKS_PER_STEP, lay.LANES) == (64, 4, 32)
    assert (lay.tiles(17), lay.steps(80), lay.steps(64)) == (2, 2, 1)
    assert lay.code_words(17, 80) == 2 * 2 * 128
    assert lay.scale_bytes(17, 80) == 2 * 2 * 64
    assert lay.zsum_entries(17) == 32


@pytest.mark.parametrize("n,k", SHAPES)
def test_host_layout_round_trip_and_positions(n, k):
    rng = np.random.default_rng(n * 1000 + k)
    w = _weight(rng, n, k)
    codes, xscales, zsum = lay.to_exec_layout(w.packed, w.scales, n, k)
    assert codes.dtype == np.uint32 and codes.shape == (lay.code_words(n, k),)
    assert xscales.dtype == np.uint8 and xscales.shape == (lay.scale_bytes(n, k),)
    assert zsum.dtype == np.int64 and zsum.shape == (lay.zsum_entries(n),)
    packed, scales = lay.from_exec_layout(codes, xscales, n, k)
    assert packed.dtype == np.uint8 and scales.dtype == np.uint8
    np.testing.assert_array_equal(packed, w.packed)
    np.testing.assert_array_equal(scales, w.scales)

    # every code where the module docstring says it is: word ((tile*steps+step)*32+lane)*4+b
    ns = lay.steps(k)
    r, j = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    tile, g, h = r // 16, r % 8, (r % 16) // 8
    step, b, t, i = j // 64, (j % 64) // 16, (j % 16) // 4, j % 4
    word_at = ((tile * ns + step) * 32 + 4 * g + t) * 4 + b
    word = codes[word_at]
    np.testing.assert_array_equal((word >> (16 * h + 4 * i)) & 0xF, w.codes())
    # padding (rows past n, elements past k) holds code 0: no bit outside the real codes' nibbles
    real = np.zeros(codes.size, np.uint32)
    np.bitwise_or.at(real, word_at, (np.uint32(0xF) << (16 * h + 4 * i)).astype(np.uint32))
    assert not (codes & ~real).any()

    # xscales: byte ((tile*steps+step)*8+g)*8 + 4h + b holds row 16 tile+g+8h, block 4 step+b
    r, q = np.meshgrid(np.arange(n), np.arange(k // 16), indexing="ij")
    idx = (((r // 16) * ns + q // 4) * 8 + r % 8) * 8 + 4 * ((r % 16) // 8) + q % 4
    np.testing.assert_array_equal(xscales[idx], w.scales)
    pad = np.ones(xscales.size, bool)
    pad[idx] = False
    assert not xscales[pad].any()


@pytest.mark.parametrize("n,k", [(17, 144), (33, 80), (1, 16)])
def test_zsum_is_each_rows_weight_sum(n, k):
    rng = np.random.default_rng(k + n)
    w = _weight(rng, n, k, nan_at=[(0, 0), (n - 1, k // 16 - 1)])
    *_, zsum = lay.to_exec_layout(w.packed, w.scales, n, k)
    twice = rex.E2M1_TWICE[w.codes()].reshape(n, k // 16, 16).sum(axis=2)
    want = (twice * _want_scale_units(w.scales)).sum(axis=1)
    nan_rows = np.isnan(w.scale_values()).any(axis=1)
    assert nan_rows[0] and nan_rows[n - 1]
    np.testing.assert_array_equal(zsum[:n][~nan_rows], want[~nan_rows])
    assert (zsum[:n][nan_rows] == lay.ZSUM_NAN).all()  # the kernel's NaN-row mark
    assert not zsum[n:].any()
    # the sum of the dequantized weights, in units of 2**-10 (rows without a NaN scale)
    deq = w.dequantize()[~nan_rows].astype(np.float64)
    np.testing.assert_array_equal(deq.sum(axis=1) * 2.0**10, want[~nan_rows].astype(np.float64))


def test_zsum_extremes_are_exact():
    n, k = 2, 4096  # every code 7 (6.0) at scale 448: the largest row sum, exact in int64
    packed = np.full((n, k // 2), 0x77, np.uint8)
    packed[1] = 0xFF  # -6.0
    scales = np.full((n, k // 16), 0x7E, np.uint8)
    *_, zsum = lay.to_exec_layout(packed, scales, n, k)
    assert zsum[:2].tolist() == [12 * (14 << 14) * k, -12 * (14 << 14) * k]


def test_refusals_name_the_argument():
    w = _weight(np.random.default_rng(1), 2, 32)
    codes, xscales, _ = lay.to_exec_layout(w.packed, w.scales, 2, 32)
    with pytest.raises(ValueError, match="codes: expected 128 uint32 words, got 127"):
        lay.from_exec_layout(codes[:-1], xscales, 2, 32)
    with pytest.raises(ValueError, match="xscales: expected 64 uint8 bytes, got 63"):
        lay.from_exec_layout(codes, xscales[:-1], 2, 32)
    with pytest.raises(TypeError, match="codes: expected dtype uint32"):
        lay.from_exec_layout(codes.astype(np.int64), xscales, 2, 32)
    with pytest.raises(TypeError, match="xscales: expected dtype uint8"):
        lay.from_exec_layout(codes, xscales.astype(np.int8), 2, 32)
    with pytest.raises(ValueError, match=r"packed: expected shape \(3, 16\)"):
        lay.to_exec_layout(w.packed, w.scales, 3, 32)
    with pytest.raises(ValueError, match=r"scales: expected shape \(2, 2\)"):
        lay.to_exec_layout(w.packed, w.scales[:, :1], 2, 32)
    with pytest.raises(TypeError, match="packed: expected dtype uint8"):
        lay.to_exec_layout(w.packed.astype(np.int16), w.scales, 2, 32)
    with pytest.raises(ValueError, match="k: expected a multiple of 16"):
        lay.from_exec_layout(codes, xscales, 2, 24)
    with pytest.raises(ValueError, match="n: expected >= 1"):
        lay.from_exec_layout(codes, xscales, 0, 32)
    with pytest.raises(TypeError, match="n: expected an int"):
        lay.to_exec_layout(w.packed, w.scales, 2.0, 32)

"""Host-side numerics: bf16 rounding, the exact fma emulation, the warp butterfly."""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from q2gemv.formats.bf16 import BF16_NAN, bf16_bits_to_f32, f32_to_bf16_bits
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference.fpmath import fma_f32, warp_tree_sum_f32


def test_bf16_rounding_matches_ml_dtypes_on_random_and_special_values():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    specials = np.array(
        [
            0,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x00000001,
            0x807FFFFF,
            0x7F7FFFFF,
            0x3F808000,
            0x3F818000,
            0x3F808001,
            0x7F7F8000,
            0x00008000,
            0x00018000,
        ],
        np.uint32,
    )
    x = np.concatenate([bits, specials]).view(np.float32)
    finite = ~np.isnan(x)
    want = x[finite].astype(ml_dtypes.bfloat16).view(np.uint16)
    assert_bits_equal(f32_to_bf16_bits(x[finite]), want, "f32->bf16 RNE")


def test_bf16_ties_to_even_and_nan_canonical():
    x = np.array([0x3F808000, 0x3F818000], np.uint32).view(np.float32)  # two ties
    assert f32_to_bf16_bits(x).tolist() == [0x3F80, 0x3F82]
    nans = np.array([0x7FC00000, 0xFFC00001, 0x7F800001], np.uint32).view(np.float32)
    assert f32_to_bf16_bits(nans).tolist() == [BF16_NAN] * 3
    assert f32_to_bf16_bits(np.float32(3.4e38)).item() == 0x7F80  # past bf16 max -> Inf


def test_bf16_widening_is_exact():
    h = np.arange(0, 2**16, dtype=np.uint32).astype(np.uint16)
    assert_bits_equal(bf16_bits_to_f32(h).view(np.uint32) >> 16, h.astype(np.uint32))


def _round_f32(q: Fraction) -> np.float32:
    """Correctly rounded fp32 of an exact rational (nearest, ties to even)."""
    c = np.float32(float(q))  # within one fp32 ulp of the answer
    cands = [np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))]
    finite = [x for x in cands if np.isfinite(x)]
    best = min(finite, key=lambda x: (abs(Fraction(float(x)) - q), int(x.view(np.uint32)) & 1))
    return best


def test_fma_emulation_is_single_rounding_for_small_factor_products():
    rng = np.random.default_rng(2)
    n = 3000
    cm1 = rng.integers(-1, 3, n).astype(np.float32)
    e2m1 = rng.choice(np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -6], np.float32), n)
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 37, n)).astype(np.float32)
    a = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    z = (rng.standard_normal(n) * 10.0 ** rng.integers(-40, 37, n)).astype(np.float32)
    z[::3] = -(cm1[::3] * a[::3])  # exact cancellations
    z[1::3] = (a[1::3] * np.float32(2.0**-23)).astype(np.float32)  # near-tie territory
    for f in (cm1, e2m1):
        got = fma_f32(f, a, z)
        for i in range(n):
            exact = Fraction(float(f[i])) * Fraction(float(a[i])) + Fraction(float(z[i]))
            want = _round_f32(exact)
            assert got[i].view(np.uint32) == want.view(np.uint32) or (got[i] == 0 == want), (
                f"fma({f[i]}, {a[i]}, {z[i]}): got {got[i]!r} want {want!r}"
            )


def test_fma_emulation_avoids_intermediate_overflow():
    big = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert fma_f32(np.float32(2), big, -big) == big  # 2*big overflows fp32 alone


def test_warp_tree_sum_order():
    v = np.zeros(32, np.float32)
    v[0], v[16], v[1] = 1e8, -1e8, 1.0
    # first level pairs lane 0 with 16: (1e8 + -1e8) then + 1 -> 1 exactly
    assert warp_tree_sum_f32(v) == 1.0
    v = np.zeros(32, np.float32)
    v[0], v[1], v[16] = 1e8, 1.0, -1e8
    # lane 1 (1.0) meets lane 17 (0) first, then lane 0's 0 -> exact 1.0 too
    assert warp_tree_sum_f32(v) == 1.0
    v = np.zeros(32, np.float32)
    v[0], v[1], v[2] = 1e8, 1.0, -1e8
    # lanes 0 and 2 meet at offset 2; lane 1 waits until offset 1: (1e8 + -1e8) + 1
    assert warp_tree_sum_f32(v) == 1.0
    v[0], v[1], v[2] = 1e8, -1e8, 1.0
    # offset 2 pairs 0 with 2: fl(1e8 + 1) = 1e8; then + -1e8 = 0
    assert warp_tree_sum_f32(v) == 0.0
    with pytest.raises(ValueError, match="32"):
        warp_tree_sum_f32(np.zeros(16, np.float32))

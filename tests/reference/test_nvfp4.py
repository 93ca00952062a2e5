"""W4A16 reference: hand cases bit for bit, an independent scalar oracle, a float64 bound."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from q2gemv import reference as ref
from q2gemv.formats.bf16 import bits_to_bf16
from q2gemv.formats.nvfp4 import Nvfp4Weight, e2m1_decode, e4m3_decode
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference.nvfp4 import w4a16_gemv
from tests.edge_values import _acts as _edge_acts
from tests.edge_values import _w4_expected, _w4_weight

BF16 = ml_dtypes.bfloat16
U = 2.0**-24  # fp32 unit roundoff
BF16_MAX = 0x7F7F
ONE = 0x2  # E2M1 code of 1.0
S_ONE = 0x38  # E4M3 bits of 1.0


def _weight(values: dict, n: int, k: int, scales=S_ONE, g=1.0) -> Nvfp4Weight:
    """Weight with E2M1 codes {(row, k): code}, zero elsewhere; scales: one byte or an array."""
    codes = np.zeros((n, k), np.uint8)
    for (r, c), code in values.items():
        codes[r, c] = code
    s = np.broadcast_to(np.asarray(scales, np.uint8), (n, k // 16)).copy()
    return Nvfp4Weight.from_codes(codes, s, g)


def _acts(values: dict, m: int, k: int) -> np.ndarray:
    """bf16 activations [m, k]: {(row, k): float} (bf16-exact values), zero elsewhere."""
    a = np.zeros((m, k), np.float32)
    for (r, c), v in values.items():
        a[r, c] = v
    out = a.astype(BF16)
    assert np.array_equal(out.astype(np.float32), a, equal_nan=True), "not bf16-exact"
    return out


def _bits(y):
    return y.view(np.uint16)


def _want(*bits):
    return np.array(bits, np.uint16)


# -- hand cases, bit for bit -----------------------------------------------------------------------


def test_single_element():
    # 1.5 (code 3) * 3.0 * scale 2.0 (0x40) * g 0.5 = 4.5 -> bf16 0x4090; other column 0
    w = _weight({(1, 5): 0x3}, 2, 16, scales=0x40, g=0.5)
    y = w4a16_gemv(_acts({(0, 5): 3.0}, 1, 16), w)
    assert_bits_equal(_bits(y), _want([0x0000, 0x4090]))


def test_single_element_in_every_slot():
    # pins the nibble order and the group/lane map: only weight k meets activation k
    k = 64
    for pos in range(k):
        w = _weight({(0, pos): 0xC}, 1, k, scales=0x40)  # -2 * 2 = -4
        a = _acts({(0, j): 1.5 if j == pos else 100.0 for j in range(k)}, 1, k)
        assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0xC0C0]), f"slot {pos}")  # -6


def test_bf16_ties_round_to_even():
    w = _weight({(0, 0): ONE, (0, 1): ONE}, 1, 16)
    y = w4a16_gemv(
        _acts({(0, 0): 1.0, (0, 1): 2.0**-8, (1, 0): 1.0, (1, 1): 3 * 2.0**-8}, 2, 16), w
    )
    # 1 + 2^-8 -> 1.0 (0x3F80); 1 + 3*2^-8 -> 1 + 2^-6 (0x3F82)
    assert_bits_equal(_bits(y), _want([0x3F80], [0x3F82]))


def test_group_sum_runs_in_k_order():
    # 2^24, +1 (tie -> 2^24), +1 (tie -> 2^24), -2^24 -> +0; the exact sum is 2
    w = _weight({(0, i): ONE for i in range(4)}, 1, 16)
    a = _acts({(0, 0): 2.0**24, (0, 1): 1.0, (0, 2): 1.0, (0, 3): -(2.0**24)}, 1, 16)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x0000]))


def test_lane_accumulates_its_groups_in_order():
    # groups 0, 32, 64, 96 all belong to lane 0: 2^24, 1, 1, -2^24 -> +0
    k = 16 * 97
    w = _weight({(0, 16 * q): ONE for q in (0, 32, 64, 96)}, 1, k)
    a = _acts({(0, 0): 2.0**24, (0, 512): 1.0, (0, 1024): 1.0, (0, 1536): -(2.0**24)}, 1, k)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x0000]))


def test_warp_tree_order():
    # lanes 0, 8, 16, 24 hold 2^24, -2^24, 1, 1. Butterfly: (l0 + l16) = 2^24 (tie),
    # (l8 + l24) = -(2^24 - 1), then + -> 1.0. Lane order would give 2.
    k = 16 * 25
    lanes = {0: 2.0**24, 8: -(2.0**24), 16: 1.0, 24: 1.0}
    w = _weight({(0, 16 * q): ONE for q in lanes}, 1, k)
    a = _acts({(0, 16 * q): v for q, v in lanes.items()}, 1, k)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x3F80]))


def test_block_scale_is_multiplied_then_added():
    # lane 0: group 0 gives acc = -1.125; group 32 has s = 1 + 2^-23 and scale 1.125.
    # fmul_rn(s, 1.125) = 1.125 + 2^-23 (the 2^-26 is rounded off), + acc -> 2^-23 (0x3400).
    # A contracted fma would keep 2^-23 + 2^-26 (0x3410).
    k = 16 * 33
    scales = np.full((1, 33), S_ONE, np.uint8)
    scales[0, 32] = 0x39  # 1.125
    w = _weight({(0, 0): ONE, (0, 512): ONE, (0, 513): ONE}, 1, k, scales=scales)
    a = _acts({(0, 0): -1.125, (0, 512): 1.0, (0, 513): 2.0**-23}, 1, k)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x3400]))


def test_global_scale_applied_once_at_the_end():
    # lane 0 holds 3, lane 1 holds -(3 - 2^-22): total 2^-22, times g = fp32(1/3)
    # (0x3EAAAAAB) is exact: 0x33AAAAAB -> bf16 0x33AB. Scaling each lane first would
    # give fp32(3g) = 1.0 and -fp32((3 - 2^-22) g) = -(1 - 2^-24): 2^-24 (0x3380).
    w = _weight({(0, 0): ONE, (0, 16): ONE, (0, 17): ONE}, 1, 32, g=1.0 / 3.0)
    a = _acts({(0, 0): 3.0, (0, 16): -3.0, (0, 17): 2.0**-22}, 1, 32)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x33AB]))


def test_fma_keeps_an_overflowing_product_finite():
    # -bf16max * 1, then fma(2, bf16max, -bf16max) = bf16max exactly; mul-then-add gives Inf
    big = float(bits_to_bf16(np.uint16(BF16_MAX)))
    w = _weight({(0, 0): ONE, (0, 1): 0x4}, 1, 16)  # 1, 2
    a = _acts({(0, 0): -big, (0, 1): big}, 1, 16)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([BF16_MAX]))


def test_overflow_to_inf():
    big = float(bits_to_bf16(np.uint16(BF16_MAX)))
    w = _weight({(0, 0): 0x7, (1, 0): 0xF}, 2, 16, scales=0x7E)  # +-6, scale 448
    assert_bits_equal(_bits(w4a16_gemv(_acts({(0, 0): big}, 1, 16), w)), _want([0x7F80, 0xFF80]))


def test_subnormal_activation_products():
    # 1.5 * 2^-133 (bf16 0x0001) = 3 * 2^-134: an exact fp32 subnormal; * 448 * 2^60
    # = 1344 * 2^-74 = 1.3125 * 2^-64 -> bf16 0x1FA8
    w = _weight({(0, 0): 0x3}, 1, 16, scales=0x7E, g=2.0**60)
    a = bits_to_bf16(np.zeros((1, 16), np.uint16))
    a = a.copy()
    a.view(np.uint16)[0, 0] = 0x0001
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x1FA8]))


def test_tiny_negative_rounds_to_negative_zero():
    # -2^-133 * 0.5 * 2^-9 = -2^-143 (fp32 subnormal) -> bf16 -0 (0x8000)
    w = _weight({(0, 0): 0x1}, 1, 16, scales=0x01)
    a = bits_to_bf16(np.zeros((1, 16), np.uint16)).copy()
    a.view(np.uint16)[0, 0] = 0x8001
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x8000]))


def test_signed_zeros():
    w = _weight({(0, 0): 0x8}, 1, 16, g=-1.0)  # a -0 weight, negative g
    # all-zero sums are +0 (acc starts at +0); +0 * -1 = -0
    a = _acts({(0, 0): 1.0, (1, 0): -0.0}, 2, 16)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x8000], [0x8000]))
    w = _weight({(0, 0): 0x8}, 1, 16, g=1.0)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _want([0x0000], [0x0000]))


@pytest.mark.parametrize(
    "acts, codes, want",
    [
        ({(0, 3): np.nan}, {}, 0x7FC0),  # NaN * 0 weight
        ({(0, 3): np.inf}, {(0, 3): ONE}, 0x7F80),
        ({(0, 3): -np.inf}, {(0, 3): ONE}, 0xFF80),
        ({(0, 3): np.inf}, {}, 0x7FC0),  # Inf * 0
        ({(0, 3): np.inf, (0, 4): -np.inf}, {(0, 3): ONE, (0, 4): ONE}, 0x7FC0),
        ({(0, 3): np.inf, (0, 40): -np.inf}, {(0, 3): ONE, (0, 40): ONE}, 0x7FC0),  # two lanes
    ],
)
def test_nan_and_inf_activations(acts, codes, want):
    w = _weight(codes, 1, 64)
    assert_bits_equal(_bits(w4a16_gemv(_acts(acts, 1, 64), w)), _want([want]))


@pytest.mark.parametrize("nan_byte", [0x7F, 0xFF])
def test_nan_scale_poisons_the_column(nan_byte):
    scales = np.full((2, 2), S_ONE, np.uint8)
    scales[1, 1] = nan_byte  # even with all-zero weights: 0 * NaN
    w = _weight({(0, 0): ONE}, 2, 32, scales=scales)
    y = w4a16_gemv(_acts({(0, 0): 2.0}, 1, 32), w)
    assert_bits_equal(_bits(y), _want([0x4000, 0x7FC0]))


@pytest.mark.parametrize(
    "g, want", [(np.inf, [0x7F80, 0x7FC0]), (-np.inf, [0xFF80, 0x7FC0]), (np.nan, [0x7FC0] * 2)]
)
def test_non_finite_global_scale(g, want):
    w = _weight({(0, 0): ONE}, 2, 16, g=g)
    assert_bits_equal(_bits(w4a16_gemv(_acts({(0, 0): 1.0}, 1, 16), w)), _want(want))


# -- an independent scalar restatement of the contract ---------------------------------------------


def _scalar_oracle(a: np.ndarray, w: Nvfp4Weight) -> np.ndarray:
    """Plain loops over (m, n, lane, group, i), np.float32 scalars; finite, in-range data only.

    ``e * a`` is exact in fp32, so ``fma(e, a, s)`` is ``s + e * a`` with one
    rounding here. Output through ml_dtypes' own fp32 -> bf16 cast (RNE).
    """
    f32 = np.float32
    a32 = a.astype(np.float32)
    e = e2m1_decode(w.codes())
    sc = e4m3_decode(w.scales)
    groups = w.k // 16
    y = np.zeros((a.shape[0], w.n), np.float32)
    for m in range(a.shape[0]):
        for n in range(w.n):
            lanes = []
            for lane in range(32):
                acc = f32(0)
                for q in range(lane, groups, 32):
                    s = f32(0)
                    for i in range(16):
                        s = f32(s + f32(e[n, 16 * q + i] * a32[m, 16 * q + i]))
                    acc = f32(acc + f32(s * sc[n, q]))
                lanes.append(acc)
            for off in (16, 8, 4, 2, 1):
                lanes = [f32(lanes[lane] + lanes[lane ^ off]) for lane in range(32)]
            y[m, n] = f32(lanes[0] * f32(w.global_scale))
    return y.astype(BF16)


def _random_case(rng, m, n, k):
    x = rng.standard_normal((n, k)) * np.exp2(rng.integers(-8, 8, (n, k // 16)).repeat(16, axis=1))
    w = Nvfp4Weight.from_float(x.astype(np.float32))
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-4, 4, (m, k)))).astype(BF16)
    return a, w


@pytest.mark.parametrize("m, n, k", [(2, 3, 16 * 70), (1, 2, 16), (3, 2, 16 * 33)])
def test_matches_scalar_oracle(m, n, k):
    a, w = _random_case(np.random.default_rng(k + m), m, n, k)
    assert_bits_equal(_bits(w4a16_gemv(a, w)), _bits(_scalar_oracle(a, w)))


def test_rows_are_independent_and_1d_input():
    a, w = _random_case(np.random.default_rng(5), 5, 9, 16 * 40)
    y = w4a16_gemv(a, w)
    for r in range(5):
        assert_bits_equal(_bits(w4a16_gemv(a[r], w)), _bits(y[r]), f"row {r}")
    assert w4a16_gemv(a[:0], w).shape == (0, 9)


# -- float64 sanity bound --------------------------------------------------------------------------


def _gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


@pytest.mark.parametrize("m, n, k", [(3, 7, 528), (1, 64, 4096), (2, 33, 16 * 100)])
def test_within_derived_bound_of_float64(m, n, k):
    """|y - d| <= E + 2^-8 (|d| + E), where d is the float64 dot of ``dequantize()``.

    Derivation (u = 2^-24, no fp32 underflow in this data, gamma_L = L u / (1 - L u)):
    each exact term ``e * a * s * g`` passes through at most L = 16 (fma chain)
    + 1 (scale multiply) + J (lane accumulation, J = ceil(K/16/32) groups per
    lane) + 5 (butterfly) + 1 (global scale) roundings, so the fp32 result
    is within gamma_L * S' of the exact sum, S' = sum |e a s g|. ``dequantize()``
    rounds each weight once (relative u), and the float64 dot adds at most
    gamma_K(2^-53) * S with S = sum |w_f32 a| >= (1 - u) S'. Hence
    E = (gamma_L + u) S / (1 - u) + gamma_K(2^-53) S, and the final bf16
    rounding adds at most 2^-8 |y_f32| <= 2^-8 (|d| + E). The 1.001 factor
    absorbs the float64 rounding of the bound's own arithmetic.
    """
    rng = np.random.default_rng(n * k + m)
    a, w = _random_case(rng, m, n, k)
    y = w4a16_gemv(a, w).astype(np.float64)
    deq = w.dequantize().astype(np.float64)
    a64 = a.astype(np.float64)
    d = a64 @ deq.T
    s = np.abs(a64) @ np.abs(deq).T
    j = -(-(k // 16) // 32)
    e = (_gamma(16 + 1 + j + 5 + 1, U) + U) * s / (1 - U) + _gamma(k, 2.0**-53) * s
    bound = (e + 2.0**-8 * (np.abs(d) + e)) * 1.001
    err = np.abs(y - d)
    assert (err <= bound).all(), float((err / bound).max())
    assert err.max() > 0  # the data does exercise rounding


# -- bad calls -------------------------------------------------------------------------------------


def test_bad_calls_name_the_argument():
    w = _weight({}, 2, 32)
    with pytest.raises(TypeError, match="weight"):
        w4a16_gemv(np.zeros((1, 32), BF16), object())
    with pytest.raises(TypeError, match="a"):
        w4a16_gemv(np.zeros((1, 32), np.float32), w)
    with pytest.raises(TypeError, match="a"):
        w4a16_gemv([[0.0] * 32], w)
    with pytest.raises(ValueError, match="a: expected K=32"):
        w4a16_gemv(np.zeros((1, 16), BF16), w)
    with pytest.raises(ValueError, match="a"):
        w4a16_gemv(np.zeros((1, 1, 32), BF16), w)


def test_w4_reference_edge_table():
    w, a = _w4_weight(1.0), _edge_acts(16)
    assert_bits_equal(ref.w4a16_gemv(a, w).view(np.uint16), _w4_expected(), label="reference")

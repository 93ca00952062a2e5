"""The exact contract for fp16 activations: the NumPy reference against hand-derived values and
against a slow, independent definition in ``fractions.Fraction``.

The oracle rounds by searching the table of every finite fp16 value (built through NumPy's
own float16, exact in float64), so it shares no rounding code with the reference. Pure NumPy.
"""

from __future__ import annotations

import bisect
import functools
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from q2gemv import Nvfp4Weight, Q2Weight
from q2gemv.formats.act import BF16, FP16
from q2gemv.formats.nvfp4 import E2M1_VALUES
from q2gemv.reference import exact as rex

from ..exact_oracles import fixed_point, floor_log2

NAN, INF, NEG_INF = 0x7E00, 0x7C00, 0xFC00
F16 = np.float16


# -- an independent oracle --------------------------------------------------------------------


@functools.cache
def _fp16_table() -> tuple[list[Fraction], list[int]]:
    """Every finite non-negative fp16 value, ascending, and its bits."""
    h = np.arange(0x7C00, dtype=np.uint16)
    return [Fraction(float(x)) for x in h.view(F16)], [int(x) for x in h]


def _value(h: int) -> Fraction:
    return Fraction(float(np.array([h], np.uint16).view(F16)[0]))


def oracle_nearest(x: Fraction) -> int:
    """fp16 bits nearest to ``x`` by search: ties to the even pattern, +0 for 0, the sign kept
    when a nonzero value rounds to 0, +-Inf from the midpoint of 65504 and 65536 on."""
    if x == 0:
        return 0
    sign = 0x8000 if x < 0 else 0
    u = abs(x)
    vals, bits = _fp16_table()
    if u >= Fraction(65520):  # 65504 + half its ulp (32): a tie goes to the even 2**16 = Inf
        return sign | INF
    i = bisect.bisect_left(vals, u)
    if i < len(vals) and vals[i] == u:
        return sign | bits[i]
    lo, hi = i - 1, i
    d_lo, d_hi = u - vals[lo], vals[hi] - u
    pick = lo if d_lo < d_hi or (d_lo == d_hi and bits[lo] % 2 == 0) else hi
    return sign | bits[pick]


def oracle_fixed_point(row) -> tuple[list[int], int | None, bool]:
    """Step 2 by the definition (:func:`tests.exact_oracles.fixed_point`) for this format."""
    return fixed_point(row, INF, _value)


def oracle_gemv(a_bits: np.ndarray, w_vals: list[list[Fraction | None]]) -> np.ndarray:
    """The contract element by element: ``w_vals[n][k]`` exact weights (None: a NaN scale)."""
    out = np.zeros((a_bits.shape[0], len(w_vals)), np.uint16)
    for i, row in enumerate(a_bits):
        A, E, special = oracle_fixed_point(row)
        for n, wrow in enumerate(w_vals):
            if special or any(v is None for v in wrow):
                out[i, n] = NAN
                continue
            total = sum((v * a for v, a in zip(wrow, A, strict=True)), Fraction(0))
            if E is not None:
                total *= Fraction(2) ** (E - 22)
            out[i, n] = oracle_nearest(total)
    return out


def q2_values(w: Q2Weight) -> list[list[Fraction | None]]:
    codes, scales = w.codes().astype(np.int64) - 1, w.scales()
    rows = []
    for n in range(w.n):
        row = []
        for k in range(w.k):
            d = scales[n, k // w.group]
            row.append(None if not np.isfinite(d) else int(codes[n, k]) * Fraction(float(d)))
        rows.append(row)
    return rows


def nvfp4_values(w: Nvfp4Weight) -> list[list[Fraction | None]]:
    codes, g = w.codes(), Fraction(float(np.float32(w.global_scale)))
    s = w.scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    rows = []
    for n in range(w.n):
        row = []
        for k in range(w.k):
            sb = s[n, k // 16]
            if not np.isfinite(sb):
                row.append(None)
                continue
            row.append(Fraction(float(E2M1_VALUES[codes[n, k]])) * Fraction(float(sb)) * g)
        rows.append(row)
    return rows


# -- hand-derived cases ---------------------------------------------------------------------


def _f16(*xs) -> np.ndarray:
    return np.array(xs, F16)


def _q2(codes_row, scale: float, k: int = 64) -> Q2Weight:
    codes = np.ones((1, k), np.uint8)  # code 1: weight 0
    codes[0, : len(codes_row)] = codes_row
    return Q2Weight.from_codes(codes, np.full((1, k // 64), scale, F16), group=64)


def _y(a_vals, codes_row, scale=1.0) -> int:
    a = np.zeros((1, 64), F16)
    a[0, : len(a_vals)] = a_vals
    return int(rex.q2_0_gemv_exact(a, _q2(codes_row, scale)).view(np.uint16)[0, 0])


@pytest.mark.parametrize(
    "a_vals, codes, scale, want",
    [
        ([1.0, 2.0**-11], [2, 2], 1.0, 0x3C00),  # 1 + 2**-11: a tie, to the even 1.0
        ([1.0 + 2.0**-10, 2.0**-11], [2, 2], 1.0, 0x3C02),  # a tie, to the even 1 + 2**-9
        ([1.0, 2.0**-11, 2.0**-20], [2, 2, 2], 1.0, 0x3C01),  # just past the tie: up
        ([1.0, 2.0**-24], [2, 2], 1.0, 0x3C00),  # 2**-24 is below the row's fixed point: 0
        ([65504.0, 65504.0], [2, 2], 1.0, INF),  # overflow
        ([65504.0, 65504.0], [0, 0], 1.0, NEG_INF),
        ([65504.0, 16.0], [2, 2], 1.0, INF),  # 65520: the tie past the largest goes to Inf
        ([65504.0, 8.0], [2, 2], 1.0, 0x7BFF),  # 65512: below the tie, 65504
        ([65504.0, 16.0], [0, 0], 1.0, NEG_INF),
        ([2.0**-24], [0], 0.25, 0x8000),  # -2**-26 rounds to zero: -0
        ([2.0**-24], [2], 0.5, 0x0000),  # 2**-25: a tie between 0 and 2**-24, to +0
        ([2.0**-24], [0], 0.5, 0x8000),  # -2**-25: -0
        ([3 * 2.0**-24], [2], 0.25, 0x0001),  # 3 * 2**-26 rounds up to the subnormal step
        ([2.0**-20], [2], 1.0, 0x0010),  # a subnormal result: 2**-20 = 16 * 2**-24
        ([1.0, 1.0], [2, 0], 1.0, 0x0000),  # an exact zero: +0
        ([-1.0, 1.0], [2, 0], 1.0, 0xC000),  # -2
        ([3.0], [3], 2.0**-24, 0x0006),  # code 3 (+2), a subnormal scale: 6 * 2**-24
    ],
)
def test_q2_fp16_hand_cases(a_vals, codes, scale, want):
    assert _y(a_vals, codes, scale) == want


def test_q2_fp16_special_rows_and_columns():
    """A NaN or +-Inf activation: the row is NaN (0x7E00); a NaN/Inf scale: the column is NaN."""
    a = np.ones((4, 64), F16)
    a[1, 3] = np.nan
    a[2, 63] = np.inf
    a[3, 0] = -np.inf
    codes = np.full((2, 64), 2, np.uint8)
    scales = np.array([[1.0], [np.inf]], F16)
    y = rex.q2_0_gemv_exact(a, Q2Weight.from_codes(codes, scales, group=64))
    assert y.dtype == F16
    assert y.view(np.uint16).tolist() == [[0x5400, NAN], [NAN, NAN], [NAN, NAN], [NAN, NAN]]


def test_fixed_point_fp16_edges():
    rows = np.array(
        [
            [0x7BFF, 0x0001, 0xFBFF, 0x0000],  # 65504 (E = 15): A = 2047 * 2**12; 2**-24 -> 0
            [0x0001, 0x0000, 0x8000, 0x0000],  # a lone 2**-24: E = -24, A = 2**22
            [0x03FF, 0x8200, 0x0001, 0x0000],  # subnormals only: E = -15
            [0x8000, 0x8000, 0x0000, 0x0000],  # zeros: E = 0, A = 0
            [0x3C00, 0x7E00, 0x0000, 0x0000],  # NaN: special
        ],
        np.uint16,
    )
    A, E, special = rex.fixed_point(rows, FP16)
    assert A[0].tolist() == [2047 << 12, 0, -(2047 << 12), 0] and E[0] == 15
    assert A[1].tolist() == [2**22, 0, 0, 0] and E[1] == -24
    assert A[2].tolist() == [1023 << 13, -(512 << 13), 1 << 13, 0] and E[2] == -15
    assert A[3].tolist() == [0] * 4 and E[3] == 0
    assert special.tolist() == [False] * 4 + [True] and (A[4] == 0).all()
    assert (2047 << 12) == 2**23 - 2**12  # the widest fp16 A, below 2**23


def test_nearest_bits_fp16_every_pattern_is_a_fixed_point():
    """Each finite fp16 ``v`` as ``mant * 2**exp`` rounds to itself (the exponent field, the
    subnormals, the carry at the top of a binade), and the neighbours' midpoints by the oracle."""
    h = np.arange(0x7C00, dtype=np.uint32).astype(np.uint16)
    mant, exp, _ = rex.fp16_scale_parts(h)  # the exact value of each fp16 pattern
    got = [rex.nearest_bits(int(m), int(e), FP16) for m, e in zip(mant, exp, strict=True)]
    assert got == h.tolist()
    rng = np.random.default_rng(5)
    for i in rng.integers(1, 0x7BFF, 300):  # the midpoint of i and i + 1: even wins
        lo, hi = _value(int(i)), _value(int(i) + 1)
        mid = (lo + hi) / 2
        v, p = mid.numerator, -(mid.denominator.bit_length() - 1)
        assert rex.nearest_bits(v, p, FP16) == oracle_nearest(mid) == (i if i % 2 == 0 else i + 1)


def test_bf16_nearest_is_nearest_bits_of_bf16():
    for v, p in [(1, -133), (3, -134), (255, 120), (511, 119), (-1, 0), (0, 5)]:
        assert rex.bf16_nearest(v, p) == rex.nearest_bits(v, p, BF16) == rex.nearest_bits(v, p)


def test_fp16_error_bound_holds():
    """The docstring's bound, exactly: ``|y - x.w| <= 2**(E - 23) * sum|w| + half an ulp of y``,
    rows with outliers (small elements lose bits in the fixed point)."""
    rng = np.random.default_rng(8)
    a = (rng.standard_normal((6, 128)) * 2.0 ** rng.integers(-16, 4, (6, 128))).astype(F16)
    a[:, :2] = 3000.0
    codes = rng.integers(0, 4, (3, 128), dtype=np.uint8)
    w = Q2Weight.from_codes(codes, np.array([[0.5, -0.25]] * 3, F16), group=64)
    y = rex.q2_0_gemv_exact(a, w).view(np.uint16)
    wv = q2_values(w)
    for i in range(6):
        e = max(floor_log2(abs(_value(int(h)))) for h in a[i].view(np.uint16) if h & 0x7FFF)
        for n in range(3):
            exact = sum(
                v * _value(int(h)) for v, h in zip(wv[n], a[i].view(np.uint16), strict=True)
            )
            got = _value(int(y[i, n]))
            mag = abs(got) if got != 0 else Fraction(2) ** -24
            ulp = max(Fraction(2) ** (floor_log2(mag) - 10), Fraction(2) ** -24)
            bound = Fraction(2) ** (e - 23) * sum(abs(v) for v in wv[n]) + ulp / 2
            assert abs(got - exact) <= bound, (i, n)


# -- hypothesis against the oracle ------------------------------------------------------------

_finite_fp16 = st.integers(0, 0xFFFF).filter(lambda h: (h & 0x7C00) != 0x7C00)
_any_fp16 = st.one_of(
    _finite_fp16,
    st.sampled_from([0x7C00, 0xFC00, 0x7E00, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x8000]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=st.lists(st.lists(_any_fp16, min_size=64, max_size=64), min_size=1, max_size=3),
    codes=st.lists(st.integers(0, 3), min_size=128, max_size=128),
    scales=st.lists(st.integers(0, 0xFFFF), min_size=2, max_size=2),
)
def test_q2_fp16_reference_matches_the_oracle(a, codes, scales):
    """Random fp16 rows (specials included) times a 2 x 64 Q2_0 g64 weight of any fp16 scales."""
    a_bits = np.array(a, np.uint16)
    w = Q2Weight.from_codes(
        np.array(codes, np.uint8).reshape(2, 64),
        np.array(scales, np.uint16).reshape(2, 1).view(F16),
        group=64,
    )
    got = rex.q2_0_gemv_exact(a_bits.view(F16), w).view(np.uint16)
    np.testing.assert_array_equal(got, oracle_gemv(a_bits, q2_values(w)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=st.lists(st.lists(_any_fp16, min_size=32, max_size=32), min_size=1, max_size=2),
    codes=st.lists(st.integers(0, 15), min_size=64, max_size=64),
    scales=st.lists(st.integers(0, 0xFF), min_size=4, max_size=4),
    g=st.sampled_from([1.0, 2.0**-12, 3.5e-3, -1.0, 448.0 * 6, 2.0**-140]),
)
def test_nvfp4_fp16_reference_matches_the_oracle(a, codes, scales, g):
    """Random fp16 rows times a 2 x 32 NVFP4 weight (any E4M3 scale, NaN included)."""
    a_bits = np.array(a, np.uint16)
    w = Nvfp4Weight.from_codes(
        np.array(codes, np.uint8).reshape(2, 32), np.array(scales, np.uint8).reshape(2, 2), g
    )
    got = rex.w4a16_gemv_exact(a_bits.view(F16), w).view(np.uint16)
    np.testing.assert_array_equal(got, oracle_gemv(a_bits, nvfp4_values(w)))

"""The exact contract's NumPy reference against slow, independent definitions of it.

``q2gemv.reference.exact`` uses vectorised bit arithmetic; the oracles here
use ``fractions.Fraction`` (exact rationals, ``round`` ties to even) and
ml_dtypes' own float64 -> bfloat16 rounding, so a shared mistake is unlikely.
Pure NumPy: no kernels, fast.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from q2gemv import Q2Weight, quantize_q2_0
from q2gemv.formats.bf16 import BF16
from q2gemv.reference import exact as rex

from ..exact_oracles import fixed_point, floor_log2

BF16_MAX = Fraction(255 * 2**120)  # 0x7F7F
NAN, INF, NEG_INF = 0x7FC0, 0x7F80, 0xFF80


# -- independent oracles -----------------------------------------------------------


def _bf16_fraction(h: int) -> Fraction:
    """The exact value of finite bf16 bits ``h`` (through ml_dtypes and float64, both exact)."""
    return Fraction(float(np.array([h], np.uint16).view(BF16)[0]))


def oracle_fixed_point(row) -> tuple[list[int], int | None, bool]:
    """Step 2 by the definition (:func:`tests.exact_oracles.fixed_point`) for this format."""
    return fixed_point(row, INF, _bf16_fraction)


def oracle_nearest(x: Fraction) -> int:
    """bf16 bits nearest to ``x``: ties to even, +0 for 0, sign kept, +-Inf past the range."""
    if x == 0:
        return 0
    sign = 0x8000 if x < 0 else 0
    u = abs(x)
    q = max(floor_log2(u) - 7, -133)  # exponent of the ulp, unbounded above
    r = round(u / Fraction(2) ** q)
    val = r * Fraction(2) ** q
    if val > BF16_MAX:
        return sign | INF
    bits = int(np.array([float(val)], np.float64).astype(BF16).view(np.uint16)[0])
    return sign | bits


def oracle_q2_gemv(a_bits: np.ndarray, w: Q2Weight) -> np.ndarray:
    """The contract, element by element, in exact rationals."""
    codes = w.codes().astype(np.int64) - 1
    scales = w.scales()
    m, _ = a_bits.shape
    out = np.zeros((m, w.n), np.uint16)
    for i in range(m):
        A, E, special = oracle_fixed_point(a_bits[i])
        for n in range(w.n):
            if special or not np.isfinite(scales[n]).all():
                out[i, n] = NAN
                continue
            total = Fraction(0)
            for b in range(w.k // w.group):
                sl = slice(b * w.group, (b + 1) * w.group)
                s = sum(int(c) * a for c, a in zip(codes[n, sl], A[sl], strict=True))
                total += s * Fraction(float(scales[n, b]))
            if E is not None:
                total *= Fraction(2) ** (E - 22)
            out[i, n] = oracle_nearest(total)
    return out


def _bits(x) -> np.ndarray:
    return np.asarray(x).view(np.uint16)


def _ml_nearest(x: float) -> int:
    with np.errstate(over="ignore"):
        return int(np.array([x], np.float64).astype(BF16).view(np.uint16)[0])


# -- fixed_point ---------------------------------------------------------------


def _fixed_point_rows() -> tuple[np.ndarray, dict[str, int]]:
    """Test rows, and the index of each named edge row."""
    rng = np.random.default_rng(11)
    k = 48
    rows = []
    finite = rng.integers(0, 2**16, (6, k), dtype=np.uint64).astype(np.uint16)
    finite[(finite & 0x7F80) == 0x7F80] ^= 0x0100  # exponent 0xFF -> 0xFD: finite
    rows += list(finite)  # whole exponent range: zeros, subnormals, wide spreads
    near = rng.standard_normal((4, k)) * 2.0 ** rng.integers(-12, 1, (4, k))
    rows += list(_bits(near.astype(BF16)))  # narrow spread: every rounding case of A
    sub = rng.integers(0, 0x80, k, dtype=np.uint16) | (rng.integers(0, 2, k, dtype=np.uint16) << 15)
    named = {}

    def add(name, row):
        named[name] = len(rows)
        rows.append(row)

    add("subnormal", sub)  # subnormals only: E <= -127
    add("zero", np.zeros(k, np.uint16))
    add("negzero", np.full(k, 0x8000, np.uint16))
    top = _bits(near[0].astype(BF16)).copy()
    top[5] = 0x437F  # 255.0: mantissa 0x7F, A = 255 * 2**15
    add("top", top)
    neg = top.copy()
    neg[5] = 0xC37F  # -255.0, the largest magnitude, negative
    add("neg", neg)
    add("tiny", np.array([0x0001] + [0] * (k - 1), np.uint16))  # one subnormal 2**-133
    for special in (0x7FC0, 0xFFC1, 0x7F80, 0xFF80):  # NaN, NaN payload, +-Inf
        r = _bits(near[1].astype(BF16)).copy()
        r[7] = special
        add(f"special{special:04X}", r)
    return np.array(rows, np.uint16), named


def test_fixed_point_matches_the_definition():
    bits, _ = _fixed_point_rows()
    A, E, special = rex.fixed_point(bits)
    assert A.dtype == np.int64 and E.dtype == np.int64 and special.dtype == bool
    for i, row in enumerate(bits):
        want_a, want_e, want_special = oracle_fixed_point(row)
        assert bool(special[i]) == want_special, i
        assert A[i].tolist() == want_a, f"row {i}"
        if not want_special:
            assert int(E[i]) == (0 if want_e is None else want_e), f"row {i}"
    assert (np.abs(A) < 2**23).all()


def test_fixed_point_edge_rows():
    bits, idx = _fixed_point_rows()
    A, E, special = rex.fixed_point(bits)
    for name in ("zero", "negzero"):
        assert (A[idx[name]] == 0).all() and E[idx[name]] == 0 and not special[idx[name]]
    assert A[idx["top"], 5] == 255 * 2**15 == 8355840 and E[idx["top"]] == 7
    assert A[idx["neg"], 5] == -8355840 and E[idx["neg"]] == 7
    assert np.abs(A[idx["top"]]).max() == 8355840  # the largest |A| the contract allows
    assert A[idx["tiny"], 0] == 2**22 and E[idx["tiny"]] == -133  # a lone 2**-133
    assert E[idx["subnormal"]] <= -127
    specials = [i for name, i in idx.items() if name.startswith("special")]
    assert special[specials].all() and special.sum() == len(specials)
    assert (A[specials] == 0).all()


def test_fixed_point_every_finite_pattern_against_a_fixed_maximum():
    """Each finite bf16 beside 0x437F (255.0, E = 7): A by the definition, all 65280 patterns."""
    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    h = h[(h & 0x7F80) != 0x7F80]
    h = h[(h & 0x7FFF) <= 0x437F]  # magnitude <= 255: E stays 7
    rows = np.stack([h, np.full_like(h, 0x437F)], axis=1)
    A, E, special = rex.fixed_point(rows)
    assert (E == 7).all() and not special.any()
    scale = Fraction(2) ** (22 - 7)
    want = [round(_bf16_fraction(int(x)) * scale) for x in h]
    assert A[:, 0].tolist() == want


def test_fp16_scale_parts_every_pattern():
    h = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    mant, exp, bad = rex.fp16_scale_parts(h)
    f = h.view(np.float16)
    assert np.array_equal(bad, ~np.isfinite(f))
    for x, mt, ex in zip(f[~bad], mant[~bad], exp[~bad], strict=True):
        assert Fraction(int(mt)) * Fraction(2) ** int(ex) == Fraction(float(x))


# -- bf16_nearest --------------------------------------------------------------


def test_bf16_nearest_random_against_ml_dtypes():
    """Values v * 2**p exact in float64 (|v| < 2**53): ml_dtypes rounds float64 -> bf16 directly."""
    rng = np.random.default_rng(12)
    for _ in range(4000):
        nb = int(rng.integers(0, 54))
        v = int(rng.integers(0, 2**nb)) if nb else 0
        if rng.random() < 0.5:
            v = -v
        target = int(rng.integers(-142, 131))  # the result's exponent: subnormal .. overflow
        p = target - max(abs(v).bit_length(), 1) + 1
        x = v * 2.0**p
        assert Fraction(x) == v * Fraction(2) ** p  # exact in float64
        assert rex.bf16_nearest(v, p) == _ml_nearest(x), (v, p)


def test_bf16_nearest_ties_go_to_even():
    rng = np.random.default_rng(13)
    for _ in range(1000):
        mant = int(rng.integers(128, 256))  # a normal bf16 mantissa
        q = int(rng.integers(-133, 121))  # its ulp's exponent
        for off in (-1, 0, 1):  # just below, at, just above the tie above mant
            v = ((2 * mant + 1) << 20) + off
            p = q - 21
            want = _ml_nearest(v * 2.0**p)
            assert rex.bf16_nearest(v, p) == want == oracle_nearest(v * Fraction(2) ** p)
            assert rex.bf16_nearest(-v, p) == want | 0x8000
        tie_bits = rex.bf16_nearest(2 * mant + 1, q - 1)  # (mant + 1/2) * 2**q
        assert tie_bits & 1 == 0  # the even neighbour (256 carries into the exponent)
        assert tie_bits == oracle_nearest((2 * mant + 1) * Fraction(2) ** (q - 1))


BOUNDARIES = [
    # (v, p, bits)
    (0, 0, 0x0000),
    (0, -500, 0x0000),
    (1, -133, 0x0001),  # the smallest subnormal
    (1, -134, 0x0000),  # half of it: a tie, to the even 0
    (-1, -134, 0x8000),  # rounds to zero, keeps the sign
    (3, -135, 0x0001),  # 0.75 ulp
    (-3, -135, 0x8001),
    (3, -134, 0x0002),  # 1.5 ulp: tie to even 2
    (5, -134, 0x0002),  # 2.5 ulp: tie to even 2
    (255, -134, 0x0080),  # 127.5 ulp: tie, up to the smallest normal 2**-126
    (253, -134, 0x007E),  # 126.5 ulp: tie, to even 126
    ((255 << 40) - 1, -174, 0x007F),  # just below that tie: the largest subnormal
    (127, -133, 0x007F),
    (1, -126, 0x0080),
    (2**300 + 1, -600, 0x0000),  # huge integer, tiny value
    (-(2**300 + 1), -600, 0x8000),
    (1, -1000, 0x0000),
    (255, 120, 0x7F7F),  # the largest bf16
    (-255, 120, 0xFF7F),
    (511, 119, INF),  # the tie above it rounds to even 2**128: Inf
    (-511, 119, NEG_INF),
    ((511 << 40) - 1, 79, 0x7F7F),  # just below that tie
    (-((511 << 40) - 1), 79, 0xFF7F),
    (1, 128, INF),
    (-1, 128, NEG_INF),
    (1, 10_000, INF),
    (2**500, 0, INF),
    (-(2**500), 0, NEG_INF),
    (1, 0, 0x3F80),
    (-1, 0, 0xBF80),
    ((257 << 62) + 0, -62 - 8, 0x3F80),  # 1 + 2**-8 exactly: tie to even 1.0
    ((257 << 62) + 1, -62 - 8, 0x3F81),  # one unit above the tie, far below: up
    ((259 << 62) + 0, -62 - 8, 0x3F82),  # 1 + 3 * 2**-8: tie to even 1 + 2**-6
]


@pytest.mark.parametrize("v,p,want", BOUNDARIES)
def test_bf16_nearest_boundaries(v, p, want):
    assert rex.bf16_nearest(v, p) == want
    assert oracle_nearest(v * Fraction(2) ** p) == want
    if abs(v) < 2**53 and -1074 < p < 900:
        assert _ml_nearest(v * 2.0**p) == want


def test_bf16_nearest_big_integers_against_fractions():
    """Integers far wider than 64 bits (sticky bits far below the round bit)."""
    rng = np.random.default_rng(14)
    for _ in range(2000):
        nb = int(rng.integers(54, 200))
        v = int.from_bytes(rng.bytes(32), "little") % (1 << nb)
        if rng.random() < 0.3:  # a tie plus or minus a far-away unit
            v = (v >> (nb - 9) << (nb - 9)) | (1 << (nb - 10))
            v += int(rng.integers(-1, 2))
        if rng.random() < 0.5:
            v = -v
        p = int(rng.integers(-134, 129)) - nb
        assert rex.bf16_nearest(v, p) == oracle_nearest(v * Fraction(2) ** p), (v, p)


# -- q2_0_gemv_exact -----------------------------------------------------------


def _weight(rng, n, k, group, scales=None, codes=None):
    if codes is None:
        codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    if scales is None:
        scales = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
    return Q2Weight.from_codes(codes, scales, group=group)


def _acts(rng, m, k):
    """bf16 activations with a wide spread (small entries lose bits in step 2)."""
    a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-30, 4, (m, k))
    return a.astype(BF16)


def _check(a, w, label=""):
    got = _bits(rex.q2_0_gemv_exact(a, w))
    want = oracle_q2_gemv(_bits(a).reshape(-1, w.k), w)
    from q2gemv.golden.check import assert_bits_equal

    assert_bits_equal(got.reshape(want.shape), want, label)
    return got


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("m,n,blocks", [(1, 1, 1), (2, 5, 2), (3, 4, 3)])
def test_q2_exact_random_against_fractions(group, m, n, blocks):
    rng = np.random.default_rng(group + 10 * m + n)
    k = group * blocks
    w = _weight(rng, n, k, group)
    _check(_acts(rng, m, k), w, f"g{group} m={m} n={n} k={k}")


def _special_case(group):
    """Rows: NaN, -Inf, zeros, normal, huge +, huge -, cancelling, tiny; columns: Inf/NaN scales, huge."""
    rng = np.random.default_rng(group)
    k, n = 2 * group, 7
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    codes[0] = 3  # every weight 2 * d
    codes[3, :group] = codes[3, group:]  # duplicated halves for the cancelling row
    scales = (rng.standard_normal((n, 2)) * 0.05).astype(np.float16)
    scales[1, 1] = np.inf
    scales[2, 0] = np.nan
    scales[0] = 65504.0  # the largest fp16
    scales[3, 1] = scales[3, 0]
    scales[4] = [-65504.0, 60000.0]
    scales[5] = [0.0, -0.0]  # an exact zero column
    scales[6] = np.float16(2.0**-24)  # the smallest subnormal fp16
    w = Q2Weight.from_codes(codes, scales, group=group)
    base = rng.standard_normal(k)
    a = np.zeros((8, k))
    a[0] = base
    a[0, 5] = np.nan
    a[1] = base
    a[1, k - 1] = -np.inf
    a[2] = 0.0  # zero row
    a[3] = base
    a[4] = 1.0e38 * (1.0 + rng.random(k))  # huge: overflows against big scales
    a[5] = -a[4]
    a[6, :group] = base[:group]  # x against -x over duplicated weight halves: exact 0
    a[6, group:] = -base[:group]
    a[7] = 2.0**-133 * np.sign(base)  # tiny: products round to +-0
    a = a.astype(BF16)
    _bits(a)[2, ::3] = 0x8000  # -0 in the zero row
    return a, w


@pytest.mark.parametrize("group", [64, 128])
def test_q2_exact_special_values(group):
    a, w = _special_case(group)
    y = _check(a, w, f"special g{group}")
    assert (y[0] == NAN).all() and (y[1] == NAN).all()  # NaN / Inf rows
    assert (y[:, 1] == NAN).all() and (y[:, 2] == NAN).all()  # Inf / NaN scale columns
    assert (y[2, [0, 3, 4, 5, 6]] == 0).all()  # zero row (with -0 entries): +0
    assert (y[2:, 5] == 0).all()  # zero-scale column: +0
    assert y[6, 3] == 0  # x and -x cancel exactly: +0
    assert y[4, 0] == INF and y[5, 0] == NEG_INF  # overflow: +-Inf by the same rule
    assert int(y[7, 6]) in (0x0000, 0x8000)  # 2**-133 * 2**-24 * ...: rounds to a signed zero


def test_q2_exact_rounds_to_zero_keeping_the_sign():
    k = 64
    codes = np.full((2, k), 1, np.uint8)
    codes[0, 0], codes[1, 0] = 2, 0  # +1 and -1 times one activation
    w = Q2Weight.from_codes(codes, np.full((2, 1), 2.0**-24, np.float16), group=64)
    a = np.zeros((1, k), BF16)
    _bits(a)[0, 0] = 0x0001  # 2**-133
    y = _bits(rex.q2_0_gemv_exact(a, w))
    assert y.tolist() == [[0x0000, 0x8000]]  # +-2**-157 round to +-0


def test_q2_exact_cancelling_sum_keeps_the_small_remainder():
    """(big + small) - big over one block: the exact sum is the small part, not 0."""
    k = 128
    codes = np.ones((1, k), np.uint8)
    codes[0, :3] = [2, 0, 2]
    w = Q2Weight.from_codes(codes, np.ones((1, 1), np.float16), group=128)
    a = np.zeros((1, k), np.float64)
    a[0, :3] = [2.0**10 + 2.0**3, 2.0**10, 2.0**-4]
    y = rex.q2_0_gemv_exact(a.astype(BF16), w)
    assert float(y[0, 0]) == 2.0**3 + 2.0**-4


def test_q2_exact_is_batch_invariant():
    rng = np.random.default_rng(21)
    for group in (64, 128):
        w = _weight(rng, 6, 2 * group, group)
        a = _acts(rng, 5, 2 * group)
        special, _ = _special_case(group)
        a = np.concatenate([a, special[:, : 2 * group]])
        ys = _bits(rex.q2_0_gemv_exact(a, w))
        for i in range(a.shape[0]):
            assert np.array_equal(ys[i], _bits(rex.q2_0_gemv_exact(a[i : i + 1], w))[0]), i
            assert np.array_equal(ys[i], _bits(rex.q2_0_gemv_exact(a[i], w)))  # 1-D a
        perm = rng.permutation(a.shape[0])
        assert np.array_equal(_bits(rex.q2_0_gemv_exact(a[perm], w)), ys[perm])


def test_q2_exact_shapes():
    rng = np.random.default_rng(22)
    w = _weight(rng, 3, 128, 64)
    assert rex.q2_0_gemv_exact(np.zeros((0, 128), BF16), w).shape == (0, 3)
    y = rex.q2_0_gemv_exact(np.ones(128, BF16), w)
    assert y.shape == (3,) and y.dtype == BF16
    with pytest.raises(TypeError, match="weight"):
        rex.q2_0_gemv_exact(np.ones(128, BF16), w.dequantize())
    with pytest.raises(ValueError, match="a: expected K=128"):
        rex.q2_0_gemv_exact(np.ones(64, BF16), w)


def test_q2_exact_error_bound_holds():
    """The docstring's bound: |y - x.w| <= 2**(E-23) * sum|w| + half an ulp of y (exact arithmetic)."""
    rng = np.random.default_rng(23)
    for group in (64, 128):
        k = 2 * group
        w = _weight(rng, 4, k, group)
        a = _acts(rng, 3, k)
        y = rex.q2_0_gemv_exact(a, w)
        wd = [[Fraction(float(x)) for x in row] for row in w.dequantize().astype(np.float64)]
        for i in range(3):
            x = [Fraction(float(v)) for v in a[i].astype(np.float64)]
            _, E, _ = oracle_fixed_point(_bits(a)[i])
            for n in range(4):
                exact = sum(xi * wi for xi, wi in zip(x, wd[n], strict=True))
                yv = Fraction(float(y[i, n]))
                ulp = Fraction(2) ** max(floor_log2(abs(yv)) - 7, -133) if yv else Fraction(0)
                bound = Fraction(2) ** (E - 23) * sum(abs(v) for v in wd[n]) + ulp / 2
                assert abs(yv - exact) <= bound, (group, i, n)


def test_ml_dtypes_rounds_float64_directly():
    """The oracle's assumption: float64 -> bfloat16 rounds once (no float32 double rounding)."""
    x = 1.0 + 2.0**-8 + 2.0**-40  # above the tie; via float32 it would become the tie -> 1.0
    assert _ml_nearest(x) == 0x3F81


def test_docs_state_the_contract_word_for_word():
    """docs/numerics.md quotes the reference's contract text; the two must not drift apart."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "numerics.md").read_text()
    text = rex.__doc__
    contract = text[text.index("1. **Special rows.**") : text.index("Nothing here")].strip()
    assert contract in doc


def test_exact_reference_memory_does_not_grow_with_m(monkeypatch):
    """Activation rows are taken in chunks: the peak is the same for 256 and 2048 rows."""
    import tracemalloc

    monkeypatch.setattr(rex, "_ROW_ELEMS", 1 << 14)  # 128 activation rows of K=128 at once
    rng = np.random.default_rng(16)
    w = quantize_q2_0(rng.standard_normal((8, 128)).astype(np.float32), group=64)
    peaks = []
    for m in (256, 2048):
        a = rng.standard_normal((m, 128)).astype(BF16)
        tracemalloc.start()
        try:
            y = rex.q2_0_gemv_exact(a, w)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        peaks.append(peak - a.nbytes - y.nbytes)  # the inputs and the result are inherent
    assert peaks[1] < 1.5 * peaks[0], peaks

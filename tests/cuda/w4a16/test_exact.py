"""NVFP4 under the exact contract: the reference against exact rational arithmetic, the kernel's
pieces (code decode, scale table, NaN scan, limb layout) and the kernel against the reference
on the simulator where the golden cases do not reach (two row tiles a CTA, chunked launches).
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from q2gemv import Nvfp4Weight
from q2gemv.check import assert_bits_equal
from q2gemv.cuda.runtime import launcher
from q2gemv.cuda.w4a16 import exact as xw
from q2gemv.formats.nvfp4 import E2M1_VALUES, E4M3_VALUES
from q2gemv.reference import exact as rex

BF16 = ml_dtypes.bfloat16


def _oracle(a_bits: np.ndarray, w: Nvfp4Weight) -> np.ndarray:
    """The contract computed with Fractions: the fixed point, exact weights, one rounding."""
    A, E, special = rex.fixed_point(a_bits)
    m, k = a_bits.shape
    out = np.full((m, w.n), rex.BF16_NAN, np.uint16)
    if not np.isfinite(w.global_scale):
        return out
    g = Fraction(float(np.float32(w.global_scale)))
    codes = w.codes()
    s = w.scales
    for n in range(w.n):
        if np.isnan(E4M3_VALUES[s[n]]).any():
            continue
        wrow = [
            Fraction(float(E2M1_VALUES[codes[n, j]])) * Fraction(float(E4M3_VALUES[s[n, j // 16]]))
            for j in range(k)
        ]
        for r in range(m):
            if special[r]:
                continue
            x = sum((wrow[j] * int(A[r, j]) for j in range(k)), Fraction(0))
            x = x * g * Fraction(2) ** (int(E[r]) - 22)
            den = x.denominator
            assert den & (den - 1) == 0  # a dyadic value
            out[r, n] = rex.bf16_nearest(x.numerator, -(den.bit_length() - 1))
    return out


def _weight(rng, n, k, scales=None, g=0.0075):
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    if scales is None:
        scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8) | (
            rng.integers(0, 2, (n, k // 16), dtype=np.uint8) << 7
        )
        scales[scales & 0x7F == 0x7F] = 0x38
    return Nvfp4Weight.from_codes(codes, scales, g)


@pytest.mark.parametrize(
    "case",
    ["random", "nan_scale", "g_nan", "g_inf", "g_zero", "g_negative", "g_subnormal", "specials"],
)
def test_reference_is_the_contract(case):
    """Every E4M3 byte class, global scales of every class, NaN/Inf/zero rows, outliers."""
    rng = np.random.default_rng(sum(map(ord, case)))
    n, k, m = 5, 48, 4
    g = {"g_nan": np.nan, "g_inf": -np.inf, "g_zero": 0.0, "g_negative": -3.25e-3}.get(case, 7e-3)
    if case == "g_subnormal":
        g = float(np.uint32(5).view(np.float32))
    w = _weight(rng, n, k, g=g)
    if case == "nan_scale":
        sc = np.array(w.scales)
        sc[2, 1] = 0xFF
        sc[4, 0] = 0x7F
        w = Nvfp4Weight.from_codes(w.codes(), sc, g)
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[1, 7] *= 2.0**20  # an outlier: the rest of the row loses low bits in the fixed point
    bits = a.astype(BF16).view(np.uint16)
    if case == "specials":
        bits[0, :] = 0x8000  # -0 row: +0 outputs
        bits[2, 5] = 0x7F80  # +Inf: NaN row
        bits[3, :] = rng.integers(1, 0x80, k) | (rng.integers(0, 2, k) << 15)  # subnormals
    got = rex.w4a16_gemv_exact(bits.view(BF16), w).view(np.uint16)
    assert_bits_equal(got, _oracle(bits, w), f"w4a16_gemv_exact reference ({case})")


def test_reference_is_batch_invariant_and_shapes():
    rng = np.random.default_rng(3)
    w = _weight(rng, 9, 64)
    a = rng.standard_normal((6, 64)).astype(BF16)
    full = rex.w4a16_gemv_exact(a, w).view(np.uint16)
    for r in range(6):
        one = rex.w4a16_gemv_exact(a[r], w).view(np.uint16)
        assert one.shape == (9,) and np.array_equal(one, full[r])
    assert rex.w4a16_gemv_exact(a[:0], w).shape == (0, 9)
    with pytest.raises(TypeError, match="weight"):
        rex.w4a16_gemv_exact(a, object())


# -- the kernel's pieces ----------------------------------------------------------------------


@cuda.jit
def _pieces_kernel(words, lo, hi, lut, nan):
    i = cuda.grid(1)
    if i < words.shape[0]:
        lo[i], hi[i] = xw.decode_codes(words[i], xw.LUT_LO, xw.LUT_HI)
        nan[i] = 1 if xw.has_nan_scale(words[i]) else 0
    if i < 256:
        lut[0, i] = xw.scale_entry(i, 0)
        lut[1, i] = xw.scale_entry(i, 1)


def test_decode_scale_table_and_nan_scan():
    """Codes in every nibble -> 2*e2m1 as int8; the scale table; the NaN-byte scan."""

    rng = np.random.default_rng(9)
    nib = np.concatenate([np.arange(16), rng.integers(0, 16, 8 * 30)]).astype(np.uint32)
    nib = np.concatenate([nib, np.zeros((-nib.size) % 8, np.uint32)]).reshape(-1, 8)
    words = (nib << (4 * np.arange(8, dtype=np.uint32))).sum(axis=1).astype(np.uint32)
    words[-1] = 0x7F000000  # a NaN scale byte in the top byte (as a scale word)
    words[-2] = 0x00FF0000
    words[-3] = 0x7E7E7E7E  # 448 four times: no NaN
    lo, hi = np.zeros_like(words), np.zeros_like(words)
    lut = np.zeros((2, 256), np.int32)
    nan = np.zeros(words.size, np.int32)
    _pieces_kernel[1, 256](words, lo, hi, lut, nan)
    got = np.stack([lo, hi], 1).view(np.int8).reshape(-1, 8)
    assert np.array_equal(got[:-3], rex.E2M1_TWICE[nib[:-3]])
    mant, exp, isnan = rex.e4m3_scale_parts(np.arange(256))
    want = np.where(isnan, 0, mant * 2.0 ** (exp + 9)).astype(np.int64)  # mant << (max(e,1)-1)
    assert np.array_equal(lut[0], want) and np.array_equal(lut[1], -want)
    b = words.view(np.uint8).reshape(-1, 4)
    assert np.array_equal(nan.astype(bool), ((b & 0x7F) == 0x7F).any(axis=1))


def test_prepare_writes_the_limbs_in_fragment_order():
    """The prepare's limbs, read back through limb_word, rebuild A exactly (L2 signed)."""

    rng = np.random.default_rng(11)
    m, k = 3, 144  # a padded row, a partial step
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[1, 3] = 255 * 2.0**8  # the largest |A|: mantissa 0xFF at E
    a[2, :] *= -1
    bits = a.astype(BF16).view(np.uint16)
    ops = xw.prepare_device(cuda.to_device(bits))
    p = ops.limbs.copy_to_host().view(np.uint8)
    A, E, _ = rex.fixed_point(bits)
    assert np.array_equal(ops.exponents.copy_to_host()[:m], E)
    mp = xw.padded_m(m)
    got = np.zeros((mp, xw.padded_k(k)), np.int64)
    for r in range(mp):
        for j in range(got.shape[1]):
            byte = [int(p[4 * xw.limb_word(r, j, li, mp) + j % 4]) for li in range(3)]
            got[r, j] = byte[0] + 256 * byte[1] + 65536 * (byte[2] - 256 * (byte[2] > 127))
    assert np.array_equal(got[:m, :k], A)
    assert not got[m:].any() and not got[:, k:].any()  # padding rows and elements: zero


# -- the kernel where the golden cases do not reach ---------------------------------------------


def test_two_row_tiles_and_chunked_launches(monkeypatch):
    """Two 16-row tiles a CTA (forced: the launcher picks them for tall weights only), M = 17
    (a 16-row launch of 4 groups and a 1-row launch), N with a partial second tile."""

    monkeypatch.setattr(xw, "row_tiles", lambda ng, n: 2 if ng == 4 else 1)
    rng = np.random.default_rng(12)
    w = _weight(rng, 21, 128)
    a = rng.standard_normal((17, 128)).astype(BF16)
    got = launcher.run_kernel("w4a16_gemv_exact", a.view(np.uint16), w)
    assert_bits_equal(got, rex.w4a16_gemv_exact(a, w).view(np.uint16), "w4a16_gemv_exact rt=2")


def test_launches_refuse_bad_operands():
    from q2gemv.cuda.w4a16 import DeviceNvfp4Weight

    rng = np.random.default_rng(13)
    dw = DeviceNvfp4Weight.upload(_weight(rng, 4, 32))
    ops = xw.W4Operands.allocate(2, 32)
    with pytest.raises(ValueError, match="out"):
        xw.w4_launches(ops, dw, cuda.device_array((2, 5), np.uint16))
    with pytest.raises(ValueError, match="a: expected K=32"):
        xw.w4_launches(xw.W4Operands.allocate(2, 48), dw, cuda.device_array((2, 4), np.uint16))
    with pytest.raises(TypeError, match="weight"):
        xw.w4_launches(ops, object(), cuda.device_array((2, 4), np.uint16))
    with pytest.raises(ValueError, match="K <="):
        xw.check_k(xw.MAX_K + 16)
    with pytest.raises(ValueError, match="multiple of 16"):
        xw.check_k(40)

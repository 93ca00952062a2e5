"""NVFP4 under the exact contract: the reference against exact rational arithmetic, the kernel's
pieces (code decode, scale table, limb layout) and the kernel against the reference
on the simulator where the golden cases do not reach (two row tiles a CTA, chunked launches).
"""

from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

from q2gemv import Nvfp4Weight
from q2gemv.cuda.nvfp4 import exact as xw
from q2gemv.cuda.nvfp4.scales import scale_entry
from q2gemv.formats.nvfp4 import E2M1_VALUES, E4M3_VALUES
from q2gemv.golden.check import assert_bits_equal
from q2gemv.host import call as road
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
def _pieces_kernel(words, lo, hi, lut):
    i = cuda.grid(1)
    if i < words.shape[0]:
        lo[i], hi[i] = xw.decode_codes(words[i], xw.LUT_LO, xw.LUT_HI)
    if i < 256:
        lut[0, i] = scale_entry(i, 0)
        lut[1, i] = scale_entry(i, 1)


def test_decode_and_scale_table():
    """Codes in every nibble -> 2*e2m1 as int8; the scale table (the global sign folded in)."""

    rng = np.random.default_rng(9)
    nib = np.concatenate([np.arange(16), rng.integers(0, 16, 8 * 30)]).astype(np.uint32)
    nib = np.concatenate([nib, np.zeros((-nib.size) % 8, np.uint32)]).reshape(-1, 8)
    words = (nib << (4 * np.arange(8, dtype=np.uint32))).sum(axis=1).astype(np.uint32)
    lo, hi = np.zeros_like(words), np.zeros_like(words)
    lut = np.zeros((2, 256), np.int32)
    _pieces_kernel[1, 256](words, lo, hi, lut)
    got = np.stack([lo, hi], 1).view(np.int8).reshape(-1, 8)
    assert np.array_equal(got, rex.E2M1_TWICE[nib])
    mant, exp, isnan = rex.e4m3_scale_parts(np.arange(256))
    want = np.where(isnan, 0, mant * 2.0 ** (exp + 9)).astype(np.int64)  # mant << (max(e,1)-1)
    assert np.array_equal(lut[0], want) and np.array_equal(lut[1], -want)


def test_prepare_writes_the_limbs_in_fragment_order():
    """The prepare's limbs, read back through limb_byte, rebuild A + 2**23 exactly; the padding
    to whole steps is A = 0."""

    rng = np.random.default_rng(11)
    m, k = 3, 144  # a partial last step
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[1, 3] = 255 * 2.0**8  # the largest |A|: mantissa 0xFF at E
    a[2, :] *= -1
    bits = a.astype(BF16).view(np.uint16)
    ops = xw.prepare_device(cuda.to_device(bits))
    p = ops.limbs.copy_to_host()
    assert p.shape == (3 * m, xw.padded_k(k) // 4)
    p = p.view(np.uint8).reshape(m, 3, -1)
    A, E, _ = rex.fixed_point(bits)
    assert np.array_equal(ops.exponents.copy_to_host(), E)
    kp = xw.padded_k(k)
    pos = np.array([xw.limb_byte(j) for j in range(kp)])
    assert sorted(pos) == list(range(kp))  # a permutation of each step
    limbs = p[:, :, pos].astype(np.int64)  # [m, limb, k]
    got = limbs[:, 0] + 256 * limbs[:, 1] + 65536 * limbs[:, 2] - 2**23
    assert np.array_equal(got[:, :k], A)
    assert not got[:, k:].any()  # the padding: A = 0


def _run(w, a, warps=None, monkeypatch=None):
    if warps is not None:
        monkeypatch.setattr(xw, "warps_for", lambda n, k, m: warps)
    return road.run_kernel("w4a16_gemv_exact", a.view(np.uint16), w)


@pytest.mark.parametrize("warps", [4, xw.WARPS, xw.WIDE_WARPS])
def test_kernel_tiles_steps_and_chunks(warps, monkeypatch):
    """Every CTA size (forced), two launches (8 rows: three column tiles; then 3 rows, two, or
    1 row, one), a partial last step. At 4 and 8 warps: more steps than warps and N with a
    partial second tile (at 4, the scale table filled in two rounds of 128 threads); at 16:
    fewer steps than warps (idle warps) and one tile (the simulator runs 512 threads slowly)."""
    rng = np.random.default_rng(12 + warps)
    n, m, k = (21, 11, 64 * 9 + 48) if warps <= xw.WARPS else (16, 9, 64 * 3 + 48)
    w = _weight(rng, n, k)
    a = rng.standard_normal((m, k)).astype(BF16)
    got = _run(w, a, warps, monkeypatch)
    assert_bits_equal(got, rex.w4a16_gemv_exact(a, w).view(np.uint16), f"warps={warps}")


def test_kernel_one_and_two_rows_nan_scales_and_specials():
    """One column tile (M <= 2, B prefetched), a NaN scale (its row NaN), an Inf activation (its
    output row NaN), a negative global scale, the largest |A|."""
    rng = np.random.default_rng(14)
    w = _weight(rng, 17, 80, g=-3.5e-3)
    sc = np.array(w.scales)
    sc[16, 4] = 0x7F
    w = Nvfp4Weight.from_codes(w.codes(), sc, w.global_scale)
    a = rng.standard_normal((2, 80)).astype(np.float32)
    a[0, 5] = 255 * 2.0**10
    a[1, 9] = np.inf
    a = a.astype(BF16)
    for m in (1, 2):
        got = _run(w, a[:m])
        assert_bits_equal(got, rex.w4a16_gemv_exact(a[:m], w).view(np.uint16), f"m={m}")
    assert (got[:, 16] == rex.BF16_NAN).all() and (got[1] == rex.BF16_NAN).all()


def test_tiles_for_counts_column_tiles():
    assert [xw.tiles_for(m) for m in range(1, 9)] == [1, 1, 2, 2, 2, 3, 3, 3]
    with pytest.raises(ValueError, match="m: w4a16_gemv_exact serves 1..8"):
        xw.tiles_for(9)


def test_warps_for_follows_the_measured_rule(h200_knobs):
    """The CTA sizes of the H200 sweep (``benchmarks/results/2026-12-03_exact_launch_sweep/
    v8_nvfp4_warps``), at the knobs of ``tuning.json``."""
    wide, base, narrow = xw.WIDE_WARPS, xw.WARPS, xw.NARROW_WARPS
    assert xw.warps_for(1024, 4096, 1) == wide  # 64 tiles: wide at every M
    assert xw.warps_for(1024, 4096, xw.MAX_M) == wide
    assert xw.warps_for(4096, 4096, 2) == wide  # 256 tiles: wide at 1 or 2 rows
    assert xw.warps_for(4096, 4096, 3) == base
    assert xw.warps_for(4096, 1024, 1) == base  # 16 steps: too few for 16 warps
    assert xw.warps_for(5120, 5120, 1) == base  # 320 tiles
    assert xw.warps_for(5120, 5120, 5) == narrow  # narrow past 4 rows from 320 tiles
    assert xw.warps_for(14336, 4096, 1) == narrow  # 896 tiles: narrow at every M
    assert xw.warps_for(16384, 16384, 1) == narrow  # 1024 tiles, 256 steps
    assert xw.warps_for(16384, 16384, xw.MAX_M) == narrow


def test_ptx_specs_are_the_builds_the_launcher_picks():
    """The PTX tests compile every column-tile count at 8 warps in bf16 and fp16, and each other
    CTA size the launcher picks at the fewest and the most column tiles in bf16."""
    picked = {xw.warps_for(n, 4096, m) for n in (1024, 4096, 28672) for m in range(1, xw.MAX_M + 1)}
    assert picked == set(xw.CTA_WARPS)
    ends = (xw.TILES[0], xw.TILES[-1])
    want = {
        f"w4a16_gemv_exact@c{nct}w{warps}"
        for warps in xw.CTA_WARPS
        for nct in (xw.TILES if warps == xw.WARPS else ends)
    }
    want |= {"w4a16_exact_prepare"}
    fp16 = {f"{n}+fp16" for n in want if n.endswith(f"w{xw.WARPS}") or "@" not in n}
    names = [name for name, _, _ in xw.ptx_specs()]
    assert sorted(names) == sorted(want | fp16)


def test_launches_choose_the_cta_size_per_chunk():
    """A call of 10 rows on a small grid: the 8-row chunk takes 8 warps, the 2-row chunk 16."""
    from q2gemv.cuda.nvfp4 import DeviceNvfp4Weight

    m, n, k = 10, 4096, 4096
    dw = DeviceNvfp4Weight.upload(_weight(np.random.default_rng(4), n, k))
    ops = xw.W4Operands.allocate(m, k)
    launches = xw.w4_launches(ops, dw, cuda.device_array((m, n), np.uint16))
    assert [block for _, _, block, _ in launches] == [32 * xw.WARPS, 32 * xw.WIDE_WARPS]


def test_launches_refuse_bad_operands():
    from q2gemv.cuda.nvfp4 import DeviceNvfp4Weight

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

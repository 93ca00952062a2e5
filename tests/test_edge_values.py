"""Edge values compute the documented bits, in the reference and in every kernel.

One weight holds one edge case per row and one activation batch one edge
case per row, so a single launch checks the whole table; the expected bits
are written out by hand from the numerics contract (docs/guarantees.md):
NaN anywhere in a dot product gives the canonical 0x7FC0; ``0 * Inf`` is
NaN; ``acc`` starts at +0.0, so an all-zero result is +0 (0x0000), never -0;
no flush-to-zero (bf16 subnormal activations survive); code 3 is +2.
K is exactly one block (Q2_0: one ``group``; NVFP4: one 16-weight group);
N=1 runs on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

import q2gemv
from q2gemv import Nvfp4Weight, Q2Weight
from q2gemv import reference as ref
from q2gemv.cuda.nvfp4 import seed as w4cuda
from q2gemv.cuda.q2_0 import seed as q2cuda
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal

NAN, PINF, NINF, ZERO = 0x7FC0, 0x7F80, 0xFF80, 0x0000
ONE = 0x3F80
Q2_KERNELS = list(q2cuda.KERNELS)


def _bits(v: float) -> int:
    """bf16 bits of a value that is exact in bf16 (hand-checked)."""
    return int(np.array([v], np.float32).view(np.uint32)[0] >> 16)


def _acts(k: int) -> np.ndarray:
    """Activation rows: ones; one NaN; one +Inf; +Inf and -Inf; all the smallest subnormal."""
    a = np.full((5, k), ONE, np.uint16)
    a[1, 0] = NAN
    a[2, 5] = PINF
    a[3, 0], a[3, k - 1] = PINF, NINF
    a[4, :] = 0x0001  # 2^-133
    return a.view(BF16)


# -- Q2_0 ----------------------------------------------------------------------------------

# weight rows: (fp16 scale bits, code) for every code of the row
Q2_ROWS = [
    (0x3C00, 3),  # d = 1, code 3 (+2)
    (0x3C00, 1),  # all-zero weights
    (0x7E00, 2),  # NaN scale
    (0x7C00, 1),  # +Inf scale times zero codes
    (0x7C00, 2),  # +Inf scale, code 2
    (0x0001, 2),  # fp16 subnormal scale 2^-24
    (0x0000, 0),  # raw zero bytes: d = +0, code 0 (-1)
    (0xBC00, 0),  # d = -1, code 0: value +1
    (0x7BFF, 3),  # d = 65504 (fp16 max), code 3
]


def _q2_weight(group: int) -> Q2Weight:
    k = group
    codes = np.array([[c] * k for _, c in Q2_ROWS], np.uint8)
    scales = np.array([[d] for d, _ in Q2_ROWS], np.uint16).view(np.float16)
    return Q2Weight.from_codes(codes, scales, group=group)


def _q2_expected(k: int) -> np.ndarray:
    """[5 activation rows, 9 weight rows] bf16 bits, from the contract by hand."""
    t = np.array(
        [
            # ones          NaN  +Inf   +Inf&-Inf  subnormals 2^-133
            [_bits(2.0 * k), NAN, PINF, NAN, _bits(k * 2.0**-132)],  # code 3, d=1
            [ZERO, NAN, NAN, NAN, ZERO],  # zero weights: 0*Inf = NaN
            [NAN, NAN, NAN, NAN, NAN],  # NaN scale
            [NAN, NAN, NAN, NAN, NAN],  # Inf scale x (s = 0) = NaN
            [PINF, NAN, PINF, NAN, PINF],  # Inf scale, code 2
            [_bits(k * 2.0**-24), NAN, PINF, NAN, ZERO],  # 2^-24 scale (k*2^-157 -> 0)
            [ZERO, NAN, NAN, NAN, ZERO],  # d = +0: (-s) * +0 = -0; +0 + -0 = +0
            [_bits(float(k)), NAN, PINF, NAN, _bits(k * 2.0**-133)],  # d = -1, code 0
            [_bits(np.float32(k * 131008.0)), NAN, PINF, NAN, _bits(k * 2.0**-133 * 131008)],
        ],
        np.uint16,
    )
    return t.T.copy()


def _round_bf16(v: float) -> int:
    from q2gemv.formats.bf16 import f32_to_bf16_bits

    return int(f32_to_bf16_bits(np.float32(v)))


@pytest.mark.parametrize("group", [64, 128])
def test_q2_reference_edge_table(group):
    w, a = _q2_weight(group), _acts(group)
    want = _q2_expected(group)
    # fp16 max row: 64 * 131008 = 8384512 and 128 * 131008 round to bf16 (RNE)
    want[0, 8] = _round_bf16(group * 131008.0)
    want[4, 8] = _round_bf16(group * 131008.0 * 2.0**-133)
    for name in Q2_KERNELS:
        got = getattr(ref, name)(a, w).view(np.uint16)
        assert_bits_equal(got, want, label=f"reference {name} group={group}")


# rt4 (32 rows per CTA) is the slowest kernel in the simulator: one group here, both in test_fuzz
@pytest.mark.parametrize(
    ("kernel", "group"),
    [(k, g) for k in Q2_KERNELS for g in (64, 128) if (k, g) != ("q2_0_gemv_vec_rt4", 128)],
)
def test_q2_kernels_edge_table(kernel, group):
    w, a = _q2_weight(group), _acts(group)
    want = getattr(ref, kernel)(a, w).view(np.uint16)
    got = q2gemv.gemv(a, w, kernel=kernel, backend="cuda").view(np.uint16)
    assert_bits_equal(got, want, label=f"{kernel} group={group}")
    assert got[0, 0] == _bits(2.0 * group)  # code 3 is +2
    assert got[4, 0] == _bits(group * 2.0**-132)  # no flush-to-zero of subnormal inputs
    assert (got[:, 2] == NAN).all() and got[0, 1] == ZERO and got[0, 6] == ZERO


@pytest.mark.parametrize("kernel", ["q2_0_gemv", "q2_0_gemv_vec_batchm"])
def test_q2_single_output_row(kernel):
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 4, (1, 256), dtype=np.uint8)
    codes[0, :7] = 3
    w = Q2Weight.from_codes(codes, np.array([[0.5, -0.25]], np.float16), group=128)
    a = rng.standard_normal((1 if kernel == "q2_0_gemv" else 3, 256)).astype(BF16)
    want = getattr(ref, kernel)(a, w)
    got = q2gemv.gemv(a, w, kernel=kernel, backend="cuda")
    assert got.shape == (a.shape[0], 1)
    assert_bits_equal(got.view(np.uint16), want.view(np.uint16), label=kernel)


# -- NVFP4 ---------------------------------------------------------------------------------

# weight rows: (E4M3 scale bits, E2M1 code) for the one 16-weight group
W4_ROWS = [
    (0x38, 7),  # s = 1, +6
    (0x38, 0),  # zero weights
    (0x7F, 2),  # NaN scale
    (0x01, 2),  # E4M3 subnormal 2^-9, +1
    (0x38, 8),  # -0 codes
    (0xFE, 15),  # s = -448, -6: +2688 per weight
]


def _w4_weight(g: float) -> Nvfp4Weight:
    codes = np.array([[c] * 16 for _, c in W4_ROWS], np.uint8)
    scales = np.array([[s] for s, _ in W4_ROWS], np.uint8)
    return Nvfp4Weight.from_codes(codes, scales, g)


def _w4_expected() -> np.ndarray:
    t = np.array(
        [
            [_bits(96.0), NAN, PINF, NAN, _bits(96 * 2.0**-133)],
            [ZERO, NAN, NAN, NAN, ZERO],
            [NAN, NAN, NAN, NAN, NAN],
            [_bits(2.0**-5), NAN, PINF, NAN, ZERO],  # 16 * 2^-133 * 2^-9 -> 0
            [ZERO, NAN, NAN, NAN, ZERO],  # -0 weights: +0 + -0 = +0
            [_bits(43008.0), NAN, PINF, NAN, _bits(43008 * 2.0**-133)],
        ],
        np.uint16,
    )
    return t.T.copy()


def test_w4_reference_edge_table():
    w, a = _w4_weight(1.0), _acts(16)
    assert_bits_equal(ref.w4a16_gemv(a, w).view(np.uint16), _w4_expected(), label="reference")


@pytest.mark.parametrize(
    "kernel", ["w4a16_gemv_batch5", "w4a16_gemv_batch8_rt2", "w4a16_gemv_batch16"]
)
def test_w4_kernels_edge_table(kernel):
    w, a = _w4_weight(1.0), _acts(16)
    got = w4cuda.w4a16_gemv(a, w, kernel=kernel).view(np.uint16)
    assert_bits_equal(got, _w4_expected(), label=kernel)


@pytest.mark.parametrize(
    ("g", "row0"),
    [(float("inf"), PINF), (0.0, ZERO), (float("nan"), NAN), (2.0**-126, _bits(96 * 2.0**-126))],
)
def test_w4_global_scale_specials(g, row0):
    w, a = _w4_weight(g), _acts(16)
    want = ref.w4a16_gemv(a, w).view(np.uint16)
    assert want[0, 0] == row0
    if np.isnan(g):
        assert (want == NAN).all()
    got = w4cuda.w4a16_gemv(a[:1], w, kernel="w4a16_gemv_batch4").view(np.uint16)
    assert_bits_equal(got, want[:1], label=f"g={g}")


def test_w4_single_output_row():
    rng = np.random.default_rng(6)
    w = Nvfp4Weight.from_float(rng.standard_normal((1, 48)).astype(np.float32))
    a = rng.standard_normal((2, 48)).astype(BF16)
    got = q2gemv.gemv(a, w, backend="cuda")
    assert got.shape == (2, 1)
    assert_bits_equal(got.view(np.uint16), ref.w4a16_gemv(a, w).view(np.uint16))

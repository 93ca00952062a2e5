"""Edge-value cases: the weights, activations and hand-written expected bits that pin the
documented edge values in the references (tests/reference/test_q2_0.py, test_nvfp4.py) and
in every kernel (tests/cuda/q2_0/test_seed.py, tests/cuda/nvfp4/test_seed.py).

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

from q2gemv import Nvfp4Weight, Q2Weight
from q2gemv.cuda.q2_0 import seed as q2cuda
from q2gemv.formats.bf16 import BF16

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


def finite_sample(rng, exp_mask: int, size: int, edges) -> np.ndarray:
    """``edges`` then ``size`` random finite 16-bit float patterns (exponent field, ``exp_mask``,
    not all ones): inputs for the device helpers' tests against their references."""
    h = rng.integers(0, 2**16, 2 * size).astype(np.uint16)
    h = h[(h & exp_mask) != exp_mask][:size]
    return np.concatenate([np.array(edges, np.uint16), h])

"""Shared case builders for the Q2_0 tests."""

from __future__ import annotations

import numpy as np

from q2gemv import Q2Weight
from q2gemv.formats.bf16 import BF16
from q2gemv.formats.q2_0 import quantize_q2_0

BF16_SPECIALS = np.array(
    [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x8001, 0x7F7F, 0xFF7F, 0x0080, 0x3F80],
    np.uint16,
)


def random_weight(rng, n, k, group, scale_bits=None):
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)  # code 3 included
    scales = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
    if scale_bits is not None:
        flat = scales.reshape(-1).view(np.uint16)
        flat[: len(scale_bits)] = scale_bits[: flat.size]
    return Q2Weight.from_codes(codes, scales, group=group)


def random_acts(rng, m, k, specials=False):
    a = rng.standard_normal((m, k)).astype(BF16)
    if specials and m:
        bits = a.view(np.uint16)
        idx = rng.choice(m * k, size=min(m * k, 3 * len(BF16_SPECIALS)), replace=False)
        bits.reshape(-1)[idx] = np.resize(BF16_SPECIALS, idx.size)
    return a


def _q2(n: int = 2, k: int = 128, group: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    return quantize_q2_0(rng.standard_normal((n, k)).astype(np.float32), group=group)

"""The Q2_0 references against float64, within a derived bound, and on hand-computed cases.

Bound (u = 2^-24, gamma_n = n u / (1 - n u), S = sum_k |a_k w_k|): every
product a_k (code_k - 1) is exact. On its way to the output it passes through
at most n rounded fp32 operations:

* 15 adds inside its unit's partial sum;
* 1 multiply by d;
* T - 1 adds into the lane accumulator, where T is the number of units per lane;
* 5 butterfly adds (+1 for the baseline's two-warp combine).

So |y_fp32 - y| <= gamma_n * S (Higham, Accuracy and Stability, ch. 3). The
bf16 store adds at most 2^-8 |y_fp32|. The float64 check sum is itself off by
at most K * 2^-53 * S.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from q2gemv import Q2Weight, reference
from q2gemv import reference as ref
from q2gemv.formats.bf16 import BF16
from q2gemv.formats.q2_0 import quantize_q2_0
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference import q2_0 as ref_q2
from tests.edge_values import Q2_KERNELS, _acts, _q2_expected, _q2_weight, _round_bf16
from tests.q2_cases import random_acts, random_weight

U = 2.0**-24


def _bound(kernel: str, k: int, s_abs: np.ndarray, y: np.ndarray) -> np.ndarray:
    if kernel == "q2_0_gemv":
        per_unit, lanes, unit, tree = 7, 64, 8, 6
    else:
        per_unit, lanes, unit, tree = 15, 32, 16, 5
    t = -(-(k // unit) // lanes)
    n = per_unit + 1 + (t - 1) + tree
    gamma = n * U / (1 - n * U)
    f32_err = gamma * s_abs
    return 2.0**-8 * (np.abs(y) + f32_err) + f32_err + k * 2.0**-53 * s_abs


@pytest.mark.parametrize("kernel", ["q2_0_gemv", "q2_0_gemv_vec", "q2_0_gemv_vec_batchm"])
@pytest.mark.parametrize("group,k", [(64, 64), (128, 1024), (64, 5120)])
def test_reference_within_derived_bound_of_float64(kernel, group, k):
    rng = np.random.default_rng(k + group)
    w = random_weight(rng, 24, k, group)
    a = random_acts(rng, 3, k)
    got = getattr(reference, kernel)(a, w).astype(np.float64)
    wd = w.dequantize().astype(np.float64)
    af = a.astype(np.float64)
    exact = af @ wd.T
    s_abs = np.abs(af) @ np.abs(wd).T
    bound = _bound(kernel, k, s_abs, exact)
    excess = np.abs(got - exact) - bound
    assert (excess <= 0).all(), (
        f"worst excess {excess.max()} at {np.unravel_index(excess.argmax(), excess.shape)}"
    )
    # and the bound is not vacuous: it is far below the magnitudes involved
    assert np.median(bound / np.maximum(s_abs, 1e-30)) < 2.0**-7


def test_hand_case_single_nonzero_and_code_three():
    codes = np.ones((2, 64), np.uint8)  # all zero weights
    codes[0, 5] = 3  # +2 * d
    codes[1, 63] = 0  # -1 * d
    w = Q2Weight.from_codes(codes, np.array([[0.5], [3.0]], np.float16), group=64)
    a = np.zeros(64, np.float32)
    a[5], a[63] = 1.5, -0.25
    y = reference.q2_0_gemv_vec(a.astype(BF16), w)
    assert y.astype(np.float32).tolist() == [1.5, 0.75]  # 1.5*2*0.5 ; -0.25*-1*3


def test_all_zero_weights_give_plus_zero_and_nan_is_canonical():
    w = Q2Weight.from_codes(np.ones((1, 64), np.uint8), np.ones((1, 1), np.float16), group=64)
    a = -np.ones(64, np.float32)
    assert reference.q2_0_gemv_vec(a.astype(BF16), w).view(np.uint16).tolist() == [0x0000]
    a[3] = np.inf  # 0 * inf = NaN
    for kernel in ("q2_0_gemv", "q2_0_gemv_vec"):
        assert getattr(reference, kernel)(a.astype(BF16), w).view(np.uint16).tolist() == [0x7FC0]


@pytest.mark.parametrize("family", ["q2_0_gemv", "q2_0_gemv_vec", "w4a16_gemv"])
def test_seed_reference_memory_is_bounded_by_its_chunk_not_by_m(monkeypatch, family):
    """Chunks shrunk to 2**16 elements: the peak beyond the bf16 output stays a few MB at
    M=20000, N=64 (before: an fp32 [M, N] result and its rounding temporaries, ~36 bytes per
    output element, 46 MB here); the bits equal the default chunking's."""
    import tracemalloc

    from q2gemv import reference
    from q2gemv.formats.bf16 import bits_to_bf16
    from q2gemv.formats.nvfp4 import Nvfp4Weight
    from q2gemv.reference import nvfp4 as ref_w4
    from q2gemv.reference import q2_0 as ref_q2

    rng = np.random.default_rng(10)
    m, n = 20000, 64
    if family.startswith("q2"):
        w = quantize_q2_0(rng.standard_normal((n, 64)).astype(np.float32), 64)
    else:
        w = Nvfp4Weight.from_float(rng.standard_normal((n, 16)).astype(np.float32))
    a = bits_to_bf16((rng.integers(0, 1 << 14, (m, w.k)) | 0x3C00).astype(np.uint16))
    fn = getattr(reference, family)
    want = fn(a[:3000], w).view(np.uint16)  # default chunks
    monkeypatch.setattr(ref_q2, "_CHUNK_ELEMS", 1 << 16)
    monkeypatch.setattr(ref_w4, "_CHUNK_ELEMS", 1 << 16)
    tracemalloc.start()
    try:
        y = fn(a, w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert y.shape == (m, n)
    assert peak - y.nbytes < 8_000_000, peak
    np.testing.assert_array_equal(y[:3000].view(np.uint16), want)


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


# -- the Q2_0 reference is chunked by rows of a --------------------------------------------------


def test_q2_reference_chunking_keeps_the_bits(monkeypatch):
    rng = np.random.default_rng(14)
    w = quantize_q2_0(rng.standard_normal((37, 256)).astype(np.float32), 64)
    a = (rng.standard_normal((21, 256)) * 4).astype(BF16)
    want = {fn: getattr(ref_q2, fn)(a, w).view(np.uint16) for fn in ("q2_0_gemv", "q2_0_gemv_vec")}
    for elems, rows in ((1, 1), (1000, 5), (1 << 14, 16)):
        monkeypatch.setattr(ref_q2, "_CHUNK_ELEMS", elems)
        monkeypatch.setattr(ref_q2, "_ROW_CHUNK", rows)
        for fn, bits in want.items():
            assert_bits_equal(getattr(ref_q2, fn)(a, w).view(np.uint16), bits, label=fn)


def test_q2_reference_memory_does_not_grow_with_m(monkeypatch):
    # unchunked, M=2048 activation rows x 64 weight rows x 64 lanes is 8M elements per
    # step (~350 MB with the f64 fma temporaries); the budget below allows 2**13 (~0.4 MB)
    monkeypatch.setattr(ref_q2, "_CHUNK_ELEMS", 1 << 13)
    rng = np.random.default_rng(15)
    w = quantize_q2_0(rng.standard_normal((64, 128)).astype(np.float32), 128)
    a = rng.standard_normal((2048, 128)).astype(BF16)
    tracemalloc.start()
    try:
        y = ref_q2.q2_0_gemv(a, w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    inherent = y.size * 4 * 3  # the fp32 [M, N] result and its bf16 conversion
    assert peak < inherent + (4 << 20), (peak, inherent)

"""The exact contract's device functions per activation format (q2gemv.cuda.exact_contract)
against q2gemv.reference.exact, bit for bit: fp16 here (bf16 has its own in
tests/cuda/q2_0/test_exact.py), through one-CTA test kernels on the simulator or a GPU."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda, int32

from q2gemv.cuda import exact_contract as xc
from q2gemv.formats.act import BF16, FP16
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference import exact as rex


def test_bf16_names_are_the_bf16_build():
    """The historical names are the bf16 build of the factory, which is built once per format."""
    dc = xc.device_contract(BF16)
    assert xc.device_contract(BF16) is dc and xc.device_contract(FP16) is not dc
    assert xc.fixed_point_one is dc.fixed_point_one
    assert xc.row_exponent is dc.row_exponent and xc.round_fixed_bf16 is dc.round_fixed
    assert (dc.nan, dc.inf) == (0x7FC0, 0x7F80)
    assert (xc.device_contract(FP16).nan, xc.device_contract(FP16).inf) == (0x7E00, 0x7C00)
    assert xc.act_suffix(BF16) == "" and xc.act_suffix(FP16) == "+fp16"


@functools.cache
def _round_kernel(act):
    round_fixed = xc.device_contract(act).round_fixed

    @cuda.jit
    def kernel(hi, lo, p, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = round_fixed(hi[i], lo[i], p[i])

    return kernel


def _split(v: int, rng) -> tuple[int, int]:
    lo = (v & 0xFFFFFFFF) + (int(rng.integers(0, 2**30)) << 32)
    hi = (v - lo) >> 32
    assert hi * 2**32 + lo == v
    return hi, lo


def _fp16_round_cases(rng) -> list[tuple[int, int]]:
    """Zero, the subnormal step 2**-24 and its half (a tie to 0), the largest value (65504) and
    the overflow boundary (65520 = a tie to Inf), ties in the normal range, wide values."""
    cases = [(0, 0), (1, -24), (1, -25), (3, -26), (-1, -25), (-3, -26), (1, -26)]
    cases += [(2047, 5), (4095, 4), (-4095, 4), (4093, 4), (1, 16), (-1, 16), (2**40, -24)]
    cases += [(2**93 - 1, -120), (-(2**93) + 1, -80), (2**63, -88), (2**63 + 1, -88)]
    for _ in range(120):  # random widths and signs, p over the kernel's range
        nb = int(rng.integers(0, 94))
        v = int.from_bytes(rng.bytes(12), "little") % (1 << nb) if nb else 0
        cases.append((-v if rng.random() < 0.5 else v, int(rng.integers(-130, 20))))
    for _ in range(80):  # ties and their neighbours at 11 significant bits
        nb = int(rng.integers(13, 94))
        mant = int(rng.integers(2048, 4096)) | 1  # 12 bits, odd: a tie when cut to 11
        v = (mant << (nb - 12)) + int(rng.integers(-1, 2))
        target = int(rng.integers(-28, 18))  # the result's exponent: subnormal .. overflow
        cases.append((-v if rng.random() < 0.5 else v, target - nb + 1))
    return cases


def test_round_fixed_fp16_matches_nearest_bits():
    rng = np.random.default_rng(41)
    cases = _fp16_round_cases(rng)
    hl = [_split(v, rng) for v, _ in cases]
    hi = np.array([h for h, _ in hl], np.int64)
    lo = np.array([x for _, x in hl], np.uint64)
    p = np.array([p for _, p in cases], np.int64)
    out = np.zeros(len(cases), np.uint32)
    _round_kernel(FP16)[1, len(cases)](hi, lo, p, out)
    want = np.array([rex.nearest_bits(v, p, FP16) for v, p in cases], np.uint32)
    assert_bits_equal(out, want, "round_fixed fp16", context=lambda i: f"case {cases[i[0]]}")
    # hand-derived: 2**-24 is the smallest subnormal, 2**-25 a tie to +0 / -0, 3 * 2**-26 up
    assert want[1:7].tolist() == [0x0001, 0x0000, 0x0001, 0x8000, 0x8001, 0x0000]
    # 2047 * 32 = 65504 (the largest), 4095 * 16 = 65520 (the tie past it: Inf), 4093 * 16 =
    # 65488 (the tie between 65472 and 65504: even 65472), 2**16 and 2**40 * 2**-24: Inf
    assert want[7:14].tolist() == [0x7BFF, 0x7C00, 0xFC00, 0x7BFE, 0x7C00, 0xFC00, 0x7C00]


@functools.cache
def _fixed_point_kernel(act):
    fixed_point_one = xc.device_contract(act).fixed_point_one

    @cuda.jit
    def kernel(h, e, out):
        i = cuda.grid(1)
        for j in range(i, h.size, cuda.gridsize(1)):
            out[j] = fixed_point_one(h[j], e[j])

    return kernel


def test_fixed_point_one_fp16_matches_the_reference():
    """Random finite fp16 and every subnormal, each at E = its own exponent and at E + 1..23."""
    rng = np.random.default_rng(42)
    subs = [x | s for x in range(0, 1024, 7) for s in (0, 0x8000)] + [0x03FF, 0x0001, 0x8001]
    h = rng.integers(0, 2**16, 3000).astype(np.uint16)
    h = np.concatenate([np.array(subs + [0x7BFF, 0xFBFF, 0x0400], np.uint16), h])
    h = h[(h & 0x7C00) != 0x7C00][:1500]
    lg = np.where(
        (h & 0x7C00) != 0,
        ((h >> 10) & 31).astype(np.int64) - 15,
        np.floor(np.log2(np.maximum(h & 0x3FF, 1))).astype(np.int64) - 24,
    )
    e = np.minimum(lg + rng.choice([0, 0, 1, 11, 12, 13, 14, 23], h.size), 15)
    out = np.zeros(h.size, np.int64)
    _fixed_point_kernel(FP16)[1, 64](h, e.astype(np.int32), out)
    # the reference's row [h, 2**e]: its E is e (2**e a normal or a subnormal fp16)
    top = np.where(e >= -14, (e + 15).clip(1, 30) << 10, 1 << (e + 24).clip(0, 9))
    A, E, _ = rex.fixed_point(np.stack([h, top.astype(np.uint16)], axis=1), FP16)
    assert np.array_equal(E, e)
    assert_bits_equal(out, A[:, 0], "fixed_point_one fp16", context=lambda i: f"h={h[i]:04X}")
    assert (out == 2**23 - 2**12).any() and (out == -(2**23 - 2**12)).any()  # the widest A


@functools.cache
def _row_exponent_kernel(act):
    row_exponent = xc.device_contract(act).row_exponent

    @cuda.jit
    def kernel(a, out):
        s_lg = cuda.shared.array(32, int32)
        e = row_exponent(a, s_lg, a.shape[1])
        if cuda.threadIdx.x == 0:
            out[cuda.blockIdx.x] = e

    return kernel


@pytest.mark.parametrize("act", [BF16, FP16], ids=lambda f: f.name)
def test_row_exponent_matches_the_reference(act):
    """One CTA of 32 threads per row of 64: normals, subnormals, zeros, -0, NaN, Inf rows."""
    rng = np.random.default_rng(43)
    mb, emax = act.mant_bits, act.exp_max
    rows = rng.integers(0, 2**16, (8, 64)).astype(np.uint16)
    rows &= np.uint16(~(1 << (mb + act.exp_bits - 1)) & 0xFFFF)  # no exponent field of all ones
    rows[1] &= np.uint16(0x8000 | ((1 << mb) - 1))  # subnormals only
    rows[2] = 0
    rows[3] = 0x8000  # -0 only: E = 0
    rows[4, 7] = act.nan
    rows[5, 63] = act.inf | 0x8000  # -Inf
    rows[6, :] = 0
    rows[6, 40] = 1  # the smallest subnormal alone
    rows[7, 0] = (emax - 1) << mb | ((1 << mb) - 1)  # the largest finite value
    out = np.zeros(8, np.int32)
    _row_exponent_kernel(act)[8, 32](rows, out)
    _, E, special = rex.fixed_point(rows, act)
    want = np.where(special, xc.SPECIAL_ROW, E).astype(np.int32)
    assert_bits_equal(out, want, f"row_exponent {act.name}")
    assert out[6] == act.min_quantum and out[7] == act.bias  # hand-derived

"""The exact contract's device functions per activation format (q2gemv.cuda.exact_contract)
against q2gemv.reference.exact, bit for bit, bf16 and fp16, through one-CTA test kernels on
the simulator or a GPU. (acc_add with the bf16 rounding: tests/cuda/q2_0/test_exact.py.)"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from numba import cuda, int32

from q2gemv.cuda import exact_contract as xc
from q2gemv.formats.act import BF16, FP16
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference import exact as rex

from ..edge_values import finite_sample


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
    """``v = hi * 2**32 + lo`` with ``lo`` a random uint64 below 2**62 (the kernel's sums are such)."""
    lo = (v & 0xFFFFFFFF) + (int(rng.integers(0, 2**30)) << 32)
    hi = (v - lo) >> 32
    assert hi * 2**32 + lo == v and abs(hi) < 2**62
    return hi, lo


def _random_round_cases(rng, act, randoms: int, p_range, ties: int, target_range) -> list:
    """``randoms`` values of random widths and signs at ``p`` in ``p_range``, then ``ties``
    ties of ``act``'s significand (and their neighbours) with the result's exponent in
    ``target_range`` (subnormal .. overflow), both above and below 64 bits."""
    b = act.mant_bits + 2  # bits of an odd mantissa that is a tie when cut to the significand
    cases = []
    for _ in range(randoms):
        nb = int(rng.integers(0, 94))
        v = int.from_bytes(rng.bytes(12), "little") % (1 << nb) if nb else 0
        cases.append((-v if rng.random() < 0.5 else v, int(rng.integers(*p_range))))
    for _ in range(ties):
        nb = int(rng.integers(b + 1, 94))
        mant = int(rng.integers(1 << (b - 1), 1 << b)) | 1
        v = (mant << (nb - b)) + int(rng.integers(-1, 2))
        target = int(rng.integers(*target_range))
        cases.append((-v if rng.random() < 0.5 else v, target - nb + 1))
    return cases


def _round_fixed(act, cases, hl) -> np.ndarray:
    """The format's ``round_fixed`` of each case ``(v, p)`` given as ``hl[i] = (hi, lo)``."""
    hi = np.array([h for h, _ in hl], np.int64)
    lo = np.array([x for _, x in hl], np.uint64)
    p = np.array([p for _, p in cases], np.int64)
    out = np.zeros(len(cases), np.uint32)
    _round_kernel(act)[1, len(cases)](hi, lo, p, out)
    return out


def test_round_fixed_bf16_matches_bf16_nearest():
    rng = np.random.default_rng(31)
    cases = [(0, 0), (0, -200), (1, -133), (1, -134), (-1, -134), (3, -134), (255, -134)]
    cases += [(255, 120), (511, 119), (-511, 119), ((511 << 40) - 1, 79), (1, 128), (-1, 0)]
    cases += [(2**93 - 1, -213), (-(2**93) + 1, 40), (2**64, -64), (2**64 - 1, -64)]
    cases += [(-(2**32), 0), (-(2**40), 3), (2**63, -300)]
    # 64 bits dropped at once (r == 64): 2**-134 is a tie (to 0), a unit more rounds up
    cases += [(2**63, -197), (2**63 + 1, -197), (2**63 - 1, -197), (-(2**63) - 1, -197)]
    cases += [(2**64, -198), (2**64 + 1, -198)]  # the same through the high word's sticky bit
    # p over the kernel's range (E - 46)
    cases += _random_round_cases(rng, BF16, 150, (-179, 82), 100, (-141, 130))
    hl = [_split(v, rng) for v, _ in cases]
    hl[0] = (-1, 2**32)  # zero as -1 * 2**32 + 2**32
    out = _round_fixed(BF16, cases, hl)
    want = np.array([rex.bf16_nearest(v, p) for v, p in cases], np.uint32)
    assert_bits_equal(out, want, "round_fixed_bf16", context=lambda i: f"case {cases[i[0]]}")


def test_round_fixed_fp16_matches_nearest_bits():
    """Zero, the subnormal step 2**-24 and its half (a tie to 0), the largest value (65504) and
    the overflow boundary (65520 = a tie to Inf), ties in the normal range, wide values."""
    rng = np.random.default_rng(41)
    cases = [(0, 0), (1, -24), (1, -25), (3, -26), (-1, -25), (-3, -26), (1, -26)]
    cases += [(2047, 5), (4095, 4), (-4095, 4), (4093, 4), (1, 16), (-1, 16), (2**40, -24)]
    cases += [(2**93 - 1, -120), (-(2**93) + 1, -80), (2**63, -88), (2**63 + 1, -88)]
    cases += _random_round_cases(rng, FP16, 120, (-130, 20), 80, (-28, 18))
    out = _round_fixed(FP16, cases, [_split(v, rng) for v, _ in cases])
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


def _check_fixed_point_one(act, h, rng, offsets, label: str) -> np.ndarray:
    """``fixed_point_one`` of the finite patterns ``h``, each at ``E`` = its own exponent plus
    one of ``offsets`` (at most the format's largest), against the reference's row
    ``[h, 2**E]`` (whose E is E: 2**E a normal or a subnormal of the format); returns it."""
    mb, bias, qmin = act.mant_bits, act.bias, act.min_quantum
    field = ((h >> mb) & act.exp_max).astype(np.int64)
    sub_lg = np.floor(np.log2(np.maximum(h & ((1 << mb) - 1), 1))).astype(np.int64) + qmin
    lg = np.where(field != 0, field - bias, sub_lg)
    e = np.minimum(lg + rng.choice(offsets, h.size), bias)
    out = np.zeros(h.size, np.int64)
    _fixed_point_kernel(act)[1, 64](h, e.astype(np.int32), out)
    top = np.where(
        e >= 1 - bias, (e + bias).clip(1, 2 * bias) << mb, 1 << (e - qmin).clip(0, mb - 1)
    )
    A, E, _ = rex.fixed_point(np.stack([h, top.astype(np.uint16)], axis=1), act)
    assert np.array_equal(E, e)
    assert_bits_equal(out, A[:, 0], label, context=lambda i: f"h={h[i]:04X} E={e[i]}")
    return out


def test_fixed_point_one_matches_the_reference():
    """Random finite bf16 and every subnormal, each at E = its own exponent and at E + 1..23."""
    rng = np.random.default_rng(33)
    subs = [x | s for x in range(128) for s in (0, 0x8000)]
    h = finite_sample(rng, 0x7F80, 2500, subs + [0x7F7F, 0xFF7F, 0x0080, 0x437F, 0xC37F])
    out = _check_fixed_point_one(BF16, h, rng, [0, 0, 1, 8, 9, 10, 11, 23], "fixed_point_one")
    assert (out == 255 * 2**15).any() and (out == -(255 * 2**15)).any()


def test_fixed_point_one_fp16_matches_the_reference():
    """Random finite fp16 and every subnormal, each at E = its own exponent and at E + 1..23."""
    rng = np.random.default_rng(42)
    subs = [x | s for x in range(0, 1024, 7) for s in (0, 0x8000)] + [0x03FF, 0x0001, 0x8001]
    h = rng.integers(0, 2**16, 3000).astype(np.uint16)
    h = np.concatenate([np.array(subs + [0x7BFF, 0xFBFF, 0x0400], np.uint16), h])
    h = h[(h & 0x7C00) != 0x7C00][:1500]
    out = _check_fixed_point_one(
        FP16, h, rng, [0, 0, 1, 11, 12, 13, 14, 23], "fixed_point_one fp16"
    )
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

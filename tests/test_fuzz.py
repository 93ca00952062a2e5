"""Property-based fuzzing (hypothesis): kernels equal the references bit for bit, and friends.

Two settings profiles, both derandomized (a fixed seed per test, so a failure
reproduces on every run and machine; ``print_blob`` prints the exact
example to replay with ``@reproduce_failure``):

* ``q2gemv-ci`` — the CUDA simulator (one OS thread per CUDA thread, ~0.3-1 s
  per 256-thread CTA on 2 cores): kernel properties draw tiny shapes
  (N <= 17, K <= 256, M <= 9) and few examples (:data:`SIM_EXAMPLES`); the
  pure properties (round-trips, chunking, ``select_tier``) draw hundreds.
* ``q2gemv-gpu`` — a real GPU: the ``gpu``-marked twins below draw N up to
  4097, K up to 5120, M up to 40 and :data:`GPU_EXAMPLES` examples each.
  Run: ``python -m pytest -q -m gpu tests/test_fuzz.py --hypothesis-show-statistics``.

Shapes: N in 1..17 (CI), K = blocks * group, M from 1 to 9 (the batch-8
chunk boundary); codes include 3; scales include NaN/Inf/subnormal/zero;
activations include NaN/Inf/-0/subnormal/the bf16 maximum.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import q2gemv
from q2gemv import Nvfp4Weight, Q2Weight, api
from q2gemv import reference as ref
from q2gemv.dispatch.nvfp4_tiers import (
    BATCH16,
    BATCH32,
    EXACT_M_LAST,
    FIRST_EXACT_M,
    W4A16_BATCHM_WIDTHS,
    W4a16BatchmTiers,
    candidate_kernel_names,
    plan_w4a16,
    select_tier,
)
from q2gemv.dispatch.plan import batchm_launch_chunks, batchm_row_chunks
from q2gemv.formats import nvfp4 as nv
from q2gemv.formats import q2_0 as q2fmt
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal

_COMMON = dict(
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("q2gemv-ci", max_examples=200, **_COMMON)
settings.register_profile("q2gemv-gpu", max_examples=500, **_COMMON)
CI = settings.get_profile("q2gemv-ci")
GPU = settings.get_profile("q2gemv-gpu")

# simulator kernel properties (each example is 1-9 simulated launches): 8, was 15 (~30 s of
# CPU each at 15 on 2 cores); every kernel and tier also has its own fixed simulator tests
SIM_EXAMPLES = 8
PURE_EXAMPLES = 300  # round-trips, chunking, tier selection
GPU_EXAMPLES = 150  # each gpu-marked kernel property (both: 61-76 s on the H200, measured)

Q2_KERNELS = tuple(api.Q2_KERNELS)
Q2_M1 = {name for name, rows in api.Q2_KERNELS.items() if rows == 1}
W4_KERNELS = tuple(api.W4A16_KERNELS)

F16_SPECIALS = np.array(
    [0x7C00, 0xFC00, 0x7E00, 0x0001, 0x8001, 0x03FF, 0x0000, 0x8000, 0x7BFF], np.uint16
)
E4M3_SPECIALS = np.array([0x7F, 0xFF, 0x01, 0x81, 0x00, 0x80, 0x7E, 0xFE], np.uint8)
BF16_SPECIALS = np.array(
    [0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x8001, 0x7F7F, 0xFF7F, 0x0080], np.uint16
)


def _sprinkle(rng, flat: np.ndarray, specials: np.ndarray, count: int) -> None:
    if count and flat.size:
        idx = rng.choice(flat.size, size=min(count, flat.size), replace=False)
        flat[idx] = specials[rng.integers(0, specials.size, idx.size)]


# GPU shapes: the NumPy reference bounds the budget (~13 s for N=4097 K=5120 M=40 on Q2_0),
# so large sizes are drawn from a few edge values and M is capped by N*K*M <= MAC_BUDGET.
MAC_BUDGET = 4097 * 5120 * 4


def _sizes(hi: int, big: tuple[int, ...]):
    """Any size 1..hi for the simulator; on the GPU (hi > 40) small sizes or a few large edges."""
    if hi <= 40:
        return st.integers(1, hi)
    return st.one_of(st.integers(1, 40), st.sampled_from([b for b in big if b <= hi]))


def _m_cap(max_m: int, n: int, k: int) -> int:
    return max(1, min(max_m, MAC_BUDGET // (n * k)))


@st.composite
def activations(draw, m: int, k: int) -> np.ndarray:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1.0, 1e-30, 1e30]))
    a = (rng.standard_normal((m, k)) * scale).astype(np.float32).astype(BF16)
    _sprinkle(rng, a.view(np.uint16).reshape(-1), BF16_SPECIALS, draw(st.integers(0, 3)))
    return a


@st.composite
def q2_weights(draw, max_n: int, max_blocks: int) -> Q2Weight:
    group = draw(st.sampled_from([64, 128]))
    n = draw(_sizes(max_n, (127, 129, 1031, 4097)))
    k = group * draw(_sizes(max_blocks, (5120 // group,)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mode = draw(st.sampled_from(["random", "random", "all3", "zero-weights", "raw-bytes"]))
    if mode == "raw-bytes":  # any byte string is a valid block_q2_0 buffer
        raw = rng.integers(0, 256, n * q2fmt.row_bytes(k, group), dtype=np.uint8)
        return Q2Weight(raw, n, k, group)
    fill = {"all3": 3, "zero-weights": 1}.get(mode)
    codes = (
        rng.integers(0, 4, (n, k), dtype=np.uint8)
        if fill is None
        else np.full((n, k), fill, np.uint8)
    )
    scales = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
    _sprinkle(rng, scales.view(np.uint16).reshape(-1), F16_SPECIALS, draw(st.integers(0, 2)))
    return Q2Weight.from_codes(codes, scales, group=group)


@st.composite
def w4_weights(draw, max_n: int, max_groups: int) -> Nvfp4Weight:
    n = draw(_sizes(max_n, (127, 129, 1031, 4097)))
    k = 16 * draw(_sizes(max_groups, (33, 320)))  # 33 groups: K = 528 crosses the 512 tile
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = rng.integers(0x20, 0x48, (n, k // 16), dtype=np.uint8)
    _sprinkle(rng, scales.reshape(-1), E4M3_SPECIALS, draw(st.integers(0, 2)))
    g = draw(st.sampled_from([1.0, 1.0, 0.5, 3.0e-3, 2.0**-126, 0.0, float("inf"), float("nan")]))
    return Nvfp4Weight.from_codes(codes, scales, g)


# -- kernels == references -----------------------------------------------------------------


def _q2_property(data, max_n, max_blocks, max_m, max_m1):
    w = data.draw(q2_weights(max_n, max_blocks), label="weight")
    kernel = data.draw(st.sampled_from(Q2_KERNELS), label="kernel")
    m = data.draw(st.integers(1, _m_cap(max_m1 if kernel in Q2_M1 else max_m, w.n, w.k)), label="m")
    a = data.draw(activations(m, w.k), label="a")
    want = getattr(ref, kernel)(a, w).view(np.uint16)
    got = q2gemv.gemv(a, w, kernel=kernel, backend="cuda").view(np.uint16)
    assert_bits_equal(got, want, label=f"{kernel} n={w.n} k={w.k} group={w.group} m={m}")


def _w4_property(data, max_n, max_groups, max_m, exact=False):
    """A tier (or the seed contract's automatic tier plan, None) against the seed reference;
    with ``exact``, also the default call (the exact contract) against its reference."""
    w = data.draw(w4_weights(max_n, max_groups), label="weight")
    choices = (None,) + W4_KERNELS + (("exact",) if exact else ())
    kernel = data.draw(st.sampled_from(choices), label="kernel")
    m = data.draw(st.integers(1, _m_cap(max_m, w.n, w.k)), label="m")
    a = data.draw(activations(m, w.k), label="a")
    if kernel == "exact":  # numerics=None: the NVFP4 default
        from q2gemv.reference.exact import w4a16_gemv_exact

        got = q2gemv.gemv(a, w, backend="cuda")
        want = w4a16_gemv_exact(a, w).view(np.uint16)
        assert_bits_equal(got.view(np.uint16), want, label=f"exact n={w.n} k={w.k} m={m}")
        return
    want = ref.w4a16_gemv(a, w).view(np.uint16)
    if kernel is None:  # the seed contract's automatic tier plan
        got = q2gemv.gemv(a, w, backend="cuda", numerics="seed")
    else:  # a forced tier, chunked by its own max_m
        from q2gemv.cuda.nvfp4 import seed as w4cuda

        got = w4cuda.w4a16_gemv(a, w, kernel=kernel)
    assert_bits_equal(got.view(np.uint16), want, label=f"{kernel} n={w.n} k={w.k} m={m}")


@settings(CI, max_examples=SIM_EXAMPLES)
@given(st.data())
def test_q2_kernels_equal_reference(data):
    _q2_property(data, max_n=17, max_blocks=2, max_m=9, max_m1=2)


@settings(CI, max_examples=SIM_EXAMPLES)
@given(st.data())
def test_w4a16_kernels_equal_reference(data):
    _w4_property(data, max_n=17, max_groups=16, max_m=9)


@pytest.mark.gpu
@settings(GPU, max_examples=GPU_EXAMPLES)
@given(st.data())
def test_gpu_q2_kernels_equal_reference(data):
    _q2_property(data, max_n=4097, max_blocks=80, max_m=40, max_m1=9)


@pytest.mark.gpu
@settings(GPU, max_examples=GPU_EXAMPLES)
@given(st.data())
def test_gpu_w4a16_kernels_equal_reference(data):
    _w4_property(data, max_n=4097, max_groups=320, max_m=40, exact=True)


# -- pack / unpack / dequant round-trips ----------------------------------------------------


@settings(CI, max_examples=PURE_EXAMPLES)
@given(w=q2_weights(max_n=9, max_blocks=4))
def test_q2_pack_unpack_dequant_round_trip(w):
    codes, scales = w.codes(), w.scales()
    assert codes.max() <= 3
    again = Q2Weight.from_codes(codes, scales, group=w.group)
    assert np.array_equal(again.raw, w.raw)  # bytes -> (codes, d) -> bytes is the identity
    assert np.array_equal(Q2Weight.from_bytes(w.raw.tobytes(), w.n, w.k, w.group).raw, w.raw)
    # the documented bit layout, element by element
    raw = w.raw.reshape(w.n, w.k // w.group, q2fmt.block_bytes(w.group))
    j = np.arange(w.k)
    blk, within = j // w.group, j % w.group
    want = (raw[:, blk, 2 + within // 4] >> (2 * (within % 4))) & 3
    assert np.array_equal(codes, want)
    assert np.array_equal(
        scales.view(np.uint16),
        raw[:, :, 0].astype(np.uint16) | (raw[:, :, 1].astype(np.uint16) << 8),
    )
    d = np.repeat(scales.astype(np.float32), w.group, axis=1)
    with np.errstate(invalid="ignore"):
        want_deq = (codes.astype(np.float32) - 1) * d
    assert np.array_equal(w.dequantize().view(np.uint32), want_deq.view(np.uint32))


@settings(CI, max_examples=PURE_EXAMPLES)
@given(w=w4_weights(max_n=9, max_groups=8))
def test_nvfp4_pack_unpack_dequant_round_trip(w):
    codes = w.codes()
    assert np.array_equal(nv.pack_nibbles(codes), w.packed)
    assert np.array_equal(codes[:, 0::2], w.packed & 0xF)  # even element in the low nibble
    again = Nvfp4Weight.from_codes(codes, np.array(w.scales), w.global_scale)
    assert np.array_equal(again.packed, w.packed)
    assert np.float32(again.global_scale).tobytes() == np.float32(w.global_scale).tobytes()
    e = nv.E2M1_VALUES[codes].astype(np.float64)
    s = np.repeat(nv.e4m3_decode(w.scales).astype(np.float64), 16, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        want = (e * s * w.global_scale).astype(np.float32)  # e*s is exact, so one rounding
    got = w.dequantize()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(got)
    assert np.array_equal(got[ok], want[ok])


# -- chunking covers every row exactly once ------------------------------------------------------


@settings(CI, max_examples=PURE_EXAMPLES)
@given(
    m=st.integers(0, 300), max_m=st.integers(1, 40), k=st.integers(1, 9000), n=st.integers(1, 9000)
)
def test_batchm_chunks_cover_each_row_once(m, max_m, k, n):
    chunks = list(batchm_row_chunks(m, max_m))
    rows = [r for r0, c in chunks for r in range(r0, r0 + c)]
    assert rows == list(range(m))
    assert all(1 <= c <= max_m for _, c in chunks)
    assert [(r0 * k * 2, r0 * n * 2, c) for r0, c in chunks] == list(
        batchm_launch_chunks(m, k, n, max_m)
    )


@settings(CI, max_examples=PURE_EXAMPLES)
@given(
    m=st.integers(0, 200),
    present=st.lists(st.booleans(), min_size=5, max_size=5),
    exact_m=st.booleans(),
    kernel=st.sampled_from((None,) + Q2_KERNELS),
)
def test_plans_cover_each_row_once(m, present, exact_m, kernel):
    names = [n for n, p in zip(candidate_kernel_names()[:5], present, strict=True) if p]
    tiers = W4a16BatchmTiers.resolve(names)
    for plan in (plan_w4a16(m, tiers, exact_m=exact_m), q2gemv.plan(_Q2W, m, kernel)):
        rows = [r for r0, c, _ in plan for r in range(r0, r0 + c)]
        assert rows == list(range(m))
        for _, c, name in plan:
            cap = {BATCH16: 16, BATCH32: 32}.get(name) or (
                1
                if name in Q2_M1
                else 32
                if name == "q2_0_gemv_exact"
                else 8
                if name.startswith("q2")
                else int(name.split("batch")[1][:1])
            )
            assert 1 <= c <= cap, (name, c)


_Q2W = Q2Weight(np.zeros(q2fmt.row_bytes(64, 64), np.uint8), 1, 64, 64)


# -- select_tier agrees with its specification ----------------------------------------------


def _select_tier_spec(m, present, exact_m):
    """Narrowest width covering m among present, allowed widths; None for m == 0 or none."""
    ok = [
        i
        for i, w in enumerate(W4A16_BATCHM_WIDTHS)
        if m >= 1 and w >= m and present[i] and (exact_m or not FIRST_EXACT_M <= i <= EXACT_M_LAST)
    ]
    return min(ok, key=lambda i: W4A16_BATCHM_WIDTHS[i]) if ok else None


@settings(CI, max_examples=PURE_EXAMPLES)
@given(
    m=st.integers(0, 70),
    present=st.lists(st.booleans(), min_size=5, max_size=5),
    exact_m=st.booleans(),
)
def test_select_tier_matches_spec(m, present, exact_m):
    got = select_tier(m, present, exact_m)
    assert got == _select_tier_spec(m, present, exact_m)
    if got is not None:  # it covers m and never picks a hidden exact-M width
        assert W4A16_BATCHM_WIDTHS[got] >= m and present[got]
        assert exact_m or W4A16_BATCHM_WIDTHS[got] in (4, 8)

"""The Q2_0 numba kernels against their references, bit for bit.

Runs on the CUDA simulator in CI (tiny shapes: it runs one OS thread per
CUDA thread) and on the GPU where there is one.
"""

from __future__ import annotations

import numpy as np
import pytest

import q2gemv
from q2gemv import Q2Weight, reference
from q2gemv import reference as ref
from q2gemv.cuda.q2_0 import seed as q2cuda
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal
from tests.edge_values import NAN, Q2_KERNELS, ZERO, _acts, _bits, _q2_weight
from tests.q2_cases import random_acts, random_weight

M1_KERNELS = ("q2_0_gemv", "q2_0_gemv_vec", "q2_0_gemv_vec_rt4")


def _check(kernel, a, w, label):
    got = q2gemv.gemv(a, w, kernel=kernel, backend="cuda")
    want = getattr(reference, kernel)(a, w)
    assert_bits_equal(got.view(np.uint16), want.view(np.uint16), label)
    return got


# Output rows per 256-thread CTA (warps per row or rows per warp in the module docstring).
ROWS_PER_CTA = {"q2_0_gemv": 4, "q2_0_gemv_vec": 8, "q2_0_gemv_vec_rt4": 32}


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("kernel", M1_KERNELS)
@pytest.mark.parametrize("n,blocks", [(1, 1), (7, 2), (9, 4), ("cta+1", 1)])
def test_m1_kernels(kernel, group, n, blocks):
    """N=1; tails (7, 9: a partial first or second CTA at 4 or 8 rows a CTA); several blocks.

    ``cta+1``: one row past a whole CTA, so the second CTA holds only a tail:
    N=33 for rt4 (32 rows a CTA), the same 4+1 and 8+1 rows for the others
    (N=33 there added only simulated CTAs: 9 for the baseline, 5 for vec).
    """
    if n == "cta+1":
        n = ROWS_PER_CTA[kernel] + 1
    rng = np.random.default_rng(n * 10 + blocks)
    k = group * blocks
    w = random_weight(rng, n, k, group)
    _check(kernel, random_acts(rng, 1, k)[0], w, f"{kernel} g{group} n={n} k={k}")


@pytest.mark.parametrize("kernel", M1_KERNELS)
def test_m1_kernels_two_rows_each_one_launch(kernel):
    rng = np.random.default_rng(5)
    w = random_weight(rng, 9, 256, 128)
    _check(kernel, random_acts(rng, 2, 256), w, kernel)


def _batchm_case(group, m):
    """N=7 (a tail inside the one 8-row CTA), K = 2 blocks."""
    rng = np.random.default_rng(100 + m)
    k = 2 * group
    return random_acts(rng, m, k), random_weight(rng, 7, k, group)


@pytest.fixture(scope="module", params=[64, 128], ids=lambda g: f"g{g}")
def batchm_m17(request):
    """M=17 through batchm once per group: launches of 8, 8 and 1 rows (shared by two tests)."""
    a, w = _batchm_case(request.param, 17)
    got = q2gemv.gemv(a, w, kernel="q2_0_gemv_vec_batchm", backend="cuda")
    return a, w, got


def test_batchm_m17_crosses_both_chunk_boundaries(batchm_m17):
    """M=17 is launched as rows 0-7, 8-15 and 16 (:func:`q2gemv.dispatch.plan.batchm_row_chunks`).

    One run crosses what M = 8, 9 and 1 crossed one launch sequence each: the
    M=8 build on a whole chunk, the 8|9 boundary (and 16|17) at a row offset,
    and the M=1 (direct-load) build on the last row.
    """
    a, w, got = batchm_m17
    assert q2gemv.plan(w, 17, "q2_0_gemv_vec_batchm") == [
        (0, 8, "q2_0_gemv_vec_batchm"),
        (8, 8, "q2_0_gemv_vec_batchm"),
        (16, 1, "q2_0_gemv_vec_batchm"),
    ]
    want = reference.q2_0_gemv_vec_batchm(a, w)
    assert_bits_equal(got.view(np.uint16), want.view(np.uint16), f"batchm g{w.group} m=17")
    assert got.shape == (17, 7)


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("m", [0, 2, 7])
def test_batchm_every_chunk_boundary(group, m):
    """M = 0 (no launch) and the builds M=1 and 17 do not reach (2: 4096-code tiles, 7).

    M = 1, 8, 9 and 17 run in :func:`test_batchm_m17_crosses_both_chunk_boundaries`.
    """
    a, w = _batchm_case(group, m)
    got = _check("q2_0_gemv_vec_batchm", a, w, f"batchm g{group} m={m}")
    assert got.shape == (m, 7)


def test_batchm_rows_equal_the_m1_kernel_rows(batchm_m17):
    """Batch invariance on the device itself, not only through the references.

    Rows 0 and 8 of the M=8 launches and row 16 of the M=1 launch against q2_0_gemv_vec.
    """
    a, w, batched = batchm_m17
    for r in (0, 8, 16):
        single = q2gemv.gemv(a[r], w, kernel="q2_0_gemv_vec", backend="cuda")
        assert_bits_equal(batched[r].view(np.uint16), single.view(np.uint16), f"row {r}")


@pytest.mark.parametrize("kernel", ["q2_0_gemv", "q2_0_gemv_vec_batchm"])
def test_special_activations_and_scales(kernel):
    rng = np.random.default_rng(7)
    # fp16 d: 0, -0, subnormal, max, Inf, NaN in the first blocks
    w = random_weight(rng, 9, 512, 64, scale_bits=[0x0000, 0x8000, 0x0001, 0x7BFF, 0x7C00, 0x7E00])
    a = random_acts(rng, 3 if kernel.endswith("batchm") else 1, 512, specials=True)
    got = _check(kernel, a, w, kernel)
    assert (got.view(np.uint16) == 0x7FC0).any()  # NaN reached the output in one pattern


def test_large_products_need_the_fused_add():
    """s = -max, then fma(+2, max, s) = max exactly; a separate 2 * max would be Inf."""
    k = 64
    codes = np.ones((1, k), np.uint8)
    codes[0, :2] = [2, 3]  # +1, +2
    w = q2gemv.Q2Weight.from_codes(codes, np.ones((1, 1), np.float16), group=64)
    a = np.zeros(k, np.float32)
    a[:2] = [-3.3895314e38, 3.3895314e38]
    a = a.astype(q2gemv.formats.bf16.BF16)
    for kernel in ("q2_0_gemv", "q2_0_gemv_vec"):
        got = _check(kernel, a, w, kernel)
        assert got.view(np.uint16)[0] == 0x7F7F  # max, not Inf


def test_raw_launch_refuses_more_rows_than_staged():
    rng = np.random.default_rng(8)
    w = random_weight(rng, 8, 128, 128)
    dw = q2cuda.DeviceQ2Weight.upload(w)
    from numba import cuda

    d_a = cuda.to_device(np.zeros((9, 128), np.uint16))
    d_out = cuda.device_array((9, 8), np.uint16)
    with pytest.raises(ValueError, match="m: kernel q2_0_gemv_vec_batchm serves 1..8"):
        q2cuda.launch_raw("q2_0_gemv_vec_batchm", d_a, dw, d_out, 9)
    with pytest.raises(ValueError, match="m: kernel q2_0_gemv_vec serves 1..1"):
        q2cuda.launch_raw("q2_0_gemv_vec", d_a[:2], dw, d_out[:2], 2)


def test_device_weight_reuse_and_out_argument():
    rng = np.random.default_rng(9)
    w = random_weight(rng, 7, 128, 128)
    dw = w.to_device()
    a = random_acts(rng, 2, 128)
    out = np.empty((2, 7), q2gemv.formats.bf16.BF16)
    res = q2gemv.gemv(a, dw, out=out, numerics="seed")  # a device weight implies cuda
    assert res is out
    want = reference.q2_0_gemv_vec_batchm(a, w)
    assert_bits_equal(out.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("m", [5, 9])
def test_batchm_register_tiled_candidate(m):
    """M=9 is launched as 8 + 1 rows: the M=8 and M=1 builds (m = 8 and 1 on their own
    crossed nothing more, at 2 simulated 16-row CTAs a launch); M=5 a build in between."""
    rng = np.random.default_rng(200 + m)
    w = random_weight(rng, 17, 128, 64)  # 17 rows: a tail inside the second 16-row CTA
    _check("q2_0_gemv_vec_batchm_rt2", random_acts(rng, m, 128), w, f"batchm_rt2 m={m}")


@pytest.mark.parametrize(
    "kernel, m", [("q2_0_gemv_vec_batchm", 8), ("q2_0_gemv_vec_batchm_rt2", 6)]
)
def test_several_staged_tiles(kernel, m):
    """K past one shared-memory tile: the word-to-lane map must survive the tile boundary.

    The batched kernels are built per M and stage tile_k(M) codes a tile
    (1024 at M = 6..8); K = 1536 is two tiles, the second one partial.
    """
    rng = np.random.default_rng(11)
    k = q2cuda.tile_k(m) + 512
    assert k == 1536
    w = random_weight(rng, 3, k, 128)
    _check(kernel, random_acts(rng, m, k), w, f"{kernel} m={m} k={k}")


def test_batched_kernels_are_built_per_m():
    """One build per M for the batched kernels (M a compile-time constant), one for the rest."""
    assert q2cuda.compiled("q2_0_gemv_vec_batchm", 3) is q2cuda.compiled("q2_0_gemv_vec_batchm", 3)
    assert q2cuda.compiled("q2_0_gemv_vec_batchm", 3) is not q2cuda.compiled(
        "q2_0_gemv_vec_batchm", 4
    )
    assert q2cuda.compiled("q2_0_gemv_vec_batchm_rt2") is q2cuda.compiled(
        "q2_0_gemv_vec_batchm_rt2", 8
    )
    assert q2cuda.compiled("q2_0_gemv_vec", 1) is q2cuda.compiled("q2_0_gemv_vec")
    with pytest.raises(ValueError, match="m: kernel q2_0_gemv_vec_batchm serves 1..8"):
        q2cuda.compiled("q2_0_gemv_vec_batchm", 9)
    with pytest.raises(ValueError, match="kernel: expected one of"):
        q2cuda.compiled("q2_0_gemv_nope")


@pytest.mark.parametrize("rows_per_warp, words", [(1, 2), (1, 3), (2, 2), (4, 3)])
def test_word_batches_of_any_size_keep_the_order(rows_per_warp, words):
    """The vec loop loads ``words`` words per lane before multiplying; the rest go one by one.

    K = 1152 (group 128) is 72 words: lanes 0-7 own 3, lanes 8-31 own 2, so
    batches of 2 and 3 leave different remainders on different lanes. Every
    batch size must give the bits of the one reference.
    """
    from numba import cuda

    rng = np.random.default_rng(300 + 10 * rows_per_warp + words)
    n, k = 9, 1152
    w = random_weight(rng, n, k, 128)
    a = random_acts(rng, 1, k)
    body = q2cuda._make_vec_body(1, rows_per_warp, words)
    kern = cuda.jit(q2cuda.SIGNATURE)(body)
    dw = q2cuda.DeviceQ2Weight.upload(w, keep_gguf=True)
    d_out = cuda.to_device(np.full((1, n), 0xFFFF, np.uint16))
    grid = -(-n // (8 * rows_per_warp))
    kern[grid, 256](cuda.to_device(a.view(np.uint16)), dw.b16, dw.bh, d_out, n, k, 128, 1)
    want = reference.q2_0_gemv_vec(a, w).view(np.uint16)
    assert_bits_equal(d_out.copy_to_host(), want, f"T={rows_per_warp} words={words}")


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

"""The exact-contract kernels (q2gemv.cuda.q2_0.exact) against q2gemv.reference.exact, bit for bit.

Only public entry points: ``road.run_kernel``, ``prepare_device`` / ``q2_launches``,
and the device helpers through one-CTA test kernels. The kernel body may be
reorganised freely; these results may not change. Runs on the CUDA
simulator in CI (tiny shapes) and on the GPU where there is one.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

from q2gemv import Q2Weight
from q2gemv.cuda import exact_contract as xc
from q2gemv.cuda.q2_0 import as_device_weight, exact_launch
from q2gemv.cuda.q2_0 import exact as ex
from q2gemv.cuda.runtime import launcher
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal
from q2gemv.host import call as road
from q2gemv.reference import exact as rex

from ...edge_values import finite_sample

NAN, INF, NEG_INF = 0x7FC0, 0x7F80, 0xFF80


def _acts(rng, m, k) -> np.ndarray:
    """bf16 bits [m, k]: a wide spread of magnitudes (small entries lose bits), a few zeros."""
    a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-28, 6, (m, k))
    a[rng.random((m, k)) < 0.05] = 0.0
    return a.astype(BF16).view(np.uint16)


def _weight(rng, n, k, group) -> Q2Weight:
    """Codes 0..3 and fp16 scales over the whole exponent range (subnormal, negative, large)."""
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    mant = rng.uniform(-2.0, 2.0, (n, k // group))
    scales = (mant * 2.0 ** rng.integers(-26, 15, (n, k // group))).astype(np.float16)
    return Q2Weight.from_codes(codes, scales, group=group)


def _check(a_bits, w, label):
    got = road.run_kernel("q2_0_gemv_exact", a_bits, w)
    want = rex.q2_0_gemv_exact(a_bits.view(BF16), w).view(np.uint16)
    assert got.dtype == np.uint16 and got.shape == (a_bits.shape[0], w.n)
    assert_bits_equal(got, want, label)
    return got


# (m, n, k, group): N = 1, tails (N % 16), more blocks than the CTA's 8 warps, every M build
CHUNKED_M = 17  # test_run_kernel_is_batch_invariant: launches of BUILD_MAX_M rows and one of 1
SHAPES = [
    (1, 1, 64, 64),
    (1, 17, 256, 128),  # a tail CTA of one row
    (2, 16, 64 * 9, 64),  # 9 blocks: warp 0 takes two
    (3, 5, 128 * 9, 128),
    (5, 7, 128, 64),
    (9, 3, 256, 128),  # a full launch and a 1-row launch (BUILD_MAX_M = 8)
]


def _chunks(m: int) -> list[int]:
    return [min(ex.BUILD_MAX_M, m - r0) for r0 in range(0, m, ex.BUILD_MAX_M)]


def test_shapes_cover_every_tile_build():
    every = {ex.tiles_for(m) for m in range(1, ex.BUILD_MAX_M + 1)}
    ms = [m for m, *_ in SHAPES] + [CHUNKED_M]
    assert {ex.tiles_for(rows) for m in ms for rows in _chunks(m)} == every
    assert len(_chunks(CHUNKED_M)) > 1
    for group in (64, 128):  # more blocks than warps, at each group
        assert any(g == group and k // g > ex.WARPS for _, _, k, g in SHAPES)


@pytest.mark.parametrize("m,n,k,group", SHAPES)
def test_run_kernel_matches_the_reference(m, n, k, group):
    rng = np.random.default_rng(1000 * m + n + k)
    _check(_acts(rng, m, k), _weight(rng, n, k, group), f"m={m} n={n} k={k} g{group}")


def _special_case(group):
    """Rows: NaN, normal, zeros (+-0), huge +, huge -, -Inf, subnormals, cancelling.

    Columns (N = 17: a tail CTA): Inf / NaN scales (columns 1-3, 9, 16), the
    largest fp16 with code 3, zero scales, duplicated halves for the
    cancelling row, random.
    """
    rng = np.random.default_rng(group)
    k, n = 2 * group, 17
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    scales = (rng.standard_normal((n, 2)) * 0.05).astype(np.float16)
    scales[1, 1] = np.inf
    scales[2, 0] = np.nan
    scales[3, 0] = -np.inf
    scales[9, 1] = np.inf  # rows g + 8 of the m16 tile (the odd lanes' flag)
    scales[16, 0] = np.nan  # the tail CTA's only row
    codes[4] = 3
    scales[4] = 65504.0
    scales[5] = [0.0, -0.0]
    scales[6] = [-65504.0, 2.0**-24]
    codes[7, :group] = codes[7, group:]
    scales[7, 1] = scales[7, 0]
    w = Q2Weight.from_codes(codes, scales, group=group)
    base = rng.standard_normal(k)
    a = np.zeros((8, k))
    a[0] = base
    a[0, 3] = np.nan
    a[1] = base
    a[3] = 1.0e38 * (1.0 + rng.random(k))  # beyond bf16 against large scales
    a[4] = -a[3]
    a[5] = base
    a[5, -1] = -np.inf
    a[6] = 2.0**-133 * rng.integers(1, 128, k) * np.sign(base)  # subnormals only
    a[7, :group] = base[:group]  # x and -x against duplicated halves
    a[7, group:] = -base[:group]
    bits = a.astype(BF16).view(np.uint16)
    bits[2, ::2] = 0x8000  # -0 in the zero row
    return bits, w


@pytest.mark.parametrize("group", [64, 128])
def test_run_kernel_special_values(group):
    a, w = _special_case(group)
    y = _check(a, w, f"special g{group}")
    assert (y[0] == NAN).all() and (y[5] == NAN).all()  # NaN, -Inf rows
    assert (y[:, [1, 2, 3, 9, 16]] == NAN).all()  # Inf, NaN, -Inf scale columns
    assert (y[2, 4:9] == 0).all() and (y[2, 10:16] == 0).all()  # a zero row gives +0
    assert (y[[1, 2, 3, 4, 6, 7], 5] == 0).all()  # zero scales give +0
    assert y[3, 4] == INF and y[4, 4] == NEG_INF  # overflow
    assert y[7, 7] == 0  # exact cancellation: +0
    assert (y[6, 4] & 0x7FFF) not in (0, INF)  # subnormal activations, large scales: normal


def test_run_kernel_is_batch_invariant():
    """Each row of a chunked call equals the reference and that row computed alone."""
    rng = np.random.default_rng(7)
    w = _weight(rng, 3, 128, 64)
    a = _acts(rng, CHUNKED_M, 128)
    a[9, 4] = 0x7FC0  # a NaN row inside the second chunk
    ys = _check(a, w, f"m={CHUNKED_M}")
    for i in (0, 9, CHUNKED_M - 1):
        assert np.array_equal(road.run_kernel("q2_0_gemv_exact", a[i : i + 1], w)[0], ys[i]), i


@pytest.mark.parametrize("warps", [ex.WIDE_WARPS, ex.NARROW_WARPS])
@pytest.mark.parametrize(
    "m, n, k, group",
    [
        (1, 17, 128 * 17, 128),  # 17 steps: warp 0 takes two (of 16; of 4: 5), a tail tile
        (3, 5, 64 * 3, 64),  # 2 steps (a half last one): warps 2.. have none
        (7, 16, 128 * 2, 128),
    ],
)
def test_every_cta_size_gives_the_same_bits(m, n, k, group, warps, monkeypatch):
    """The 16- and 4-warp builds (:func:`warps_for`; the 8-warp one is the other tests'):
    the same bits as the reference."""
    monkeypatch.setattr(ex, "warps_for", lambda n, k, m: warps)
    rng = np.random.default_rng(m * 100 + n)
    w = _weight(rng, n, k, group)
    ops = ex.ExactOperands.allocate(m, k)
    launches = ex.q2_launches(ops, as_device_weight(w), cuda.device_array((m, n), np.uint16))
    assert {block for _, _, block, _ in launches} == {32 * warps}
    _check(_acts(rng, m, k), w, f"{warps}-warp CTAs m={m} n={n} k={k} g{group}")


@pytest.mark.parametrize(
    "m, n, k, group, parts, warps",
    [
        (1, 17, 128 * 5, 128, 3, 8),  # 5 steps in parts of 2, 2 and 1; a tail tile
        (3, 5, 64 * 5, 64, 4, 2),  # 3 steps (a half last one) in parts of 1: the last is empty
        (9, 16, 256, 128, 2, 2),  # a chunk of 8 rows, then one of 1 on the same workspace
    ],
)
def test_k_split_across_ctas_gives_the_same_bits(m, n, k, group, parts, warps, monkeypatch):
    """K split over ``gridDim.y`` CTAs (:func:`parts_for`), the parts' sums added by integer
    atomics: the same bits as the reference, a NaN scale or a special row in any part
    included, and the workspace left zero for the next launch (the same call twice)."""
    monkeypatch.setattr(ex, "warps_for", lambda n, k, m: warps)
    monkeypatch.setattr(ex, "parts_for", lambda n, k, m, w: parts)
    rng = np.random.default_rng(m * 1000 + n + parts)
    w = _weight(rng, n, k, group)
    if m == 3:
        scales = w.scales()
        scales[1, -1] = np.nan  # in the last part's block of row 1
        scales[4, 0] = np.inf  # in the first part's block of row 4
        w = Q2Weight.from_codes(w.codes(), scales, group=group)
    a = _acts(rng, m, k)
    a[m // 2, k - 1] = INF  # a special activation row
    ops = ex.ExactOperands.allocate(m, k)
    launches = ex.q2_launches(ops, as_device_weight(w), cuda.device_array((m, n), np.uint16))
    assert {grid for _, grid, _, _ in launches} == {(-(-n // ex.ROWS_PER_CTA), parts)}
    first = _check(a, w, f"K split in {parts}, m={m} n={n} k={k} g{group}")
    assert np.array_equal(_check(a, w, "the same call again"), first)


def test_warps_for_follows_the_measured_rule(h200_knobs):
    """The CTA sizes of the H200 sweep (``benchmarks/results/2026-12-03_exact_launch_sweep/
    v7_warps_split``), at the knobs of ``tuning.json``."""
    wide, base, narrow = ex.WIDE_WARPS, ex.WARPS, ex.NARROW_WARPS
    assert ex.warps_for(1024, 4096, 1) == wide  # 64 tiles: wide at every M
    assert ex.warps_for(1024, 4096, ex.BUILD_MAX_M) == wide
    assert ex.warps_for(4096, 4096, 1) == wide  # 256 tiles: wide at 1 or 2 rows
    assert ex.warps_for(4096, 14336, 2) == wide
    assert ex.warps_for(4096, 14336, 3) == base  # more rows: 8 warps
    assert ex.warps_for(4096, 4096, ex.BUILD_MAX_M) == base  # 256 tiles: too few for 4 warps
    assert ex.warps_for(1024, 2048, 1) == base  # 16 steps: not two for each of 16 warps
    assert ex.warps_for(28672, 4096, 1) == narrow  # 1792 tiles, 32 steps
    assert ex.warps_for(14336, 4096, 4) == narrow  # 896 tiles
    assert ex.warps_for(6144, 4096, 4) == base  # 384 tiles: narrow only past 4 rows
    assert ex.warps_for(6144, 4096, 5) == narrow
    assert ex.warps_for(5120, 5120, ex.BUILD_MAX_M) == narrow  # 320 tiles, 40 steps
    assert ex.warps_for(5120, 5120, 1) == base
    assert ex.warps_for(16384, 16384, 1) == base  # 128 steps: never narrow
    assert ex.warps_for(16384, 16384, ex.BUILD_MAX_M) == base
    assert ex.parts_for(1024, 4096, 1, wide) == 1  # K split across CTAs: never on an H200


def test_cta_warps_reads_its_knobs():
    """The rule is the knobs' (a GPU's entry may differ): each threshold moves the choice."""
    from q2gemv.cuda.exact_contract import cta_warps

    kn = {
        "wide_tiles": 10, "wide_tiles_few_rows": 20, "wide_max_m": 1,
        "narrow_max_steps": 40, "narrow_min_tiles": {"2": 100, "8": 50},
    }  # fmt: skip
    assert cta_warps(10, 32, 8, kn) == ex.WIDE_WARPS
    assert cta_warps(20, 32, 1, kn) == ex.WIDE_WARPS and cta_warps(20, 32, 2, kn) == ex.WARPS
    assert cta_warps(10, 31, 1, kn) == ex.WARPS  # fewer than 2 steps for each of 16 warps
    assert cta_warps(100, 40, 2, kn) == ex.NARROW_WARPS and cta_warps(99, 40, 2, kn) == ex.WARPS
    assert cta_warps(50, 40, 3, kn) == ex.NARROW_WARPS  # the key 8 serves 3..8 rows
    assert cta_warps(50, 40, 9, kn) == ex.NARROW_WARPS  # past the last key: the last key's
    assert cta_warps(1000, 41, 1, kn) == ex.WARPS  # K too long for 4 warps


def test_ptx_specs_are_the_builds_the_launcher_picks():
    """The PTX tests compile every M group and Q2_0 group at 8 warps in bf16 and fp16, and each
    other CTA size the launcher picks (on the measured shapes) at every M group in bf16 and
    group 128."""
    picked = {
        (ex.tiles_for(m), ex.warps_for(n, k, m))
        for n, k in ((1024, 4096), (4096, 4096), (16384, 16384), (28672, 4096), (6144, 4096))
        for m in range(1, ex.BUILD_MAX_M + 1)
    }
    assert {warps for _, warps in picked} == set(ex.CTA_WARPS)
    want = {
        f"q2_0_gemv_exact@m{2 * nt}g{group}{ex.build_suffix(warps)}"
        for nt in ex.TILES
        for warps in ex.CTA_WARPS
        for group in ((64, 128) if warps == ex.WARPS else (128,))
    }
    assert {f"q2_0_gemv_exact@m{2 * nt}g128{ex.build_suffix(w)}" for nt, w in picked} <= want
    fp16 = {f"{n}+fp16" for n in want | {"exact_prepare"} if "w" not in n.split("@")[-1]}
    names = [name for name, _, _ in ex.ptx_specs()]
    assert sorted(names) == sorted(want | {"exact_prepare"} | fp16)


def test_launches_choose_the_cta_size_per_chunk():
    """A call of 9 rows on a small grid: the 8-row chunk takes 8 warps, the 1-row chunk 16."""
    m, n, k = 9, 4096, 4096
    w = as_device_weight(_weight(np.random.default_rng(3), n, k, 128))
    ops = ex.ExactOperands.allocate(m, k)
    launches = ex.q2_launches(ops, w, cuda.device_array((m, n), np.uint16))
    assert [block for _, _, block, _ in launches] == [32 * ex.WARPS, 32 * ex.WIDE_WARPS]


def test_q2_launches_chunk_by_max_m():
    """Narrow weights: chunks of MAX_M rows, each in unbatched launches of BUILD_MAX_M rows."""
    rng = np.random.default_rng(8)
    w = _weight(rng, 3, 64, 64)
    m = ex.MAX_M + ex.BUILD_MAX_M + 1
    ops = ex.ExactOperands.allocate(m, 64)  # launching nothing: only the launch list
    dw = as_device_weight(w)
    launches = ex.q2_launches(ops, dw, cuda.device_array((m, 3), np.uint16))
    assert len(launches) == ex.MAX_M // ex.BUILD_MAX_M + 2
    assert [a[-1] for *_, a in launches] == [0, 8, 16, 24, 32, 40]  # each launch's first row
    with pytest.raises(ValueError, match="out"):
        ex.q2_launches(ops, dw, cuda.device_array((m, 4), np.uint16))
    with pytest.raises(ValueError, match="m: an unbatched q2_0_gemv_exact build serves"):
        ex.tiles_for(ex.BUILD_MAX_M + 1)


def test_wide_weights_take_one_batched_launch_per_chunk(h200_knobs, monkeypatch):
    """From ``batched_min_tiles`` row tiles on, a chunk of 9..32 rows is one launch of the
    batched build (its one-word build here), and the bits stay the reference's; 8 rows or
    fewer stay unbatched. Then the rule is replaced so that a small weight counts as wide."""
    from q2gemv.cuda.q2_0 import exact_batched as xb

    # the measured split (v9_one_word): batched on these weights, 8-row launches on those
    for n, k in ((14336, 4096), (16384, 16384), (17408, 5120), (5120, 17408)):
        assert ex.batched_for(n, k, 9) and ex.batched_for(n, k, 32), (n, k)
        assert not ex.batched_for(n, k, 8), (n, k)
    for n, k in ((4096, 4096), (1024, 4096), (4096, 14336), (5120, 5120)):
        assert not ex.batched_for(n, k, 12) and not ex.batched_for(n, k, 32), (n, k)
    monkeypatch.setattr(ex, "batched_for", lambda n_, k_, m_: m_ > ex.BUILD_MAX_M)
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: xb.LaunchRule(2, 1))
    rng = np.random.default_rng(21)
    m, n, k = 37, 20, 256
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    hw = Q2Weight.from_codes(codes, (rng.standard_normal((n, 2)) * 0.05).astype(np.float16), 128)
    dw = as_device_weight(hw)
    a = _acts(rng, m, k)
    ops = ex.ExactOperands.allocate(m, k)
    launches = exact_launch.q2_launches(ops, dw, cuda.device_array((m, n), np.uint16))
    assert [a_[-1] for *_, a_ in launches] == [0, 32]
    assert launches[0][0].no_pdl and not hasattr(
        launches[1][0], "no_pdl"
    )  # one launch of 32 rows, one of 5
    assert launches[0][2] == 64 and launches[1][2] == 32 * ex.warps_for(n, k, 5)
    _check(a, hw, "m=37 on a 'wide' weight: a batched launch and an unbatched one")


def test_prepared_operands_serve_two_weights():
    """One prepare, two GEMVs (the same ExactOperands, no second prepare): both bit-exact."""

    rng = np.random.default_rng(9)
    a = _acts(rng, 3, 128)
    d_a = cuda.to_device(a)
    ops = ex.prepare_device(d_a)
    for group in (64, 128):
        w = _weight(rng, 5, 128, group)
        d_out = cuda.device_array((3, 5), np.uint16)
        ls = launcher.exact_launches("q2_0", d_a, as_device_weight(w), d_out, ops=ops)
        assert [name for *_, name in ls] == ["q2_0_gemv_exact"]  # no prepare
        launcher.launch_all(ls)
        want = rex.q2_0_gemv_exact(a.view(BF16), w).view(np.uint16)
        assert_bits_equal(d_out.copy_to_host(), want, f"g{group}")


# -- exact_prepare -------------------------------------------------------------


def _prepare_rows(k: int) -> np.ndarray:
    rng = np.random.default_rng(k)
    a = _acts(rng, 7, k)
    a[1, 9] = 0xFFC1  # a NaN: SPECIAL_ROW, A = 0
    a[2] = 0  # zeros: E = 0, A = 0
    a[3, 5] = 0x437F  # 255.0 (mantissa 0x7F): A = 255 * 2**15, the largest |A|
    a[3, 6] = 0xC37F
    a[4] = rng.integers(0, 0x80, k) | (rng.integers(0, 2, k) << 15)  # subnormals only
    a[5, -1] = 0x7F80  # +Inf in the last word
    a[6] = rng.integers(0, 2**16, k)  # every exponent
    a[6][(a[6] & 0x7F80) == 0x7F80] ^= 0x0100
    return a.astype(np.uint16)


@pytest.mark.parametrize("k", [64, 192])  # 4 words, and 12 words (3 units, most threads idle)
def test_prepare_device_matches_fixed_point(k):
    a = _prepare_rows(k)
    m = a.shape[0]
    ops = ex.prepare_device(cuda.to_device(a))
    assert (ops.m, ops.k) == (m, k)
    exps = ops.exponents.copy_to_host()
    limbs = ops.limbs.copy_to_host()
    sums = ops.unit_sums.copy_to_host()
    A, E, special = rex.fixed_point(a)
    assert special.tolist() == [False, True, False, False, False, True, False]
    assert exps.tolist() == np.where(special, ex.SPECIAL_ROW, E).tolist()
    assert A[3, 5] == 255 * 2**15 and A[3, 6] == -(255 * 2**15)
    assert sums.shape == (m, k // 64)
    assert sums.tolist() == A.reshape(m, k // 64, 64).sum(axis=2).tolist()
    # limb l of row m: byte 4i + b of word w (16 bytes) is byte l of A[16w + 4b + i] + 2**23
    off = (A + 2**23).astype(np.uint32)
    assert ((off >= 0) & (off < 2**24)).all()
    assert limbs.shape == (3 * m, k // 4) and limbs.dtype == np.uint32
    got = limbs.reshape(m, 3, k // 16, 4)  # [m, limb, word, i] uint32
    want = np.zeros_like(got)
    for b in range(4):
        for i in range(4):
            code = off.reshape(m, k // 16, 16)[:, :, 4 * b + i]  # [m, word]
            for li in range(3):
                want[:, li, :, i] |= ((code >> (8 * li)) & 0xFF) << (8 * b)
    assert np.array_equal(got, want)
    assert (got[[1, 5], 2] == 0x80808080).all() and (got[[1, 5], :2] == 0).all()  # A = 0


# -- device helpers ------------------------------------------------------------


@cuda.jit
def _acc_kernel(ps, shs, pexp, acc_hi, acc_lo, out):
    i = cuda.grid(1)
    if i < acc_hi.size:
        for j in range(ps.shape[1]):
            ex.acc_add(acc_hi, acc_lo, i, ps[i, j], shs[i, j])
        out[i] = xc.round_fixed_bf16(acc_hi[i], acc_lo[i], pexp[i])


def test_acc_add_is_exact():
    rng = np.random.default_rng(32)
    threads, terms = 64, 48
    lim = 2**43 - 1
    ps = rng.integers(-lim, lim + 1, (threads, terms), dtype=np.int64)
    ps[rng.random((threads, terms)) < 0.3] >>= 30  # small terms too
    shs = rng.integers(0, 30, (threads, terms)).astype(np.int32)
    ps[0], shs[0] = lim, 29  # the largest terms
    ps[1], shs[1] = -lim, 29
    ps[2], shs[2] = -1, 0  # many -1: borrows through the low word
    ps[3, ::2], ps[3, 1::2], shs[3] = lim, -lim, 29  # cancelling to exactly 0
    ps[4], shs[4] = np.int64(2**32 - 1), 0  # low-word carries
    pexp = rng.integers(-179, 40, threads).astype(np.int64)
    acc_hi = np.zeros(threads, np.int64)
    acc_lo = np.zeros(threads, np.uint64)
    out = np.zeros(threads, np.uint32)
    _acc_kernel[1, threads](ps, shs, pexp, acc_hi, acc_lo, out)
    for i in range(threads):
        total = sum(int(p) << int(s) for p, s in zip(ps[i], shs[i], strict=True))
        assert int(acc_hi[i]) * 2**32 + int(acc_lo[i]) == total, i
        assert int(out[i]) == rex.bf16_nearest(total, int(pexp[i])), i
    assert int(acc_hi[3]) * 2**32 + int(acc_lo[3]) == 0 and out[3] == 0


@cuda.jit
def _scale_kernel(h, mant, sh, neg):
    i = cuda.grid(1)
    for j in range(i, h.size, cuda.gridsize(1)):
        mant[j], sh[j], neg[j] = ex.scale_parts(h[j])


def test_scale_parts_matches_fp16_scale_parts():
    edges = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF]
    h = finite_sample(np.random.default_rng(34), 0x7C00, 2000, edges)
    mant, sh, neg = (np.zeros(h.size, t) for t in (np.int32, np.int32, np.bool_))
    _scale_kernel[1, 64](h, mant, sh, neg)
    rmant, rexp, _ = rex.fp16_scale_parts(h)
    assert np.array_equal(np.where(neg, -mant, mant), rmant)
    assert np.array_equal(sh - ex.SCALE_LSB, rexp)  # |d| = mant * 2**(sh - 24)
    assert sh.min() == 0 and sh.max() == 29  # acc_add's precondition 0 <= sh <= 29

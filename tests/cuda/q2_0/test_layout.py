"""The Q2_0 execution layout: host builder, its inverse, the device twins, and the kernel on it."""

from __future__ import annotations

import numpy as np
import pytest

import q2gemv
from q2gemv.formats import q2_0 as fmt
from q2gemv.formats import q2_0_layout as lay

SHAPES = [(1, 64, 64), (17, 192, 64), (33, 256, 128), (16, 128, 128), (5, 320, 64), (9, 384, 128)]


def _raw(rng, n, k, group, nan_at=None):
    raw = rng.integers(0, 256, n * fmt.row_bytes(k, group), dtype=np.uint8)
    blocks = raw.reshape(n, k // group, fmt.block_bytes(group))
    d = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
    if nan_at is not None:
        d[nan_at] = np.float16(np.nan)
    blocks[:, :, :2] = d.view(np.uint8).reshape(n, k // group, 2)
    return raw


@pytest.mark.parametrize("n,k,group", SHAPES)
def test_host_layout_round_trip_and_code_positions(n, k, group):
    rng = np.random.default_rng(n * k + group)
    raw = _raw(rng, n, k, group)
    codes, scales = lay.to_exec_layout(raw, n, k, group)
    assert codes.dtype == np.uint32 and codes.size == lay.code_words(n, k)
    assert scales.dtype == np.uint16 and scales.size == lay.scale_halves(n, k, group)
    np.testing.assert_array_equal(lay.from_exec_layout(codes, scales, n, k, group), raw)
    # every code where the module docstring says it is
    want = fmt.unpack_codes(raw, n, k, group)
    cw = codes.reshape(lay.tiles(n), lay.steps(k), 8, 4, 4)  # tile, step, g, t, word
    r, j = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    tile, rr = np.divmod(r, 16)
    step, ui = np.divmod(j // 64, 2)
    word = cw[tile, step, rr % 8, (j % 64) // 16, ui * 2 + rr // 8]
    np.testing.assert_array_equal((word >> (2 * (j % 16))) & 3, want)
    # scales: [tile, block, row in tile]; padding rows hold 0
    s = scales.reshape(lay.tiles(n), k // group, 16).transpose(0, 2, 1).reshape(-1, k // group)
    np.testing.assert_array_equal(s[:n].view(np.float16), fmt.unpack_scales(raw, n, k, group))
    assert not s[n:].any()


def test_layout_tiles_are_the_exact_kernels_rows():
    from q2gemv.dispatch import registry as kernels

    assert lay.TILE_ROWS == kernels.get("q2_0_gemv_exact").rows_per_cta == 16
    assert lay.UNIT * 2 == lay.UNIT * lay.STEP_UNITS == 128  # a step is one g128 block


def test_from_exec_layout_refuses_wrong_sizes():
    codes, scales = lay.to_exec_layout(np.zeros(2 * 34, np.uint8), 2, 128, 128)
    with pytest.raises(ValueError, match="codes: expected 128 uint32 words"):
        lay.from_exec_layout(codes[:-1], scales, 2, 128, 128)
    with pytest.raises(ValueError, match="scales: expected 16 uint16"):
        lay.from_exec_layout(codes, scales[:-1], 2, 128, 128)


@pytest.mark.parametrize("n,k,group", [(17, 192, 64), (9, 384, 128)])
def test_device_pack_and_unpack_equal_the_host(n, k, group):
    from numba import cuda

    from q2gemv.cuda.q2_0 import layout as dlay

    rng = np.random.default_rng(7)
    raw = _raw(rng, n, k, group)
    codes, scales = lay.to_exec_layout(raw, n, k, group)
    d_codes, d_scales = dlay.pack(cuda.to_device(raw.view(np.uint16)), n, k, group)
    np.testing.assert_array_equal(d_codes.copy_to_host(), codes)
    np.testing.assert_array_equal(d_scales.copy_to_host(), scales)
    back = dlay.unpack(cuda.to_device(codes), cuda.to_device(scales), n, k, group)
    np.testing.assert_array_equal(back.copy_to_host().view(np.uint8), raw)


def test_device_weight_holds_the_weight_once_unless_asked():
    rng = np.random.default_rng(3)
    n, k, group = 5, 192, 64
    w = q2gemv.Q2Weight.from_bytes(_raw(rng, n, k, group).tobytes(), n, k, group)
    dw = w.to_device()
    assert dw.b16 is None and dw.bh is None  # only the layout on the device
    a = rng.standard_normal((2, k)).astype(q2gemv.BF16)
    # a seed call rebuilds the GGUF bytes on the device, bit for bit
    y = q2gemv.gemv(a, dw, numerics="seed")
    want = q2gemv.gemv(a, w, numerics="seed", backend="reference")
    q2gemv.assert_bits_equal(y.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(dw.to_gguf(), w.raw)
    kept = w.to_device(keep_gguf=True)
    np.testing.assert_array_equal(kept.b16.copy_to_host().view(np.uint8), w.raw)
    with pytest.raises(ValueError, match="keep_gguf"):
        q2gemv.to_device(q2gemv.Nvfp4Weight.from_float(np.ones((16, 32), np.float32)), keep_gguf=1)


def test_from_buffers_repacks_into_its_own_layout():
    from numba import cuda

    from q2gemv.cuda.q2_0.weight import DeviceQ2Weight

    rng = np.random.default_rng(4)
    n, k, group = 9, 384, 128
    raw = _raw(rng, n, k, group)
    dw = DeviceQ2Weight.from_buffers(cuda.to_device(raw), n, k, group)
    codes, scales = lay.to_exec_layout(raw, n, k, group)
    np.testing.assert_array_equal(dw.codes.copy_to_host(), codes)
    np.testing.assert_array_equal(dw.scales.copy_to_host(), scales)


@pytest.mark.parametrize(
    "n,k,group,m,nan_at",
    [
        (17, 64 * 19, 64, 3, (16, 18)),  # odd unit count: the last step is half padded
        (5, 128 * 10, 128, 1, (2, 9)),  # more steps than warps: the prefetch path
        (20, 128 * 9, 128, 5, None),
    ],
)
def test_exact_kernel_on_the_layout_equals_the_reference(n, k, group, m, nan_at):
    rng = np.random.default_rng(n + k)
    w = q2gemv.Q2Weight.from_bytes(_raw(rng, n, k, group, nan_at).tobytes(), n, k, group)
    a = rng.standard_normal((m, k)).astype(q2gemv.BF16)
    a[0, 5] = a[0, 5] * 1000  # an outlier
    y = q2gemv.gemv(a, w)
    want = q2gemv.gemv(a, w, backend="reference")
    q2gemv.assert_bits_equal(y.view(np.uint16), want.view(np.uint16))
    if nan_at is not None:
        assert (y.view(np.uint16)[:, nan_at[0]] == 0x7FC0).all()


def test_out_overlapping_the_layout_is_refused(no_launch):
    from numba import cuda

    rng = np.random.default_rng(5)
    n, k, group = 16, 128, 128
    dw = q2gemv.Q2Weight.from_bytes(_raw(rng, n, k, group).tobytes(), n, k, group).to_device()
    d_a = cuda.to_device(rng.standard_normal((2, k)).astype(q2gemv.BF16).view(np.uint16))
    out = dw.codes.view(np.uint16)[: 2 * n].reshape(2, n)
    with pytest.raises(ValueError, match=r"overlap the weight's device buffer \(codes\)"):
        q2gemv.gemv(d_a, dw, out=out)


def test_a_host_weight_is_uploaded_in_the_form_its_contract_reads():
    """A seed-contract call on a host weight uploads the GGUF bytes only (no layout); an
    exact-contract one the layout only. Either makes the other at need."""
    from q2gemv.cuda.q2_0.weight import as_device_weight

    rng = np.random.default_rng(78)
    w = fmt.Q2Weight(_raw(rng, 3, 128, 64), 3, 128, 64)
    seed = as_device_weight(w, 0, "seed")
    assert seed.codes is None and seed.b16 is not None
    exact = as_device_weight(w, 0, "exact")
    assert exact.b16 is None and exact.codes is not None
    for got, want in zip(seed.exec_layout(), exact.exec_layout(), strict=True):
        np.testing.assert_array_equal(got.copy_to_host(), want.copy_to_host())


# -- one-word accumulator bases ------------------------------------------------------


def _bases_by_rows(d: np.ndarray, k: int, group: int) -> np.ndarray:
    """accumulator_bases of a weight with fp16 scales ``d`` [n, k / group] (codes 0)."""
    n = d.shape[0]
    w = fmt.Q2Weight.from_codes(np.zeros((n, k), np.uint8), d, group=group)
    _, scales = lay.to_exec_layout(w.raw, n, k, group)
    return lay.accumulator_bases(scales, n, k, group)


def _exact_bound_holds(d: np.ndarray, base: int) -> bool:
    """The bound, in Python integers: every row's sum of |m_b| below 2**32, each below 2**31."""
    bits = d.view(np.uint16).astype(int)
    for row in bits:
        total = 0
        for h in row:
            e, f = (h >> 10) & 31, h & 1023
            mant = f | 1024 if e else f
            if mant:
                m = mant << (max(e, 1) - 1 - base)
                if m >= 2**31:
                    return False
                total += m
        if total >= 2**32:
            return False
    return True


def test_accumulator_bases_take_the_tile_minimum_and_refuse_past_the_bound():
    group, k = 128, 128 * 3
    # 2**-14 (shift 0) and 64 (mant 1024, shift 20): sum 1024 + 2 * 2**30 < 2**32 -> base 0
    ok = np.array([[2.0**-14, 64.0, 64.0]], np.float16)
    assert _bases_by_rows(ok, k, group).tolist() == [0]
    assert _exact_bound_holds(ok, 0)
    # four blocks of 2**30 each: the sum reaches 2**32 -> no base
    over = np.array([[2.0**-14, 64.0, 64.0, 64.0, 64.0]], np.float16)
    assert _bases_by_rows(over, 128 * 5, group).tolist() == [lay.NO_BASE]
    assert not _exact_bound_holds(over, 0)
    # one multiplier of 2**31 (mant 1024 << 21): refused although the sum is below 2**32
    big = np.array([[2.0**-14, 128.0]], np.float16)
    assert _bases_by_rows(big, 256, group).tolist() == [lay.NO_BASE]
    # the base is the smallest shift of the nonzero scales; zeros and signs do not count
    d = np.array([[0.0, -0.5, 0.25], [0.125, -0.0, 1.0]], np.float16)
    assert _bases_by_rows(d, k, group).tolist() == [11]  # 0.125: exponent field 12, shift 11
    # a non-finite scale: that tile only has no base (rows 16.. are the second tile)
    d = (np.random.default_rng(1).standard_normal((20, 3)) * 0.05).astype(np.float16)
    d[17, 1] = np.inf
    assert _bases_by_rows(d, k, group)[1] == lay.NO_BASE and _bases_by_rows(d, k, group)[0] >= 0


@pytest.mark.parametrize("group", [64, 128])
def test_accumulator_bases_agree_with_the_bound_in_python_integers(group):
    rng = np.random.default_rng(group)
    seen = set()
    for spread in range(0, 30, 3):
        k = group * int(rng.integers(1, 40))
        lo = int(rng.integers(-14, 2))
        e = np.minimum(rng.integers(lo, lo + spread + 1, (16, k // group)), 14)
        d = rng.uniform(-2, 2, (16, k // group)) * 2.0**e
        d = d.astype(np.float16)
        (base,) = _bases_by_rows(d, k, group)
        mants = d.view(np.uint16) & 0x7FFF
        shifts = [max(int(h) >> 10, 1) - 1 for h in mants.ravel() if h & 0x7FFF]
        want = min(shifts) if shifts else 0
        assert base == (want if _exact_bound_holds(d, want) else lay.NO_BASE), (spread, k)
        seen.add(int(base) if base <= 0 else 1)
    assert seen == {lay.NO_BASE, 0, 1}  # refused, base 0 and a base above 0 all occurred

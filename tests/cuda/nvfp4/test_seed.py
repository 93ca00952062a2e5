"""W4A16 NVFP4 kernels (GPU, or the CUDA simulator): bit-equal to the reference and to each other.

Simulator cost is one OS thread per CUDA thread and about a third of a
second per reduced activation row per live CTA, so shapes are small and
chosen so every tier meets: N = 1, 7, 9, 17, 24 (one CTA, tails, several
CTAs), K = 16, 64, 528 (one group, several, two 512-element tiles), and the
M values each tier serves (1, 3, 4, 5, 7, 8, 9, 16, 17, 32, 33).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import q2gemv
from q2gemv import reference as ref
from q2gemv.cuda.nvfp4 import seed as kw
from q2gemv.cuda.nvfp4 import seed as w4cuda
from q2gemv.dispatch import nvfp4_tiers as T
from q2gemv.dispatch.nvfp4_tiers import BATCH8_RT2, W4a16BatchmTiers, plan_w4a16
from q2gemv.formats.nvfp4 import Nvfp4Weight
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference.nvfp4 import w4a16_gemv as reference
from tests.edge_values import NAN, PINF, ZERO, _acts, _bits, _w4_expected, _w4_weight
from tests.weight_cases import _acts as _api_acts
from tests.weight_cases import _nv_parts

BF16 = ml_dtypes.bfloat16


def _case(seed: int, m: int, n: int, k: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k)) * np.exp2(rng.integers(-6, 6, (n, k // 16)).repeat(16, axis=1))
    w = Nvfp4Weight.from_float(x.astype(np.float32))
    a = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-3, 3, (m, k)))).astype(BF16)
    return a, w


def _check(a, w, kernel=None, label=""):
    got = kw.w4a16_gemv(a, w, kernel=kernel)
    want = reference(a, w)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert_bits_equal(got.view(np.uint16), want.view(np.uint16), label or str(kernel))
    return got


# -- every kernel, against the reference ----------------------------------------------------

TIER_CASES = [
    # (kernel, m, n, k)
    ("w4a16_gemv_batch4", 1, 1, 16),
    ("w4a16_gemv_batch4", 3, 9, 528),
    ("w4a16_gemv_batch4", 4, 24, 64),
    ("w4a16_gemv_batch5", 5, 7, 64),
    ("w4a16_gemv_batch6", 5, 17, 16),
    ("w4a16_gemv_batch6", 6, 1, 528),
    ("w4a16_gemv_batch7", 7, 9, 16),
    ("w4a16_gemv_batch8", 8, 7, 64),
    ("w4a16_gemv_batch8", 5, 1, 528),
    (BATCH8_RT2, 8, 9, 64),
    (BATCH8_RT2, 7, 17, 16),
    (BATCH8_RT2, 3, 1, 528),
    ("w4a16_gemv_batch16", 9, 7, 64),
    ("w4a16_gemv_batch16", 16, 1, 528),
    ("w4a16_gemv_batch32", 17, 3, 16),
    ("w4a16_gemv_batch32", 32, 1, 528),
]


@pytest.mark.parametrize("kernel, m, n, k", TIER_CASES)
def test_kernel_matches_reference(kernel, m, n, k):
    a, w = _case(m * 1000 + n * 10 + k, m, n, k)
    _check(a, w, kernel)


def test_all_kernels_agree_with_each_other():
    a, w = _case(7, 2, 9, 64)
    outs = {name: kw.w4a16_gemv(a, w, kernel=name).view(np.uint16) for name in kw.KERNEL_NAMES}
    want = reference(a, w).view(np.uint16)
    for name, got in outs.items():
        assert_bits_equal(got, want, name)
        assert_bits_equal(got, outs["w4a16_gemv_batch4"], f"{name} vs batch4")


def test_forced_kernel_chunks_rows():
    # batch4 forced on 9 rows: launches of 4, 4, 1
    a, w = _case(11, 9, 7, 16)
    _check(a, w, "w4a16_gemv_batch4")


@pytest.mark.parametrize("m", [0, 1, 33])
def test_automatic_plan(m):
    a, w = _case(13 + m, m, 3, 16)
    tiers = W4a16BatchmTiers.resolve(kw.KERNEL_NAMES)
    if m == 33:
        assert [name for _, _, name in plan_w4a16(m, tiers)] == [
            "w4a16_gemv_batch32",
            "w4a16_gemv_batch4",
        ]
    y = _check(a, w, label=f"auto m={m}")
    assert y.shape == (m, 3)


def test_one_dimensional_input_and_device_weight_reuse():
    a, w = _case(17, 2, 9, 64)
    dw = kw.DeviceNvfp4Weight.upload(w)
    y = kw.w4a16_gemv(a, dw, kernel="w4a16_gemv_batch4")
    y0 = kw.w4a16_gemv(a[0], dw, kernel="w4a16_gemv_batch4")
    assert y0.shape == (9,)
    assert_bits_equal(y0.view(np.uint16), reference(a[0], w).view(np.uint16))
    assert_bits_equal(y.view(np.uint16), reference(a, w).view(np.uint16))


def test_strided_activations():
    a, w = _case(19, 6, 7, 64)
    _check(a[::2], w, "w4a16_gemv_batch4")


# -- the contract's order, special values -----------------------------------------------------


def _contract_case():
    """Four hand cases of the reference tests, one per (activation row, weight column).

    K = 1040 (65 groups): row/col 0 lane 0 accumulates groups 0, 32, 64 (2^24, 1, -2^24
    -> 0, exact 1); 1: the butterfly (lanes 0, 8, 16, 24 = 2^24, -2^24, 1, 1 -> 1.0);
    2: scale multiplied then added (-> 2^-23); 3: an fma keeping an fp32-overflowing
    product finite (-> bf16 max). Off-diagonal outputs are compared too.
    """
    k = 1040
    codes = np.zeros((4, k), np.uint8)
    scales = np.full((4, k // 16), 0x38, np.uint8)
    a = np.zeros((4, k), np.float32)
    for q, v in ((0, 2.0**24), (32, 1.0), (64, -(2.0**24))):
        codes[0, 16 * q] = 0x2
        a[0, 16 * q] = v
    for q, v in ((0, 2.0**24), (8, -(2.0**24)), (16, 1.0), (24, 1.0)):
        codes[1, 16 * q] = 0x2
        a[1, 16 * q] = v
    codes[2, [0, 512, 513]] = 0x2
    scales[2, 32] = 0x39
    a[2, [0, 512, 513]] = [-1.125, 1.0, 2.0**-23]
    big = float(np.uint16(0x7F7F).view(BF16))
    codes[3, [0, 1]] = [0x2, 0x4]
    a[3, [0, 1]] = [-big, big]
    w = Nvfp4Weight.from_codes(codes, scales, 1.0)
    return a.astype(BF16), w


@pytest.mark.parametrize("kernel", ["w4a16_gemv_batch4", BATCH8_RT2, "w4a16_gemv_batch32"])
def test_contract_order_cases(kernel):
    a, w = _contract_case()
    y = _check(a, w, kernel).view(np.uint16)
    assert [int(y[i, i]) for i in range(4)] == [0x0000, 0x3F80, 0x3400, 0x7F7F]


def _special_case(m: int, n: int, k: int):
    rng = np.random.default_rng(23)
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = rng.choice(
        np.array([0x38, 0x01, 0x07, 0x08, 0x7E, 0xFE, 0x80, 0x00, 0xB8, 0x23], np.uint8),
        (n, k // 16),
    )
    scales[1, 0] = 0x7F  # NaN scales poison columns 1 and 2
    scales[2, -1] = 0xFF
    w = Nvfp4Weight.from_codes(codes, scales, -0.75)
    bits = (rng.standard_normal((m, k)) * 4).astype(BF16).view(np.uint16)
    specials = np.array(
        [0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x0001, 0x8001, 0x007F, 0x8000, 0x7F7F, 0xFF7F],
        np.uint16,
    )
    idx = rng.integers(0, bits.size, 3 * specials.size)
    bits.reshape(-1)[idx] = np.resize(specials, idx.size)
    bits[0, :] = rng.choice(specials[4:8], k)  # one row of subnormals and zeros only
    return bits.view(BF16), w


@pytest.mark.parametrize(
    "kernel, m", [("w4a16_gemv_batch4", 4), (BATCH8_RT2, 3), ("w4a16_gemv_batch32", 2)]
)
def test_special_values(kernel, m):
    a, w = _special_case(m, 9, 64)
    y = _check(a, w, kernel).view(np.uint16)
    assert (y[:, 1] == 0x7FC0).all() and (y[:, 2] == 0x7FC0).all()


@pytest.mark.parametrize("g", [np.inf, -np.inf, np.nan, 0.0, -0.0, 2.0**-100])
def test_global_scale_extremes(g):
    a, w = _case(29, 2, 3, 32)
    w = Nvfp4Weight.from_parts(w.packed, w.scales, g)
    _check(a, w, "w4a16_gemv_batch4")


# -- bad calls: refused before anything launches ---------------------------------------------


@pytest.fixture
def no_launch(monkeypatch):
    def boom(name, *_):
        raise AssertionError(f"kernel {name} was reached")

    monkeypatch.setattr(kw, "compiled", boom)


def test_raw_launch_refuses_rows_beyond_max_m(no_launch):
    from numba import cuda

    a, w = _case(31, 5, 7, 16)
    dw = kw.DeviceNvfp4Weight.upload(w)
    d_a = cuda.to_device(a.view(np.uint16))
    d_out = cuda.device_array((5, 7), np.uint16)
    with pytest.raises(ValueError, match=r"m: kernel w4a16_gemv_batch4 serves 1\.\.4 rows"):
        kw.launch_raw("w4a16_gemv_batch4", d_a, dw, d_out, 5)
    with pytest.raises(ValueError, match="m:"):
        kw.launch_raw("w4a16_gemv_batch8", d_a[:0], dw, d_out[:0], 0)
    with pytest.raises(TypeError, match="m:"):
        kw.launch_raw("w4a16_gemv_batch8", d_a, dw, d_out, 5.0)
    with pytest.raises(ValueError, match="a: expected shape"):
        kw.launch_raw("w4a16_gemv_batch8", d_a[:4], dw, d_out, 5)
    with pytest.raises(ValueError, match="out: expected shape"):
        kw.launch_raw("w4a16_gemv_batch8", d_a, dw, d_out[:, :3], 5)
    with pytest.raises(TypeError, match="out: expected uint16"):
        kw.launch_raw("w4a16_gemv_batch8", d_a, dw, cuda.device_array((5, 7), np.float32), 5)
    with pytest.raises(ValueError, match="kernel"):
        kw.launch_raw("w4a16_gemv_batch9", d_a, dw, d_out, 5)


def test_api_refuses_bad_arguments(no_launch):
    a, w = _case(37, 2, 7, 32)
    with pytest.raises(TypeError, match="a:"):
        kw.w4a16_gemv(a.astype(np.float32), w)
    with pytest.raises(ValueError, match="a:"):
        kw.w4a16_gemv(a[None], w)
    with pytest.raises(ValueError, match="a: expected K=32"):
        kw.w4a16_gemv(a[:, :16], w)
    with pytest.raises(TypeError, match="weight"):
        kw.w4a16_gemv(a, np.zeros((7, 16), np.uint8))
    with pytest.raises(ValueError, match="kernel"):
        kw.w4a16_gemv(a, w, kernel="w4a16_gemv_batch64")
    with pytest.raises(TypeError, match="tiers"):
        kw.w4a16_gemv(a, w, tiers=[True] * 5)
    with pytest.raises(ValueError, match="n:"):
        kw.SPECS["w4a16_gemv_batch4"].grid(0)


# -- build table, resolution, PTX hook ---------------------------------------------------------


def test_specs_and_shared_memory_budget():
    assert set(kw.KERNEL_NAMES) == {
        *(f"w4a16_gemv_batch{w}" for w in (4, 5, 6, 7, 8, 16, 32)),
        BATCH8_RT2,
    }
    for spec in kw.SPECS.values():
        groups = kw.TILE_K // 16
        elem = 4 if kw.stage_f32(spec.max_m) else 2
        assert spec.max_m * 16 * (groups + 1) * elem <= 48 * 1024
        assert kw.TILE_K % 512 == 0
    assert kw.stage_f32(16) and not kw.stage_f32(32)
    assert kw.SPECS[BATCH8_RT2].cols == 2 and kw.SPECS[BATCH8_RT2].grid(17) == (2, 1, 1)
    assert kw.SPECS["w4a16_gemv_batch8"].grid(17) == (3, 1, 1)


def test_buildable_kernels_and_default_resolution(monkeypatch):
    assert kw.buildable_kernels(["w4a16_gemv_batch4", "nope"]) == ["w4a16_gemv_batch4"]
    real = kw.compiled

    def flaky(name):
        if name == "w4a16_gemv_batch5":
            raise RuntimeError("pretend this tier does not build here")
        return real(name)

    monkeypatch.setattr(kw, "compiled", flaky)
    tiers = W4a16BatchmTiers.resolve()
    assert tiers.kernels[1] is None and tiers.kernel(5, exact_m=True) == "w4a16_gemv_batch6"
    assert tiers.has_base()


def test_ptx_specs_cover_every_kernel():
    specs = kw.ptx_specs()
    assert [name for name, _, _ in specs] == list(kw.KERNEL_NAMES)
    assert all(sig == kw.SIGNATURE and callable(body) for _, body, sig in specs)


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


def test_w4a16_gemv_kernel_not_a_name(no_launch):
    with pytest.raises(TypeError, match=r"kernel: expected a kernel name"):
        w4cuda.w4a16_gemv(_api_acts(), Nvfp4Weight(*_nv_parts(), 1.0), kernel=["w4a16_gemv_batch4"])


def _tiers_with(name: str) -> W4a16BatchmTiers:
    """A table holding ``name`` at width 8, past the constructor's check (as a stale or
    hand-patched table would)."""
    t = W4a16BatchmTiers.resolve(available=T.candidate_kernel_names())
    object.__setattr__(t, "kernels", t.kernels[:4] + (name,))
    return t


def test_w4a16_gemv_checks_the_whole_plan_before_the_first_launch(no_launch):
    # M = 40: chunk 0..31 on batch32 would launch before chunk 32..39 reached the bad name
    a = _api_acts(40)
    with pytest.raises(ValueError, match=r"plan: launch 1: unknown kernel 'w4a16_gemv_bogus'"):
        w4cuda.w4a16_gemv(a, Nvfp4Weight(*_nv_parts(), 1.0), tiers=_tiers_with("w4a16_gemv_bogus"))
    with pytest.raises(ValueError, match=r"plan: launch 1 .*1\.\.4 rows of w4a16_gemv_batch4"):
        w4cuda.w4a16_gemv(a, Nvfp4Weight(*_nv_parts(), 1.0), tiers=_tiers_with("w4a16_gemv_batch4"))


def test_run_plan_checks_before_upload(no_launch, monkeypatch):
    uploads = []
    monkeypatch.setattr(w4cuda.DeviceNvfp4Weight, "upload", lambda *a, **k: uploads.append(a))
    plan = [(0, 32, "w4a16_gemv_batch32"), (32, 8, "nope")]
    with pytest.raises(ValueError, match=r"plan: launch 1: unknown kernel 'nope'"):
        w4cuda._run_plan(plan, _api_acts(40).view(np.uint16), Nvfp4Weight(*_nv_parts(), 1.0), 0)
    assert uploads == []

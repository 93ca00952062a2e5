"""The batched exact variant (q2gemv.cuda.q2_0.exact_batched) against q2gemv.reference.exact.

Run through the public call with ``kernel="q2_0_gemv_exact_batched"`` after registering the
variant; the CTA shape is forced small (1 or 2 warps) so the simulator stays quick, and every
code path is crossed: 1 to 4 column groups, both groups (a half last step at group 64), a K
split in 2 and 3 parts (the atomic sums and the last part's rounding), a part with no step, row
tails, non-finite scales on rows g and g + 8, NaN rows, a chunk of 32 rows and one of 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import q2gemv
from q2gemv.cuda.q2_0 import as_device_weight
from q2gemv.cuda.q2_0 import exact as ex
from q2gemv.cuda.q2_0 import exact_batched as xb
from q2gemv.cuda.runtime import launcher
from q2gemv.dispatch import registry as kernels
from q2gemv.formats.bf16 import BF16
from q2gemv.formats.q2_0 import Q2Weight
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference import exact as rex

from .test_exact import _acts, _special_case, _weight


@pytest.fixture
def batched():
    xb.register()
    yield xb.NAME
    kernels._unregister(xb.NAME)


def _check(a_bits, w, name, label):
    got = q2gemv.gemv(a_bits.view(BF16), w, kernel=name, backend="cuda").view(np.uint16)
    want = rex.q2_0_gemv_exact(a_bits.view(BF16), w).view(np.uint16)
    assert_bits_equal(got, want, label)
    return got


@pytest.mark.parametrize(
    "m, n, k, group, warps, parts, cols",
    [
        (3, 17, 256, 128, 1, 1, 1),  # one group, a tail tile in a second CTA
        (9, 20, 64 * 5, 64, 2, 2, 1),  # two groups, a half last step, K split in 2
        (20, 9, 128 * 3, 128, 1, 3, 1),  # three groups, one step a part
        (17, 5, 128, 128, 1, 2, 1),  # one step, two parts: the second has none
        (33, 3, 64, 64, 1, 1, 1),  # a launch of 32 rows (four groups) and one of 1
        (20, 40, 128 * 2, 128, 2, 1, 2),  # 2 warps a tile: 3 groups built as 4, 2 a warp
        (9, 17, 64 * 3, 64, 2, 2, 2),  # 2 warps a tile (a group each), split, a tail tile
    ],
)
def test_matches_the_reference(batched, monkeypatch, m, n, k, group, warps, parts, cols):
    rule = xb.LaunchRule(warps, parts, cols)
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: rule)
    rng = np.random.default_rng(m * 1000 + n)
    a = _acts(rng, m, k)
    a[m // 2, 3] = 0x7FC0  # a NaN row
    _check(a, _weight(rng, n, k, group), batched, f"m={m} n={n} k={k} g{group} {rule}")


def _narrow_weight(rng, n, k, group) -> Q2Weight:
    """Scales as a quantizer makes them (one magnitude, both signs): every tile has a base, so
    the one-word build runs."""
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    scales = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
    return Q2Weight.from_codes(codes, scales, group=group)


@pytest.mark.parametrize(
    "m, n, k, group, warps, parts",
    [
        (3, 17, 256, 128, 1, 1),  # one group, a tail tile
        (9, 20, 64 * 5, 64, 2, 2),  # two groups, a half last step, K split in 2
        (33, 3, 128 * 2, 128, 1, 3),  # 32 rows (four groups) and 1, a part with no step
    ],
)
def test_one_word_build_matches_the_reference(batched, monkeypatch, m, n, k, group, warps, parts):
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: xb.LaunchRule(warps, parts))
    rng = np.random.default_rng(m + n + k)
    hw = _narrow_weight(rng, n, k, group)
    w = as_device_weight(hw)
    bases, one_word = w.accumulator_bases()
    bases = bases.copy_to_host()
    assert one_word and (bases >= 0).all() and bases.max() > 0  # a base above 0 is crossed
    a = _acts(rng, m, k)
    a[m - 1, 5] = 0x7FC0  # a NaN row
    got = q2gemv.gemv(a.view(BF16), w, kernel=batched, backend="cuda").view(np.uint16)
    want = rex.q2_0_gemv_exact(a.view(BF16), hw).view(np.uint16)
    assert_bits_equal(got, want, f"one word m={m} n={n} k={k} g{group}")


def test_one_word_build_with_fp16_activations(batched, monkeypatch):
    """fp16 in and out through the one-word build, with a K split in 2: the fp16 rounding of
    the same two words."""
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: xb.LaunchRule(1, 2))
    rng = np.random.default_rng(78)
    m, n, k = 10, 17, 64 * 3
    a = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-20, 8, (m, k))).astype(np.float16)
    a[3] = rng.uniform(30000, 65504, k).astype(np.float16)  # sums past 65504: +-Inf
    hw = _narrow_weight(rng, n, k, 64)
    w = as_device_weight(hw)
    assert w.accumulator_bases()[1]
    got = q2gemv.gemv(a, w, kernel=batched, backend="cuda")
    want = rex.q2_0_gemv_exact(a, hw)
    assert got.dtype == np.float16 == want.dtype
    assert_bits_equal(got.view(np.uint16), want.view(np.uint16), "one word fp16")


def test_one_word_build_at_the_edge_of_its_bound(batched, monkeypatch):
    """Each row's multipliers sum to just under 2**32 against base 0 and every block sum is
    near +-2**31 (codes all 3 or all 0, the largest activations): partial sums near 2**62
    in one int64, still exact; a different sign per row."""
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: xb.LaunchRule(1, 1))
    group, k, n, m = 128, 128 * 3, 4, 2
    d = np.array([[2.0**-14, 64.0, 64.0]] * n, np.float16)
    d[1] *= -1
    d[3, 0] = 65504.0 / 2**11  # mant 2047, shift 18: the sum stays below 2**32
    codes = np.full((n, k), 3, np.uint8)
    codes[2] = 0
    hw = Q2Weight.from_codes(codes, d, group=group)
    w = as_device_weight(hw)
    assert w.accumulator_bases()[1]
    a = np.full((m, k), 255.0 / 128, np.float32).astype(BF16).view(np.uint16)  # A = 255 * 2**15
    a[1, ::2] ^= 0x8000  # alternating signs: cancellation through the 2**62 partials
    got = q2gemv.gemv(a.view(BF16), w, kernel=batched, backend="cuda").view(np.uint16)
    want = rex.q2_0_gemv_exact(a.view(BF16), hw).view(np.uint16)
    assert_bits_equal(got, want, "one word at its bound")


def test_special_values_through_a_split(batched, monkeypatch):
    """Inf/NaN scales on rows g and g + 8 reach their outputs through the split's sums."""
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: xb.LaunchRule(1, 2))
    a, w = _special_case(128)
    y = _check(a, w, batched, "special, 2 parts")
    assert (y[:, [1, 2, 3, 9, 16]] == 0x7FC0).all()


def test_split_workspace_is_left_zero_and_kept(batched, monkeypatch):
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: xb.LaunchRule(1, 2))
    rng = np.random.default_rng(4)
    m, n, k = 3, 5, 256
    w = as_device_weight(_weight(rng, n, k, 64))
    d_a = cuda.to_device(_acts(rng, m, k))
    ops = ex.prepare_device(d_a)
    plan = [(0, m, batched)]
    outs = []
    for _ in range(2):
        d_out = cuda.device_array((m, n), np.uint16)
        launcher.launch_all(launcher.launches("q2_0", "exact", plan, w, d_a, d_out, ops=ops))
        outs.append(d_out.copy_to_host())
    assert np.array_equal(outs[0], outs[1])
    assert len(ops._split) == 1  # made once, reused
    ((ws, cnt),) = ops._split.values()
    assert not ws.copy_to_host().any() and not cnt.copy_to_host().any()


def test_launch_rule_is_the_measured_one():
    """Pinned from the H200 entry of cuda/q2_0/tuning.json (the launch sweeps, M = 12, 16, 32:
    the fastest batched shape of each of these weights in v9_one_word)."""
    rule = xb.launch_rule
    assert rule(16384, 16384, 32) == xb.LaunchRule(8, 1)
    assert rule(14336, 4096, 16) == xb.LaunchRule(8, 1)
    assert rule(17408, 5120, 32) == xb.LaunchRule(4, 1)  # 136 CTAs of 8 warps: past one wave
    assert rule(5120, 17408, 12) == xb.LaunchRule(4, 4)
    assert rule(4096, 4096, 32) == xb.LaunchRule(4, 4)
    assert rule(4096, 14336, 16) == xb.LaunchRule(4, 4)
    assert rule(1024, 4096, 32) == xb.LaunchRule(4, 8)
    assert rule(16, 128, 3) == xb.LaunchRule(4, 1)  # one step: never split
    with pytest.raises(ValueError, match="m: q2_0_gemv_exact_batched serves 1..32"):
        rule(16, 128, 33)


def test_registering_changes_no_default():
    assert kernels.family("q2_0").exact_kernel == "q2_0_gemv_exact"
    spec = xb.register()
    try:
        assert spec.golden is False and spec.max_m == 32
        assert xb.register() is spec  # twice: the same entry
        assert kernels.family("q2_0").exact_kernel == "q2_0_gemv_exact"
    finally:
        kernels._unregister(xb.NAME)


def test_launch_rule_reads_the_knobs_of_this_gpu(tmp_path, monkeypatch):
    """The rule's knobs are data: another GPU's entry (or the default) changes the shapes."""
    import json
    from pathlib import Path

    from q2gemv.cuda.runtime import tuning

    src = Path(xb.__file__).parent / "tuning.json"
    table = json.loads(src.read_text())
    assert table["default"] in table["gpus"]
    other = dict(table["gpus"][table["default"]][xb.NAME], wide_tiles=10**9, narrow_warps=2)
    table["gpus"]["Other GPU"] = {"measured_by": "a test", xb.NAME: other}
    (tmp_path / "tuning.json").write_text(json.dumps(table))
    monkeypatch.setattr(xb, "__file__", str(tmp_path / "exact_batched.py"))
    try:
        tuning.set_gpu_name("NVIDIA Other GPU 80GB")
        assert xb.launch_rule(16384, 16384, 32).warps == 2  # never wide, 2 warps
        tuning.set_gpu_name("NVIDIA H200")
        assert xb.launch_rule(16384, 16384, 32) == xb.LaunchRule(8, 1)
        tuning.set_gpu_name("some unknown GPU")  # the default entry
        assert xb.launch_rule(16384, 16384, 32) == xb.LaunchRule(8, 1)
    finally:
        tuning.set_gpu_name(None)


def test_fp16_activations_through_a_split(batched, monkeypatch):
    """fp16 in, fp16 out: the batched build of the fp16 format (the operands carry it), a K
    split in 2 (the last part rounds), NaN / subnormal / near-65504 rows, against the fp16
    reference."""
    monkeypatch.setattr(xb, "launch_rule", lambda n_, k_, m_: xb.LaunchRule(1, 2, 1))
    rng = np.random.default_rng(77)
    m, n, k = 5, 17, 64 * 3
    a = (rng.standard_normal((m, k)) * 2.0 ** rng.integers(-20, 8, (m, k))).astype(np.float16)
    a[1, 4] = np.nan
    a[2] = (rng.integers(-1023, 1024, k) * 2.0**-24).astype(np.float16)  # subnormals only
    a[3] = rng.uniform(30000, 65504, k).astype(np.float16)  # sums past 65504: +-Inf
    w = _weight(rng, n, k, 64)
    got = q2gemv.gemv(a, w, kernel=xb.NAME, backend="cuda")
    want = rex.q2_0_gemv_exact(a, w)
    assert got.dtype == np.float16 == want.dtype
    assert_bits_equal(got.view(np.uint16), want.view(np.uint16), "batched fp16")
    assert (want.view(np.uint16)[1] == 0x7E00).all()

"""fp16 activations through the exact kernels (both families, the prepared road) against the
reference, bit for bit, on the simulator (or a GPU): the smallest shapes that cross a tail CTA,
a half last step (g64), both groups, two B tiles, and the specials (NaN/Inf rows, NaN scales,
subnormal inputs and results, overflow to +-Inf, underflow to -0)."""

from __future__ import annotations

import numpy as np
import pytest

import q2gemv
from q2gemv import Nvfp4Weight, Q2Weight
from q2gemv.golden.check import assert_bits_equal

F16 = np.float16
NAN = 0x7E00


def _acts(rng, m: int, k: int) -> np.ndarray:
    """fp16 [m, k]: rows 0.. random over the whole fp16 range (subnormals too), then a NaN
    row, a -Inf row, a subnormals-only row, a row of large values (sums past 65504)."""
    a = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-26, 14, (m, k))
    a[rng.random((m, k)) < 0.05] = 0.0
    a = a.astype(F16)
    if m >= 5:
        a[1, 5] = np.nan
        a[2, -1] = -np.inf
        a[3] = (rng.integers(-1023, 1024, k) * 2.0**-24).astype(F16)  # subnormals only
        a[4] = (rng.uniform(30000, 65504, k) * np.sign(rng.standard_normal(k))).astype(F16)
    return a


def _q2_weight(rng, n: int, k: int, group: int) -> Q2Weight:
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    scales = rng.uniform(-2, 2, (n, k // group)) * 2.0 ** rng.integers(-24, 8, (n, k // group))
    scales = scales.astype(F16)
    scales[2, 0] = np.nan  # a bad column
    scales[16 % n, -1] = np.inf  # the tail CTA's row
    codes[3] = 3  # every weight +2: with row 4's large values, +-Inf
    scales[3] = 4.0
    scales[5] = 2.0**-24  # subnormal scale: tiny results that round to +-0 or subnormals
    return Q2Weight.from_codes(codes, scales, group=group)


def _bits(x) -> np.ndarray:
    return np.asarray(x).view(np.uint16)


def _check(a, w, label):
    got = q2gemv.gemv(a, w, backend="cuda")
    want = q2gemv.gemv(a, w, backend="reference")
    assert got.dtype == F16 and want.dtype == F16 and got.shape == want.shape
    assert_bits_equal(_bits(got), _bits(want), label)
    return _bits(want)


@pytest.mark.parametrize("m,n,k,group", [(5, 17, 192, 64), (5, 17, 256, 128)])
def test_q2_exact_fp16_matches_the_reference(m, n, k, group):
    """5 rows (B tiles of 2 rows: 3 of them), N = 17 (a tail CTA of one row), g64 with 3 units
    (a half last step) and g128."""
    rng = np.random.default_rng(k + group)
    a = _acts(rng, m, k)
    want = _check(a, _q2_weight(rng, n, k, group), f"q2 fp16 m={m} n={n} k={k} g{group}")
    assert (want[1] == NAN).all() and (want[2] == NAN).all() and (want[:, 2] == NAN).all()
    assert {0x7C00, 0xFC00} <= set(want[4].tolist())  # overflow, both signs
    sub = want[3][(want[3] & 0x7C00) == 0]
    assert (sub & 0x7FFF).any() and (sub == 0x8000).any()  # subnormal results and a -0


def test_q2_exact_fp16_prepared_and_out():
    """q2gemv.prepare keeps the format: gemv(prepare(a), w) == gemv(a, w), into a float16 out."""
    rng = np.random.default_rng(7)
    a = _acts(rng, 5, 128)
    w = _q2_weight(rng, 17, 128, 64)
    p = q2gemv.prepare(a, backend="cuda")
    assert p.act.name == "fp16"
    out = np.empty((5, 17), F16)
    got = q2gemv.gemv(p, w, out=out)
    assert got is out
    assert_bits_equal(_bits(out), _bits(q2gemv.gemv(a, w, backend="reference")), "prepared")


def _nvfp4_weight(rng, n: int, k: int, g: float) -> Nvfp4Weight:
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    scales = rng.integers(0, 0x7F, (n, k // 16), dtype=np.uint8)  # any finite E4M3
    scales[2, 0] = 0x7F  # NaN: a bad column
    scales[16 % n, -1] = 0xFF
    codes[3] = 7  # +6 everywhere, the largest scale: with row 4, +-Inf
    scales[3] = 0x7E
    return Nvfp4Weight.from_codes(codes, scales, g)


def test_w4a16_exact_fp16_matches_the_reference():
    """5 rows (two column tiles of 8 limbs), N = 17 (a tail CTA), K = 80 (a padded last step)."""
    rng = np.random.default_rng(9)
    a = _acts(rng, 5, 80)
    want = _check(a, _nvfp4_weight(rng, 17, 80, 2.0**-9), "w4a16 fp16")
    assert (want[1] == NAN).all() and (want[:, 2] == NAN).all()
    assert {0x7C00, 0xFC00} <= set(want[4].tolist())


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_torch_fp16_cuda_tensors_and_layers(family):
    """CUDA torch.float16 activations: gemv returns torch.float16 with the reference's bits,
    into a float16 ``out`` (a bfloat16 ``out`` is a TypeError naming out), and the torch layer
    on the GPU equals the same layer on the CPU."""
    torch = pytest.importorskip("torch")
    from q2gemv.torch import Nvfp4Linear, Q2Linear

    rng = np.random.default_rng(11)
    a = _acts(rng, 9, 256)
    if family == "q2_0":
        w, layer = _q2_weight(rng, 33, 256, 128), Q2Linear
    else:
        w, layer = _nvfp4_weight(rng, 33, 256, 2.0**-9), Nvfp4Linear
    x = torch.from_numpy(a).cuda()
    dw = w.to_device()
    y = q2gemv.gemv(x, dw)
    assert y.dtype == torch.float16 and y.is_cuda
    want = q2gemv.gemv(a, w, backend="reference")
    assert_bits_equal(_bits(y.cpu().numpy()), _bits(want), f"{family} torch fp16")
    out = torch.empty((9, 33), dtype=torch.float16, device="cuda")
    assert q2gemv.gemv(x, dw, out=out) is out
    assert_bits_equal(_bits(out.cpu().numpy()), _bits(want), f"{family} torch fp16 out=")
    with pytest.raises(TypeError, match="^out: expected torch.float16"):
        q2gemv.gemv(x, dw, out=torch.empty((9, 33), dtype=torch.bfloat16, device="cuda"))
    lin = layer(w)
    got_gpu = lin.cuda()(x).cpu()
    got_cpu = lin.cpu()(x.cpu())
    assert got_gpu.dtype == torch.float16
    assert_bits_equal(_bits(got_gpu.numpy()), _bits(got_cpu.numpy()), f"{family} layer fp16")

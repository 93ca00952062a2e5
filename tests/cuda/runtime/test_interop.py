"""Activations already on the device: numba device arrays (simulator in CI), torch/CuPy (GPU).

Nothing goes through the host: results come back as the same kind of device array.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import q2gemv
from q2gemv.golden.check import assert_bits_equal
from tests.q2_cases import random_acts, random_weight


def _nvfp4(rng, n, k):
    return q2gemv.Nvfp4Weight.from_float(rng.standard_normal((n, k)).astype(np.float32))


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
@pytest.mark.parametrize("m", [1, 3])
def test_numba_device_activations_stay_on_device(family, m):
    rng = np.random.default_rng(m)
    w = random_weight(rng, 9, 128, 64) if family == "q2_0" else _nvfp4(rng, 9, 64)
    a = random_acts(rng, m, w.k)
    d_a = cuda.to_device(a.view(np.uint16))
    y = q2gemv.gemv(d_a, w)
    assert hasattr(y, "copy_to_host") and tuple(y.shape) == (m, 9)
    want = q2gemv.gemv(a, w, backend="reference")
    assert_bits_equal(y.copy_to_host(), want.view(np.uint16), f"{family} m={m}")


def test_device_out_and_device_weight_and_1d():
    rng = np.random.default_rng(5)
    w = random_weight(rng, 7, 128, 128)
    dw = w.to_device()
    a = random_acts(rng, 1, 128)[0]
    d_a = cuda.to_device(a.view(np.uint16))
    out = cuda.device_array((7,), np.uint16)
    res = q2gemv.gemv(d_a, dw, out=out)
    assert res is out
    want = q2gemv.gemv(a, w, backend="reference")
    assert_bits_equal(out.copy_to_host(), want.view(np.uint16))


@pytest.mark.parametrize(
    "make,exc,needle",
    [
        (lambda w: cuda.to_device(np.zeros((2, 128), np.float32)), TypeError, "a: expected uint16"),
        (lambda w: cuda.to_device(np.zeros((2, 64), np.uint16)), ValueError, "a: expected K=128"),
        (
            lambda w: cuda.to_device(np.zeros((2, 2, 128), np.uint16)),
            ValueError,
            "a: expected shape",
        ),
    ],
)
def test_bad_device_activations(make, exc, needle):
    w = random_weight(np.random.default_rng(0), 7, 128, 128)
    with pytest.raises(exc, match=needle):
        q2gemv.gemv(make(w), w)


def test_device_activations_refuse_reference_backend_and_aliasing_out():
    w = random_weight(np.random.default_rng(1), 8, 128, 128)
    d_a = cuda.to_device(np.zeros((8, 128), np.uint16))
    with pytest.raises(ValueError, match="backend"):
        q2gemv.gemv(d_a, w, backend="reference")
    with pytest.raises(ValueError, match="out: expected shape"):
        q2gemv.gemv(d_a, w, out=cuda.device_array((8, 9), np.uint16))


@pytest.mark.gpu
def test_torch_bf16_tensors_in_and_out_and_graph_capture():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    w = random_weight(rng, 5120, 5120, 128)
    dw = w.to_device()
    a = random_acts(rng, 4, 5120)
    t_a = torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
    y = q2gemv.gemv(t_a, dw)
    assert y.dtype == torch.bfloat16 and y.is_cuda and tuple(y.shape) == (4, 5120)
    want = q2gemv.gemv(a, w, backend="reference").view(np.uint16)
    assert_bits_equal(y.view(torch.int16).cpu().numpy().view(np.uint16), want, "torch")
    # capture on a side stream: launches go on torch's current stream via external_stream
    out = torch.empty_like(y)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        q2gemv.gemv(t_a, dw, out=out)  # warm-up (compiles) outside the capture
        torch.cuda.synchronize()
        out.zero_()
        with torch.cuda.graph(g, stream=s):
            q2gemv.gemv(t_a, dw, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert_bits_equal(out.view(torch.int16).cpu().numpy().view(np.uint16), want, "graph replay")


@pytest.mark.gpu
def test_cupy_uint16_bits():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(8)
    w = _nvfp4(rng, 33, 5120)
    a = random_acts(rng, 5, 5120)
    y = q2gemv.gemv(cp.asarray(a.view(np.uint16)), w, stream=cp.cuda.get_current_stream().ptr)
    cuda.synchronize()
    want = q2gemv.gemv(a, w, backend="reference").view(np.uint16)
    assert_bits_equal(cp.asnumpy(cp.asarray(y)), want, "cupy")


@pytest.mark.gpu
def test_misaligned_activations_refused_by_16_byte_load_kernels():
    """A view starting 2 bytes into a buffer: the 16-byte-load kernels refuse it, the others run."""
    rng = np.random.default_rng(9)
    w = random_weight(rng, 8, 128, 128)
    a = random_acts(rng, 1, 128)
    buf = cuda.to_device(
        np.concatenate([[0], a.view(np.uint16).reshape(-1), [0] * 7]).astype(np.uint16)
    )
    d_a = buf[1:129].reshape(1, 128)
    for name in ("q2_0_gemv_vec", "q2_0_gemv_vec_rt4", "q2_0_gemv_vec_batchm_rt2"):
        with pytest.raises(ValueError, match=f"a: kernel {name} reads activations 16 bytes"):
            q2gemv.gemv(d_a, w, kernel=name)
    want = q2gemv.gemv(a, w, kernel="q2_0_gemv", backend="reference").view(np.uint16)
    got = q2gemv.gemv(d_a, w, kernel="q2_0_gemv").copy_to_host()
    assert_bits_equal(got.view(np.uint16), want, "baseline on a misaligned view")

"""Device-resident weights of both families: to_device, from_buffers, the DeviceWeight protocol.

Simulator: numba device arrays; GPU: torch tensors (no host copy), marked ``gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import q2gemv
from q2gemv.cuda import DeviceNvfp4Weight, DeviceQ2Weight
from q2gemv.golden.check import assert_bits_equal
from q2gemv.host.backends import gpu_present
from tests.cuda.test_ptx import _run

from ..q2_cases import random_acts, random_weight


def _nvfp4(rng, n, k):
    return q2gemv.Nvfp4Weight.from_float(rng.standard_normal((n, k)).astype(np.float32))


def test_to_device_both_families_and_protocol():
    rng = np.random.default_rng(0)
    q2 = random_weight(rng, 3, 64, 64)
    nv = _nvfp4(rng, 3, 32)
    for host, cls, fam in ((q2, DeviceQ2Weight, "q2_0"), (nv, DeviceNvfp4Weight, "w4a16")):
        dw = host.to_device()
        assert isinstance(dw, cls) and isinstance(dw, q2gemv.DeviceWeight)
        assert (dw.family, dw.n, dw.k) == (fam, host.n, host.k)
        assert q2gemv.to_device(dw) is dw
        assert type(q2gemv.to_device(host)) is cls
    with pytest.raises(TypeError, match="weight: expected a Q2Weight"):
        q2gemv.to_device(np.zeros(4))


def test_q2_from_buffers_equals_upload():
    rng = np.random.default_rng(1)
    w = random_weight(rng, 5, 128, 64)
    raw = cuda.to_device(np.array(w.raw))
    for buf in (raw, raw.reshape(5, w.raw.size // 5)):
        dw = DeviceQ2Weight.from_buffers(buf, 5, 128, 64)
        assert (dw.n, dw.k, dw.group) == (5, 128, 64)
        a = random_acts(rng, 2, 128)
        want = q2gemv.gemv(a, w, backend="reference")
        assert_bits_equal(q2gemv.gemv(a, dw).view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize(
    "args,exc,needle",
    [
        ((np.zeros(180, np.uint8), 5, 128, 64), TypeError, "raw: expected a device array"),
        ((cuda.to_device(np.zeros(90, np.uint16)), 5, 128, 64), TypeError, "raw: expected uint8"),
        ((cuda.to_device(np.zeros(178, np.uint8)), 5, 128, 64), ValueError, "raw: expected 180"),
        ((cuda.to_device(np.zeros(180, np.uint8)), 5, 128, 128), ValueError, "raw: expected 170"),
        ((cuda.to_device(np.zeros(180, np.uint8)), 5, 128, 32), ValueError, "group"),
    ],
)
def test_q2_from_buffers_refusals(args, exc, needle):
    with pytest.raises(exc, match=needle):
        DeviceQ2Weight.from_buffers(*args)


def test_nvfp4_from_buffers_equals_upload():
    rng = np.random.default_rng(2)
    w = _nvfp4(rng, 3, 32)
    a = random_acts(rng, 1, 32)
    want = q2gemv.gemv(a, w, backend="reference").view(np.uint16)
    sc = cuda.to_device(np.array(w.scales))
    for packed in (np.array(w.packed), np.array(w.packed).view(np.uint32)):
        dw = DeviceNvfp4Weight.from_buffers(cuda.to_device(packed), sc, w.global_scale)
        assert (dw.n, dw.k, dw.global_scale) == (3, 32, np.float32(w.global_scale))
        assert_bits_equal(q2gemv.gemv(a, dw).view(np.uint16), want)
    with pytest.raises(ValueError, match="scales: expected shape"):
        DeviceNvfp4Weight.from_buffers(
            cuda.to_device(np.array(w.packed)), cuda.to_device(np.zeros((3, 3), np.uint8))
        )
    with pytest.raises(TypeError, match="packed: expected uint8"):
        DeviceNvfp4Weight.from_buffers(cuda.to_device(np.zeros((3, 16), np.uint16)), sc)
    with pytest.raises(TypeError, match="scales: expected a device array"):
        DeviceNvfp4Weight.from_buffers(cuda.to_device(np.array(w.packed)), np.array(w.scales))


@pytest.mark.gpu
def test_from_buffers_torch_tensors_no_copy():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    w = random_weight(rng, 256, 512, 128)
    t_raw = torch.from_numpy(np.array(w.raw)).cuda()
    dw = DeviceQ2Weight.from_buffers(t_raw, 256, 512, 128)
    assert dw.b16 is None  # a snapshot in its own layout: no reference to t_raw (issue 33)
    nv = _nvfp4(rng, 64, 512)
    t_p = torch.from_numpy(np.array(nv.packed)).cuda()
    t_s = torch.from_numpy(np.array(nv.scales)).cuda()
    dnv = DeviceNvfp4Weight.from_buffers(t_p, t_s, nv.global_scale)
    assert dnv.wp is None and dnv.scales is None
    t_raw.fill_(0x55)  # later writes do not reach the weights
    t_p.fill_(0x77)
    a = random_acts(rng, 2, 512)
    t_a = torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
    for host, dev in ((w, dw), (nv, dnv)):
        want = q2gemv.gemv(a, host, backend="reference").view(np.uint16)
        got = q2gemv.gemv(t_a, dev).view(torch.int16).cpu().numpy().view(np.uint16)
        assert_bits_equal(got, want, dev.family)


# -- issue 33 item 10: one weight, one answer -------------------------------------------------


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_from_buffers_is_a_snapshot_every_contract_reads(family):
    """The exact kernel read the layout made at construction while the seed kernels and
    to_gguf() read the caller's buffer as it is now: after the caller rewrote it, one weight
    gave two answers."""
    rng = np.random.default_rng(10)
    a = random_acts(rng, 2, 128)
    if family == "q2_0":
        w, other = random_weight(rng, 5, 128, 64), random_weight(rng, 5, 128, 64)
        buf = cuda.to_device(np.array(w.raw))
        dw = DeviceQ2Weight.from_buffers(buf, 5, 128, 64)
        buf.copy_to_device(np.array(other.raw))  # the caller rewrites its bytes
        np.testing.assert_array_equal(dw.to_gguf(), w.raw)
    else:
        w, other = _nvfp4(rng, 5, 128), _nvfp4(rng, 5, 128)
        d_p, d_s = cuda.to_device(np.array(w.packed)), cuda.to_device(np.array(w.scales))
        dw = DeviceNvfp4Weight.from_buffers(d_p, d_s, w.global_scale)
        d_p.copy_to_device(np.array(other.packed))
        d_s.copy_to_device(np.array(other.scales))
        packed, scales, _ = dw.to_parts()
        np.testing.assert_array_equal(packed, w.packed)
        np.testing.assert_array_equal(scales, w.scales)
    for numerics in ("exact", "seed"):
        want = q2gemv.gemv(a, w, backend="reference", numerics=numerics).view(np.uint16)
        got = q2gemv.gemv(a, dw, numerics=numerics).view(np.uint16)
        assert_bits_equal(got, want, f"{family} {numerics}")


@pytest.mark.skipif(gpu_present(), reason="needs a machine without a CUDA GPU")
def test_to_device_without_any_backend_raises_the_one_line_backend_error():
    r = _run(
        """
        import numpy as np
        import q2gemv
        from q2gemv.formats.nvfp4 import Nvfp4Weight
        w = q2gemv.quantize_q2_0(np.ones((2, 128), np.float32))
        f = Nvfp4Weight.from_float(np.ones((2, 16), np.float32))
        msgs = []
        import ml_dtypes
        try:
            q2gemv.gemv(np.zeros(128, ml_dtypes.bfloat16), w, backend="cuda")
        except ValueError as e:
            msgs.append(str(e))
        for call in (w.to_device, f.to_device, lambda: q2gemv.to_device(w)):
            try:
                call()
            except ValueError as e:
                msgs.append(str(e))
        print(len(msgs))
        for m in msgs:
            print(m)
        """,
        NUMBA_ENABLE_CUDASIM="0",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "4", r.stdout
    assert len(lines) == 5, r.stdout  # each message is one line
    assert lines[1].startswith("backend: 'cuda' needs a CUDA GPU or the CUDA simulator")
    assert len(set(lines[1:])) == 1, lines

"""q2gemv.torch's cache of device weights: a layout copy is reused only while it is current."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
qt = pytest.importorskip("q2gemv.nn.ops")
q2op = pytest.importorskip("q2gemv.nn.q2_0")  # the Q2_0 op and its device weight
w4op = pytest.importorskip("q2gemv.nn.nvfp4")  # the NVFP4 op and its device weight
layers = pytest.importorskip("q2gemv.nn.layers")


@pytest.fixture
def built(monkeypatch):
    """Count DeviceQ2Weight / DeviceNvfp4Weight.from_buffers calls (the CPU has no CUDA
    buffers to repack)."""
    from q2gemv.cuda import nvfp4 as w4a16
    from q2gemv.cuda import q2_0

    calls = []

    class Fake:
        """A device weight stand-in: copies of the bytes its layout would be made from."""

        def __init__(self, args):
            self.bytes = [a.clone() for a in args if isinstance(a, torch.Tensor)]

    def fake(*args):
        calls.append(len(args))  # not the buffers: the cache must not be what keeps them alive
        return Fake(args)

    def unchanged(dw, *tensors):  # the layout's inverse compared with the buffers
        return all(torch.equal(a, b) for a, b in zip(dw.bytes, tensors, strict=True))

    monkeypatch.setattr(q2_0.DeviceQ2Weight, "from_buffers", staticmethod(fake))
    monkeypatch.setattr(w4a16.DeviceNvfp4Weight, "from_buffers", staticmethod(fake))
    monkeypatch.setattr(q2op, "_CudaBuffer", lambda t: t)
    monkeypatch.setattr(w4op, "_CudaBuffer", lambda t: t)
    monkeypatch.setattr(q2op, "_q2_unchanged", unchanged)
    monkeypatch.setattr(w4op, "_nvfp4_unchanged", unchanged)
    qt.clear_device_weight_cache()
    yield calls
    qt.clear_device_weight_cache()


def test_same_buffer_same_version_reuses_the_layout(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    a = q2op._q2_device_weight(raw, 4, 128, 128)
    assert q2op._q2_device_weight(raw, 4, 128, 128) is a
    assert (
        q2op._q2_device_weight(raw.view(-1).view(4, 34), 4, 128, 128) is a
    )  # a view: same storage
    assert len(built) == 1


def test_an_in_place_write_rebuilds_the_layout(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    a = q2op._q2_device_weight(raw, 4, 128, 128)
    raw.copy_(torch.ones_like(raw))  # as load_state_dict does
    b = q2op._q2_device_weight(raw, 4, 128, 128)
    assert b is not a and len(built) == 2


def test_another_storage_at_the_same_address_rebuilds(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    a = q2op._q2_device_weight(raw, 4, 128, 128)
    key = next(iter(qt._DEVICE_WEIGHTS))
    other = torch.zeros(1, dtype=torch.uint8).untyped_storage()
    _, version, dw = qt._DEVICE_WEIGHTS[key]
    qt._DEVICE_WEIGHTS[key] = ((weakref.ref(other),), version, dw)  # an address reused
    assert q2op._q2_device_weight(raw, 4, 128, 128) is not a and len(built) == 2


def test_a_freed_buffer_drops_its_layout(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    q2op._q2_device_weight(raw, 4, 128, 128)
    assert len(qt._DEVICE_WEIGHTS) == 1
    del raw
    gc.collect()
    assert len(qt._DEVICE_WEIGHTS) == 0


def test_nvfp4_layout_follows_both_of_its_buffers(built):
    """An NVFP4 device weight's layout copies ``packed`` and ``scales``: a write to either
    rebuilds it; unchanged buffers reuse it; freeing ``packed`` drops it."""
    packed = torch.zeros(4, 16, dtype=torch.uint8)
    scales = torch.zeros(4, 2, dtype=torch.uint8)
    a = w4op._nvfp4_device_weight(packed, scales, 1.0)
    assert w4op._nvfp4_device_weight(packed, scales, 1.0) is a and len(built) == 1
    scales.fill_(0x38)  # a new scale, same address
    b = w4op._nvfp4_device_weight(packed, scales, 1.0)
    assert b is not a and len(built) == 2
    packed.fill_(0x11)
    c = w4op._nvfp4_device_weight(packed, scales, 1.0)
    assert c is not b and len(built) == 3
    assert w4op._nvfp4_device_weight(packed, scales, 1.0) is c
    del packed
    gc.collect()
    assert len(qt._DEVICE_WEIGHTS) == 0


# -- issue 33 item 9: a write torch does not count -----------------------------------------------


def _q2_layer():
    import numpy as np

    from q2gemv import quantize_q2_0

    w = np.random.default_rng(9).standard_normal((4, 128)).astype(np.float32)
    return layers.Q2Linear(quantize_q2_0(w, group=128))


def test_a_data_write_through_the_layer_attribute_rebuilds_the_layout(built):
    """``layer.raw.data.copy_(new)`` bumps no version (``.data`` has a counter of its own): the
    CUDA forward kept the old layout while the CPU computed with the new bytes."""
    layer = _q2_layer()
    raw = layer._buffers["raw"]
    a = q2op._q2_device_weight(raw, 4, 128, 128)
    version = raw._version
    layer.raw.data.copy_(torch.ones_like(raw))  # what the issue did
    assert raw._version == version  # torch did not count it
    b = q2op._q2_device_weight(raw, 4, 128, 128)
    assert b is not a and len(built) == 2
    # the layer's own reads keep the layout: forward, quantized_weight
    layer.quantized_weight()
    layer(torch.zeros(1, 128, dtype=torch.bfloat16))
    assert q2op._q2_device_weight(raw, 4, 128, 128) is b and len(built) == 2


def test_nvfp4_buffers_read_through_the_layer_drop_the_layout(built):
    import numpy as np

    from q2gemv import Nvfp4Weight

    w = Nvfp4Weight.from_float(np.ones((4, 32), np.float32))
    layer = layers.Nvfp4Linear(w)
    packed, scales = layer._buffers["packed"], layer._buffers["scales"]
    a = w4op._nvfp4_device_weight(packed, scales, layer.global_scale)
    layer.get_buffer("scales").data.fill_(0x38)
    b = w4op._nvfp4_device_weight(packed, scales, layer.global_scale)
    assert b is not a and len(built) == 2
    layer.packed.data.fill_(0x11)
    assert w4op._nvfp4_device_weight(packed, scales, layer.global_scale) is not b
    assert len(built) == 3


def test_buffers_handed_out_in_bulk_drop_the_layout(built):
    """A loader's ``for name, b in model.named_buffers(): b.data.copy_(...)`` (or through
    ``state_dict(keep_vars=True)``) is a write torch does not count either."""
    model = torch.nn.Sequential(_q2_layer())
    raw = model[0]._buffers["raw"]
    a = q2op._q2_device_weight(raw, 4, 128, 128)
    for name, b in model.named_buffers():
        if name.endswith("raw"):
            b.data.copy_(torch.ones_like(b))
    b = q2op._q2_device_weight(raw, 4, 128, 128)
    assert b is not a
    model.state_dict(keep_vars=True)["0.raw"].data.fill_(7)
    c = q2op._q2_device_weight(raw, 4, 128, 128)
    assert c is not b and len(built) == 3
    model(torch.zeros(1, 128, dtype=torch.bfloat16))  # the layer's own reads keep it
    assert q2op._q2_device_weight(raw, 4, 128, 128) is c


def test_a_handed_out_buffer_left_unchanged_keeps_the_layout(built):
    """A hand-out that writes nothing (``state_dict()`` to save, ``layer.raw.shape``) keeps the
    device weight: a CUDA graph captured over its layout stays valid. The check is made once."""
    layer = _q2_layer()
    raw = layer._buffers["raw"]
    a = q2op._q2_device_weight(raw, 4, 128, 128)
    assert tuple(layer.raw.shape) == (4, 34)
    layer.state_dict()
    assert q2op._q2_device_weight(raw, 4, 128, 128) is a and len(built) == 1
    assert not qt._HANDED_OUT  # checked, not checked again at the next call


@pytest.mark.gpu
def test_cuda_forward_follows_a_data_write():
    import numpy as np

    import q2gemv
    from q2gemv import quantize_q2_0

    rng = np.random.default_rng(19)
    w1, w2 = (quantize_q2_0(rng.standard_normal((64, 256)).astype(np.float32)) for _ in "ab")
    layer = layers.Q2Linear(w1).cuda()
    x = torch.randn(2, 256).to(torch.bfloat16)
    layer(x.cuda())  # the layout of w1 is cached
    layer.raw.data.copy_(torch.from_numpy(np.array(w2.raw)).view(64, -1))
    got = layer(x.cuda()).cpu()
    a = x.view(torch.int16).numpy().view(q2gemv.BF16)
    want = q2gemv.gemv(a, w2, backend="reference").view(np.uint16)
    assert (got.view(torch.int16).numpy().view(np.uint16) == want).all()
    assert torch.equal(got, layer.cpu()(x))  # the CPU agrees


def test_the_unchanged_checks_compare_every_byte_through_the_layout_inverse():
    """The checks behind a hand-out, on real device weights (the simulator; CPU tensors)."""
    import numpy as np

    import q2gemv

    rng = np.random.default_rng(21)
    w = q2gemv.quantize_q2_0(rng.standard_normal((4, 128)).astype(np.float32), 64)
    dw = w.to_device()
    raw = torch.from_numpy(np.array(w.raw)).view(4, -1)
    assert q2op._q2_unchanged(dw, raw)
    raw[3, 17] ^= 4  # one code of the last row
    assert not q2op._q2_unchanged(dw, raw)
    f = q2gemv.Nvfp4Weight.from_float(rng.standard_normal((4, 32)).astype(np.float32))
    dn = f.to_device()
    packed, scales = torch.from_numpy(np.array(f.packed)), torch.from_numpy(np.array(f.scales))
    assert w4op._nvfp4_unchanged(dn, packed, scales)
    scales[1, 1] ^= 1
    assert not w4op._nvfp4_unchanged(dn, packed, scales)
    scales[1, 1] ^= 1
    packed[0, 0] ^= 0x10
    assert not w4op._nvfp4_unchanged(dn, packed, scales)

"""q2gemv.torch's cache of device weights: a layout copy is reused only while it is current."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
qt = pytest.importorskip("q2gemv.torch")


@pytest.fixture
def built(monkeypatch):
    """Count DeviceQ2Weight / DeviceNvfp4Weight.from_buffers calls (the CPU has no CUDA
    buffers to repack)."""
    from q2gemv.cuda import q2_0, w4a16

    calls = []

    def fake(*args):
        calls.append(len(args))  # not the buffers: the cache must not be what keeps them alive
        return object()

    monkeypatch.setattr(q2_0.DeviceQ2Weight, "from_buffers", staticmethod(fake))
    monkeypatch.setattr(w4a16.DeviceNvfp4Weight, "from_buffers", staticmethod(fake))
    monkeypatch.setattr(qt, "_CudaBuffer", lambda t: t)
    qt.clear_device_weight_cache()
    yield calls
    qt.clear_device_weight_cache()


def test_same_buffer_same_version_reuses_the_layout(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    a = qt._q2_device_weight(raw, 4, 128, 128)
    assert qt._q2_device_weight(raw, 4, 128, 128) is a
    assert qt._q2_device_weight(raw.view(-1).view(4, 34), 4, 128, 128) is a  # a view: same storage
    assert len(built) == 1


def test_an_in_place_write_rebuilds_the_layout(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    a = qt._q2_device_weight(raw, 4, 128, 128)
    raw.copy_(torch.ones_like(raw))  # as load_state_dict does
    b = qt._q2_device_weight(raw, 4, 128, 128)
    assert b is not a and len(built) == 2


def test_another_storage_at_the_same_address_rebuilds(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    a = qt._q2_device_weight(raw, 4, 128, 128)
    key = next(iter(qt._DEVICE_WEIGHTS))
    other = torch.zeros(1, dtype=torch.uint8).untyped_storage()
    _, version, dw = qt._DEVICE_WEIGHTS[key]
    qt._DEVICE_WEIGHTS[key] = ((weakref.ref(other),), version, dw)  # an address reused
    assert qt._q2_device_weight(raw, 4, 128, 128) is not a and len(built) == 2


def test_a_freed_buffer_drops_its_layout(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    qt._q2_device_weight(raw, 4, 128, 128)
    assert len(qt._DEVICE_WEIGHTS) == 1
    del raw
    gc.collect()
    assert len(qt._DEVICE_WEIGHTS) == 0


def test_nvfp4_layout_follows_both_of_its_buffers(built):
    """An NVFP4 device weight's layout copies ``packed`` and ``scales``: a write to either
    rebuilds it; unchanged buffers reuse it; freeing ``packed`` drops it."""
    packed = torch.zeros(4, 16, dtype=torch.uint8)
    scales = torch.zeros(4, 2, dtype=torch.uint8)
    a = qt._nvfp4_device_weight(packed, scales, 1.0)
    assert qt._nvfp4_device_weight(packed, scales, 1.0) is a and len(built) == 1
    scales.fill_(0x38)  # a new scale, same address
    b = qt._nvfp4_device_weight(packed, scales, 1.0)
    assert b is not a and len(built) == 2
    packed.fill_(0x11)
    c = qt._nvfp4_device_weight(packed, scales, 1.0)
    assert c is not b and len(built) == 3
    assert qt._nvfp4_device_weight(packed, scales, 1.0) is c
    del packed
    gc.collect()
    assert len(qt._DEVICE_WEIGHTS) == 0

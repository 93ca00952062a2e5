"""q2gemv.torch's cache of Q2_0 device weights: a layout copy is reused only while it is current."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
qt = pytest.importorskip("q2gemv.torch")


@pytest.fixture
def built(monkeypatch):
    """Count DeviceQ2Weight.from_buffers calls (the CPU has no CUDA buffers to repack)."""
    from q2gemv.cuda import q2_0

    calls = []

    def fake(raw, n, k, group):
        calls.append((n, k, group))
        return object()

    monkeypatch.setattr(q2_0.DeviceQ2Weight, "from_buffers", staticmethod(fake))
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
    qt._DEVICE_WEIGHTS[key] = (weakref.ref(other), version, dw)  # a freed buffer's address reused
    assert qt._q2_device_weight(raw, 4, 128, 128) is not a and len(built) == 2


def test_a_freed_buffer_drops_its_layout(built):
    raw = torch.zeros(4, 34, dtype=torch.uint8)
    qt._q2_device_weight(raw, 4, 128, 128)
    assert len(qt._DEVICE_WEIGHTS) == 1
    del raw
    gc.collect()
    assert len(qt._DEVICE_WEIGHTS) == 0

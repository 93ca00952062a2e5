"""Edges of the public API (issue 16, "Hardening round 2"): ownership of weight bytes,
global scales fp32 cannot hold, out= overlapping a weight, argument types refused before
any launch, whole-plan validation, device-weight sizes, and the backend line of explain.

Host-only: nothing here launches a kernel (thread safety, the no-GPU backend error and
the chunked reference live in tests/test_api_edges_runtime.py).
"""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from q2gemv import Nvfp4Weight, Q2Weight
from q2gemv.formats._frozen import frozen, is_frozen

N, K = 3, 128


def _q2_raw(n=N, k=K, group=64) -> np.ndarray:
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    scales = rng.standard_normal((n, k // group)).astype(np.float16)
    return np.array(Q2Weight.from_codes(codes, scales, group).raw)  # a writeable copy


def _nv_parts(n=N, k=K):
    rng = np.random.default_rng(6)
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0x20, 0x40, (n, k // 16), dtype=np.uint8)
    return packed, scales


def _chain(x: np.ndarray):
    """x and every ndarray base below it."""
    while isinstance(x, np.ndarray):
        yield x
        x = x.base


# -- ownership of a weight's bytes ------------------------------------------------------------


def _writeable_inputs(x: np.ndarray):
    ro_view = x.view()
    ro_view.flags.writeable = False
    owned_ro = x.copy()
    owned_ro.flags.writeable = False
    return {"writeable": x, "read-only-view-of-writeable": ro_view, "owned-read-only": owned_ro}


@pytest.mark.parametrize("kind", ["writeable", "read-only-view-of-writeable", "owned-read-only"])
def test_q2weight_copies_memory_that_can_be_written(kind):
    raw = _q2_raw()
    src = _writeable_inputs(raw)[kind]
    w = Q2Weight(src, N, K, 64)
    assert not np.shares_memory(w.raw, raw)
    for arr in _chain(w.raw):  # no array in the weight's chain can be made writeable again
        assert not arr.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            arr.flags.writeable = True
    before = w.raw.tobytes()
    raw[:] = 0xAB  # the caller writes its own buffer: the weight does not change
    if kind == "owned-read-only":
        src.flags.writeable = True
        src[:] = 0xCD
    assert w.raw.tobytes() == before


def test_q2weight_issue_reproducer_is_refused():
    w = Q2Weight.from_bytes(_q2_raw(), N, K, 64)
    with pytest.raises(ValueError):
        w.raw.flags.writeable = True
    with pytest.raises(ValueError):
        w.raw[0] = 0xAB


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview-of-bytes"])
def test_q2weight_from_bytes_buffer_objects(kind):
    data = _q2_raw().tobytes()
    buf = {"bytes": data, "bytearray": bytearray(data), "memoryview-of-bytes": memoryview(data)}[
        kind
    ]
    w = Q2Weight.from_bytes(buf, N, K, 64)
    assert w.raw.tobytes() == data
    view = np.frombuffer(buf, np.uint8)
    # bytes cannot change: wrapped; a bytearray can: copied
    assert np.shares_memory(w.raw, view) == (kind != "bytearray")
    with pytest.raises(ValueError):
        w.raw.flags.writeable = True


def test_read_only_file_map_is_wrapped_without_copy(tmp_path):
    data = _q2_raw().tobytes()
    p = tmp_path / "w.bin"
    p.write_bytes(data)
    with open(p, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    raw = np.frombuffer(m, np.uint8)
    assert is_frozen(raw)
    w = Q2Weight.from_bytes(raw, N, K, 64)
    assert np.shares_memory(w.raw, raw)  # zero-copy: the loaders' path
    del w, raw
    m.close()


def test_writeable_file_map_is_copied(tmp_path):
    p = tmp_path / "w.bin"
    p.write_bytes(_q2_raw().tobytes())
    with open(p, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
    raw = np.frombuffer(m, np.uint8)
    w = Q2Weight.from_bytes(raw, N, K, 64)
    assert not np.shares_memory(w.raw, raw)
    before = w.raw.tobytes()
    raw[0] ^= 0xFF  # writes the file; the weight keeps its bytes
    assert w.raw.tobytes() == before
    del raw
    m.close()


@pytest.mark.parametrize("kind", ["writeable", "read-only-view-of-writeable", "owned-read-only"])
def test_nvfp4_parts_are_copied_when_they_can_be_written(kind):
    packed, scales = _nv_parts()
    w = Nvfp4Weight.from_parts(
        _writeable_inputs(packed)[kind], _writeable_inputs(scales)[kind], 1.0
    )
    for part, src in ((w.packed, packed), (w.scales, scales)):
        assert not np.shares_memory(part, src)
        for arr in _chain(part):
            with pytest.raises(ValueError, match="WRITEABLE"):
                arr.flags.writeable = True
    before = (w.packed.tobytes(), w.scales.tobytes())
    packed[:] = 0xAB
    scales[:] = 0xCD
    assert (w.packed.tobytes(), w.scales.tobytes()) == before


def test_nvfp4_immutable_parts_are_wrapped():
    packed, scales = (frozen(x) for x in _nv_parts())  # bytes-backed, like a read-only map
    w = Nvfp4Weight.from_parts(packed, scales, 1.0)
    assert np.shares_memory(w.packed, packed) and np.shares_memory(w.scales, scales)


def test_is_frozen_decides_by_the_memory():
    b = np.frombuffer(bytes(8), np.uint8)
    assert is_frozen(b) and is_frozen(b[2:].reshape(2, 3))
    assert not is_frozen(np.zeros(8, np.uint8))
    ro = np.zeros(8, np.uint8)
    ro.flags.writeable = False
    assert not is_frozen(ro)  # it owns its memory: it can be flagged writeable again
    assert not is_frozen(np.frombuffer(bytearray(8), np.uint8))
    assert is_frozen(np.frombuffer(memoryview(bytes(8)), np.uint8))
    assert not is_frozen(np.frombuffer(memoryview(bytearray(8)).toreadonly(), np.uint8))


# -- NVFP4 global scales fp32 cannot hold ---------------------------------------------------


@pytest.mark.parametrize(
    "g",
    [2**200, -(2**200), 2**2000, 1e39, np.float64(-1e39), np.array([1e300]), 1e-46, 2.0**-151],
    ids=["2**200", "-2**200", "2**2000", "1e39", "-1e39-f64", "array-1e300", "1e-46", "2**-151"],
)
def test_global_scale_fp32_cannot_hold_is_refused(g):
    packed, scales = _nv_parts()
    with pytest.raises(ValueError, match=r"global_scale: expected a value representable in fp32"):
        Nvfp4Weight(packed, scales, g)
    with pytest.raises(ValueError, match=r"global_scale: expected a value representable"):
        Nvfp4Weight.from_parts(packed, scales, g)


@pytest.mark.parametrize(
    ("g", "want"),
    [
        (float("inf"), np.inf),  # an IEEE special given as such is kept (validate() reports it)
        (-np.inf, -np.inf),
        (0, 0.0),
        (2.0**-149, 2.0**-149),  # the smallest fp32 subnormal
        (3.4e38, float(np.float32(3.4e38))),
        (2**100, 2.0**100),
        (0.1, float(np.float32(0.1))),
    ],
)
def test_global_scale_representable_or_special_is_kept(g, want):
    w = Nvfp4Weight(*_nv_parts(), g)
    assert w.global_scale == want or (np.isnan(want) and np.isnan(w.global_scale))


def test_global_scale_nan_is_kept():
    assert np.isnan(Nvfp4Weight(*_nv_parts(), float("nan")).global_scale)


def test_divisor_fp32_cannot_hold_is_refused():
    packed, scales = _nv_parts()
    with pytest.raises(ValueError, match=r"weight_global_scale: expected a value representable"):
        Nvfp4Weight.from_compressed_tensors(packed, scales, 2**2000)

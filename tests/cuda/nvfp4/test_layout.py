"""The NVFP4 execution layout on the device: pack / unpack equal the host, and the device weight."""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import q2gemv
from q2gemv.cuda.nvfp4 import layout as dlay
from q2gemv.cuda.nvfp4.weight import DeviceNvfp4Weight
from q2gemv.formats import nvfp4_layout as lay
from q2gemv.formats.nvfp4 import Nvfp4Weight


def _weight(rng, n, k, g=0.5):
    """Every code and every scale byte, NaN ones (0x7F / 0xFF) included."""
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0, 256, (n, k // 16), dtype=np.uint8)
    scales[0, 0], scales[-1, -1] = 0x7F, 0xFF
    return Nvfp4Weight(packed, scales, g)


def _host(a) -> np.ndarray:
    return a.copy_to_host()


def _same_buffer(x, y) -> bool:
    """Do device arrays ``x`` and ``y`` start at one address (the simulator: share memory)?"""
    try:
        return x.device_ctypes_pointer.value == y.device_ctypes_pointer.value
    except AttributeError:  # the simulator's arrays are NumPy underneath
        return np.shares_memory(np.asarray(x._ary), np.asarray(y._ary))


@pytest.mark.parametrize("n,k", [(17, 144), (33, 80), (1, 16), (16, 192)])
def test_device_pack_and_unpack_equal_the_host(n, k):
    rng = np.random.default_rng(n + k)
    w = _weight(rng, n, k)
    want = lay.to_exec_layout(w.packed, w.scales, n, k)
    got = dlay.pack(cuda.to_device(w.packed.view(np.uint32)), cuda.to_device(w.scales), n, k)
    for name, g, x in zip(("codes", "xscales", "zsum"), got, want, strict=True):
        assert g.dtype == x.dtype and g.shape == x.shape, name
        np.testing.assert_array_equal(_host(g), x, err_msg=name)
    wp, scales = dlay.unpack(cuda.to_device(want[0]), cuda.to_device(want[1]), n, k)
    assert wp.shape == (n, k // 8) and scales.shape == (n, k // 16)
    np.testing.assert_array_equal(_host(wp).view(np.uint8), w.packed)
    np.testing.assert_array_equal(_host(scales), w.scales)


def test_upload_holds_the_weight_once_unless_asked():
    rng = np.random.default_rng(3)
    n, k = 9, 80
    w = _weight(rng, n, k)
    dw = w.to_device()
    assert dw.wp is None and dw.scales is None  # only the layout on the device
    for g, x in zip(dw.exec_layout(), lay.to_exec_layout(w.packed, w.scales, n, k), strict=True):
        np.testing.assert_array_equal(_host(g), x)
    wp, scales = dw.raw_parts()  # rebuilt on the device, once
    assert dw.raw_parts() == (wp, scales) and dw.wp is wp
    np.testing.assert_array_equal(_host(wp).view(np.uint8), w.packed)
    np.testing.assert_array_equal(_host(scales), w.scales)
    packed, sc, g = dw.to_parts()
    np.testing.assert_array_equal(packed, w.packed)
    np.testing.assert_array_equal(sc, w.scales)
    assert g == np.float32(0.5)
    kept = q2gemv.to_device(w, keep_packed=True)
    np.testing.assert_array_equal(_host(kept.wp).view(np.uint8), w.packed)
    np.testing.assert_array_equal(_host(kept.scales), w.scales)
    np.testing.assert_array_equal(_host(kept.codes), _host(dw.codes))


def test_a_seed_call_on_a_layout_only_weight_rebuilds_the_raw_arrays():
    rng = np.random.default_rng(4)
    w = Nvfp4Weight.from_float(rng.standard_normal((5, 64)).astype(np.float32))
    dw = w.to_device()
    a = rng.standard_normal((2, 64)).astype(q2gemv.BF16)
    y = q2gemv.gemv(a, dw, numerics="seed")
    want = q2gemv.gemv(a, w, numerics="seed", backend="reference")
    q2gemv.assert_bits_equal(y.view(np.uint16), want.view(np.uint16))
    assert dw.wp is not None


def test_keep_packed_is_checked_and_nvfp4_only():
    w = Nvfp4Weight.from_float(np.ones((16, 32), np.float32))
    with pytest.raises(TypeError, match="keep_packed: expected a bool, got int"):
        w.to_device(keep_packed=1)
    q2 = q2gemv.quantize_q2_0(np.ones((2, 64), np.float32), 64)
    with pytest.raises(ValueError, match="keep_packed: an upload option of NVFP4 weights only"):
        q2gemv.to_device(q2, keep_packed=True)
    with pytest.raises(ValueError, match="keep_gguf: an upload option of Q2_0 weights only"):
        q2gemv.to_device(w, keep_gguf=True)


def test_from_buffers_owns_a_layout_and_keeps_no_reference_to_the_buffers():
    rng = np.random.default_rng(5)
    n, k = 17, 48
    w = _weight(rng, n, k)
    d_p, d_s = cuda.to_device(np.array(w.packed)), cuda.to_device(np.array(w.scales))
    dw = DeviceNvfp4Weight.from_buffers(d_p, d_s, w.global_scale)
    assert dw.wp is None and dw.scales is None  # a snapshot (issue 33): rebuilt for seed
    for g, x in zip(dw.exec_layout(), lay.to_exec_layout(w.packed, w.scales, n, k), strict=True):
        np.testing.assert_array_equal(_host(g), x)
    wp, scales = dw.raw_parts()
    assert not _same_buffer(wp, d_p) and scales is not d_s
    np.testing.assert_array_equal(_host(wp).view(np.uint8).reshape(n, k // 2), w.packed)
    np.testing.assert_array_equal(_host(scales), w.scales)


def test_hand_built_weight_makes_its_layout_at_first_use():
    rng = np.random.default_rng(6)
    n, k = 3, 32
    w = _weight(rng, n, k)
    d_wp, d_s = cuda.to_device(w.packed.view(np.uint32)), cuda.to_device(w.scales)
    dw = DeviceNvfp4Weight(d_wp, d_s, 2.0, n, k)
    assert dw.codes is None and dw.xscales is None and dw.zsum is None
    codes, xscales, zsum = dw.exec_layout()
    assert dw.exec_layout()[0] is codes  # made once
    want = lay.to_exec_layout(w.packed, w.scales, n, k)
    for g, x in zip((codes, xscales, zsum), want, strict=True):
        np.testing.assert_array_equal(_host(g), x)
    # and a layout-only one, built by hand from the layout, rebuilds the raw arrays
    again = DeviceNvfp4Weight(None, None, 2.0, n, k, codes, xscales, zsum)
    np.testing.assert_array_equal(_host(again.raw_parts()[0]), _host(d_wp))


def _layout(n=3, k=32):
    w = _weight(np.random.default_rng(7), n, k)
    return [cuda.to_device(x) for x in lay.to_exec_layout(w.packed, w.scales, n, k)]


@pytest.mark.parametrize(
    ("parts", "exc", "match"),
    [
        (lambda c, x, z: (c, x, None), ValueError, r"wp: expected the packed codes and scales"),
        (lambda c, x, z: (None, None, None), ValueError, r"or codes, xscales and zsum"),
        (lambda c, x, z: (c[:-1], x, z), ValueError, r"codes: expected shape \(128,\), got \(127,\)"),
        (lambda c, x, z: (x, x, z), TypeError, r"codes: expected dtype uint32, got uint8"),
        (lambda c, x, z: (c, x[:-1], z), ValueError, r"xscales: expected shape \(64,\)"),
        (lambda c, x, z: (c, c, z), TypeError, r"xscales: expected dtype uint8"),
        (lambda c, x, z: (c, x, z[:-1]), ValueError, r"zsum: expected shape \(16,\)"),
        (lambda c, x, z: (c, x, c), TypeError, r"zsum: expected dtype int64"),
        (lambda c, x, z: (c.copy_to_host(), x, z), TypeError, r"codes: expected a numba device array"),
    ],
    ids=["no-zsum", "nothing", "codes-size", "codes-dtype", "xscales-size", "xscales-dtype",
         "zsum-size", "zsum-dtype", "codes-host"],
)  # fmt: skip
def test_construction_refuses_a_bad_layout(parts, exc, match):
    c, x, z = _layout()
    with pytest.raises(exc, match=match):
        DeviceNvfp4Weight(None, None, 1.0, 3, 32, *parts(c, x, z))


def test_a_layout_beside_raw_arrays_is_checked_too():
    c, x, z = _layout()
    wp, sc = DeviceNvfp4Weight(None, None, 1.0, 3, 32, c, x, z).raw_parts()
    with pytest.raises(ValueError, match=r"codes: expected shape \(128,\)"):
        DeviceNvfp4Weight(wp, sc, 1.0, 3, 32, c[:64], x, z)
    with pytest.raises(ValueError, match=r"codes: expected shape \(256,\)"):  # n=17: two tiles
        DeviceNvfp4Weight(None, None, 1.0, 17, 32, c, x, z)


def test_out_overlapping_the_layout_is_refused(no_launch):
    dw = _weight(np.random.default_rng(8), 16, 64).to_device()
    d_a = cuda.to_device(np.zeros((2, 64), np.uint16))
    out = dw.codes.view(np.uint16)[: 2 * 16].reshape(2, 16)
    with pytest.raises(ValueError, match=r"overlap the weight's device buffer \(codes\)"):
        q2gemv.gemv(d_a, dw, out=out)


def test_a_host_weight_is_uploaded_in_the_form_its_contract_reads():
    """A seed-contract call on a host weight uploads packed/scales only (no layout, no device
    unpack); an exact-contract one uploads the layout only. Either makes the other at need."""
    from q2gemv.cuda.nvfp4.weight import as_device_weight

    w = _weight(np.random.default_rng(77), 5, 48)
    seed = as_device_weight(w, 0, "seed")
    assert seed.codes is None and seed.wp is not None
    exact = as_device_weight(w, 0, "exact")
    assert exact.wp is None and exact.codes is not None
    for got, want in zip(seed.exec_layout(), exact.exec_layout(), strict=True):
        np.testing.assert_array_equal(got.copy_to_host(), want.copy_to_host())

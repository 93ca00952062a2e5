"""q2gemv.cuda.nvfp4's device weight: from_buffers takes and refuses what Nvfp4Weight does."""

from __future__ import annotations

import numpy as np
import pytest

from q2gemv import Nvfp4Weight
from q2gemv.cuda.nvfp4 import seed as w4cuda
from tests.formats.test_nvfp4 import _host_error, _nvfp4_parts
from tests.weight_cases import K, N, _nv_parts

BAD_SCALES = [
    1e39,
    -1e39,
    1e-46,
    2**200,
    2**2000,
    np.float64(1e39),
    1 + 0j,
    np.complex64(2),
    np.array([1 + 0j]),
    np.array([1.0, 2.0], np.float32),
    True,
    "1.0",
]


BAD_IDS = [
    "1e39", "-1e39", "1e-46", "2**200", "2**2000", "f64-1e39", "complex", "np-complex",
    "complex-array", "size-2", "bool", "str",
]  # fmt: skip


@pytest.mark.parametrize("g", BAD_SCALES, ids=BAD_IDS)
def test_device_weight_refuses_what_the_host_weight_refuses(g):
    """DeviceNvfp4Weight.from_buffers used to take 1e39 (-> inf), 1e-46 (-> 0), a NumPy
    complex, and to raise OverflowError for 2**2000."""
    from numba import cuda

    from q2gemv.cuda.nvfp4 import DeviceNvfp4Weight

    packed, scales = _nvfp4_parts()
    want_type, want_msg = _host_error(g)
    d_p, d_s = cuda.to_device(packed), cuda.to_device(scales)
    with pytest.raises(want_type) as e:
        DeviceNvfp4Weight.from_buffers(d_p, d_s, g)
    assert str(e.value) == want_msg


@pytest.mark.parametrize(
    "g", [np.array([0.375]), np.float64(0.1), 3, float("inf"), float("nan"), 2.0**-149]
)
def test_device_weight_accepts_what_the_host_weight_accepts(g):
    """A size-1 array used to be refused by from_buffers though Nvfp4Weight takes it."""
    from numba import cuda

    from q2gemv.cuda.nvfp4 import DeviceNvfp4Weight
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    packed, scales = _nvfp4_parts()
    host = Nvfp4Weight(packed, scales, g)
    dw = DeviceNvfp4Weight.from_buffers(cuda.to_device(packed), cuda.to_device(scales), g)
    assert isinstance(dw.global_scale, np.float32)
    assert np.float32(dw.global_scale).view(np.uint32) == np.float32(host.global_scale).view(
        np.uint32
    )


def _dnv(n=N):
    return w4cuda.DeviceNvfp4Weight.upload(Nvfp4Weight(*_nv_parts(n=n), 0.5), keep_packed=True)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (
            lambda d: (d.wp, d.scales, 1.0, 2 * N, K),
            ValueError,
            r"wp: expected shape \(6, 16\), got \(3, 16\)",
        ),
        (lambda d: (d.wp, d.scales, 1.0, N, K // 2), ValueError, r"wp: expected shape \(3, 8\)"),
        (lambda d: (d.wp, d.scales, 1.0, N, 24), ValueError, r"k: expected a multiple of 16"),
        (lambda d: (d.wp, d.scales, 1.0, 0, K), ValueError, r"n: expected >= 1"),
        (lambda d: (d.scales, d.wp, 1.0, N, K), TypeError, r"wp: expected dtype uint32"),
        (
            lambda d: (d.wp, _dnv(2 * N).scales, 1.0, N, K),
            ValueError,
            r"scales: expected shape \(3, 8\)",
        ),
        (lambda d: (d.wp, d.scales, "1", N, K), TypeError, r"global_scale: expected a real number"),
        (
            lambda d: (d.wp.copy_to_host(), d.scales, 1.0, N, K),
            TypeError,
            r"wp: expected a numba device array",
        ),
    ],
    ids=["rows", "k-half", "k-24", "n-0", "swapped", "scales-rows", "global-str", "host-array"],
)
def test_device_nvfp4_weight_checks_sizes(no_launch, args, exc, match):
    d = _dnv()
    with pytest.raises(exc, match=match):
        w4cuda.DeviceNvfp4Weight(*args(d))


def test_device_nvfp4_weight_round_trip():
    d = _dnv()
    again = w4cuda.DeviceNvfp4Weight(d.wp, d.scales, d.global_scale, N, K)
    assert again.global_scale == np.float32(0.5) and isinstance(again.global_scale, np.float32)

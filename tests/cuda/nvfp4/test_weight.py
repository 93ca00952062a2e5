"""q2gemv.cuda.nvfp4's device weight: from_buffers takes and refuses what Nvfp4Weight does."""

from __future__ import annotations

import numpy as np
import pytest

from tests.formats.test_nvfp4 import _host_error, _nvfp4_parts

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

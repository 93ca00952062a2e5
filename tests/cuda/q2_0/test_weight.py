"""q2gemv.cuda.q2_0's device weight: from_buffers sizes in fixed-width ints do not wrap."""

from __future__ import annotations

import numpy as np
import pytest


def test_device_q2_from_buffers_sizes_do_not_wrap():
    from numba import cuda

    from q2gemv.cuda.q2_0 import DeviceQ2Weight

    d = cuda.to_device(np.zeros(6464, np.uint8))
    with pytest.raises(ValueError, match=r"^raw: expected 72000 bytes for n=4000 k=64"):
        DeviceQ2Weight.from_buffers(d, np.int16(4000), np.int16(64), 64)
    w = DeviceQ2Weight.from_buffers(cuda.to_device(np.zeros(36, np.uint8)), np.int8(2), 64, 64)
    assert (type(w.n), type(w.k), type(w.group)) == (int, int, int)

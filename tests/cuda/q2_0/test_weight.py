"""q2gemv.cuda.q2_0's device weight: from_buffers sizes in fixed-width ints do not wrap."""

from __future__ import annotations

import numpy as np
import pytest

from q2gemv import Q2Weight
from q2gemv.cuda.q2_0 import seed as q2cuda
from tests.weight_cases import K, _q2_raw


def test_device_q2_from_buffers_sizes_do_not_wrap():
    from numba import cuda

    from q2gemv.cuda.q2_0 import DeviceQ2Weight

    d = cuda.to_device(np.zeros(6464, np.uint8))
    with pytest.raises(ValueError, match=r"^raw: expected 72000 bytes for n=4000 k=64"):
        DeviceQ2Weight.from_buffers(d, np.int16(4000), np.int16(64), 64)
    w = DeviceQ2Weight.from_buffers(cuda.to_device(np.zeros(36, np.uint8)), np.int8(2), 64, 64)
    assert (type(w.n), type(w.k), type(w.group)) == (int, int, int)


def _dq2(n=8, group=64):
    w = Q2Weight(_q2_raw(n=n, group=group), n, K, group)
    return w.to_device(keep_gguf=True)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        (
            lambda d: (d.b16, d.bh, 16, K, 64),
            ValueError,
            r"b16: expected 288 halves \(576 bytes\) for n=16 k=128 group=64, got 144",
        ),
        (
            lambda d: (d.b16, d.bh, 8, K, 128),
            ValueError,
            r"b16: expected 136 halves .* group=128, got 144",
        ),
        (lambda d: (d.b16, d.bh, 8, 256, 64), ValueError, r"b16: expected 288 halves"),
        (lambda d: (d.b16, d.bh, 4, K, 64), ValueError, r"b16: expected 72 halves"),
        (lambda d: (d.b16, d.bh, 8, K, 96), ValueError, r"group: expected 64 or 128"),
        (lambda d: (d.b16, d.bh, 8.0, K, 64), TypeError, r"n: expected an int"),
        (lambda d: (d.b16, d.bh, 8, 96, 64), ValueError, r"k: expected a multiple of group=64"),
        (
            lambda d: (d.b16.copy_to_host(), d.bh, 8, K, 64),
            TypeError,
            r"b16: expected a numba device array",
        ),
        (lambda d: (d.bh, d.bh, 8, K, 64), TypeError, r"b16: expected dtype uint16"),
        (lambda d: (d.b16, d.b16, 8, K, 64), TypeError, r"bh: expected dtype float16"),
        (
            lambda d: (d.b16, _dq2().bh, 8, K, 64),
            ValueError,
            r"bh: expected the float16 view of b16",
        ),
    ],
    ids=[
        "rows-16-over-8",
        "group128-over-64",
        "k-256-over-128",
        "rows-4-over-8",
        "group-96",
        "n-float",
        "k-not-group",
        "host-array",
        "b16-float16",
        "bh-uint16",
        "bh-other-buffer",
    ],
)
def test_device_q2_weight_checks_sizes(no_launch, args, exc, match):
    d = _dq2()
    with pytest.raises(exc, match=match):
        q2cuda.DeviceQ2Weight(*args(d))


def test_device_q2_weight_round_trip():
    d = _dq2()
    again = q2cuda.DeviceQ2Weight(d.b16, d.bh, np.int64(8), K, 64)
    assert (again.n, again.k, again.group) == (8, K, 64) and type(again.n) is int


def test_accumulator_bases_are_the_same_for_every_way_to_make_the_weight():
    """upload (from the host's scales), from_buffers and a hand-built weight (from the device
    layout's scales, copied back once) give the same bases, made once and kept."""
    from numba import cuda

    from q2gemv.cuda.q2_0 import DeviceQ2Weight
    from q2gemv.formats import q2_0_layout as lay

    rng = np.random.default_rng(5)
    n, k, group = 40, 256, 128
    d = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
    d[20, 1] = np.inf  # the second tile has no base
    w = Q2Weight.from_codes(rng.integers(0, 4, (n, k), dtype=np.uint8), d, group=group)
    _, scales = lay.to_exec_layout(w.raw, n, k, group)
    want = lay.accumulator_bases(scales, n, k, group)
    assert want[1] == lay.NO_BASE and (want[[0, 2]] >= 0).all()
    raw = cuda.to_device(w.raw)
    b16 = cuda.to_device(w.raw.view(np.uint16))
    made = [
        DeviceQ2Weight.upload(w),
        DeviceQ2Weight.from_buffers(raw, n, k, group),
        DeviceQ2Weight(b16, b16.view(np.float16), n, k, group),  # layout made at first use
    ]
    for dw in made:
        bases, one_word = dw.accumulator_bases()
        assert np.array_equal(bases.copy_to_host(), want) and one_word is False
        assert dw.accumulator_bases()[0] is bases  # kept

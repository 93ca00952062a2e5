"""Grid math and batch chunking: exhaustive, pure, CPU-only."""

from __future__ import annotations

import pytest

from q2gemv.dispatch import plan as launch


@pytest.mark.parametrize("m", range(0, 70))
def test_row_chunks_cover_every_row_once(m):
    chunks = list(launch.batchm_row_chunks(m))
    nxt = 0
    for r0, rows in chunks:
        assert r0 == nxt
        assert 1 <= rows <= launch.Q2_BATCHM_MAX_M
        nxt += rows
    assert nxt == m
    assert (chunks == []) == (m == 0)
    # only the last chunk may be short
    assert all(rows == 8 for _, rows in chunks[:-1])


def test_launch_chunks_seed_example():
    assert list(launch.batchm_launch_chunks(17, 256, 5)) == [
        (0, 0, 8),
        (4096, 80, 8),
        (8192, 160, 1),
    ]


def test_launch_chunk_offsets_are_whole_bf16_rows():
    for m in (1, 8, 9, 33):
        for (ib, ob, rows), (r0, rows2) in zip(
            launch.batchm_launch_chunks(m, 640, 7), launch.batchm_row_chunks(m), strict=False
        ):
            assert (ib, ob, rows) == (r0 * 640 * 2, r0 * 7 * 2, rows2)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 7, 8, 9, 16, 17, 5120, 17408])
def test_grids(n):
    assert launch.q2_grid("q2_0_gemv", n) == ((n + 3) // 4, 1, 1)
    assert launch.q2_grid("q2_0_gemv_vec", n) == ((n + 7) // 8, 1, 1)
    assert launch.q2_grid("q2_0_gemv_vec_batchm", n) == ((n + 7) // 8, 1, 1)


def test_bad_arguments():
    with pytest.raises(ValueError, match="m"):
        list(launch.batchm_row_chunks(-1))
    with pytest.raises(ValueError, match="kernel"):
        launch.q2_grid("nope", 4)
    with pytest.raises(ValueError, match="n"):
        launch.q2_grid("q2_0_gemv", 0)


class _FakeDeviceArray:
    """Only what check_alignment reads: numba's device_ctypes_pointer."""

    def __init__(self, addr: int):
        import ctypes

        self.device_ctypes_pointer = ctypes.c_void_p(addr)


@pytest.mark.parametrize(
    "addr, ok",
    [
        (0x7F0000000000, True),
        (0x7F0000000010, True),
        (0x7F0000000002, False),
        (0x7F0000000008, False),
    ],
)
def test_check_alignment(addr, ok):
    arr = _FakeDeviceArray(addr)
    assert launch.device_address(arr) == addr
    if ok:
        launch.check_alignment("q2_0_gemv_vec", arr, 16)
    else:
        with pytest.raises(ValueError, match=r"a: kernel q2_0_gemv_vec reads activations 16 bytes"):
            launch.check_alignment("q2_0_gemv_vec", arr, 16)


def test_check_alignment_without_an_address():
    launch.check_alignment(
        "q2_0_gemv_vec", object(), 16
    )  # the simulator's arrays: nothing to check
    assert launch.device_address(object()) is None


def test_check_weight_halves():
    """32-bit half indices: the vec kernels refuse 2**32 halves or more, the baseline does not."""
    launch.check_weight_halves("q2_0_gemv_vec", launch.MAX_WEIGHT_HALVES - 1)
    launch.check_weight_halves("q2_0_gemv", launch.MAX_WEIGHT_HALVES)
    for name in ("q2_0_gemv_vec", "q2_0_gemv_vec_rt4", "q2_0_gemv_vec_batchm_rt2"):
        with pytest.raises(ValueError, match=f"weight: kernel {name} indexes the weight in 32"):
            launch.check_weight_halves(name, launch.MAX_WEIGHT_HALVES)


def test_default_q2_kernel_rule():
    """The measured M=1 / M>1 choice (api.default_q2_kernel's docstring has the numbers)."""
    import numpy as np

    import q2gemv
    from q2gemv.api import Q2_RT4_MIN_N, default_q2_kernel

    assert default_q2_kernel(1, Q2_RT4_MIN_N) == "q2_0_gemv_vec_rt4"
    for m, n in ((1, 5120), (1, Q2_RT4_MIN_N - 1), (2, Q2_RT4_MIN_N), (8, 5120), (9, 5120)):
        assert default_q2_kernel(m, n) == "q2_0_gemv_vec_batchm_rt2", (m, n)
    big = q2gemv.Q2Weight.from_codes(
        np.ones((Q2_RT4_MIN_N, 64), np.uint8), np.ones((Q2_RT4_MIN_N, 1), np.float32), group=64
    )
    # the seed contract's rule (numerics="seed"; Q2_0's default is the exact kernel)
    assert q2gemv.plan(big, 1, numerics="seed") == [(0, 1, "q2_0_gemv_vec_rt4")]
    assert q2gemv.plan(big, 2, numerics="seed") == [(0, 2, "q2_0_gemv_vec_batchm_rt2")]
    assert q2gemv.plan(big, 9, numerics="seed") == [
        (0, 8, "q2_0_gemv_vec_batchm_rt2"),
        (8, 1, "q2_0_gemv_vec_batchm_rt2"),
    ]


def test_chunk_plan_is_a_lazy_sequence_equal_to_its_list():
    plan = launch.ChunkPlan(17, 8, lambda rows: f"k{rows}")
    want = [(0, 8, "k8"), (8, 8, "k8"), (16, 1, "k1")]
    assert plan == want and list(plan) == want and len(plan) == 3
    assert plan[-1] == want[-1] and plan[1:] == want[1:]
    with pytest.raises(IndexError):
        plan[3]
    assert launch.ChunkPlan(0, 8, str) == []
    huge = launch.ChunkPlan(2**31 - 1, 8, lambda rows: "k")  # described, never built
    assert len(huge) == 2**28 and huge[-1] == (2**31 - 8, 7, "k")


def test_check_chunks_covers_rows_once_in_order():
    assert launch.check_chunks(None, 19, 8) == [(0, 8), (8, 8), (16, 3)]
    assert launch.check_chunks([(0, 16), (16, 1)], 17, 16, multiple=4) == [(0, 16), (16, 1)]
    for chunks, m, multiple, needle in [
        ([(0, 8), (9, 2)], 11, 1, "from row 8"),  # a gap
        ([(0, 9)], 9, 1, "1..8 rows"),  # too many rows in one launch
        ([(0, 2), (2, 2)], 4, 4, "multiples of 4"),  # a chunk off the 4-row groups
        ([(0, 8)], 9, 1, "covering 9 rows"),  # rows left over
    ]:
        with pytest.raises(ValueError, match=rf"^plan: .*{needle}"):
            launch.check_chunks(chunks, m, 8, multiple)

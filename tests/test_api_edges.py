"""Edges of the public API (issue 16, "Hardening round 2"): ownership of weight bytes,
global scales fp32 cannot hold, out= overlapping a weight, argument types refused before
any launch, whole-plan validation, device-weight sizes, and the backend line of explain.

Nothing here launches a kernel (device weights are uploaded, in the simulator on a
CPU-only machine); thread safety, the no-GPU backend error and the chunked reference
live in tests/test_api_edges_runtime.py.
"""

from __future__ import annotations

import itertools
import mmap

import numpy as np
import pytest

import q2gemv
from q2gemv import Nvfp4Weight, Q2Weight
from q2gemv.api import check_out
from q2gemv.cuda.nvfp4 import seed as w4cuda
from q2gemv.cuda.q2_0 import seed as q2cuda
from q2gemv.dispatch import nvfp4_tiers as T
from q2gemv.dispatch.nvfp4_tiers import W4a16BatchmTiers, select_tier
from q2gemv.formats._frozen import frozen, is_frozen
from q2gemv.formats.bf16 import BF16
from q2gemv.host.backends import cuda_kind, simulator_active

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


# -- out= overlapping an input --------------------------------------------------------------

M = 2


def _acts(m=M, k=K, seed=7):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(BF16)


def _weight_over(buf: np.ndarray, family: str):
    """A weight whose bytes are the writeable ``buf``: what the ownership rule now prevents,
    built by bypassing it (as a subclass or an older version could) to test check_out alone."""
    if family == "q2_0":
        w = Q2Weight(_q2_raw(), N, K, 64)
        object.__setattr__(w, "raw", buf[: w.raw.size])
    else:
        w = Nvfp4Weight(*_nv_parts(), 1.0)
        object.__setattr__(w, "packed", buf[: w.packed.size].reshape(w.packed.shape))
    return w


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_out_overlapping_the_weight_is_refused(no_launch, family):
    buf = np.zeros(4096, np.uint8)
    w = _weight_over(buf, family)
    out = buf[: M * N * 2].view(BF16).reshape(M, N)
    name = "raw" if family == "q2_0" else "packed"
    for backend in ("reference", "cuda"):
        with pytest.raises(
            ValueError, match=rf"out: must not overlap the weight's bytes \(weight\.{name}\)"
        ):
            q2gemv.gemv(_acts(), w, out=out, backend=backend)
    assert not buf.any()  # nothing was written


def test_check_out_names_each_weight_part():
    w = Nvfp4Weight(*_nv_parts(), 1.0)
    buf = np.zeros(4096, np.uint8)
    object.__setattr__(w, "scales", buf[: w.scales.size].reshape(w.scales.shape))
    out = buf[: M * N * 2].view(BF16).reshape(M, N)
    with pytest.raises(ValueError, match=r"weight\.scales"):
        check_out(out, _acts(), (M, N), w)
    check_out(np.zeros((M, N), BF16), _acts(), (M, N), w)  # a separate out is fine


def test_out_overlapping_a_device_weight_is_refused(no_launch):
    from numba import cuda

    w = Q2Weight(_q2_raw(), N, K, 64)
    dw = w.to_device(keep_gguf=True)
    d_a = cuda.to_device(_acts().view(np.uint16))
    out = dw.b16[: M * N].reshape(M, N)  # uint16 [M, N] over the weight's device bytes
    before = dw.b16.copy_to_host()
    with pytest.raises(
        ValueError, match=r"out: must not overlap the weight's device buffer \(b16\)"
    ):
        q2gemv.gemv(d_a, dw, out=out)
    assert (dw.b16.copy_to_host() == before).all()


# -- kernel, stream, present: named, refused before any launch ------------------------------


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
@pytest.mark.parametrize("kernel", [["q2_0_gemv"], ("w4a16_gemv_batch4",), 3, b"q2_0_gemv"])
def test_kernel_not_a_name_is_a_type_error(no_launch, family, kernel):
    w = Q2Weight(_q2_raw(), N, K, 64) if family == "q2_0" else Nvfp4Weight(*_nv_parts(), 1.0)
    for backend in ("reference", "cuda"):
        with pytest.raises(TypeError, match=r"kernel: expected a kernel name \(str\) or None"):
            q2gemv.gemv(_acts(), w, kernel=kernel, backend=backend)


def test_w4a16_gemv_kernel_not_a_name(no_launch):
    with pytest.raises(TypeError, match=r"kernel: expected a kernel name"):
        w4cuda.w4a16_gemv(_acts(), Nvfp4Weight(*_nv_parts(), 1.0), kernel=["w4a16_gemv_batch4"])


@pytest.mark.parametrize(
    ("stream", "exc", "match"),
    [
        ("x", TypeError, r"stream: expected None, an int cudaStream_t handle or a numba stream"),
        (object(), TypeError, r"stream: expected None"),
        (1.5, TypeError, r"stream: expected None"),
        (
            True,
            TypeError,
            r"stream: expected None, an int cudaStream_t handle or a numba stream, got bool",
        ),
        (-1, ValueError, r"stream: expected a cudaStream_t handle >= 0, got -1"),
    ],
    ids=["str", "object", "float", "bool", "negative"],
)
@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_bad_stream_is_refused_before_any_launch(no_launch, stream, exc, match, family):
    w = Q2Weight(_q2_raw(), N, K, 64) if family == "q2_0" else Nvfp4Weight(*_nv_parts(), 1.0)
    with pytest.raises(exc, match=match):
        q2gemv.gemv(_acts(), w, backend="cuda", stream=stream)


def test_raw_stream_handle_in_the_simulator_is_refused(no_launch):
    if not simulator_active():
        pytest.skip("the simulator refuses raw handles; a GPU takes them")
    with pytest.raises(ValueError, match=r"stream: the CUDA simulator has no external streams"):
        q2gemv.gemv(_acts(), Q2Weight(_q2_raw(), N, K, 64), backend="cuda", stream=5)


@pytest.mark.parametrize(
    ("present", "exc", "match"),
    [
        (None, TypeError, r"present: expected a sequence of 5 bools"),
        (5, TypeError, r"present: expected a sequence of 5 bools"),
        ("TTTTT", TypeError, r"present: expected a sequence of 5 bools"),
        ([1, 1, 1, 1, 1], TypeError, r"present: expected bool flags, got int"),
        ([True, None, True, True, True], TypeError, r"present: expected bool flags, got NoneType"),
        ([True] * 4, ValueError, r"present: expected 5 flags"),
    ],
    ids=["None", "int", "str", "ints", "None-flag", "four"],
)
def test_select_tier_names_present(present, exc, match):
    with pytest.raises(exc, match=match):
        select_tier(1, present, True)


def test_select_tier_names_exact_m():
    with pytest.raises(TypeError, match=r"exact_m: expected a bool, got str"):
        select_tier(1, [True] * 5, "yes")
    assert select_tier(5, np.ones(5, bool), np.bool_(True)) == 1  # numpy bools are bools


# -- W4A16 tables and plans: validated whole, before the first launch ---------------------


def test_tier_table_refuses_unknown_kernels():
    with pytest.raises(ValueError, match=r"kernels: width 4 expected None or a W4A16 kernel"):
        W4a16BatchmTiers(("w4a16_gemv_batch4_typo", None, None, None, None))
    with pytest.raises(ValueError, match=r"kernels: width 8 expected .*got 'w4a16_gemv_batch4'"):
        W4a16BatchmTiers((None, None, None, None, "w4a16_gemv_batch4"))  # too narrow for 8 rows
    t = W4a16BatchmTiers(("w4a16_gemv_batch8", None, None, None, "w4a16_gemv_batch32"))
    assert t.kernel(3) == "w4a16_gemv_batch8"  # wider is allowed (same bits, slower)


def test_kernel_tables_agree():
    assert T.W4A16_KERNEL_MAX_M == w4cuda.MAX_M
    for names in ([], T.candidate_kernel_names()):
        W4a16BatchmTiers.resolve(available=names)  # every resolved table is accepted


def test_check_plan_accepts_every_tier_plan():
    for mask in itertools.product([False, True], repeat=5):
        names = [
            n for n, keep in zip(T.candidate_kernel_names(), mask + (True,), strict=True) if keep
        ]
        tiers = W4a16BatchmTiers.resolve(available=names)
        for m in (0, 1, 4, 5, 7, 8, 9, 16, 17, 32, 33, 70):
            plan = T.plan_w4a16(m, tiers)
            assert T.check_plan(plan, m) == plan


@pytest.mark.parametrize(
    ("plan", "m", "match"),
    [
        ([(0, 4, "w4a16_gemv_batch3")], 4, r"plan: launch 0: unknown kernel 'w4a16_gemv_batch3'"),
        ([(0, 4, ["w4a16_gemv_batch4"])], 4, r"unknown kernel"),
        ([(0, 5, "w4a16_gemv_batch4")], 5, r"plan: launch 0 .*1\.\.4 rows of w4a16_gemv_batch4"),
        ([(0, 0, "w4a16_gemv_batch4")], 0, r"plan: launch 0"),
        ([(0, 4, "w4a16_gemv_batch4"), (5, 4, "w4a16_gemv_batch4")], 9, r"expected rows 4\.\."),
        ([(0, 4, "w4a16_gemv_batch4"), (2, 4, "w4a16_gemv_batch4")], 6, r"expected rows 4\.\."),
        ([(0, 4, "w4a16_gemv_batch4")], 8, r"plan: covers rows 0\.\.3, expected 0\.\.7"),
        ([(0, True, "w4a16_gemv_batch4")], 1, r"plan: launch 0"),
        ([(0, 4)], 4, r"plan: launch 0: expected \(row0, rows, kernel\)"),
        (5, 4, r"plan: expected \(row0, rows, kernel\) launches"),
    ],
)
def test_check_plan_refuses(plan, m, match):
    with pytest.raises(ValueError, match=match):
        T.check_plan(plan, m)


def _tiers_with(name: str) -> W4a16BatchmTiers:
    """A table holding ``name`` at width 8, past the constructor's check (as a stale or
    hand-patched table would)."""
    t = W4a16BatchmTiers.resolve(available=T.candidate_kernel_names())
    object.__setattr__(t, "kernels", t.kernels[:4] + (name,))
    return t


def test_w4a16_gemv_checks_the_whole_plan_before_the_first_launch(no_launch):
    # M = 40: chunk 0..31 on batch32 would launch before chunk 32..39 reached the bad name
    a = _acts(40)
    with pytest.raises(ValueError, match=r"plan: launch 1: unknown kernel 'w4a16_gemv_bogus'"):
        w4cuda.w4a16_gemv(a, Nvfp4Weight(*_nv_parts(), 1.0), tiers=_tiers_with("w4a16_gemv_bogus"))
    with pytest.raises(ValueError, match=r"plan: launch 1 .*1\.\.4 rows of w4a16_gemv_batch4"):
        w4cuda.w4a16_gemv(a, Nvfp4Weight(*_nv_parts(), 1.0), tiers=_tiers_with("w4a16_gemv_batch4"))


def test_run_plan_checks_before_upload(no_launch, monkeypatch):
    uploads = []
    monkeypatch.setattr(w4cuda.DeviceNvfp4Weight, "upload", lambda *a, **k: uploads.append(a))
    plan = [(0, 32, "w4a16_gemv_batch32"), (32, 8, "nope")]
    with pytest.raises(ValueError, match=r"plan: launch 1: unknown kernel 'nope'"):
        w4cuda._run_plan(plan, _acts(40).view(np.uint16), Nvfp4Weight(*_nv_parts(), 1.0), 0)
    assert uploads == []


# -- device weights: sizes checked against (n, k, group) at construction ------------------


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


# -- explain states the backend ------------------------------------------------------------


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_explain_states_the_backend(family):
    w = Q2Weight(_q2_raw(), N, K, 64) if family == "q2_0" else Nvfp4Weight(*_nv_parts(), 1.0)
    lines = q2gemv.explain(w, 3).splitlines()
    want = {
        "simulator": "backend: cuda on numba's CUDA simulator",
        "gpu": "backend: cuda on the GPU",
    }[cuda_kind()]
    assert lines[1].startswith(want), lines  # right after the head line
    dw = w.to_device() if family == "q2_0" else w4cuda.DeviceNvfp4Weight.upload(w)
    assert q2gemv.explain(dw, 3).splitlines()[1] == "backend: cuda (the weight is device-resident)"

"""Edges of the API that need a run (issue 16): backend="cuda" with neither a GPU nor the
simulator (in a subprocess), concurrent calls from threads (simulator: serialised, same
bits; GPU: threads and streams, gpu-marked), and the Q2_0 reference's memory bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import tracemalloc

import numpy as np
import pytest

import q2gemv
from q2gemv import Nvfp4Weight, quantize_q2_0
from q2gemv import reference as ref
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal
from q2gemv.host.backends import gpu_present, simulator_active
from q2gemv.reference import q2_0 as ref_q2
from q2gemv.reference.exact import q2_0_gemv_exact

# -- backend="cuda" where nothing serves it ---------------------------------------------------

_NO_CUDA_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import q2gemv
    from q2gemv.formats.bf16 import BF16

    w = q2gemv.quantize_q2_0(np.ones((3, 128), np.float32), 64)
    w4 = q2gemv.Nvfp4Weight.from_float(np.ones((3, 128), np.float32))
    a = np.ones((2, 128), BF16)
    for weight in (w, w4):
        try:
            q2gemv.gemv(a, weight, backend="cuda")
        except Exception as e:
            print("ERR", type(e).__name__, e)
        else:
            print("RAN")
        print("EXPLAIN", q2gemv.explain(weight, 2).splitlines()[1])
        print("DEFAULT", q2gemv.gemv(a, weight).shape)  # backend=None falls back
    """
)


def test_backend_cuda_without_gpu_or_simulator_says_how_to_get_one():
    if gpu_present():
        pytest.skip("this machine has a GPU: backend='cuda' is served")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    res = subprocess.run(
        [sys.executable, "-c", _NO_CUDA_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    errs = [ln for ln in lines if ln.startswith("ERR")]
    assert len(errs) == 2, res.stdout  # both families refused, neither ran
    for ln in errs:
        assert ln.startswith(
            "ERR ValueError backend: 'cuda' needs a CUDA GPU or the CUDA simulator"
        )
        assert "NUMBA_ENABLE_CUDASIM=1 before numba is first imported" in ln
        assert "CudaSupportError" not in ln
    assert [ln for ln in lines if ln.startswith("EXPLAIN")] == [
        "EXPLAIN backend: reference (NumPy; no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not "
        "set before numba's import)"
    ] * 2
    assert [ln for ln in lines if ln.startswith("DEFAULT")] == ["DEFAULT (2, 3)"] * 2


# -- concurrent calls from threads ------------------------------------------------------------


def _run_threads(jobs):
    """Run ``jobs`` (callables) in one thread each, started together; their results in order."""
    results: list = [None] * len(jobs)
    errors: list = []
    barrier = threading.Barrier(len(jobs))

    def work(i, job):
        try:
            barrier.wait()
            results[i] = job()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=work, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return results


def _case(n, k, m, seed):
    rng = np.random.default_rng(seed)
    w = quantize_q2_0(rng.standard_normal((n, k)).astype(np.float32), 64)
    w4 = Nvfp4Weight.from_float(rng.standard_normal((n, k)).astype(np.float32))
    a = rng.standard_normal((m, k)).astype(BF16)
    return w, w4, a


def test_simulator_calls_from_four_threads_are_serialised_with_the_same_bits():
    if not simulator_active():
        pytest.skip("simulator behaviour (a GPU runs test_gpu_threads_and_streams)")
    from numba import cuda

    w, w4, a = _case(7, 128, 1, seed=11)
    want_q2 = q2_0_gemv_exact(a, w).view(np.uint16)  # Q2_0's default contract
    want_w4 = ref.w4a16_gemv(a, w4).view(np.uint16)
    dw = w.to_device()
    jobs = [
        lambda: q2gemv.gemv(a, w, backend="cuda"),
        lambda: q2gemv.gemv(a, w4, backend="cuda", stream=cuda.stream()),
        lambda: q2gemv.gemv(a, dw),  # a device weight, uploaded before the threads start
        lambda: q2gemv.gemv(cuda.to_device(a.view(np.uint16)), w4).copy_to_host(),
    ]
    got = _run_threads(jobs)
    for i, want in enumerate((want_q2, want_w4, want_q2, want_w4)):
        assert_bits_equal(np.asarray(got[i]).view(np.uint16), want, label=f"thread {i}")


def test_simulator_lock_is_held_by_one_call_at_a_time(monkeypatch):
    if not simulator_active():
        pytest.skip("the lock is a no-op on a GPU")
    from q2gemv.cuda.runtime import launcher
    from q2gemv.host.backends import SIMULATOR_LOCK

    inside, most = [0], [0]
    real = launcher.launch_all  # every gemv on the cuda backend enqueues through it

    def counting(*args, **kwargs):
        assert SIMULATOR_LOCK.held()
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        try:
            return real(*args, **kwargs)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(launcher, "launch_all", counting)
    _, w4, a = _case(3, 64, 1, seed=12)
    for numerics in ("seed", "exact"):
        inside[0] = most[0] = 0
        _run_threads([lambda n=numerics: q2gemv.gemv(a, w4, backend="cuda", numerics=n)] * 3)
        assert most[0] == 1, numerics
    assert not SIMULATOR_LOCK.held()


@pytest.mark.gpu
def test_gpu_threads_and_streams():
    """8 threads, each on its own stream, both families, host and device weights: same bits."""
    from numba import cuda

    w, w4, a = _case(4096, 2048, 9, seed=13)
    want_q2 = q2_0_gemv_exact(a, w).view(np.uint16)  # Q2_0's default contract
    want_w4 = ref.w4a16_gemv(a, w4).view(np.uint16)
    from q2gemv.cuda.nvfp4 import DeviceNvfp4Weight

    dw, dw4 = w.to_device(), DeviceNvfp4Weight.upload(w4)  # shared by every thread

    def job(i):
        st = cuda.stream()
        out = []
        for _ in range(5):
            out.append(q2gemv.gemv(a, w if i % 2 else dw, backend="cuda", stream=st))
            out.append(q2gemv.gemv(a, w4 if i % 2 else dw4, backend="cuda", stream=st))
            d_a = cuda.to_device(a.view(np.uint16), stream=st)
            out.append(q2gemv.gemv(d_a, dw, stream=st).copy_to_host(stream=st))
            st.synchronize()
        return out

    for i, outs in enumerate(_run_threads([lambda i=i: job(i) for i in range(8)])):
        for j, y in enumerate(outs):
            want = want_w4 if j % 3 == 1 else want_q2
            assert_bits_equal(np.asarray(y).view(np.uint16), want, label=f"thread {i} call {j}")


# -- the Q2_0 reference is chunked by rows of a --------------------------------------------------


def test_q2_reference_chunking_keeps_the_bits(monkeypatch):
    rng = np.random.default_rng(14)
    w = quantize_q2_0(rng.standard_normal((37, 256)).astype(np.float32), 64)
    a = (rng.standard_normal((21, 256)) * 4).astype(BF16)
    want = {fn: getattr(ref_q2, fn)(a, w).view(np.uint16) for fn in ("q2_0_gemv", "q2_0_gemv_vec")}
    for elems, rows in ((1, 1), (1000, 5), (1 << 14, 16)):
        monkeypatch.setattr(ref_q2, "_CHUNK_ELEMS", elems)
        monkeypatch.setattr(ref_q2, "_ROW_CHUNK", rows)
        for fn, bits in want.items():
            assert_bits_equal(getattr(ref_q2, fn)(a, w).view(np.uint16), bits, label=fn)


def test_q2_reference_memory_does_not_grow_with_m(monkeypatch):
    # unchunked, M=2048 activation rows x 64 weight rows x 64 lanes is 8M elements per
    # step (~350 MB with the f64 fma temporaries); the budget below allows 2**13 (~0.4 MB)
    monkeypatch.setattr(ref_q2, "_CHUNK_ELEMS", 1 << 13)
    rng = np.random.default_rng(15)
    w = quantize_q2_0(rng.standard_normal((64, 128)).astype(np.float32), 128)
    a = rng.standard_normal((2048, 128)).astype(BF16)
    tracemalloc.start()
    try:
        y = ref_q2.q2_0_gemv(a, w)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    inherent = y.size * 4 * 3  # the fp32 [M, N] result and its bf16 conversion
    assert peak < inherent + (4 << 20), (peak, inherent)

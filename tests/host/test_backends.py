"""host/backends.py under threads (issue 16): concurrent calls from threads are serialised
by the simulator lock with the same bits; on a GPU, threads and streams (gpu-marked).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import q2gemv
from q2gemv import Nvfp4Weight, quantize_q2_0
from q2gemv import reference as ref
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal
from q2gemv.host.backends import simulator_active
from q2gemv.reference.exact import q2_0_gemv_exact

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

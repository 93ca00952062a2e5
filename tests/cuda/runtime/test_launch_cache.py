"""gemv's cached bound launches: a repeated device call is a lookup plus the launches, never stale.

Simulator: numba device arrays (the cache keys on identity there and keeps the
objects alive); GPU (``gpu`` marker): torch tensors, keyed on addresses.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import cuda

import q2gemv
from q2gemv.cuda.runtime import launcher
from q2gemv.golden.check import assert_bits_equal
from tests.q2_cases import random_acts, random_weight

N, K = 5, 64


@pytest.fixture
def counted(monkeypatch):
    """How many times the launcher validated a plan (the cache's misses)."""
    calls = []
    real = launcher._launches  # the road's validation (launches() is its public wrapper)

    def spy(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(launcher, "_launches", spy)
    return calls


def _want(a, w, **kw):
    return q2gemv.gemv(a, w, backend="reference", **kw).view(np.uint16)


@pytest.mark.parametrize("numerics", ["exact", "seed"])
def test_second_call_hits_and_new_buffers_are_never_stale(counted, numerics):
    rng = np.random.default_rng(1)
    w = random_weight(rng, N, K, 64)
    dw = w.to_device()
    a1, a2 = random_acts(rng, 1, K), random_acts(rng, 1, K)
    d_a1, d_a2 = cuda.to_device(a1.view(np.uint16)), cuda.to_device(a2.view(np.uint16))
    out1, out2 = cuda.device_array((1, N), np.uint16), cuda.device_array((1, N), np.uint16)
    assert q2gemv.gemv(d_a1, dw, out=out1, numerics=numerics) is out1
    assert len(counted) == 1 and len(dw.launch_cache) == 1
    out1.copy_to_device(np.zeros((1, N), np.uint16))
    assert q2gemv.gemv(d_a1, dw, out=out1, numerics=numerics) is out1  # hit: no validation
    assert len(counted) == 1
    assert_bits_equal(out1.copy_to_host(), _want(a1, w, numerics=numerics), "hit")
    q2gemv.gemv(d_a2, dw, out=out1, numerics=numerics)  # other activations: a new entry
    assert_bits_equal(out1.copy_to_host(), _want(a2, w, numerics=numerics), "new a")
    q2gemv.gemv(d_a1, dw, out=out2, numerics=numerics)  # other out: a new entry
    assert_bits_equal(out2.copy_to_host(), _want(a1, w, numerics=numerics), "new out")
    assert len(counted) == 3 and len(dw.launch_cache) == 3
    with pytest.raises(ValueError, match="out: expected shape"):  # still validated per key
        q2gemv.gemv(d_a1, dw, out=cuda.device_array((1, N + 1), np.uint16), numerics=numerics)
    # arguments gemv refuses never match a cached key, even beside cached buffers
    for kw, exc, needle in (
        ({"kernel": ["q2_0_gemv"]}, TypeError, "kernel: expected a kernel name"),
        ({"stream": "x"}, TypeError, "stream: expected None"),
        ({"stream": 1.0}, TypeError, "stream: expected None"),
        ({"backend": "reference"}, ValueError, "backend: activations on the GPU need"),
    ):
        with pytest.raises(exc, match=needle):
            q2gemv.gemv(d_a1, dw, out=out1, **({"numerics": numerics} | kw))


def test_stream_kernel_and_nvfp4_are_part_of_the_key(counted, monkeypatch):
    monkeypatch.setattr(launcher, "LAUNCH_CACHE_SIZE", 2)
    rng = np.random.default_rng(2)
    w = q2gemv.Nvfp4Weight.from_float(rng.standard_normal((3, 32)).astype(np.float32))
    dw = q2gemv.to_device(w)
    a = random_acts(rng, 2, 32)
    d_a = cuda.to_device(a.view(np.uint16))
    out = cuda.device_array((2, 3), np.uint16)
    want = _want(a, w)
    st = cuda.stream()
    for kw in ({}, {"stream": st}, {"kernel": "w4a16_gemv_batch8"}, {}):
        q2gemv.gemv(d_a, dw, out=out, **kw)
        cuda.synchronize()
        assert_bits_equal(out.copy_to_host(), want, str(kw))
        assert len(dw.launch_cache) <= 2
    assert len(counted) == 4  # the cache holds 2: the first key was dropped, so missed again


def test_host_weight_and_no_out_are_not_cached(counted):
    rng = np.random.default_rng(3)
    w = random_weight(rng, N, K, 64)
    d_a = cuda.to_device(random_acts(rng, 1, K).view(np.uint16))
    q2gemv.gemv(d_a, w, out=cuda.device_array((1, N), np.uint16))
    dw = w.to_device()
    q2gemv.gemv(d_a, dw)
    assert len(counted) == 2 and dw.launch_cache == {}


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_torch_cached_calls_match_reference_and_follow_buffers(family):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    if family == "q2_0":
        w = random_weight(rng, 512, 512, 128)
    else:
        w = q2gemv.Nvfp4Weight.from_float(rng.standard_normal((512, 512)).astype(np.float32))
    dw = w.to_device()

    def t(x):
        return torch.from_numpy(x.view(np.int16)).cuda().view(torch.bfloat16)

    for m in (1, 4, 9):
        a1, a2 = random_acts(rng, m, 512), random_acts(rng, m, 512)
        ta1, ta2 = t(a1), t(a2)
        out = torch.empty((m, 512), dtype=torch.bfloat16, device="cuda")
        for ta, a in ((ta1, a1), (ta1, a1), (ta2, a2), (ta1, a1)):
            out.zero_()
            assert q2gemv.gemv(ta, dw, out=out) is out
            got = out.view(torch.int16).cpu().numpy().view(np.uint16)
            assert_bits_equal(got, _want(a, w), f"{family} m={m}")
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):  # torch's current stream changes: a new key, bits the same
            q2gemv.gemv(ta2, dw, out=out)
        s.synchronize()
        assert_bits_equal(out.view(torch.int16).cpu().numpy().view(np.uint16), _want(a2, w))
    assert 0 < len(dw.launch_cache) <= launcher.LAUNCH_CACHE_SIZE


@pytest.mark.gpu
def test_cached_exact_call_is_graph_capturable():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    w = random_weight(rng, 1024, 1024, 128)
    dw = w.to_device()
    a = random_acts(rng, 2, 1024)
    ta = torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16)
    out = torch.empty((2, 1024), dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        q2gemv.gemv(ta, dw, out=out)  # warm-up: validates, allocates the workspace, binds
        q2gemv.gemv(ta, dw, out=out)  # the cached path
        torch.cuda.synchronize()
        out.zero_()
        with torch.cuda.graph(g, stream=s):
            q2gemv.gemv(ta, dw, out=out)
    g.replay()
    torch.cuda.synchronize()
    assert_bits_equal(out.view(torch.int16).cpu().numpy().view(np.uint16), _want(a, w))


@pytest.mark.gpu
def test_cached_call_host_time_is_small():
    """Not a benchmark (benchmarks/bench_api.py is): a loose guard that the hit path is taken."""
    import time

    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    dw = random_weight(rng, 1024, 1024, 128).to_device()
    ta = torch.zeros((1, 1024), dtype=torch.bfloat16, device="cuda")
    out = torch.empty((1, 1024), dtype=torch.bfloat16, device="cuda")
    q2gemv.gemv(ta, dw, out=out)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        q2gemv.gemv(ta, dw, out=out)
    per_call = (time.perf_counter() - t0) / 200
    torch.cuda.synchronize()
    assert per_call < 100e-6, per_call


def test_reload_env_replans(counted):
    from q2gemv.dispatch import nvfp4_tiers as tiers

    rng = np.random.default_rng(7)
    dw = random_weight(rng, N, K, 64).to_device()
    d_a = cuda.to_device(random_acts(rng, 1, K).view(np.uint16))
    out = cuda.device_array((1, N), np.uint16)
    q2gemv.gemv(d_a, dw, out=out, numerics="seed")
    tiers.reload_env()  # the W4A16 kill switches may have changed: plans made before are stale
    q2gemv.gemv(d_a, dw, out=out, numerics="seed")
    assert len(counted) == 2

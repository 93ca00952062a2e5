"""The API's numerics switch: exact by default for Q2_0, seed on request, NVFP4 unchanged.

Covers ``q2gemv.gemv`` / ``plan`` / ``explain`` with ``numerics=``, ``kernel=``
against it, ``q2gemv.prepare`` (activations converted once, bit-equal
results), batch invariance across the exact kernel's row chunks, device
activations (numba arrays) under the exact contract, and the long-plan
summary of ``explain``. Simulated calls use N <= 16, K <= 256 (one CTA of
256 threads: ~1-3 s each on the CUDA simulator).

Then the edges of issue 16: backend="cuda" with neither a GPU nor the simulator (in a
subprocess), out= overlapping a weight, kernel= and stream= refused before any launch,
and the backend line of ``explain`` (on the small cases of tests/weight_cases.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import q2gemv
from q2gemv import Nvfp4Weight, Q2Weight, api
from q2gemv import reference as ref
from q2gemv.api import check_out
from q2gemv.cuda.nvfp4 import seed as w4cuda
from q2gemv.dispatch import nvfp4_tiers as tiers
from q2gemv.dispatch import plan as launch
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal
from q2gemv.host.backends import cuda_kind, gpu_present, simulator_active
from q2gemv.reference.exact import q2_0_gemv_exact
from tests.q2_cases import random_acts, random_weight
from tests.weight_cases import K as K_EDGE
from tests.weight_cases import M as M_EDGE
from tests.weight_cases import N as N_EDGE
from tests.weight_cases import _acts, _nv_parts, _q2_raw

N, K = 16, 128


def _case(seed=0, m=3, n=N, k=K, group=64, specials=False):
    rng = np.random.default_rng(seed)
    return random_weight(rng, n, k, group), random_acts(rng, m, k, specials=specials)


def _nv(seed=1, n=7, k=64):
    rng = np.random.default_rng(seed)
    return q2gemv.Nvfp4Weight.from_float(rng.standard_normal((n, k)).astype(np.float32))


def _bits(y):
    return np.asarray(y).view(np.uint16)


# -- the default and the switch ------------------------------------------------------------------


def test_default_is_exact_for_q2_on_the_reference_backend():
    w, a = _case()
    want = _bits(q2_0_gemv_exact(a, w))
    assert_bits_equal(_bits(q2gemv.gemv(a, w, backend="reference")), want, label="default")
    assert_bits_equal(
        _bits(q2gemv.gemv(a, w, backend="reference", numerics="exact")), want, label="exact"
    )
    assert q2gemv.plan(w, 3) == [(0, 3, "q2_0_gemv_exact")]
    assert q2gemv.plan(w, 3, numerics="exact") == q2gemv.plan(w, 3, "q2_0_gemv_exact")
    assert api.resolve_numerics("q2_0") == "exact"


def test_default_is_exact_for_q2_on_the_cuda_backend():
    w, a = _case(seed=2, m=2)
    got = q2gemv.gemv(a, w, backend="cuda")
    assert_bits_equal(_bits(got), _bits(q2_0_gemv_exact(a, w)), label="cuda default")


def test_seed_reproduces_the_seed_kernels_bits():
    # +-2**16 at k = 0 and 64 (equal weights) cancel exactly; fp32 partial sums of the seed
    # order lose the small terms beside them, the exact contract keeps them (to 2**-6)
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 4, (N, K), dtype=np.uint8)
    codes[:, 64] = codes[:, 0]
    w = q2gemv.Q2Weight.from_codes(
        codes, (rng.standard_normal((N, 1)) * 0.05).astype(np.float16), group=128
    )
    a = rng.standard_normal((2, K)).astype(np.float32)
    a[:, 0], a[:, 64] = 2.0**16, -(2.0**16)
    a = a.astype(BF16)
    want = _bits(ref.q2_0_gemv_vec(a, w))  # every vec-family seed kernel gives these bits
    assert not np.array_equal(want, _bits(q2_0_gemv_exact(a, w)))  # the contracts differ here
    got_ref = q2gemv.gemv(a, w, backend="reference", numerics="seed")
    assert_bits_equal(_bits(got_ref), want, label="seed reference")
    got = q2gemv.gemv(a, w, backend="cuda", numerics="seed")
    assert_bits_equal(_bits(got), want, label="seed cuda")
    # the seed plan is today's rule, unchanged
    for m in (0, 1, 2, 9):
        seed = [(r0, r, api.default_q2_kernel(m, w.n)) for r0, r in launch.batchm_row_chunks(m)]
        assert q2gemv.plan(w, m, numerics="seed") == seed, m


@pytest.mark.parametrize("kernel", ["q2_0_gemv", "q2_0_gemv_vec_batchm_rt2"])
def test_a_seed_kernel_name_wins_over_the_default(kernel):
    w, a = _case(seed=4)
    got = q2gemv.gemv(a, w, kernel=kernel, backend="reference")
    assert_bits_equal(_bits(got), _bits(getattr(ref, kernel)(a, w)), label=kernel)
    assert all(name == kernel for _, _, name in q2gemv.plan(w, 3, kernel))
    text = q2gemv.explain(w, 3, kernel)
    assert "numerics: seed" in text and "kernel= wins" in text
    assert api.resolve_numerics("q2_0", None, kernel) == "seed"
    assert api.resolve_numerics("q2_0", "seed", kernel) == "seed"


def test_contradicting_kernel_and_numerics_is_a_value_error_naming_kernel():
    w, a = _case()
    with pytest.raises(ValueError, match=r"^kernel: q2_0_gemv_exact computes the exact"):
        q2gemv.gemv(a, w, kernel="q2_0_gemv_exact", numerics="seed", backend="reference")
    with pytest.raises(ValueError, match=r"^kernel: q2_0_gemv_vec computes the seed"):
        q2gemv.plan(w, 2, "q2_0_gemv_vec", numerics="exact")
    with pytest.raises(ValueError, match=r"^kernel: expected one of"):
        q2gemv.explain(w, 2, "q2_0_gemv_fast")


@pytest.mark.parametrize("bad", ["fast", "EXACT", "", 1, True, ["exact"]])
def test_bad_numerics_is_a_value_error_naming_it_before_anything_runs(bad, monkeypatch):
    from q2gemv.cuda.runtime import launcher

    def never(*args, **kwargs):
        raise AssertionError("ran before numerics was checked")

    monkeypatch.setattr(launcher, "run_bits", never)
    monkeypatch.setattr(launcher, "enqueue", never)
    w, a = _case()
    from numba import cuda

    for call in (
        lambda: q2gemv.gemv(a, w, numerics=bad, backend="cuda"),
        lambda: q2gemv.gemv(cuda.to_device(a.view(np.uint16)), w, numerics=bad),
        lambda: q2gemv.gemv(q2gemv.prepare(a, backend="reference"), w, numerics=bad),
        lambda: q2gemv.plan(w, 3, numerics=bad),
        lambda: q2gemv.explain(w, 3, numerics=bad),
        lambda: q2gemv.plan(_nv(), 3, numerics=bad),
    ):
        with pytest.raises(ValueError, match=r"^numerics: expected one of \('exact', 'seed'\)"):
            call()


def test_nvfp4_defaults_to_exact_and_seed_is_the_tier_dispatch():
    """NVFP4: numerics=None and 'exact' run w4a16_gemv_exact; 'seed' (or naming a tier) runs
    the seed tier plan exactly as before the exact contract existed."""
    from q2gemv.reference import exact as rex

    w4 = _nv()
    a = random_acts(np.random.default_rng(5), 5, w4.k)
    want_exact = _bits(rex.w4a16_gemv_exact(a, w4))
    want_seed = _bits(ref.w4a16_gemv(a, w4))
    assert api.resolve_numerics("w4a16") == "exact"
    for numerics in (None, "exact"):
        got = q2gemv.gemv(a, w4, backend="reference", numerics=numerics)
        assert_bits_equal(_bits(got), want_exact, label=f"nvfp4 numerics={numerics}")
        assert list(q2gemv.plan(w4, 5, numerics=numerics)) == [(0, 5, "w4a16_gemv_exact")]
    got = q2gemv.gemv(a, w4, backend="reference", numerics="seed")
    assert_bits_equal(_bits(got), want_seed, label="nvfp4 numerics='seed'")
    assert q2gemv.plan(w4, 5, numerics="seed") == tiers.plan_w4a16(5, api.default_w4a16_tiers())
    tier = tiers.plan_w4a16(5, api.default_w4a16_tiers())[0][2]
    assert api.resolve_numerics("w4a16", None, tier) == "seed"  # a named tier: seed
    assert api.resolve_numerics("w4a16", None, "w4a16_gemv_exact") == "exact"
    assert list(q2gemv.plan(w4, 20)) == [
        (0, 8, "w4a16_gemv_exact"), (8, 8, "w4a16_gemv_exact"), (16, 4, "w4a16_gemv_exact")
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"^kernel: w4a16_gemv_exact computes the exact"):
        q2gemv.plan(w4, 5, kernel="w4a16_gemv_exact", numerics="seed")
    with pytest.raises(ValueError, match=rf"^kernel: {tier} computes the seed contract"):
        q2gemv.plan(w4, 5, kernel=tier, numerics="exact")
    with pytest.raises(ValueError, match=r"^kernel: expected one of"):
        q2gemv.plan(w4, 5, kernel="q2_0_gemv_exact")
    text = q2gemv.explain(w4, 5)
    assert "numerics: exact" in text and "the NVFP4 default" in text
    assert "kernel: w4a16_gemv_exact" in text
    assert "numerics: seed" in q2gemv.explain(w4, 5, numerics="seed")


# -- q2gemv.prepare -------------------------------------------------------------------------------


def test_prepare_on_the_reference_backend_is_bit_equal_and_reusable():
    rng = np.random.default_rng(6)
    w1, w2 = random_weight(rng, 9, K, 64), random_weight(rng, 5, K, 128)
    a = random_acts(rng, 4, K, specials=True)
    p = q2gemv.prepare(a, backend="reference")
    assert (p.m, p.k, p.backend, p.operands) == (4, K, "reference", None)
    a[...] = 0  # the prepared copy is private: changing the caller's array changes nothing
    a = p.bits.view(BF16)
    for w in (w1, w2, w1):
        assert_bits_equal(_bits(q2gemv.gemv(p, w)), _bits(q2gemv.gemv(a, w, backend="reference")))
    p1 = q2gemv.prepare(a[1], backend="reference")  # 1-D in, 1-D out
    y1 = q2gemv.gemv(p1, w1)
    assert y1.shape == (9,)
    assert_bits_equal(_bits(y1), _bits(q2_0_gemv_exact(a[1], w1)))
    out = np.empty((4, 5), BF16)
    assert q2gemv.gemv(p, w2, out=out) is out


def test_prepare_on_cuda_converts_once_and_uploads_nothing_new(monkeypatch):
    from q2gemv.cuda.q2_0 import exact
    from q2gemv.cuda.runtime import launcher

    w, a = _case(seed=7, m=2, specials=True)
    dw = w.to_device()
    want = _bits(q2_0_gemv_exact(a, w))
    p = q2gemv.prepare(a, backend="cuda")
    assert p.backend == "cuda" and p.operands is not None

    def never(*args, **kwargs):
        raise AssertionError("the activations were prepared again")

    monkeypatch.setattr(exact, "prepare_device", never)
    monkeypatch.setattr(launcher, "prepare_device", never)
    assert_bits_equal(_bits(q2gemv.gemv(p, dw)), want, label="prepared, device weight")
    assert_bits_equal(_bits(q2gemv.gemv(p, w)), want, label="prepared, host weight")
    assert_bits_equal(_bits(q2gemv.gemv(p, w, backend="reference")), want, label="reference")


def test_prepared_activations_serve_only_q2_exact():
    w, a = _case()
    p = q2gemv.prepare(a, backend="reference")
    bad = [
        (lambda: q2gemv.gemv(p, _nv(k=K)), ValueError, r"^a: prepared .* not an NVFP4 weight"),
        (lambda: q2gemv.gemv(p, w, numerics="seed"), ValueError, r"^a: prepared .*seed"),
        (lambda: q2gemv.gemv(p, w, kernel="q2_0_gemv"), ValueError, r"^a: prepared .*seed"),
        (lambda: q2gemv.gemv(p, random_weight(np.random.default_rng(0), 3, 256, 64)),
         ValueError, r"^a: expected K=256"),
        (lambda: q2gemv.gemv(p, w, backend="cuda"), ValueError, r"^a: these activations were "
         r"prepared for the reference backend"),
        (lambda: q2gemv.prepare(a.astype(np.float32)), TypeError, r"^a: expected dtype bfloat16"),
        (lambda: q2gemv.prepare(a[:, :100]), ValueError, r"^a: the exact contract's kernels"),
        (lambda: q2gemv.prepare(a[None]), ValueError, r"^a: expected shape"),
        (lambda: q2gemv.prepare(a, backend="gpu"), ValueError, r"^backend: expected one of"),
    ]  # fmt: skip
    for call, exc, needle in bad:
        with pytest.raises(exc, match=needle):
            call()


# -- batch invariance across the exact kernel's row chunks ----------------------------------------


def test_batch_invariance_across_row_chunks():
    """M=17 crosses the 8-row launches twice (and would cross 16): each row == a one-row call.
    M=33 crosses a chunk of 32 rows."""
    from q2gemv.cuda.q2_0 import exact

    rng = np.random.default_rng(8)
    w = random_weight(rng, 9, K, 128)
    a = random_acts(rng, 17, K)
    a[3, 5] = a[12, 0] = np.nan  # two NaN rows, one in each later chunk
    assert exact.BUILD_MAX_M < 17 and exact.MAX_M == api.Q2_EXACT_KERNELS["q2_0_gemv_exact"]
    assert len(q2gemv.plan(w, 17)) == 1 and len(q2gemv.plan(w, 33)) == 2
    ref_all = _bits(q2gemv.gemv(a, w, backend="reference"))
    for i in range(17):
        one = q2gemv.gemv(a[i : i + 1], w, backend="reference")
        assert_bits_equal(_bits(one), ref_all[i : i + 1], label=f"reference row {i}")
    got = _bits(q2gemv.gemv(a, w, backend="cuda"))
    assert_bits_equal(got, ref_all, label="cuda M=17")
    for i in (0, 7, 8, 15, 16):  # both sides of every chunk seam
        one = q2gemv.gemv(a[i], w, backend="cuda")
        assert_bits_equal(_bits(one), got[i], label=f"cuda row {i} alone")


# -- device activations ---------------------------------------------------------------------------


def test_device_activations_use_prepare_and_the_exact_kernel_on_the_callers_stream():
    from numba import cuda

    from q2gemv.cuda.runtime import launcher

    w, a = _case(seed=9, m=2)
    dw = w.to_device()
    want = _bits(q2_0_gemv_exact(a, w))
    st = cuda.stream()
    d_a = cuda.to_device(a.view(np.uint16), stream=st)
    launcher.clear_workspaces()
    y = q2gemv.gemv(d_a, dw, stream=st)
    assert_bits_equal(y.copy_to_host(stream=st), want, label="device a, exact")
    (key,) = launcher._WORKSPACES
    # (device, stream, exact module, M, K, activation format)
    assert key[2:] == ("q2gemv.cuda.q2_0.exact_launch", 2, K, "bf16")
    out = cuda.device_array((2, N), np.uint16)
    assert q2gemv.gemv(d_a, dw, out=out, stream=st) is out  # the same stream: the same buffers
    assert list(launcher._WORKSPACES) == [key]
    assert_bits_equal(out.copy_to_host(), want, label="device a, exact, out=")
    seed = q2gemv.gemv(d_a, dw, numerics="seed").copy_to_host()
    assert_bits_equal(seed, _bits(ref.q2_0_gemv_vec(a, w)), label="device a, seed")


# -- explain ----------------------------------------------------------------------------------------


def test_explain_names_the_contract_and_the_exact_launches():
    w, _ = _case()
    lines = q2gemv.explain(w, 17).splitlines()
    assert lines[1].startswith("backend: ")  # the backend line stays second
    assert lines[2].startswith("numerics: exact (order-free") and "Q2_0 default" in lines[2]
    assert "docs/numerics.md" in lines[2]
    assert "kernel: q2_0_gemv_exact" in lines[3]
    assert lines[4].startswith(f"launches ({-(-17 // launch.Q2_EXACT_MAX_M)}): rows 0..")
    seed = q2gemv.explain(w, 3, numerics="seed")
    assert "numerics: seed" in seed and "numerics='seed'" in seed
    assert "q2_0_gemv_vec_batchm_rt2" in seed


@pytest.mark.parametrize("numerics", [None, "seed"])
def test_plan_refuses_huge_m_and_explain_summarises_long_plans(numerics):
    w, _ = _case()
    for m in (2**63, api.PLAN_MAX_M + 1):
        with pytest.raises(ValueError, match=r"^m: expected at most"):
            q2gemv.plan(w, m, numerics=numerics)
        with pytest.raises(ValueError, match=r"^m: expected at most"):
            q2gemv.explain(w, m, numerics=numerics)
    t0 = time.perf_counter()
    texts = [q2gemv.explain(w, api.PLAN_MAX_M, numerics=numerics)]
    texts.append(q2gemv.explain(w, api.PLAN_MAX_M, "q2_0_gemv", numerics=numerics))
    texts.append(q2gemv.explain(_nv(), api.PLAN_MAX_M))
    assert time.perf_counter() - t0 < 5  # nothing of 2**31 entries was built
    for text in texts:
        assert len(text) < 3000 and "more like these" in text, text
    assert f"rows {api.PLAN_MAX_M - 1}..{api.PLAN_MAX_M - 1} on q2_0_gemv" in texts[1]
    assert "launches (2147483647)" in texts[1]
    # a short plan is listed in full, as before
    assert q2gemv.explain(w, 2, numerics=numerics).count(" on q2_0_gemv") == len(
        q2gemv.plan(w, 2, numerics=numerics)
    )


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


def _weight_over(buf: np.ndarray, family: str):
    """A weight whose bytes are the writeable ``buf``: what the ownership rule now prevents,
    built by bypassing it (as a subclass or an older version could) to test check_out alone."""
    if family == "q2_0":
        w = Q2Weight(_q2_raw(), N_EDGE, K_EDGE, 64)
        object.__setattr__(w, "raw", buf[: w.raw.size])
    else:
        w = Nvfp4Weight(*_nv_parts(), 1.0)
        object.__setattr__(w, "packed", buf[: w.packed.size].reshape(w.packed.shape))
    return w


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_out_overlapping_the_weight_is_refused(no_launch, family):
    buf = np.zeros(4096, np.uint8)
    w = _weight_over(buf, family)
    out = buf[: M_EDGE * N_EDGE * 2].view(BF16).reshape(M_EDGE, N_EDGE)
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
    out = buf[: M_EDGE * N_EDGE * 2].view(BF16).reshape(M_EDGE, N_EDGE)
    with pytest.raises(ValueError, match=r"weight\.scales"):
        check_out(out, _acts(), (M_EDGE, N_EDGE), w)
    # a separate out is fine
    check_out(np.zeros((M_EDGE, N_EDGE), BF16), _acts(), (M_EDGE, N_EDGE), w)


def test_out_overlapping_a_device_weight_is_refused(no_launch):
    from numba import cuda

    w = Q2Weight(_q2_raw(), N_EDGE, K_EDGE, 64)
    dw = w.to_device(keep_gguf=True)
    d_a = cuda.to_device(_acts().view(np.uint16))
    # uint16 [M, N] over the weight's device bytes
    out = dw.b16[: M_EDGE * N_EDGE].reshape(M_EDGE, N_EDGE)
    before = dw.b16.copy_to_host()
    with pytest.raises(
        ValueError, match=r"out: must not overlap the weight's device buffer \(b16\)"
    ):
        q2gemv.gemv(d_a, dw, out=out)
    assert (dw.b16.copy_to_host() == before).all()


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
@pytest.mark.parametrize("kernel", [["q2_0_gemv"], ("w4a16_gemv_batch4",), 3, b"q2_0_gemv"])
def test_kernel_not_a_name_is_a_type_error(no_launch, family, kernel):
    w = (
        Q2Weight(_q2_raw(), N_EDGE, K_EDGE, 64)
        if family == "q2_0"
        else Nvfp4Weight(*_nv_parts(), 1.0)
    )
    for backend in ("reference", "cuda"):
        with pytest.raises(TypeError, match=r"kernel: expected a kernel name \(str\) or None"):
            q2gemv.gemv(_acts(), w, kernel=kernel, backend=backend)


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
    w = (
        Q2Weight(_q2_raw(), N_EDGE, K_EDGE, 64)
        if family == "q2_0"
        else Nvfp4Weight(*_nv_parts(), 1.0)
    )
    with pytest.raises(exc, match=match):
        q2gemv.gemv(_acts(), w, backend="cuda", stream=stream)


def test_raw_stream_handle_in_the_simulator_is_refused(no_launch):
    if not simulator_active():
        pytest.skip("the simulator refuses raw handles; a GPU takes them")
    with pytest.raises(ValueError, match=r"stream: the CUDA simulator has no external streams"):
        q2gemv.gemv(_acts(), Q2Weight(_q2_raw(), N_EDGE, K_EDGE, 64), backend="cuda", stream=5)


@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_explain_states_the_backend(family):
    w = (
        Q2Weight(_q2_raw(), N_EDGE, K_EDGE, 64)
        if family == "q2_0"
        else Nvfp4Weight(*_nv_parts(), 1.0)
    )
    lines = q2gemv.explain(w, 3).splitlines()
    want = {
        "simulator": "backend: cuda on numba's CUDA simulator",
        "gpu": "backend: cuda on the GPU",
    }[cuda_kind()]
    assert lines[1].startswith(want), lines  # right after the head line
    dw = w.to_device() if family == "q2_0" else w4cuda.DeviceNvfp4Weight.upload(w)
    assert q2gemv.explain(dw, 3).splitlines()[1] == "backend: cuda (the weight is device-resident)"

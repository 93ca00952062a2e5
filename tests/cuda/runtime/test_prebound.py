"""The pre-bound launch path, checked without a GPU.

Two checks need numba's real CUDA target (not the simulator this test
session may have selected), so they run in a subprocess with
``NUMBA_ENABLE_CUDASIM=0``; neither touches a driver:

* the argument list numba's own ``_Kernel._prepare_args`` flattens, packed
  the way :class:`~q2gemv.cuda.runtime.prebound.PreboundLaunch` packs it, has
  exactly the parameter sizes of the PTX entry (sm_90) of one kernel of each
  family (all kernels of a family share its signature);
* the ``void*[]`` a PreboundLaunch hands to ``cuLaunchKernel`` (a fake
  driver here) points at those values, with the grid, block and stream
  asked for.

No timing is asserted anywhere (benchmarks are scripts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from q2gemv.cuda.runtime import prebound

_FAKES = textwrap.dedent(
    """
    import ctypes, json, re, sys, types as pytypes
    import numpy as np
    from numba import cuda
    from numba.cuda.dispatcher import _Kernel
    from numba.cuda.core import sigutils
    from numba.cuda.cudadrv.devicearray import _StridedLayoutShim, _StridedMemoryViewShim
    from q2gemv.cuda.runtime import prebound
    from q2gemv.cuda.q2_0 import seed as q2_0
    from q2gemv.cuda.nvfp4 import seed as w4a16

    class FakeDev:
        '''Looks like a numba device array to _prepare_args (no driver).'''
        __cuda_memory__ = True
        def __init__(self, ptr, shape, dtype):
            self.ptr, self.shape, self.dtype = ptr, tuple(shape), np.dtype(dtype)
            self.size = int(np.prod(shape))
            st, acc = [], self.dtype.itemsize
            for s in reversed(self.shape):
                st.append(acc)
                acc *= s
            self.strides = tuple(reversed(st))
        @property
        def _strided_memory_view_shim(self):
            lay = _StridedLayoutShim(strides_in_bytes=self.strides, is_contiguous_c=True,
                                     is_contiguous_f=len(self.shape) == 1, is_contiguous_any=True)
            return _StridedMemoryViewShim(ptr=self.ptr, shape=self.shape, dtype=self.dtype,
                                          size=self.size, _layout=lay)

    def ptx_param_sizes(body, sig):
        ptx, _ = cuda.compile_ptx(body, sig, cc=(9, 0))
        entry = ptx[ptx.index(".entry"):]
        entry = entry[: entry.index(")")]
        return [int(b) // 8 for b in re.findall(r"\\.param\\s+\\.[usbf](\\d+)", entry)]

    def fake_args(sig):
        argtypes, _ = sigutils.normalize_signature(sig)
        vals, ptr = [], 0x10000
        for t in argtypes:
            if hasattr(t, "ndim"):
                shape = (3, 64) if t.ndim == 2 else (96,)
                vals.append(FakeDev(ptr, shape, np.dtype(str(t.dtype))))
                ptr += 0x10000
            elif str(t) == "float32":
                vals.append(np.float32(0.5))
            else:
                vals.append(np.int32(7 + len(vals)))
        return argtypes, vals

    def flatten(argtypes, vals):
        flat, retr = [], []
        holder = pytypes.SimpleNamespace(extensions=[])
        for t, v in zip(argtypes, vals):
            _Kernel._prepare_args(holder, t, v, 0, retr, flat)
        assert not retr
        return flat
    """
)

_ABI_SCRIPT = _FAKES + textwrap.dedent(
    """
    out = {}
    for mod in (q2_0, w4a16):
        # one kernel per module: every kernel of a family has the family's signature
        for name, body, sig in mod.ptx_specs()[:1]:
            argtypes, vals = fake_args(sig)
            have = [ctypes.sizeof(prebound._ctype_of(v)) for v in flatten(argtypes, vals)]
            out[name] = [have, ptx_param_sizes(body, sig)]
    print(json.dumps(out))
    """
)

_LAUNCH_SCRIPT = _FAKES + textwrap.dedent(
    """
    calls = []

    class FakeResult(int):
        pass

    SUCCESS = FakeResult(0)

    class FakeDriver:
        class CUresult:
            CUDA_SUCCESS = SUCCESS
        @staticmethod
        def CUstream(h):
            return ("stream", int(h))
        @staticmethod
        def cuKernelGetFunction(handle):
            return SUCCESS, ("function of", handle)
        @staticmethod
        def cuGetErrorString(err):
            return SUCCESS, b"fake"
        @staticmethod
        def cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
            n = len(SIZES)
            ptrs = (ctypes.c_void_p * n).from_address(params)
            blobs = [ctypes.string_at(ptrs[i], SIZES[i]).hex() for i in range(n)]
            calls.append(dict(f=list(f), grid=[gx, gy, gz], block=[bx, by, bz], shmem=shmem,
                              stream=list(stream), params=blobs, extra=extra, attrs=None))
            return (SUCCESS,)
        class CUlaunchAttributeID:
            CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = "programmatic"
        class CUlaunchAttribute:
            def __init__(self):
                self.id = None
                self.value = pytypes.SimpleNamespace(programmaticStreamSerializationAllowed=0)
        class CUlaunchConfig:
            pass
        @staticmethod
        def cuLaunchKernelEx(cfg, f, params, extra):
            n = len(SIZES)
            ptrs = (ctypes.c_void_p * n).from_address(params)
            blobs = [ctypes.string_at(ptrs[i], SIZES[i]).hex() for i in range(n)]
            attrs = [[a.id, a.value.programmaticStreamSerializationAllowed]
                     for a in cfg.attrs[: cfg.numAttrs]]
            calls.append(dict(f=list(f), grid=[cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ],
                              block=[cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ],
                              shmem=cfg.sharedMemBytes, stream=list(cfg.hStream), params=blobs,
                              extra=extra, attrs=attrs))
            return (SUCCESS,)

    name = "q2_0_gemv_vec_batchm"
    sig = q2_0.SIGNATURE
    argtypes, vals = fake_args(sig)
    flat = flatten(argtypes, vals)
    SIZES = [ctypes.sizeof(prebound._ctype_of(v)) for v in flat]
    want = [bytes(prebound._ctype_of(v)).hex() for v in flat]

    class Info:
        def __init__(self, size):
            self.size = size

    kernel = pytypes.SimpleNamespace(
        argument_types=argtypes,
        extensions=[],
        bind=lambda: None,
        _codelibrary=pytypes.SimpleNamespace(get_cufunc=lambda: pytypes.SimpleNamespace(
            handle="kernel-handle",
            kernel=pytypes.SimpleNamespace(arguments_info=[Info(s) for s in SIZES]),
        )),
    )
    kernel._prepare_args = pytypes.MethodType(_Kernel._prepare_args, kernel)
    dispatcher = pytypes.SimpleNamespace(overloads={argtypes: kernel}, __name__=name)
    prebound._driver = lambda: FakeDriver
    prebound.cuda = pytypes.SimpleNamespace(current_context=lambda: None)
    pb = prebound.PreboundLaunch(dispatcher, (40, 1), 256, vals, stream=1234, name=name)
    pb()
    pb(stream=99)
    del vals  # the object must keep its own references to everything it packed
    pb()
    pdl = []
    for cc in ((9, 0), (8, 6)):  # PDL asked for: Hopper launches with it, an older GPU without
        prebound._compute_capability = lambda cc=cc: cc
        _, vals = fake_args(sig)
        pl = prebound.PreboundLaunch(dispatcher, (40, 1), 256, vals, stream=1234, name=name,
                                     pdl=True)
        pl()
        pl(stream=99)
        pl()
        pdl.append(pl.pdl)
    print(json.dumps(dict(calls=calls, want=want, mode=pb.mode, pdl=pdl, plain=pb.pdl)))
    """
)


def _run_real_target(script: str) -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    here = os.path.abspath(__file__)  # tests/cuda/runtime/: the repository is 4 levels up
    src = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here)))), "src"
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    r = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    if r.returncode != 0:
        if "NVVM" in r.stderr or "libnvvm" in r.stderr.lower():
            pytest.skip(f"no NVVM to compile PTX here: {r.stderr.strip().splitlines()[-1]}")
        raise AssertionError(f"subprocess failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_flattened_arguments_match_every_kernels_ptx_parameters():
    out = _run_real_target(_ABI_SCRIPT)
    assert out, "no kernels found"
    for name, (have, ptx) in out.items():
        assert have == ptx, f"{name}: packed sizes {have} != PTX params {ptx}"


def test_prebound_hands_the_driver_the_flattened_values():
    out = _run_real_target(_LAUNCH_SCRIPT)
    assert out["mode"] == "driver"
    first, override, again, *pdl_calls = out["calls"]
    assert out["plain"] is False and first["attrs"] is None  # pdl not asked for: cuLaunchKernel
    assert first["f"] == ["function of", "kernel-handle"]
    assert first["grid"] == [40, 1, 1] and first["block"] == [256, 1, 1]
    assert first["shmem"] == 0 and first["extra"] == 0
    assert first["stream"] == ["stream", 1234]
    assert override["stream"] == ["stream", 99]
    assert again["stream"] == ["stream", 1234]
    for call in (first, override, again):
        assert call["params"] == out["want"]
    # pdl=True: on sm_90 cuLaunchKernelEx with the programmatic-serialization attribute (the
    # same parameters, grid, block and streams); before sm_90 the plain launch
    assert out["pdl"] == [True, False]
    assert [c["stream"] for c in pdl_calls] == [
        ["stream", 1234],
        ["stream", 99],
        ["stream", 1234],
    ] * 2
    for call in pdl_calls[:3]:
        assert call["attrs"] == [["programmatic", 1]]
    for call in pdl_calls[3:]:
        assert call["attrs"] is None
    for call in pdl_calls:
        assert call["params"] == out["want"] and call["f"] == first["f"]
        assert call["grid"] == [40, 1, 1] and call["block"] == [256, 1, 1] and call["shmem"] == 0


@pytest.mark.parametrize(
    "stream, want",
    [(None, 0), (0, 0), (1234, 1234), (np.int64(5), 5)],
)
def test_stream_handle_plain_values(stream, want):
    assert prebound.stream_handle(stream) == want


def test_stream_handle_protocols():
    class TorchLike:
        cuda_stream = 77

    class CudaStreamProtocol:
        def __cuda_stream__(self):
            return (0, 88)

    assert prebound.stream_handle(TorchLike()) == 77
    assert prebound.stream_handle(CudaStreamProtocol()) == 88
    with pytest.raises(TypeError):
        prebound.stream_handle("stream")
    with pytest.raises(TypeError):
        prebound.stream_handle(True)


def test_ctype_of_refuses_what_it_cannot_pack():
    assert prebound._ctype_of(5).value == 5
    assert prebound._ctype_of(None).value == 0
    with pytest.raises(TypeError):
        prebound._ctype_of("x")


def test_dim3():
    assert prebound._dim3(7) == (7, 1, 1)
    assert prebound._dim3((2, 3)) == (2, 3, 1)
    with pytest.raises(ValueError):
        prebound._dim3((0,))
    with pytest.raises(ValueError):
        prebound._dim3((1, 1, 1, 1))


def test_bound_plan_asks_pdl_only_for_a_waiting_kernel_after_the_first_launch(monkeypatch):
    """A GEMV launched after its call's prepare may use PDL (its spec waits); the first launch
    of a call (a prepare, or the GEMV of prepared activations) and any kernel that does not
    wait never do."""
    from q2gemv.cuda.runtime import launcher

    seen = []

    def record(d, g, b, a, **kw):
        seen.append((kw["name"], kw["pdl"]))

    monkeypatch.setattr(launcher, "PreboundLaunch", record)
    plan = ["exact_prepare", "q2_0_gemv_exact", "q2_0_gemv_exact", "q2_0_gemv"]
    launcher.BoundPlan([(None, 1, 32, (), n) for n in plan])
    assert seen == [
        ("exact_prepare", False),
        ("q2_0_gemv_exact", True),
        ("q2_0_gemv_exact", True),
        ("q2_0_gemv", False),
    ]
    seen.clear()
    launcher.BoundPlan([(None, 1, 32, (), "w4a16_gemv_exact")])
    assert seen == [("w4a16_gemv_exact", False)]

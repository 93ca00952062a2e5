"""Pre-bound kernel launches: everything but the stream decided once, then one driver call.

A launch through numba's dispatcher pays on the host for the configuration lookup,
overload typing, marshalling every argument into numba's flattened kernel ABI and
``cuda.core``'s packing; for a decode GEMV that is as long as the kernel
(docs/design_notes.md). :class:`PreboundLaunch` pays it once, at construction: the
dispatcher's single compiled overload, bound to the current context; the arguments
flattened by numba's own ``_Kernel._prepare_args`` (the ABI is numba's by construction)
into ctypes values that live as long as the object, with a ``void*[]`` of their
addresses (checked against ``cuda.core``'s parameter sizes when it reports them: a
mismatch raises here, not on the GPU); grid, block, shared memory and the
``CUfunction``. ``__call__`` is then one ``cuLaunchKernel`` plus an error check. It only
enqueues on the stream it is given, so it is capturable in a CUDA graph.

Programmatic dependent launch (``pdl=True``, sm_90+): ``cuLaunchKernelEx`` with the
programmatic-stream-serialization attribute, so the kernel may start while the launch
before it still runs; it must read that launch's results only after ``grid_dep_wait``
(:mod:`q2gemv.cuda.runtime.dev`; :attr:`q2gemv.dispatch.registry.KernelSpec.grid_wait` says which
kernels do). Before sm_90, or with ``Q2GEMV_PDL=0`` (side-by-side timing), it is an
ordinary launch. In a CUDA graph it becomes a programmatic edge (CUDA 12.3+).

Limits: device buffers and scalars are fixed at construction (one object per rotated
weight copy; the object keeps them alive); host arrays are refused. Under the CUDA
simulator there is no driver: the object launches through the dispatcher
(``mode == "simulator"``), so callers' code paths stay the same.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

import numpy as np
from numba import config, cuda

SIMULATED: bool = bool(config.ENABLE_CUDASIM)
PDL_ENABLED: bool = os.environ.get("Q2GEMV_PDL", "1") != "0"
PDL_MIN_CC = (9, 0)  # griddepcontrol and the launch attribute: Hopper and later


def stream_handle(stream) -> int:
    """The raw ``CUstream`` value of ``stream`` as an int (0: the default stream).

    Accepts an int, a torch stream (``.cuda_stream``), a numba stream or any
    object with ``__cuda_stream__`` (the CUDA stream protocol), or None/0.
    """
    if stream is None:
        return 0
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return int(stream)
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
        return int(stream.cuda_stream)
    if hasattr(stream, "__cuda_stream__"):  # numba Stream, cuda.core Stream
        return int(stream.__cuda_stream__()[1])
    raise TypeError(f"stream: expected an int or a CUDA stream object, got {type(stream).__name__}")


def _single_overload(dispatcher):
    overloads = list(dispatcher.overloads.values())
    if len(overloads) != 1:
        raise ValueError(
            f"dispatcher {dispatcher!r}: expected exactly one compiled overload (compile it "
            f"eagerly for one signature), found {len(overloads)}"
        )
    return overloads[0]


def _ctype_of(value):
    """ctypes storage for one flattened kernel argument as ``cuda.core`` would pack it."""
    if isinstance(value, ctypes._SimpleCData):
        return value
    if value is None:  # c_void_p(0).value: a null data pointer (empty array)
        return ctypes.c_int64(0)
    if isinstance(value, bool):
        return ctypes.c_bool(value)
    if isinstance(value, int):  # pointers, nitems, itemsize, shape, strides: intptr_t
        return ctypes.c_int64(value)
    if isinstance(value, float):
        return ctypes.c_double(value)
    raise TypeError(f"kernel argument: cannot pre-pack a {type(value).__name__} ({value!r})")


def _driver():
    from cuda.bindings import driver

    return driver


def _check(driver, err, what: str) -> None:
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise RuntimeError(f"{what}: {err!r} ({msg.decode() if msg else '?'})")


class PreboundLaunch:
    """One kernel launch prepared once; ``launch()`` / ``launch(stream=...)`` enqueues it.

    Args:
        dispatcher: a ``cuda.jit`` dispatcher compiled for exactly one signature.
        griddim, blockdim: ints or 1..3-tuples, as for ``kernel[grid, block]``.
        args: the kernel arguments (device arrays, Python/NumPy scalars).
        stream: the default stream of :meth:`__call__` (int handle or stream object).
        sharedmem: dynamic shared memory bytes.
        name: a label for error messages and reports.
        keep_args: hold ``args`` (and so the device buffers) for the object's
            lifetime (default). False on a GPU: only their addresses are kept,
            and the caller answers for the buffers (the launch cache of
            :mod:`q2gemv.cuda.runtime.interop` keys bound launches on those addresses);
            the simulator always keeps them (it launches through the dispatcher).
        pdl: launch with programmatic dependent launch where the device allows
            (see the module docstring); only for a kernel that waits with
            ``grid_dep_wait`` before reading what earlier launches wrote.
            ``self.pdl`` says whether it does.
    """

    def __init__(
        self,
        dispatcher,
        griddim,
        blockdim,
        args: Sequence,
        *,
        stream=0,
        sharedmem: int = 0,
        name: str = "",
        keep_args: bool = True,
        pdl: bool = False,
    ):
        self.name = name or getattr(dispatcher, "__name__", "kernel")
        self.griddim = _dim3(griddim)
        self.blockdim = _dim3(blockdim)
        self.sharedmem = int(sharedmem)
        self.args = tuple(args)  # keeps the device buffers alive
        self._stream = stream_handle(stream)
        self.pdl = False
        if SIMULATED:
            self.mode = "simulator"
            self._dispatcher = dispatcher
            return
        self.mode = "driver"
        self._bind(dispatcher)
        if pdl and PDL_ENABLED and _compute_capability() >= PDL_MIN_CC:
            self._bind_pdl()
        if not keep_args:  # the caller keeps the buffers alive (or keys on their addresses)
            self.args = None

    def _bind(self, dispatcher) -> None:
        driver = _driver()
        cuda.current_context()  # make numba's (primary) context current on this thread
        kernel = _single_overload(dispatcher)
        kernel.bind()  # load the module into the context now, never during a capture
        cufunc = kernel._codelibrary.get_cufunc()
        flat: list = []
        retr: list = []
        for ty, val in zip(kernel.argument_types, self.args, strict=True):
            kernel._prepare_args(ty, val, 0, retr, flat)
        if retr:
            raise TypeError(
                f"{self.name}: host arrays among the arguments (they would need a copy back); "
                "pass device arrays"
            )
        self._values = [_ctype_of(v) for v in flat]
        self._check_param_sizes(cufunc)
        self._ptrs = (ctypes.c_void_p * max(1, len(self._values)))(
            *[ctypes.addressof(v) for v in self._values]
        )
        self._params = ctypes.addressof(self._ptrs)
        self._func = self._resolve_function(driver, cufunc.handle)
        self._cu_stream = driver.CUstream(self._stream)
        self._launch_kernel = driver.cuLaunchKernel
        self._success = driver.CUresult.CUDA_SUCCESS
        self._driver = driver

    def _bind_pdl(self) -> None:
        """The ``cuLaunchKernelEx`` configuration of this launch (the stream set per call)."""
        driver = self._driver
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg = driver.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.griddim
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.blockdim
        cfg.sharedMemBytes = self.sharedmem
        cfg.hStream = self._cu_stream
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        self._cfg = cfg
        self._cfg_stream = self._stream
        self._launch_ex = driver.cuLaunchKernelEx
        self.pdl = True

    def _check_param_sizes(self, cufunc) -> None:
        core_kernel = getattr(cufunc, "kernel", None)
        try:
            info = core_kernel.arguments_info if core_kernel is not None else None
        except Exception:  # noqa: BLE001 - needs a CUDA 12.4+ driver; the check is a bonus
            info = None
        if info is None:
            return
        sizes = [int(p.size if hasattr(p, "size") else p[1]) for p in info]
        have = [ctypes.sizeof(v) for v in self._values]
        if sizes != have:
            raise RuntimeError(
                f"{self.name}: flattened argument sizes {have} do not match the kernel's "
                f"parameters {sizes}"
            )

    @staticmethod
    def _resolve_function(driver, handle):
        # numba-cuda 0.30 loads kernels as CUkernel (library API); cuLaunchKernel takes
        # a CUkernel too, but the CUfunction of the current context skips a lookup.
        try:
            err, func = driver.cuKernelGetFunction(handle)
        except TypeError:  # already a CUfunction (module API)
            return handle
        return func if err == driver.CUresult.CUDA_SUCCESS else handle

    def __call__(self, stream=None) -> None:
        if self.mode == "simulator":
            self._dispatcher[self.griddim, self.blockdim, 0, self.sharedmem](*self.args)
            return
        if self.pdl:
            h = self._stream if stream is None else stream_handle(stream)
            if h != self._cfg_stream:
                self._cfg.hStream = self._driver.CUstream(h)
                self._cfg_stream = h
            (err,) = self._launch_ex(self._cfg, self._func, self._params, 0)
            if err != self._success:
                _check(self._driver, err, f"cuLaunchKernelEx({self.name}, PDL)")
            return
        s = self._cu_stream if stream is None else self._driver.CUstream(stream_handle(stream))
        g, b = self.griddim, self.blockdim
        (err,) = self._launch_kernel(
            self._func, g[0], g[1], g[2], b[0], b[1], b[2], self.sharedmem, s, self._params, 0
        )
        if err != self._success:
            _check(self._driver, err, f"cuLaunchKernel({self.name})")

    launch = __call__

    def __repr__(self) -> str:
        return (
            f"PreboundLaunch({self.name}, grid={self.griddim}, block={self.blockdim}, "
            f"mode={self.mode}, pdl={self.pdl})"
        )


def _compute_capability() -> tuple[int, int]:
    """The current device's compute capability (numba's context)."""
    return tuple(cuda.current_context().device.compute_capability)


def _dim3(d) -> tuple[int, int, int]:
    if isinstance(d, (int, np.integer)):
        d = (int(d),)
    d = tuple(int(x) for x in d)
    if not 1 <= len(d) <= 3 or min(d) < 1:
        raise ValueError(f"launch dimensions: expected 1..3 positive ints, got {d}")
    return d + (1,) * (3 - len(d))

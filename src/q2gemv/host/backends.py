"""Which backends exist here: NumPy reference always; numba.cuda on a GPU or the simulator.

Nothing here runs at import. ``NUMBA_ENABLE_CUDASIM`` is read by numba when
numba is first imported, so a process picks the simulator or the GPU once;
:func:`gpu_present` looks for a driver without importing numba so callers
can decide before that happens (e.g. to start a simulator subprocess).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import sys
import threading

BACKENDS = ("reference", "cuda")

HOW_TO_GET_CUDA = (
    "run on a machine with an NVIDIA GPU and driver, or select numba's CUDA simulator by "
    "setting NUMBA_ENABLE_CUDASIM=1 before numba is first imported (slow: tiny shapes "
    "only); or use backend='reference' (NumPy, same bits)"
)


def simulator_requested() -> bool:
    """True when this process's environment selects numba's CUDA simulator."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def gpu_present() -> bool:
    """A cheap, numba-free guess that an NVIDIA GPU and driver are on this machine."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or (
        shutil.which("nvidia-smi") is not None and os.path.exists("/proc/driver/nvidia")
    )


def cuda_kind() -> str | None:
    """``"gpu"``, ``"simulator"`` or None: what ``backend="cuda"`` runs on in this process."""
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        return "simulator"
    try:
        return "gpu" if cuda.is_available() else None
    except Exception:  # a broken driver install is "no GPU", not a crash
        return None


def default_backend() -> str:
    """``"cuda"`` when a GPU or the simulator serves it in this process, else ``"reference"``."""
    if not simulator_requested() and not gpu_present():
        return "reference"
    return "cuda" if cuda_kind() else "reference"


def require_cuda() -> str:
    """``"gpu"`` or ``"simulator"``; a ValueError naming ``backend`` when neither serves here.

    Asked for explicitly (``backend="cuda"``, a device weight) on a machine with
    neither, numba would fail deep inside with ``CudaSupportError``; this says
    how to get a backend instead, before anything is uploaded or launched.
    """
    kind = cuda_kind()
    if kind is None:
        raise ValueError(
            "backend: 'cuda' needs a CUDA GPU or the CUDA simulator, and this process has "
            f"neither: {HOW_TO_GET_CUDA}"
        )
    return kind


def describe_default(on_device: bool = False) -> str:
    """One line: the backend :func:`q2gemv.gemv` runs when ``backend`` is left None, and why.

    ``on_device``: the weight is device-resident (which implies ``"cuda"``).
    Imports numba only where a GPU or the simulator may serve (as
    :func:`default_backend` does).
    """
    if on_device:
        return "backend: cuda (the weight is device-resident)"
    if default_backend() == "reference":
        return (
            "backend: reference (NumPy; no CUDA GPU here and NUMBA_ENABLE_CUDASIM is not set "
            "before numba's import)"
        )
    if cuda_kind() == "simulator":
        return "backend: cuda on numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1; same bits, slow)"
    return "backend: cuda on the GPU"


# -- the simulator runs one call at a time ----------------------------------------------------


def simulator_active() -> bool:
    """True when ``backend="cuda"`` runs (or, numba not imported yet, will run) in the simulator."""
    config = sys.modules.get("numba.core.config")
    if config is not None:
        return bool(config.ENABLE_CUDASIM)
    return simulator_requested()


class _SimulatorLock:
    """A process-wide re-entrant lock that knows whether the current thread holds it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._local = threading.local()

    def held(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def __enter__(self) -> _SimulatorLock:
        self._lock.acquire()
        self._local.depth = getattr(self._local, "depth", 0) + 1
        return self

    def __exit__(self, *exc) -> None:
        self._local.depth -= 1
        self._lock.release()


SIMULATOR_LOCK = _SimulatorLock()


def simulator_lock():
    """Context manager that serialises device work in the CUDA simulator; a no-op on a GPU.

    Why: numba's simulator supports one kernel at a time (a module-global
    kernel context), and while a kernel runs it rebinds every global name
    that refers to ``numba.cuda`` in the kernel's module to a fake module:
    another thread's host code in that module (``cuda.to_device``) then fails
    with "'FakeCUDAModule' object has no attribute 'to_device'", and a second
    launch sees the wrong module. Each call holds this lock around all of its
    device work (uploads, launches, copies back); concurrent calls from
    several threads therefore run one after another, with the same bits. On a
    GPU numba's launches are thread-safe and nothing is locked.
    """
    return SIMULATOR_LOCK if simulator_active() else contextlib.nullcontext()

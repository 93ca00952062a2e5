"""Which backends exist here: NumPy reference always; numba.cuda on a GPU or the simulator.

Nothing here runs at import. ``NUMBA_ENABLE_CUDASIM`` is read by numba when
numba is first imported, so a process picks the simulator or the GPU once;
:func:`gpu_present` looks for a driver without importing numba so callers
can decide before that happens (e.g. to start a simulator subprocess).
"""

from __future__ import annotations

import glob
import os
import shutil

BACKENDS = ("reference", "cuda")


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

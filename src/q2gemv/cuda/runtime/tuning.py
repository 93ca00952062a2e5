"""Measured launch knobs as data: one JSON file per kernel family folder, one entry per GPU.

A launch rule (a pure function of the shape) reads its knobs here instead of holding them
as constants: ``knobs(folder, kernel)`` gives the entry of the GPU this process runs on
(matched by its device name), or the file's ``default`` entry where the GPU has none, where
there is no GPU, or under the simulator. Each entry names the sweep it was measured by.
Knobs change launch shapes only: every entry gives the same bits (the exact contract).
Read on first use, never at import; :func:`set_gpu_name` lets a test pick an entry.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

_GPU_NAME: str | None = None  # None: ask numba's current device on first use


def set_gpu_name(name: str | None) -> None:
    """Use the entries of GPU ``name`` from now on (None: the current device's again)."""
    global _GPU_NAME
    _GPU_NAME = name
    knobs.cache_clear()


def gpu_name() -> str:
    """The current device's name (``""`` under the simulator or without a GPU)."""
    if _GPU_NAME is not None:
        return _GPU_NAME
    from numba import config, cuda

    if config.ENABLE_CUDASIM or not cuda.is_available():
        return ""
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


@functools.cache
def _table(path: str) -> dict:
    return json.loads(Path(path).read_text())


@functools.cache
def knobs(folder: str, kernel: str) -> dict:
    """The knobs of ``kernel`` in ``folder/tuning.json`` for the current GPU (see the module)."""
    table = _table(str(Path(folder) / "tuning.json"))
    name = gpu_name()
    entry = next((e for gpu, e in table["gpus"].items() if gpu and gpu in name), None)
    entry = entry or table["gpus"][table["default"]]
    return dict(entry[kernel])

"""What the file readers' tests share: the memory map behind a loaded array."""

from __future__ import annotations

import mmap

import numpy as np


def mmap_of(arr: np.ndarray) -> mmap.mmap:
    """Walk an array's base chain to the mmap that owns its memory."""
    obj = arr
    while not isinstance(obj, mmap.mmap):
        obj = obj.obj if isinstance(obj, memoryview) else obj.base
        assert obj is not None, "array is not backed by a memory map"
    return obj

"""GGUF files (v2/v3), memory-mapped and copy-free.

* :mod:`.reader`: the file layout, :func:`read_gguf`, the ``block_q2_0`` loader
  :func:`load_q2_weights` (types 42, 142; the group from the byte room);
* :mod:`.writer`: :func:`save_q2_weights` (a GGUF v3 file of Q2_0 tensors) and
  :func:`write_gguf` (a model's file through the ``gguf`` package's ``GGUFWriter``);
* :mod:`.inspect`: :func:`format_inspect`, the ``q2gemv inspect`` summary.
"""

from __future__ import annotations

from .inspect import format_inspect
from .reader import GgufArray, GgufError, GgufFile, GgufTensorInfo, load_q2_weights, read_gguf
from .writer import GgufTensorOut, save_q2_weights, write_gguf

__all__ = [
    "GgufArray",
    "GgufError",
    "GgufFile",
    "GgufTensorInfo",
    "GgufTensorOut",
    "format_inspect",
    "load_q2_weights",
    "read_gguf",
    "save_q2_weights",
    "write_gguf",
]

"""File loading and saving, memory-mapped and copy-free.

* :mod:`q2gemv.io.gguf`: GGUF v2/v3 reader, ``block_q2_0`` (types 42, 142)
  loader (``reader``), v3 writers (``writer``) and the ``inspect`` text (``inspect``).
* :mod:`q2gemv.io.safetensors`: NVFP4 linear layers from ModelOpt and
  compressed-tensors safetensors checkpoints (``reader``), and the writer (``writer``).

Importing this package reads no file.
"""

from __future__ import annotations

from .gguf import (
    GgufArray,
    GgufError,
    GgufFile,
    GgufTensorInfo,
    format_inspect,
    load_q2_weights,
    read_gguf,
    save_q2_weights,
)
from .safetensors import SafetensorsError, find_nvfp4_layers, load_nvfp4_weights

__all__ = [
    "GgufArray",
    "GgufError",
    "GgufFile",
    "GgufTensorInfo",
    "SafetensorsError",
    "find_nvfp4_layers",
    "format_inspect",
    "load_nvfp4_weights",
    "load_q2_weights",
    "read_gguf",
    "save_q2_weights",
]

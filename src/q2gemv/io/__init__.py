"""File loading and saving: GGUF Q2_0 weights (``q2gemv.io.gguf``) and NVFP4
safetensors checkpoints (``q2gemv.io.safetensors``, needs the ``q2gemv[io]`` extra).

Importing this package reads no file and imports no optional dependency.
"""

from __future__ import annotations

from .gguf import (
    GgufError,
    GgufFile,
    GgufTensorInfo,
    format_inspect,
    load_q2_weights,
    read_gguf,
    save_q2_weights,
)

__all__ = [
    "GgufError",
    "GgufFile",
    "GgufTensorInfo",
    "format_inspect",
    "load_q2_weights",
    "read_gguf",
    "save_q2_weights",
]

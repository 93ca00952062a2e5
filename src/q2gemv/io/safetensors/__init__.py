"""safetensors files: NVFP4 linear layers (ModelOpt, compressed-tensors), memory-mapped.

* :mod:`.reader`: :func:`load_nvfp4_weights`, :func:`find_nvfp4_layers`, the checkpoint reader;
* :mod:`.writer`: :func:`write_safetensors` (a checkpoint file, written atomically).
"""

from __future__ import annotations

from .reader import SafetensorsError, find_nvfp4_layers, load_nvfp4_weights
from .writer import SafetensorsOut, write_safetensors

__all__ = [
    "SafetensorsError",
    "SafetensorsOut",
    "find_nvfp4_layers",
    "load_nvfp4_weights",
    "write_safetensors",
]

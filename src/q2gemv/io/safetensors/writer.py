"""A safetensors file written tensor by tensor, atomically (the writer of :func:`q2gemv.torch.save_safetensors`).

The layout is the one :mod:`q2gemv.io.safetensors` reads (u64 header length, JSON
header, data). As the ``safetensors`` reference implementation writes it: the header
is padded with spaces to a multiple of 8 bytes, tensors are laid out in order of
decreasing element size (then in the order given), so every tensor starts at a
multiple of its element size, back to back with no gap, and ``__metadata__`` holds
``{"format": "pt"}`` plus what the caller adds. The ``safetensors`` package is not
needed: each tensor's bytes come from its ``data()`` when it is written, so a model is
never held twice in memory (``safetensors.torch.save`` builds the whole file in one
``bytes``). The file goes through :func:`q2gemv.tools.atomic.atomic_write`.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...tools.atomic import atomic_write
from ...tools.progress import Progress
from .reader import DTYPE_SIZES


@dataclass(frozen=True)
class SafetensorsOut:
    """One tensor to write: name, safetensors dtype (``"U8"``, ``"F8_E4M3"``, ``"BF16"``,
    ``"F32"``...), row-major shape, and ``data()`` giving exactly its bytes (any dtype)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPE_SIZES[self.dtype]


def write_safetensors(
    path: str | os.PathLike,
    tensors: Sequence[SafetensorsOut],
    metadata: Mapping[str, str] | None = None,
    *,
    progress: bool | None = None,
) -> None:
    """Write ``tensors`` as one safetensors file at ``path`` (created or replaced atomically).

    Raises:
        ValueError: a duplicate or empty name, an unknown dtype, a metadata value that is
            not a str, or a ``data()`` whose byte count is not the tensor's.
    """
    meta = {"format": "pt", **(metadata or {})}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise ValueError("metadata: safetensors metadata maps str to str")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names) or "" in names or "__metadata__" in names:
        raise ValueError("tensors: names must be distinct, non-empty and not __metadata__")
    for t in tensors:
        if t.dtype not in DTYPE_SIZES:
            raise ValueError(f"tensor {t.name!r}: unknown safetensors dtype {t.dtype!r}")
    order = sorted(tensors, key=lambda t: -DTYPE_SIZES[t.dtype])  # stable: given order kept
    header: dict[str, object] = {"__metadata__": meta}
    offset = 0
    for t in order:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with atomic_write(path) as f, Progress("save_safetensors", len(order), progress) as bar:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in order:
            data = np.ascontiguousarray(t.data())
            if data.nbytes != t.nbytes:
                raise ValueError(
                    f"tensor {t.name!r}: data() gave {data.nbytes} bytes, expected {t.nbytes}"
                )
            f.write(memoryview(data.reshape(-1).view(np.uint8)))
            bar.step(t.name)

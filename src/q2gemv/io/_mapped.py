"""The read-only memory map both readers (GGUF, safetensors) open a file through."""

from __future__ import annotations

import mmap


def open_map(path, size: int) -> tuple[mmap.mmap | bytes, int]:
    """``(buffer, size)`` of the file at ``path`` of ``size`` bytes: a read-only map, or
    ``b""`` for an empty file (``mmap`` cannot map zero bytes)."""
    if size == 0:
        return b"", 0
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), size


def close_quietly(buf) -> None:
    """Close a map from :func:`open_map`; one whose views are still alive closes when they go."""
    if isinstance(buf, mmap.mmap):
        try:
            buf.close()
        except BufferError:  # views still alive: the map closes when they go
            pass

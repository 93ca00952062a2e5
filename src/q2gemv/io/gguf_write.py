"""A GGUF v3 file from typed metadata and tensors, written by the ``gguf`` package's ``GGUFWriter``.

:func:`write_gguf` is the file half of :func:`q2gemv.torch.save_gguf` (the model walk is
:mod:`q2gemv.models.export`). ``GGUFWriter`` (llama.cpp's ``gguf`` package, ``pip install
gguf``) writes the header, the metadata and every tensor, the ``block_q2_0`` ones
included: it takes a tensor type id it does not know (42, 142) as ``raw_dtype`` when the
data is handed over as bytes of a non-uint8 dtype with the logical ``(n, k)`` shape
given, so no byte of the layout is written here. What this module adds:

* the file goes through :func:`q2gemv.tools.atomic.atomic_write` (a temporary file beside
  the target, renamed over it at the end): ``GGUFWriter`` is given that open file
  instead of opening ``path`` itself, so a failure part-way leaves no partial target;
* tensors are produced one at a time (``GgufTensorOut.data`` is called when the tensor
  is written), so a model's permuted copies are not all held at once;
* one ``q2gemv.q2_0.group.<name>`` u32 per Q2 tensor (its group), as
  :func:`q2gemv.io.save_q2_weights` writes, so a tensor too small for its byte size to
  tell group 64 from 128 reads back unaided (llama.cpp ignores unknown keys).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formats.q2_0 import block_bytes
from ..tools.atomic import atomic_write
from ..tools.progress import Progress
from .gguf import GGML_MAX_NAME, GGUF_UINT32, KEY_Q2_GROUP_PREFIX, Q2_TYPES

GGUF_F32, GGUF_F16, GGUF_BF16 = 0, 1, 30  # ggml tensor type ids of the float tensors written
FLOAT_SIZES = {GGUF_F32: 4, GGUF_F16: 2, GGUF_BF16: 2}


@dataclass(frozen=True)
class GgufTensorOut:
    """One tensor to write.

    Attributes:
        name: the GGUF tensor name (under 64 bytes).
        shape: the row-major logical shape (``(n, k)`` for a weight, ``(k,)`` for a norm);
            written innermost-first (``ne = [k, n]``).
        type_id: 0 F32, 1 F16, 30 BF16, 42 Q2_0 (group 64 or 128), 142 PQ2_0 (group 128).
        data: called once when the tensor is written; returns a C-contiguous array of
            exactly the tensor's bytes (any dtype: BF16 as uint16 bits, Q2 as uint8 rows).
        group: the ``block_q2_0`` group of a Q2 type (None for float types).
    """

    name: str
    shape: tuple[int, ...]
    type_id: int
    data: Callable[[], np.ndarray]
    group: int | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor data (without padding)."""
        count = int(np.prod(self.shape, dtype=np.int64))
        if self.type_id in Q2_TYPES:
            return count // self.group * block_bytes(self.group)
        return count * FLOAT_SIZES[self.type_id]


def _check(t: GgufTensorOut) -> None:
    if not t.name or len(t.name.encode("utf-8")) >= GGML_MAX_NAME:
        raise ValueError(f"tensor name {t.name!r}: expected 1 to {GGML_MAX_NAME - 1} bytes")
    if t.type_id in Q2_TYPES:
        if t.group not in (64, 128) or (t.type_id == 142 and t.group != 128):
            raise ValueError(f"tensor {t.name!r}: type {t.type_id} with group {t.group!r}")
        if len(t.shape) != 2 or t.shape[1] % t.group:
            raise ValueError(f"tensor {t.name!r}: shape {t.shape} is not [n, k*{t.group}]")
    elif t.type_id not in FLOAT_SIZES:
        raise ValueError(f"tensor {t.name!r}: type {t.type_id} is not F32, F16, BF16 or Q2_0")


def write_gguf(
    path: str | os.PathLike,
    arch: str,
    metadata: Sequence[tuple[str, Any, int, int | None]],
    tensors: Sequence[GgufTensorOut],
    *,
    progress: bool | None = None,
) -> None:
    """Write a GGUF v3 file (alignment 32) with ``GGUFWriter``, atomically.

    Args:
        path: the file to create or replace (never truncated in place).
        arch: ``general.architecture`` (written first, as ``GGUFWriter`` does).
        metadata: ``(key, value, value_type, element_type)`` in order; the types are
            GGUF metadata value type ids (:data:`q2gemv.io.gguf.GGUF_UINT32`, ...;
            ``element_type`` for arrays, else None). A ``q2gemv.q2_0.group.<name>`` u32 is
            added for every Q2 tensor.
        tensors: in file order (see :class:`GgufTensorOut`).
        progress: one step per tensor written (see :mod:`q2gemv.tools.progress`).

    Raises:
        ImportError: the ``gguf`` package is not installed.
        ValueError: a tensor name, type, group or shape that cannot be written, or a
            ``data()`` whose byte count is not the tensor's.
    """
    try:
        import gguf
        from gguf.gguf_writer import WriterState
    except ImportError as err:
        raise ImportError(
            "writing a GGUF file needs llama.cpp's gguf package: pip install gguf"
        ) from err
    for t in tensors:
        _check(t)
    w = gguf.GGUFWriter(None, arch)
    for key, value, vtype, elem in metadata:
        sub = None if elem is None else gguf.GGUFValueType(elem)
        w.add_key_value(key, value, gguf.GGUFValueType(vtype), sub_type=sub)
    for t in tensors:
        if t.type_id in Q2_TYPES:
            w.add_key_value(KEY_Q2_GROUP_PREFIX + t.name, t.group, gguf.GGUFValueType(GGUF_UINT32))
    for t in tensors:
        # a non-uint8 dtype: GGUFWriter then takes ``shape`` as the logical shape, not bytes
        w.add_tensor_info(t.name, t.shape, np.dtype(np.int8), t.nbytes, raw_dtype=t.type_id)
    with atomic_write(path) as f, Progress("save_gguf", len(tensors), progress) as bar:
        w.fout, w.state = [f], WriterState.EMPTY  # GGUFWriter writes into our open file
        try:
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for t in tensors:
                data = np.ascontiguousarray(t.data())
                if data.nbytes != t.nbytes:
                    raise ValueError(
                        f"tensor {t.name!r}: data() gave {data.nbytes} bytes, expected {t.nbytes}"
                    )
                w.write_tensor_data(data)
                bar.step(t.name)  # write_tensor_data padded it to the alignment, the last too
        finally:
            w.fout = None  # atomic_write closes the file, never GGUFWriter

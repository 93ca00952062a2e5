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

import operator
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...formats.q2_0 import GGUF_TYPE_PQ2_0, GGUF_TYPE_Q2_0, Q2Weight, block_bytes
from ...tools.atomic import atomic_write
from ...tools.progress import Progress
from .reader import (
    _NUMPY_DTYPES,
    _SCALARS,
    GGML_MAX_NAME,
    GGUF_ARRAY,
    GGUF_BOOL,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_FLOAT32,
    GGUF_FLOAT64,
    GGUF_INT8,
    GGUF_INT16,
    GGUF_INT32,
    GGUF_INT64,
    GGUF_MAGIC,
    GGUF_MAX_ALIGNMENT,
    GGUF_MIN_ALIGNMENT,
    GGUF_STRING,
    GGUF_UINT8,
    GGUF_UINT16,
    GGUF_UINT32,
    GGUF_UINT64,
    GGUF_VERSION,
    KEY_ALIGNMENT,
    KEY_Q2_GROUP_PREFIX,
    Q2_TYPES,
    GgufArray,
    _align_up,
    value_type_name,
)

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


# -- writing -------------------------------------------------------------------

_INT_TYPES = (  # the smallest signed type first, as gguf-py does for Python ints
    (GGUF_INT32, -(2**31), 2**31 - 1),
    (GGUF_INT64, -(2**63), 2**63 - 1),
    (GGUF_UINT64, 0, 2**64 - 1),
)
_DTYPE_TO_GGUF = {
    np.dtype(np.uint8): GGUF_UINT8,
    np.dtype(np.int8): GGUF_INT8,
    np.dtype(np.uint16): GGUF_UINT16,
    np.dtype(np.int16): GGUF_INT16,
    np.dtype(np.uint32): GGUF_UINT32,
    np.dtype(np.int32): GGUF_INT32,
    np.dtype(np.float32): GGUF_FLOAT32,
    np.dtype(np.bool_): GGUF_BOOL,
    np.dtype(np.uint64): GGUF_UINT64,
    np.dtype(np.int64): GGUF_INT64,
    np.dtype(np.float64): GGUF_FLOAT64,
}


def _pack_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _infer_type(value, where: str) -> int:
    if isinstance(value, (np.generic, np.ndarray)) and value.dtype in _DTYPE_TO_GGUF:
        return GGUF_ARRAY if isinstance(value, np.ndarray) else _DTYPE_TO_GGUF[value.dtype]
    if isinstance(value, bool):
        return GGUF_BOOL
    if isinstance(value, int):
        for t, lo, hi in _INT_TYPES:
            if lo <= value <= hi:
                return t
        raise ValueError(f"{where}: integer {value} does not fit 64 bits")
    if isinstance(value, float):
        return GGUF_FLOAT32
    if isinstance(value, str):
        return GGUF_STRING
    if isinstance(value, (list, tuple, GgufArray)):
        return GGUF_ARRAY
    raise TypeError(
        f"{where}: expected str, int, float, bool, a numpy scalar or a list of them, "
        f"got {type(value).__name__}"
    )


def _pack_value(value, vtype: int, where: str) -> bytes:
    if vtype == GGUF_STRING:
        if not isinstance(value, str):
            raise TypeError(f"{where}: expected a str, got {type(value).__name__}")
        return _pack_string(value)
    if vtype == GGUF_ARRAY:
        if isinstance(value, GgufArray):  # read from a file: its bytes as they were
            return struct.pack("<IQ", value.elem_type, len(value)) + value._data
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                raise ValueError(f"{where}: expected a 1-D array, got shape {value.shape}")
            elem = _DTYPE_TO_GGUF[value.dtype]
            body = value.astype(_NUMPY_DTYPES[elem]).tobytes()
            return struct.pack("<IQ", elem, value.size) + body
        items = list(value)
        if not items:
            raise ValueError(
                f"{where}: cannot infer the element type of an empty list; "
                "pass an empty 1-D numpy array of the wanted dtype"
            )
        types = [_infer_type(v, f"{where}[{i}]") for i, v in enumerate(items)]
        if all(t in (GGUF_INT32, GGUF_INT64, GGUF_UINT64) for t in types) and not any(
            isinstance(v, np.generic) for v in items
        ):
            elem = max(types, key=[GGUF_INT32, GGUF_INT64, GGUF_UINT64].index)
            if elem == GGUF_UINT64 and min(items) < 0:
                raise ValueError(f"{where}: integers span more than 64 bits")
        elif len(set(types)) == 1:
            elem = types[0]
        else:
            names = sorted({value_type_name(t) for t in types})
            raise TypeError(f"{where}: mixed element types {names} in one array")
        return struct.pack("<IQ", elem, len(items)) + b"".join(
            _pack_value(v, elem, f"{where}[{i}]") for i, v in enumerate(items)
        )
    code = _SCALARS[vtype][0]
    if vtype == GGUF_BOOL:
        return struct.pack(code, 1 if value else 0)
    try:
        return struct.pack(code, value.item() if isinstance(value, np.generic) else value)
    except struct.error as e:
        raise ValueError(f"{where}: {value!r} does not fit {value_type_name(vtype)} ({e})") from e


def _as_int(x) -> int | None:
    """``x`` as a Python int when it is an integer (int or NumPy integer, not bool), else None."""
    if isinstance(x, (bool, np.bool_)):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def default_q2_type_id(group: int) -> int:
    """GGUF type id written for a group by default: 142 (PQ2_0) for 128, 42 (Q2_0) for 64."""
    return GGUF_TYPE_PQ2_0 if group == 128 else GGUF_TYPE_Q2_0


def save_q2_weights(
    path: str | os.PathLike,
    weights: dict[str, Q2Weight],
    metadata: dict[str, Any] | None = None,
    *,
    type_id: int | None = None,
    alignment: int = GGUF_DEFAULT_ALIGNMENT,
) -> None:
    """Write ``weights`` as a GGUF v3 file that :func:`load_q2_weights` reads back.

    Args:
        path: the file to create or overwrite (str or os.PathLike), atomically.
        weights: tensor name -> :class:`Q2Weight`, written in dict order.
        metadata: extra GGUF metadata, written first in dict order.
        type_id: None (142 for group 128, 42 for group 64), 42 for all, or 142 (group 128 only).
        alignment: the data alignment, a power of two from 8 to 2**31.

    Returns None. Layout and metadata value types: docs/files.md#save_q2_weights-layout.

    Raises:
        TypeError/ValueError naming the argument (a weight not a Q2Weight, a
        tensor name of 64 bytes or more, an unsupported metadata value or a
        ``q2gemv.q2_0.group.*`` key, a ``type_id`` other than 42/142/None, an
        ``alignment`` that is not a power of two from 8 to 2**31; NumPy
        integers are accepted).
    """
    if not isinstance(weights, dict):
        raise TypeError(
            f"weights: expected a dict of name -> Q2Weight, got {type(weights).__name__}"
        )
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata: expected a dict or None, got {type(metadata).__name__}")
    if type_id is not None and (_as_int(type_id) not in Q2_TYPES):
        raise ValueError(f"type_id: expected 42, 142 or None, got {type_id!r}")
    type_id = None if type_id is None else _as_int(type_id)
    a = _as_int(alignment)
    if a is None or not (GGUF_MIN_ALIGNMENT <= a <= GGUF_MAX_ALIGNMENT) or a & (a - 1):
        raise ValueError(
            f"alignment: expected a power of two from {GGUF_MIN_ALIGNMENT} to 2**31 (a GGUF "
            f"u32, a multiple of 8), got {alignment!r}"
        )
    alignment = a

    kv = b""
    n_kv = 0
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise TypeError(f"metadata: keys must be str, got {type(key).__name__}")
        where = f"metadata[{key!r}]"
        if key.startswith(KEY_Q2_GROUP_PREFIX):
            raise ValueError(f"{where}: keys {KEY_Q2_GROUP_PREFIX}* are written by this function")
        if key == KEY_ALIGNMENT:
            if _as_int(value) != alignment:
                raise ValueError(f"{where}: {value!r} disagrees with alignment={alignment}")
            vtype, value = GGUF_UINT32, alignment
        else:
            vtype = _infer_type(value, where)
        kv += _pack_string(key) + struct.pack("<I", vtype) + _pack_value(value, vtype, where)
        n_kv += 1
    if KEY_ALIGNMENT not in metadata:
        kv += _pack_string(KEY_ALIGNMENT) + struct.pack("<II", GGUF_UINT32, alignment)
        n_kv += 1
    for name, w in weights.items():  # checked below; recorded so small tensors read back
        if isinstance(name, str) and isinstance(w, Q2Weight):
            kv += _pack_string(KEY_Q2_GROUP_PREFIX + name)
            kv += struct.pack("<II", GGUF_UINT32, w.group)
            n_kv += 1

    infos = b""
    rel = 0
    items = []
    for name, w in weights.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"weights: tensor names must be non-empty str, got {name!r}")
        if len(name.encode("utf-8")) >= GGML_MAX_NAME:
            raise ValueError(
                f"weights[{name!r}]: tensor names must be under {GGML_MAX_NAME} bytes "
                "(ggml's limit)"
            )
        if not isinstance(w, Q2Weight):
            raise TypeError(f"weights[{name!r}]: expected a Q2Weight, got {type(w).__name__}")
        tid = default_q2_type_id(w.group) if type_id is None else type_id
        if tid == GGUF_TYPE_PQ2_0 and w.group != 128:
            raise ValueError(
                f"type_id: 142 (PQ2_0) is group 128, but weights[{name!r}] is group {w.group}"
            )
        infos += _pack_string(name) + struct.pack("<IQQIQ", 2, w.k, w.n, tid, rel)
        items.append(w)
        rel += _align_up(w.nbytes, alignment)

    head = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(items), n_kv) + kv + infos
    with atomic_write(path) as f:  # never truncates ``path`` in place: see q2gemv.tools.atomic
        f.write(head)
        f.write(b"\0" * (_align_up(len(head), alignment) - len(head)))
        for w in items:
            f.write(memoryview(w.raw))
            f.write(b"\0" * (_align_up(w.nbytes, alignment) - w.nbytes))

"""A small GGUF (v2, v3) reader and a Q2_0 writer, memory-mapped and copy-free.

The file layout (GGUF specification, ggml ``docs/gguf.md``; all integers
little-endian)::

    magic              4 bytes  "GGUF"
    version            u32      2 or 3 (v1 used u32 counts: refused)
    tensor_count       u64
    metadata_kv_count  u64
    metadata_kv_count x { key: string, value_type: u32, value }
    tensor_count      x { name: string, n_dims: u32, ne: u64[n_dims],
                          type: u32, offset: u64 }
    zero padding up to a multiple of ``alignment``
    tensor data        each tensor at data_start + offset, offset % alignment == 0

    string  = { len: u64, utf-8 bytes[len] }          (no terminator)
    array   = { elem_type: u32, count: u64, count x value }
    value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (one
    byte, 0 or 1), 8 string, 9 array, 10 u64, 11 i64, 12 f64

``alignment`` is the metadata key ``general.alignment`` (u32, a power of two),
32 when absent. ``ne`` is innermost-first: a row-major 2-D weight
``[n, k]`` is stored with ``ne = [k, n]``.

Q2_0 tensors (types 42 and 142) are read as :class:`~q2gemv.formats.q2_0.Q2Weight`
views of the map; their group comes from their byte room (docs/files.md).
"""

from __future__ import annotations

import bisect
import mmap
import operator
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...formats.q2_0 import GGUF_TYPE_PQ2_0, GGUF_TYPE_Q2_0, GROUPS, Q2Weight, block_bytes
from .._mapped import close_quietly, open_map

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_READ_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4  # ggml refuses tensors of more dimensions
GGML_MAX_NAME = 64  # ggml's name buffer, terminator included: names up to 63 bytes
GGUF_MIN_ALIGNMENT = 8  # the specification: general.alignment is a multiple of 8
GGUF_MAX_ALIGNMENT = 2**31  # the largest power of two a u32 holds
KEY_ALIGNMENT = "general.alignment"
# Written by save_q2_weights for each Q2 tensor: its group (u32 64 or 128), so a small
# type-42 tensor, whose byte size fits both groups, reads back unaided.
KEY_Q2_GROUP_PREFIX = "q2gemv.q2_0.group."

Q2_TYPES = (GGUF_TYPE_Q2_0, GGUF_TYPE_PQ2_0)

# -- metadata value types ------------------------------------------------------
GGUF_UINT8, GGUF_INT8, GGUF_UINT16, GGUF_INT16 = 0, 1, 2, 3
GGUF_UINT32, GGUF_INT32, GGUF_FLOAT32, GGUF_BOOL = 4, 5, 6, 7
GGUF_STRING, GGUF_ARRAY, GGUF_UINT64, GGUF_INT64, GGUF_FLOAT64 = 8, 9, 10, 11, 12

# fixed-size value types: struct code (little-endian), byte size, name
_SCALARS: dict[int, tuple[str, int, str]] = {
    GGUF_UINT8: ("<B", 1, "uint8"),
    GGUF_INT8: ("<b", 1, "int8"),
    GGUF_UINT16: ("<H", 2, "uint16"),
    GGUF_INT16: ("<h", 2, "int16"),
    GGUF_UINT32: ("<I", 4, "uint32"),
    GGUF_INT32: ("<i", 4, "int32"),
    GGUF_FLOAT32: ("<f", 4, "float32"),
    GGUF_BOOL: ("<B", 1, "bool"),
    GGUF_UINT64: ("<Q", 8, "uint64"),
    GGUF_INT64: ("<q", 8, "int64"),
    GGUF_FLOAT64: ("<d", 8, "float64"),
}
_NUMPY_DTYPES = {  # element type -> little-endian numpy dtype, for arrays
    GGUF_UINT8: "<u1",
    GGUF_INT8: "<i1",
    GGUF_UINT16: "<u2",
    GGUF_INT16: "<i2",
    GGUF_UINT32: "<u4",
    GGUF_INT32: "<i4",
    GGUF_FLOAT32: "<f4",
    GGUF_BOOL: "<u1",
    GGUF_UINT64: "<u8",
    GGUF_INT64: "<i8",
    GGUF_FLOAT64: "<f8",
}


def value_type_name(value_type: int) -> str:
    """``"uint32"``, ``"string"``, ``"array"``... for a GGUF metadata value type id."""
    if value_type == GGUF_STRING:
        return "string"
    if value_type == GGUF_ARRAY:
        return "array"
    if value_type in _SCALARS:
        return _SCALARS[value_type][2]
    return f"type{value_type}"


# -- ggml tensor types ---------------------------------------------------------
# id -> (name, elements per block, bytes per block), from ggml's type traits.
# The Q2_0 ids are not here: their block size depends on the group, which the
# loader derives per tensor.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
_Q2_NAMES = {GGUF_TYPE_Q2_0: "Q2_0", GGUF_TYPE_PQ2_0: "PQ2_0"}


def tensor_type_name(type_id: int) -> str:
    """ggml's name for a tensor type id (``"Q2_0"`` for 42, ``"PQ2_0"`` for 142)."""
    if type_id in _Q2_NAMES:
        return _Q2_NAMES[type_id]
    if type_id in GGML_TYPES:
        return GGML_TYPES[type_id][0]
    return f"type{type_id}"


class GgufError(ValueError):
    """A GGUF file that cannot be read as the specification says.

    The message names the file and, where one is concerned, the tensor.
    ``path`` and ``tensor`` are kept as attributes.
    """

    def __init__(self, path: str, message: str, tensor: str | None = None) -> None:
        self.path = path
        self.tensor = tensor
        where = f"{path}: tensor {tensor!r}: " if tensor is not None else f"{path}: "
        super().__init__(where + message)


def _align_up(x: int, alignment: int) -> int:
    return (x + alignment - 1) // alignment * alignment


def q2_sizes(n_elements: int, k: int) -> dict[int, int]:
    """Bytes of a ``block_q2_0`` tensor for each group whose block fits its rows.

    ``k`` is the row length (``ne[0]``); a group is possible only when it
    divides ``k``, since blocks never straddle rows.
    """
    return {g: n_elements // g * block_bytes(g) for g in GROUPS if k >= 1 and k % g == 0}


def q2_groups_for_room(n_elements: int, k: int, room: int, alignment: int) -> tuple[int, ...]:
    """The groups (ascending) whose tensor size explains ``room`` bytes.

    GGUF does not store a tensor's byte size. A ``block_q2_0`` tensor's room
    is the distance from its offset to the next larger tensor offset, or to
    the end of the file for the last tensor. Writers place each tensor at the
    previous one's end rounded up to ``alignment`` (ggml and gguf-py also pad
    after the last one), so group ``g`` explains the room when::

        size_g <= room < size_g + alignment     size_g = n_elements/g * (2 + g/4)

    Returns ``()`` when no group does (a truncated or malformed file) and both
    groups when the tensor is too small for the sizes to tell them apart
    (they differ by ``n_elements/64`` bytes, so at alignment 32 any tensor of
    2048 or more elements is unambiguous).
    """
    return tuple(
        g for g, size in q2_sizes(n_elements, k).items() if size <= room < size + alignment
    )


@dataclass(frozen=True)
class GgufTensorInfo:
    """One tensor info record of a GGUF file.

    Attributes:
        name: the tensor name.
        ne: dimensions as stored, innermost first (``ne[0]`` is the row length).
        type_id: the ggml tensor type id (42 Q2_0, 142 PQ2_0, 0 F32, ...).
        offset: absolute byte offset of the data in the file.
        relative_offset: the offset as stored, relative to the data section.
        room: bytes from ``offset`` to the next larger tensor offset or the end
            of the file.
        nbytes: the data size in bytes; ``None`` for an unknown type id or a
            Q2 tensor whose group the file leaves ambiguous.
        group: the ``block_q2_0`` group for Q2 types when determined, else
            ``None``.
        q2_groups: for Q2 types, the groups that explain ``room`` (see
            :func:`q2_groups_for_room`); ``()`` for other types.
    """

    name: str
    ne: tuple[int, ...]
    type_id: int
    offset: int
    relative_offset: int
    room: int
    nbytes: int | None
    group: int | None = None
    q2_groups: tuple[int, ...] = ()

    @property
    def n_elements(self) -> int:
        """Elements in the tensor: the product of ``ne`` (1 for a 0-D tensor)."""
        return int(np.prod(self.ne, dtype=object)) if self.ne else 1

    @property
    def k(self) -> int:
        """Row length: ``ne[0]`` (1 for a 0-D tensor)."""
        return self.ne[0] if self.ne else 1

    @property
    def n(self) -> int:
        """Rows: the product of ``ne[1:]`` (1 for 0-D and 1-D tensors)."""
        return int(np.prod(self.ne[1:], dtype=object)) if len(self.ne) > 1 else 1

    @property
    def type_name(self) -> str:
        """ggml's name for ``type_id`` (``"Q2_0"``, ``"PQ2_0"``, ``"F32"``, ``"type99"``...)."""
        return tensor_type_name(self.type_id)

    @property
    def is_q2(self) -> bool:
        """True for the ``block_q2_0`` type ids: 42 (Q2_0) and 142 (PQ2_0)."""
        return self.type_id in Q2_TYPES


@dataclass(frozen=True)
class GgufFile:
    """The parsed header, metadata and tensor infos of a GGUF file (no tensor data).

    Attributes:
        path: the file read.
        version: GGUF version (2 or 3).
        alignment: ``general.alignment`` or 32.
        metadata: key -> Python value (int, float, bool, str; floats carry the
            stored float32/float64 value). Arrays of numbers or bools are
            read-only 1-D NumPy arrays of the stored dtype (no Python object
            per element); arrays of strings or arrays are :class:`GgufArray`
            sequences (their bytes as stored, elements decoded on access), so
            the metadata costs about the bytes it takes in the file.
        metadata_types: key -> ``(value_type,)`` or, for arrays,
            ``(GGUF_ARRAY, element_type)``.
        tensors: tensor infos in file order.
        data_offset: absolute start of the data section.
        file_size: bytes in the file.
    """

    path: str
    version: int
    alignment: int
    metadata: dict[str, Any] = field(repr=False)
    metadata_types: dict[str, tuple[int, ...]] = field(repr=False)
    tensors: tuple[GgufTensorInfo, ...] = field(repr=False)
    data_offset: int
    file_size: int

    def tensor(self, name: str) -> GgufTensorInfo:
        """The tensor info named ``name``; KeyError when absent."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"{self.path}: no tensor named {name!r}")


class GgufArray(Sequence):
    """A metadata array of strings or of arrays, kept compact: its bytes as stored.

    One copy of the array's encoded elements and each element's offset (4 bytes, 8
    beyond 4 GiB), not a Python object per element, so hostile metadata cannot
    exhaust memory (docs/design_notes.md). The encoding was checked when the file was
    read, so decoding an element cannot fail.

    Elements are decoded on access: a ``str`` for an array of strings; for an
    array of arrays, a read-only NumPy array (numbers, bools) or another
    ``GgufArray``. A slice gives a list. ``tolist()`` gives nested Python lists;
    a ``GgufArray`` equals a list, tuple or ``GgufArray`` of the same values.

    Attributes:
        elem_type: the GGUF value type of the elements (8 string, 9 array).
    """

    __slots__ = ("elem_type", "_data", "_starts")

    def __init__(self, elem_type: int, data: bytes, starts: np.ndarray) -> None:
        self.elem_type = elem_type
        self._data = data  # the encoded elements, as in the file
        self._starts = starts  # element i is _data[starts[i]:starts[i + 1]]

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._decode(j) for j in range(*i.indices(len(self)))]
        i = operator.index(i)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"GgufArray index {i} out of range for {n} elements")
        return self._decode(i)

    def _decode(self, i: int):
        cur = _Cursor(self._data, int(self._starts[i + 1]), "<metadata array>")
        cur.pos = int(self._starts[i])
        return _read_value(cur, self.elem_type, "<element>", depth=1)

    def tolist(self) -> list:
        """The elements as nested Python lists (str, int, float, bool inside)."""
        return [_plain(v) for v in self]

    def __eq__(self, other):
        if isinstance(other, (GgufArray, list, tuple)):
            return len(self) == len(other) and self.tolist() == _plain(other)
        return NotImplemented

    __hash__ = None  # a sequence compared by value, like list

    def __repr__(self) -> str:
        return f"GgufArray({value_type_name(self.elem_type)} x {len(self)}: {short_text(self)})"

    @property
    def nbytes(self) -> int:
        """Bytes held: the encoded elements plus their offsets."""
        return len(self._data) + self._starts.nbytes


def _plain(value):
    """Metadata values as plain Python: NumPy arrays and GgufArrays as (nested) lists."""
    if isinstance(value, (np.ndarray, GgufArray)):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# -- parsing -------------------------------------------------------------------


class _Cursor:
    """Bounds-checked little-endian reads from a buffer of ``size`` bytes."""

    def __init__(self, buf, size: int, path: str) -> None:
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    def need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise GgufError(
                self.path,
                f"truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"but the file has {self.size} bytes",
            )
        pos = self.pos
        self.pos += n
        return pos

    def scalar(self, value_type: int, what: str):
        code, size, _ = _SCALARS[value_type]
        return struct.unpack_from(code, self.buf, self.need(size, what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(GGUF_UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(GGUF_UINT64, what)

    def string(self, what: str, max_bytes: int | None = None) -> str:
        n = self.u64(f"{what} length")
        if max_bytes is not None and n > max_bytes:
            raise GgufError(
                self.path,
                f"{what} is {n} bytes long at offset {self.pos - 8}; names are at most "
                f"{max_bytes} bytes (ggml's limit)",
            )
        pos = self.need(n, what)
        try:
            return bytes(self.buf[pos : pos + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise GgufError(self.path, f"{what} at offset {pos} is not valid UTF-8 ({e})") from e


def _read_value(cur: _Cursor, value_type: int, key: str, depth: int = 0):
    """One metadata value of ``value_type``; numeric arrays become read-only NumPy arrays,
    string/nested arrays :class:`GgufArray` (checked element by element, not decoded)."""
    what = f"metadata {key!r}"
    if value_type == GGUF_STRING:
        return cur.string(what)
    if value_type == GGUF_BOOL:
        b = cur.scalar(GGUF_BOOL, what)
        if b not in (0, 1):
            raise GgufError(
                cur.path, f"{what}: bool byte {b} at offset {cur.pos - 1} is not 0 or 1"
            )
        return bool(b)
    if value_type in _SCALARS:
        return cur.scalar(value_type, what)
    if value_type == GGUF_ARRAY:
        elem, count = _array_header(cur, what, depth)
        if elem in _SCALARS:
            # one copy into a NumPy array (the map closes after parsing), never a list of
            # Python numbers: 10 million f32 stay 40 MB instead of ~400 MB of objects
            arr = _scalar_array(cur, elem, count, what, _NUMPY_DTYPES[elem])
            if elem == GGUF_BOOL:
                arr = arr.view(np.bool_)
            arr = arr.copy()
            arr.flags.writeable = False
            return arr
        if elem in (GGUF_STRING, GGUF_ARRAY):
            _need_nested(cur, elem, count, what)
            begin = cur.pos
            dtype = np.uint32 if cur.size - begin < 2**32 else np.int64
            starts = np.empty(count + 1, dtype=dtype)
            for j in range(count):
                starts[j] = cur.pos - begin
                _check_value(cur, elem, key, depth + 1)
            starts[count] = cur.pos - begin
            starts.flags.writeable = False
            return GgufArray(elem, bytes(cur.buf[begin : cur.pos]), starts)
        raise GgufError(
            cur.path, f"{what}: unknown array element type {elem} at offset {cur.pos - 12}"
        )
    raise GgufError(cur.path, f"{what}: unknown metadata value type {value_type}")


def _array_header(cur: _Cursor, what: str, depth: int) -> tuple[int, int]:
    """An array value's ``(element type, count)``, refusing arrays nested more than 8 deep."""
    if depth > 8:
        raise GgufError(cur.path, f"{what}: arrays nested more than 8 deep")
    return cur.u32(f"{what} array element type"), cur.u64(f"{what} array length")


def _scalar_array(cur: _Cursor, elem: int, count: int, what: str, dtype):
    """Step over an array of ``count`` scalars of type ``elem``; a bool array must hold 0/1
    bytes. Returns a view of them as ``dtype`` (None: no view, nothing kept)."""
    pos = cur.need(count * _SCALARS[elem][1], f"{what} array of {count} {value_type_name(elem)}")
    if dtype is None:
        return None
    arr = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=pos)
    if elem == GGUF_BOOL and arr.size and int(arr.view(np.uint8).max()) > 1:
        raise GgufError(cur.path, f"{what}: bool array holds a byte other than 0/1")
    return arr


def _need_nested(cur: _Cursor, elem: int, count: int, what: str) -> None:
    """Refuse an absurd count of strings or arrays before looping: each takes at least 8 bytes
    (a string's length) or 12 (an array's type and count)."""
    least = 8 if elem == GGUF_STRING else 12
    if count * least > cur.size - cur.pos:
        cur.need(count * least, f"{what} array of {count} {value_type_name(elem)}")


def _check_value(cur: _Cursor, value_type: int, key: str, depth: int) -> None:
    """Step over one metadata value, checking it as :func:`_read_value` would, keeping nothing."""
    if value_type == GGUF_STRING:
        cur.string(f"metadata {key!r}")  # checks the UTF-8; the str is dropped at once
    elif value_type == GGUF_ARRAY:
        what = f"metadata {key!r}"
        elem, count = _array_header(cur, what, depth)
        if elem in _SCALARS:
            _scalar_array(cur, elem, count, what, np.uint8 if elem == GGUF_BOOL else None)
        elif elem in (GGUF_STRING, GGUF_ARRAY):
            _need_nested(cur, elem, count, what)
            for _ in range(count):
                _check_value(cur, elem, key, depth + 1)
        else:
            raise GgufError(
                cur.path, f"{what}: unknown array element type {elem} at offset {cur.pos - 12}"
            )
    else:
        _read_value(cur, value_type, key, depth)  # a scalar: nothing to keep


def _parse(buf, size: int, path: str) -> GgufFile:
    cur = _Cursor(buf, size, path)
    magic = bytes(buf[cur.need(4, "magic") : 4])
    if magic != GGUF_MAGIC:
        raise GgufError(path, f"bad magic {magic!r}: not a GGUF file (expected {GGUF_MAGIC!r})")
    version = cur.u32("version")
    if version not in GGUF_READ_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version == 1:
            msg = "GGUF v1 (32-bit counts) is not supported; re-convert the model to v3"
        elif swapped in GGUF_READ_VERSIONS:
            msg = f"big-endian GGUF (version {swapped}) is not supported"
        else:
            msg = f"unknown GGUF version {version} (this reader takes 2 and 3)"
        raise GgufError(path, msg)
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata kv count")
    # a kv takes >= 13 bytes (key length u64, type u32, a 1-byte value) and a tensor
    # info >= 24 (name length, n_dims, type, offset): refuse counts the file cannot hold.
    if n_kv * 13 + n_tensors * 24 > size - cur.pos:
        raise GgufError(
            path,
            f"truncated or corrupt: {n_tensors} tensors and {n_kv} metadata entries "
            f"cannot fit in {size} bytes",
        )

    metadata: dict[str, Any] = {}
    metadata_types: dict[str, tuple[int, ...]] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in metadata:
            raise GgufError(path, f"duplicate metadata key {key!r}")
        vtype = cur.u32(f"metadata {key!r} value type")
        if vtype not in _SCALARS and vtype not in (GGUF_STRING, GGUF_ARRAY):
            raise GgufError(
                path, f"metadata {key!r}: unknown value type {vtype} at offset {cur.pos - 4}"
            )
        if vtype == GGUF_ARRAY:
            elem = struct.unpack_from("<I", buf, cur.need(4, f"metadata {key!r}"))[0]
            cur.pos -= 4
            metadata_types[key] = (GGUF_ARRAY, elem)
        else:
            metadata_types[key] = (vtype,)
        metadata[key] = _read_value(cur, vtype, key)

    alignment = GGUF_DEFAULT_ALIGNMENT
    if KEY_ALIGNMENT in metadata:
        a = metadata[KEY_ALIGNMENT]
        if metadata_types[KEY_ALIGNMENT][0] in (GGUF_FLOAT32, GGUF_FLOAT64, GGUF_BOOL) or not (
            isinstance(a, int)
            and GGUF_MIN_ALIGNMENT <= a <= GGUF_MAX_ALIGNMENT
            and a & (a - 1) == 0
        ):
            raise GgufError(
                path,
                f"{KEY_ALIGNMENT} = {a!r}: expected a power-of-two integer, a multiple of "
                f"{GGUF_MIN_ALIGNMENT} (the GGUF specification)",
            )
        alignment = a
    recorded_groups = _recorded_groups(metadata, path)

    raw_infos = []
    names = set()
    for i in range(n_tensors):
        name = cur.string(f"tensor info #{i} name", max_bytes=GGML_MAX_NAME - 1)
        if name in names:
            raise GgufError(path, "duplicate tensor name", tensor=name)
        names.add(name)
        n_dims = cur.u32(f"tensor {name!r} n_dims")
        if n_dims > GGML_MAX_DIMS:
            raise GgufError(path, f"n_dims {n_dims} > {GGML_MAX_DIMS}", tensor=name)
        ne = tuple(cur.u64(f"tensor {name!r} ne[{d}]") for d in range(n_dims))
        type_id = cur.u32(f"tensor {name!r} type")
        rel = cur.u64(f"tensor {name!r} offset")
        raw_infos.append((name, ne, type_id, rel))

    data_offset = _align_up(cur.pos, alignment)
    if raw_infos and data_offset > size:
        raise GgufError(
            path,
            f"truncated: the data section starts at {data_offset}, but the file has {size} bytes",
        )

    starts = sorted({data_offset + rel for _, _, _, rel in raw_infos})
    tensors = []
    for name, ne, type_id, rel in raw_infos:
        if rel % alignment:
            raise GgufError(
                path, f"offset {rel} is not a multiple of the alignment {alignment}", tensor=name
            )
        offset = data_offset + rel
        if offset > size:
            raise GgufError(
                path,
                f"data at offset {offset} starts past the end of the file ({size} bytes)",
                tensor=name,
            )
        i = bisect.bisect_right(starts, offset)
        room = min(starts[i] if i < len(starts) else size, size) - offset
        info = GgufTensorInfo(name, ne, type_id, offset, rel, room, None)
        tensors.append(_size_tensor(info, alignment, size, path, recorded_groups.get(name)))
    unknown = sorted(set(recorded_groups) - names)
    if unknown:
        raise GgufError(path, f"{KEY_Q2_GROUP_PREFIX}* names no tensor: {unknown[:3]}")

    # A tensor's least possible size: its size, or for an undecided Q2 tensor the smaller
    # group's (either way its data starts there and takes at least that much).
    by_offset = sorted(tensors, key=lambda t: (t.offset, _min_nbytes(t)))
    for a, b in zip(by_offset, by_offset[1:], strict=False):
        least = _min_nbytes(a)
        if least and a.offset + least > b.offset:
            raise GgufError(
                path,
                f"data [{a.offset}, {a.offset + least}) overlaps tensor {b.name!r} at {b.offset}",
                tensor=a.name,
            )
    _check_alignment_agrees(buf, cur.pos, data_offset, by_offset, alignment, size, path)
    return GgufFile(
        path=path,
        version=version,
        alignment=alignment,
        metadata=metadata,
        metadata_types=metadata_types,
        tensors=tuple(tensors),
        data_offset=data_offset,
        file_size=size,
    )


def _check_alignment_agrees(buf, header_end, data_offset, by_offset, alignment, size, path):
    """Refuse a file whose layout was padded to another alignment than ``general.alignment``.

    Such a file would otherwise be read ``alignment`` bytes off without error
    (issue 24): the specification's padding before the data section is zero
    bytes (data there means the section starts earlier), and writers pad the
    last tensor to the alignment at most (more bytes after it mean it starts
    later). Checked only where the last tensor's size is known.
    """
    if not by_offset:
        return
    pad = bytes(buf[header_end:data_offset])
    if pad.strip(b"\0"):
        raise GgufError(
            path,
            f"the {len(pad)} padding bytes before the data section (offset {data_offset}) "
            f"are not zero: {KEY_ALIGNMENT} = {alignment} disagrees with the file's layout",
        )
    last = by_offset[-1]
    if last.nbytes is not None and size - (last.offset + last.nbytes) >= alignment:
        raise GgufError(
            path,
            f"{size - last.offset - last.nbytes} bytes follow the last tensor's data (at most "
            f"{alignment - 1} of padding expected): {KEY_ALIGNMENT} = {alignment} disagrees "
            "with the file's layout",
            tensor=last.name,
        )


def _recorded_groups(metadata: dict, path: str) -> dict[str, int]:
    """Tensor name -> group from the ``q2gemv.q2_0.group.<name>`` keys (save_q2_weights)."""
    out = {}
    for key, value in metadata.items():
        if key.startswith(KEY_Q2_GROUP_PREFIX):
            if isinstance(value, bool) or value not in GROUPS:
                raise GgufError(path, f"metadata {key!r} = {value!r}: expected 64 or 128")
            out[key[len(KEY_Q2_GROUP_PREFIX) :]] = int(value)
    return out


def _min_nbytes(t: GgufTensorInfo) -> int:
    if t.nbytes is not None:
        return t.nbytes
    if t.is_q2 and t.q2_groups:
        sizes = q2_sizes(t.n_elements, t.k)
        return min(sizes[g] for g in t.q2_groups)
    return 0


def _size_tensor(
    info: GgufTensorInfo, alignment: int, size: int, path: str, recorded: int | None = None
) -> GgufTensorInfo:
    """Fill ``nbytes`` (and the Q2 group) of a tensor info; check it lies inside the file.

    ``recorded``: the group the file's metadata records for this tensor, if any.
    """
    n_el, k, name = info.n_elements, info.k, info.name
    last = info.offset + info.room == size
    until = "the end of the file" if last else "the next tensor"
    if info.type_id in Q2_TYPES:
        if n_el == 0:
            raise GgufError(path, f"{info.type_name} tensor with ne={list(info.ne)} is empty", name)
        groups = q2_groups_for_room(n_el, k, info.room, alignment)
        sizes = q2_sizes(n_el, k)
        if not groups:
            if not sizes:
                raise GgufError(
                    path,
                    f"{info.type_name} tensor with ne={list(info.ne)}: the row length "
                    f"ne[0]={k} is a multiple of neither group 64 nor 128",
                    tensor=name,
                )
            need = ", ".join(f"{s} bytes as group {g}" for g, s in sizes.items())
            what = (
                "data past the end of the file: "
                if last and info.room < min(sizes.values())
                else ""
            )
            raise GgufError(
                path,
                f"{what}{info.type_name} tensor of {n_el} elements (ne={list(info.ne)}) "
                f"needs {need} (plus < {alignment} bytes of padding), but {info.room} "
                f"bytes lie between its offset {info.offset} and {until}",
                tensor=name,
            )
        if recorded is not None:
            if recorded not in groups:
                raise GgufError(
                    path,
                    f"metadata {KEY_Q2_GROUP_PREFIX}{name} records group {recorded}, but the "
                    f"tensor's {info.room} bytes of room fit only group(s) {list(groups)}",
                    tensor=name,
                )
            if info.type_id == GGUF_TYPE_PQ2_0 and recorded != 128:
                raise GgufError(
                    path, f"type PQ2_0 (142) is group 128, metadata records {recorded}", name
                )
            groups_kept, group = groups, recorded
        elif info.type_id == GGUF_TYPE_PQ2_0:
            if 128 not in groups:
                raise GgufError(
                    path,
                    f"type PQ2_0 (142) is group 128, but its {info.room} bytes of room fit "
                    f"only group 64 ({sizes[64]} bytes)",
                    tensor=name,
                )
            groups_kept, group = groups, 128  # the id breaks a tie; the size agrees
        else:
            groups_kept, group = groups, (groups[0] if len(groups) == 1 else None)
        nbytes = sizes[group] if group is not None else None
        return replace(info, nbytes=nbytes, group=group, q2_groups=groups_kept)
    if info.type_id in GGML_TYPES:
        tname, blck, tsize = GGML_TYPES[info.type_id]
        if k % blck:
            raise GgufError(
                path,
                f"{tname} row length ne[0]={k} is not a multiple of its block {blck}",
                tensor=name,
            )
        nbytes = n_el // blck * tsize
        if info.offset + nbytes > size:
            raise GgufError(
                path,
                f"data past the end of the file: {nbytes} bytes of {tname} at offset "
                f"{info.offset}, file has {size} bytes",
                tensor=name,
            )
        return replace(info, nbytes=nbytes)
    if recorded is not None:
        raise GgufError(
            path, f"metadata records a Q2_0 group for a {info.type_name} tensor", tensor=name
        )
    return info  # unknown type: size unknown, offset already checked against the file


def _file_size(path: str) -> int:
    if os.path.isdir(path):
        raise GgufError(path, "is a directory, not a GGUF file")
    try:
        return os.path.getsize(path)
    except OSError as e:
        raise FileNotFoundError(f"{path}: cannot read ({e.strerror})") from e


def _open_map(path: str) -> tuple[mmap.mmap | bytes, int]:
    return open_map(path, _file_size(path))


def read_gguf(path: str | os.PathLike) -> GgufFile:
    """Parse the header, metadata and tensor infos of a GGUF v2/v3 file.

    ``path`` (str or os.PathLike) names the file; returns a :class:`GgufFile`.

    Reads through a read-only memory map and checks everything it can
    without reading tensor data: magic, version, every length against the
    file size, metadata value types, ``general.alignment``, offsets aligned,
    inside the file and not overlapping, and each Q2 tensor's room (see
    :func:`q2_groups_for_room`). A Q2_0 (id 42) tensor too small for its
    size to tell the groups apart is returned with ``group=None``.

    Raises:
        GgufError: on any violation, naming the file and the tensor.
        FileNotFoundError: when the file cannot be opened.
    """
    path = os.fspath(path)
    buf, size = _open_map(path)
    try:
        return _parse(buf, size, path)
    finally:
        close_quietly(buf)


def load_q2_weights(
    path: str | os.PathLike, *, ambiguous_group: int | None = None
) -> dict[str, Q2Weight]:
    """Every Q2_0 (type 42) and PQ2_0 (type 142) tensor of a GGUF file, memory-mapped.

    Args:
        path: the GGUF file (str or os.PathLike), mapped read-only; nothing is copied.
        ambiguous_group: 64 or 128 for a foreign type-42 tensor whose size fits both groups.

    Returns tensor name -> :class:`Q2Weight` in file order (empty when there are none);
    other ggml tensor types are skipped. Shapes and the group rule:
    docs/files.md#load_q2_weights-shapes-and-groups.

    Raises:
        GgufError: malformed file, no group fits a tensor's room, a 142
            tensor whose room fits only group 64, an unknown tensor type id,
            or an unresolved tie.
        ValueError: ``ambiguous_group`` not 64, 128 or None.
    """
    if ambiguous_group is not None and (
        isinstance(ambiguous_group, bool) or ambiguous_group not in GROUPS
    ):
        raise ValueError(f"ambiguous_group: expected 64, 128 or None, got {ambiguous_group!r}")
    path = os.fspath(path)
    buf, size = _open_map(path)
    out: dict[str, Q2Weight] = {}
    try:
        gf = _parse(buf, size, path)
        for t in gf.tensors:
            if not t.is_q2 and t.type_id not in GGML_TYPES:
                raise GgufError(
                    path,
                    f"unknown tensor type id {t.type_id}: its size is unknown, so the file "
                    "cannot be checked (a corrupt type field could hide a Q2_0 tensor)",
                    tensor=t.name,
                )
            if not t.is_q2:
                continue
            g = t.group
            if g is None:
                if ambiguous_group is None:
                    raise GgufError(
                        path,
                        f"Q2_0 tensor of {t.n_elements} elements: its {t.room} bytes of room "
                        f"fit group 64 and group 128 alike at alignment {gf.alignment}; "
                        "pass ambiguous_group=64 or 128",
                        tensor=t.name,
                    )
                g = ambiguous_group
            nbytes = q2_sizes(t.n_elements, t.k)[g]
            raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=t.offset)
            out[t.name] = Q2Weight.from_bytes(raw, t.n, t.k, g)
    except BaseException:
        out.clear()
        close_quietly(buf)
        raise
    if not out:
        close_quietly(buf)
    return out


# -- text: one escaped line per value (reprs, the inspect summary) --------------------------


def escape_text(text: str) -> str:
    """``text`` safe to print on one terminal line: backslashes doubled, every character that
    is not printable (newline, ESC, other controls, ...) written as a ``\\xNN`` / ``\\uNNNN``
    escape, so a file cannot forge rows or terminal commands in ``inspect``'s output."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)


def short_text(value, limit: int = 60) -> str:
    if isinstance(value, (list, np.ndarray, GgufArray)):
        head = ", ".join(short_text(v, 20) for v in list(value[:4]))
        return f"[{head}{', ...' if len(value) > 4 else ''}]"
    if isinstance(value, np.generic):
        value = value.item()
    s = repr(value) if isinstance(value, str) else escape_text(str(value))  # repr escapes
    return s if len(s) <= limit else s[: limit - 3] + "..."

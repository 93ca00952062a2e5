"""NVFP4 weights from safetensors checkpoints (ModelOpt and compressed-tensors layouts).

A safetensors file is::

    header_len   u64, little-endian
    header       header_len bytes of UTF-8 JSON:
                 {"__metadata__": {str: str, ...},                    (optional)
                  "<name>": {"dtype": "U8" | "F8_E4M3" | "F32" | ...,
                             "shape": [d0, d1, ...],                  (row-major)
                             "data_offsets": [begin, end]}, ...}
    data         the tensors, at data_offsets relative to byte 8 + header_len

Parsed here into views of a read-only memory map (no copy), the one reader of every
loader; every refusal is a :class:`SafetensorsError` naming file and tensor (docs/files.md).

The two NVFP4 layouts, per linear layer prefix ``<p>`` (the bit layout of
the pieces is in :mod:`q2gemv.formats.nvfp4`)::

    compressed-tensors              ModelOpt
    <p>.weight_packed        U8 [n, k/2]         <p>.weight          U8 [n, k/2]
    <p>.weight_scale         F8_E4M3|U8 [n, k/16] <p>.weight_scale    F8_E4M3|U8 [n, k/16]
    <p>.weight_global_scale  F32 [] or [1]       <p>.weight_scale_2  F32 [] or [1]
      a DIVISOR:  w = e2m1 * (s / g_ct)            a MULTIPLIER: w = e2m1 * s * g

The divisor becomes the multiplier ``fp32(1 / g_ct)``
(:func:`q2gemv.formats.nvfp4.global_scale_from_divisor`).
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from ...formats.nvfp4 import BLOCK, Nvfp4Weight, check_global_scale, global_scale_from_divisor
from .._mapped import close_quietly, open_map

MAX_HEADER_BYTES = 100_000_000  # the safetensors reference implementation's limit

# safetensors dtype -> bytes per element (the ones with a whole-byte size)
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

# safetensors dtype -> the NumPy dtype its bytes are read as (little-endian)
NUMPY_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F64": np.dtype("<f8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
}

COMPRESSED_TENSORS = "compressed-tensors"
MODELOPT = "modelopt"
# layout -> (packed suffix, scales suffix, global-scale suffix)
LAYOUT_SUFFIXES = {
    COMPRESSED_TENSORS: ("weight_packed", "weight_scale", "weight_global_scale"),
    MODELOPT: ("weight", "weight_scale", "weight_scale_2"),
}


class SafetensorsError(ValueError):
    """A safetensors file or NVFP4 layer that cannot be read; names the file and tensor."""

    def __init__(self, path: str, message: str, tensor: str | None = None) -> None:
        self.path = path
        self.tensor = tensor
        where = f"{path}: tensor {tensor!r}: " if tensor is not None else f"{path}: "
        super().__init__(where + message)


@dataclass(frozen=True)
class SafetensorsEntry:
    """One tensor of a safetensors header; ``begin``/``end`` are absolute file offsets."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _parse_header(buf, size: int, path: str) -> tuple[dict[str, SafetensorsEntry], dict]:
    if size < 8:
        raise SafetensorsError(path, f"truncated: {size} bytes, the header length alone is 8")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > MAX_HEADER_BYTES:
        raise SafetensorsError(path, f"header of {n} bytes exceeds the {MAX_HEADER_BYTES} limit")
    if 8 + n > size:
        raise SafetensorsError(
            path, f"truncated: the header needs {n} bytes after byte 8, file has {size}"
        )
    try:
        header = json.loads(bytes(buf[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(path, f"header is not UTF-8 JSON ({e})") from e
    except RecursionError:  # e.g. 100,000 nested brackets: never a safetensors header
        raise SafetensorsError(path, "header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise SafetensorsError(path, f"header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", None) or {}
    data_start, data_size = 8 + n, size - 8 - n
    entries: dict[str, SafetensorsEntry] = {}
    for name, e in header.items():
        try:
            dtype, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
            ok = (
                isinstance(dtype, str)
                and isinstance(shape, list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                and all(isinstance(x, int) and not isinstance(x, bool) for x in (b, end))
            )
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise SafetensorsError(path, f"malformed header entry {e!r}", tensor=name)
        if not 0 <= b <= end <= data_size:
            raise SafetensorsError(
                path,
                f"data_offsets [{b}, {end}] outside the {data_size} data bytes "
                "(truncated file or corrupt header)",
                tensor=name,
            )
        if dtype in DTYPE_SIZES:
            want = int(np.prod(shape, dtype=object)) * DTYPE_SIZES[dtype]
            if end - b != want:
                raise SafetensorsError(
                    path,
                    f"{end - b} data bytes for {dtype} {shape} (needs {want})",
                    tensor=name,
                )
        entries[name] = SafetensorsEntry(
            name, dtype, tuple(shape), data_start + b, data_start + end
        )
    spans = sorted((e.begin, e.end, e.name) for e in entries.values() if e.end > e.begin)
    for (_, a_end, a), (b_begin, _, b) in zip(spans, spans[1:], strict=False):
        if a_end > b_begin:
            raise SafetensorsError(path, f"data overlaps tensor {b!r}", tensor=a)
    return entries, metadata


def find_nvfp4_layers(dtypes: Mapping[str, str]) -> dict[str, tuple[str, tuple[str, str, str]]]:
    """Group tensor names into NVFP4 layers: prefix -> (layout, (packed, scales, global)).

    ``dtypes`` maps every tensor name of a checkpoint to its safetensors
    dtype. A prefix ``<p>`` is a compressed-tensors NVFP4 layer when it has
    ``<p>.weight_global_scale`` or a U8 ``<p>.weight_packed``; it is a
    ModelOpt one when it has ``<p>.weight_scale_2``, or a U8 ``<p>.weight``
    beside an F8_E4M3 ``<p>.weight_scale``. Other prefixes (bf16 layers, FP8
    layers whose ``weight`` is F8_E4M3, int4 ``weight_packed`` stored as I32,
    MXFP4 with U8 E8M0 scales and no ``weight_scale_2``) are not NVFP4 and
    are left out.

    Raises:
        ValueError: an NVFP4 layer misses one of its three tensors, or a
            prefix carries both layouts.
    """
    found: dict[str, tuple[str, tuple[str, str, str]]] = {}
    for name in dtypes:
        prefix, _, suffix = name.rpartition(".")
        if not prefix:
            continue
        ct = (suffix == "weight_global_scale") or (
            suffix == "weight_packed" and dtypes[name] == "U8"
        )
        mo = (suffix == "weight_scale_2") or (
            suffix == "weight"
            and dtypes[name] == "U8"
            and dtypes.get(f"{prefix}.weight_scale") == "F8_E4M3"
        )
        for layout, hit in ((COMPRESSED_TENSORS, ct), (MODELOPT, mo)):
            if not hit:
                continue
            if prefix in found and found[prefix][0] != layout:
                raise ValueError(
                    f"layer {prefix!r} has tensors of both the compressed-tensors and the "
                    "ModelOpt NVFP4 layouts"
                )
            names = tuple(f"{prefix}.{s}" for s in LAYOUT_SUFFIXES[layout])
            missing = [n for n in names if n not in dtypes]
            if missing:
                raise ValueError(
                    f"{layout} NVFP4 layer {prefix!r} is missing {', '.join(map(repr, missing))}"
                )
            found[prefix] = (layout, names)
    return found


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path}: no *.safetensors files in this directory")
        return files
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    return [path]


def _open(file: Path):
    return open_map(file, file.stat().st_size)


class SafetensorsCheckpoint:
    """Every tensor of a ``.safetensors`` file or a directory of shards, memory-mapped.

    The one safetensors reader of the package: every header is parsed and
    checked when the checkpoint is opened (see the module docstring), a name
    may appear in one shard only, and :meth:`array` and :meth:`nvfp4_weights`
    return read-only views of the maps. Errors are :class:`SafetensorsError`
    naming the file and the tensor; a missing path is ``FileNotFoundError``.

    Use it as a context manager (or call :meth:`close`): closing closes the
    maps that no returned array still views (those close when the arrays go).

    Attributes:
        path: the path given, as a str.
        entries: tensor name -> :class:`SafetensorsEntry`, over every shard.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        self.entries: dict[str, SafetensorsEntry] = {}
        self._where: dict[str, tuple[str, object]] = {}  # name -> (file, map)
        self._maps: list = []
        try:
            for file in _files(Path(self.path)):
                buf, size = _open(file)
                self._maps.append(buf)
                entries, _ = _parse_header(buf, size, str(file))
                for name, e in entries.items():
                    if name in self._where:
                        raise SafetensorsError(
                            str(file), f"also in {self._where[name][0]} (duplicate name)", name
                        )
                    self._where[name] = (str(file), buf)
                    self.entries[name] = e
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> SafetensorsCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close the maps that no returned array views."""
        for m in self._maps:
            close_quietly(m)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def file(self, name: str) -> str:
        """The shard that holds tensor ``name``."""
        return self._where[name][0]

    def error(self, name: str, message: str) -> SafetensorsError:
        """A :class:`SafetensorsError` naming tensor ``name`` and its shard."""
        return SafetensorsError(self.file(name), message, tensor=name)

    def array(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a read-only NumPy view of the map, in its dtype and shape.

        BF16 and the F8 types come back as their ``ml_dtypes`` dtypes. A dtype this
        reader has no NumPy dtype for (``F4``, ...) is a :class:`SafetensorsError`.
        """
        e = self.entries[name]
        dtype = NUMPY_DTYPES.get(e.dtype)
        if dtype is None:
            raise self.error(
                name, f"dtype {e.dtype} cannot be read (known: {sorted(NUMPY_DTYPES)})"
            )
        buf = self._where[name][1]
        count = e.end - e.begin
        if count == 0:
            return np.zeros(e.shape, dtype)
        a = np.frombuffer(buf, dtype=np.uint8, count=count, offset=e.begin)
        return a.view(dtype).reshape(e.shape)

    def nvfp4_layers(self) -> dict[str, tuple[str, tuple[str, str, str]]]:
        """:func:`find_nvfp4_layers` of the checkpoint's tensors (errors as SafetensorsError)."""
        try:
            return find_nvfp4_layers({n: e.dtype for n, e in self.entries.items()})
        except ValueError as err:
            raise SafetensorsError(self.path, str(err)) from err

    def nvfp4_weights(self) -> dict[str, Nvfp4Weight]:
        """Every NVFP4 layer as an :class:`Nvfp4Weight`, keyed by prefix (see
        :func:`load_nvfp4_weights`)."""
        return {
            prefix: self._nvfp4_weight(layout, names)
            for prefix, (layout, names) in self.nvfp4_layers().items()
        }

    def _located(self, name: str) -> tuple[str, object, SafetensorsEntry]:
        file, buf = self._where[name]
        return file, buf, self.entries[name]

    def _nvfp4_weight(self, layout: str, names: tuple[str, str, str]) -> Nvfp4Weight:
        p_name, s_name, g_name = names
        packed = _view(self._located(p_name), ("U8",), 2)
        scales = _view(self._located(s_name), ("F8_E4M3", "U8"), 2)
        stored = float(_view(self._located(g_name), ("F32",), None)[0])
        n, half_k = packed.shape
        if half_k < BLOCK // 2 or (2 * half_k) % BLOCK:
            raise self.error(
                p_name,
                f"packed shape {packed.shape}: k = {2 * half_k} is not a multiple of {BLOCK}",
            )
        if scales.shape != (n, 2 * half_k // BLOCK):
            raise self.error(
                s_name,
                f"shape {scales.shape}, expected {(n, 2 * half_k // BLOCK)} "
                f"(one E4M3 scale per {BLOCK} weights of {p_name!r} {packed.shape})",
            )
        # A non-finite global scale would make every weight of the layer NaN or infinite
        # (every logit NaN); formats.nvfp4 keeps IEEE specials given as such, a file is
        # refused instead.
        if not math.isfinite(stored):
            raise self.error(
                g_name, f"global scale {stored} is not finite: every weight would be NaN or Inf"
            )
        try:
            if layout == COMPRESSED_TENSORS:
                g = global_scale_from_divisor(stored)
            else:
                g = check_global_scale(stored, g_name.rpartition(".")[2])
        except ValueError as err:
            raise self.error(g_name, str(err)) from err
        if not math.isfinite(g):
            raise self.error(
                g_name, f"divisor {stored} gives the global scale {g}: every weight would be Inf"
            )
        return Nvfp4Weight.from_parts(packed, scales, g)


def load_nvfp4_weights(path: str | os.PathLike) -> dict[str, Nvfp4Weight]:
    """Every NVFP4 linear layer of a safetensors checkpoint, memory-mapped, keyed by prefix.

    Args:
        path: a ``.safetensors`` file or a directory of shards read together.

    Returns layer prefix (``"model.layers.0.mlp.down_proj"``) -> :class:`Nvfp4Weight`,
    over read-only views of the map. What is checked:
    docs/files.md#load_nvfp4_weights-what-is-checked.

    Raises:
        SafetensorsError: a malformed file, a layer missing a companion
            tensor, a wrong dtype or shape, or a non-finite global scale
            (naming file and tensor).
        FileNotFoundError: ``path`` does not exist / holds no shards.
    """
    with SafetensorsCheckpoint(path) as checkpoint:
        return checkpoint.nvfp4_weights()


def _view(
    located: tuple[str, object, SafetensorsEntry], dtypes: tuple[str, ...], ndim: int | None
) -> np.ndarray:
    """A read-only uint8 (or fp32) view of one tensor; ndim None means a scalar or [1]."""
    file, buf, e = located
    if e.dtype not in dtypes:
        raise SafetensorsError(
            file, f"dtype {e.dtype}, expected {' or '.join(dtypes)}", tensor=e.name
        )
    if ndim is None:
        if e.shape not in ((), (1,)):
            raise SafetensorsError(
                file, f"shape {list(e.shape)}, expected a scalar [] or [1]", tensor=e.name
            )
        return np.frombuffer(buf, dtype="<f4", count=1, offset=e.begin)
    if len(e.shape) != ndim or 0 in e.shape:
        raise SafetensorsError(
            file, f"shape {list(e.shape)}, expected a non-empty {ndim}-D tensor", tensor=e.name
        )
    return np.frombuffer(buf, dtype=np.uint8, count=e.end - e.begin, offset=e.begin).reshape(
        e.shape
    )

"""GGUF/ggml ``block_q2_0``: the ternary 2-bit format, both group sizes.

This module is the one place that states the layout; kernels, references
and loaders import these names.

One block covers ``group`` consecutive weights of a row (``QK``)::

    struct block_q2_0 { fp16 d; uint8 qs[QK/4]; }    // little-endian, d first

    QK = 128 -> 34 bytes (PrismML "prism" builds, Ternary-Bonsai files, PQ2_0)
    QK = 64  -> 18 bytes (mainline ggml, GGUF type id 42)

    byte:  0      1      2          3          ...  1 + QK/4
         [ d lo | d hi | qs[0]    | qs[1]    | ... | qs[QK/4-1] ]

    qs[b] bit:   7 6 | 5 4 | 3 2 | 1 0
    code index:  4b+3| 4b+2| 4b+1| 4b+0          (LSB-first, 4 codes a byte)

    code(j)  = (qs[j // 4] >> (2 * (j % 4))) & 3
    value(j) = (code(j) - 1) * d          codes 0, 1, 2, 3 -> -1, 0, +1, +2

Code 3 (+2) is legal even though ternary quantizers never write it; every
kernel takes it. A row of K weights is K // QK consecutive blocks; rows are
independent and stored one after another. ``qs`` of block i starts at byte
``BLOCK_BYTES * i + 2``, so it is 4-byte aligned only for odd i: the kernels
read it as 16-bit halves. Kernels consume these bytes unchanged (keep-packed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ._frozen import check_u8, frozen
from ._sizes import as_size
from .bf16 import float_matrix

GROUPS = (64, 128)
SCALE_BYTES = 2
GGUF_TYPE_Q2_0 = 42  # mainline: group 64; older PrismML files: group 128
GGUF_TYPE_PQ2_0 = 142  # newer PrismML builds: group 128


def block_bytes(group: int) -> int:
    """Bytes of one ``block_q2_0`` of ``group`` codes: 2 (fp16 d) + group/4."""
    return SCALE_BYTES + check_group(group) // 4


def check_group(group: int) -> int:
    """``group`` (codes per block: 64 or 128, a NumPy integer accepted, a bool not) as an int.

    Raises ValueError naming ``group`` otherwise.
    """
    try:
        g = as_size(group, "group")
    except TypeError:
        g = None
    if g not in GROUPS:
        raise ValueError(f"group: expected 64 or 128, got {group!r}")
    return g


def row_bytes(k: int, group: int) -> int:
    """Bytes of one weight row of ``k`` codes: ``(k // group) * block_bytes(group)``, an int.

    A remainder of ``k`` is dropped, not rejected. Raises TypeError naming ``k`` when it
    is not an integer, ValueError when ``group`` is not 64 or 128.
    """
    return (as_size(k, "k") // check_group(group)) * block_bytes(group)


def _check_nk(n: int, k: int, group: int) -> tuple[int, int]:
    """``(n, k)`` as Python ints (:func:`as_size`), each >= 1, ``k`` a multiple of ``group``."""
    n, k = as_size(n, "n"), as_size(k, "k")
    for name, v in (("n", n), ("k", k)):
        if v < 1:
            raise ValueError(f"{name}: expected >= 1, got {v}")
    if k % group:
        raise ValueError(f"k: expected a multiple of group={group}, got k={k}")
    return n, k


def group_from_nbytes(nbytes: int, n_elements: int) -> int:
    """The group (64 or 128) whose block size explains ``nbytes`` for ``n_elements``.

    A loader must derive the group from the byte size, never from the GGUF
    type id alone (id 42 means group 64 in mainline ggml, group 128 in older
    PrismML files). Raises ValueError when neither group fits.
    """
    nbytes, n_elements = as_size(nbytes, "nbytes"), as_size(n_elements, "n_elements")
    for g in GROUPS:
        if n_elements % g == 0 and (n_elements // g) * block_bytes(g) == nbytes:
            return g
    raise ValueError(
        f"{nbytes} bytes for {n_elements} elements fit neither group 64 "
        f"({block_bytes(64)} B per 64) nor group 128 ({block_bytes(128)} B per 128)"
    )


def _blocks(raw: np.ndarray, n: int, k: int, group: int) -> np.ndarray:
    """raw bytes as a [n, k//group, block_bytes] uint8 view."""
    return raw.reshape(n, k // group, block_bytes(group))


def pack(codes: np.ndarray, scales_f16: np.ndarray, group: int) -> np.ndarray:
    """codes uint8 [n, k] in 0..3 and fp16 scales [n, k//group] -> raw block bytes (1-D uint8).

    Args:
        codes: uint8 [n, k], values 0..3 (not checked here; larger values
            corrupt neighbouring codes), ``k`` a multiple of ``group``.
        scales_f16: [n, k // group], one ``d`` per block; converted to
            little-endian float16 (float32 input is rounded, RNE).
        group: codes per block, 64 or 128.

    Returns:
        uint8 [n * (k // group) * (2 + group // 4)]: row-major blocks, each
        ``d`` then ``qs`` in the bit layout of the module docstring.

    Raises:
        ValueError: from NumPy's reshape when the shapes disagree with
        ``group``. Use :meth:`Q2Weight.from_codes` for checked input.
    """
    n, k = codes.shape
    nb = k // group
    out = np.empty((n, nb, block_bytes(group)), dtype=np.uint8)
    out[:, :, :SCALE_BYTES] = (
        np.ascontiguousarray(scales_f16, dtype="<f2").view(np.uint8).reshape(n, nb, 2)
    )
    c = codes.reshape(n, nb, group // 4, 4).astype(np.uint8)
    out[:, :, SCALE_BYTES:] = c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)
    return out.reshape(-1)


def unpack_codes(raw: np.ndarray, n: int, k: int, group: int) -> np.ndarray:
    """Extract the 2-bit codes of ``n`` rows of ``block_q2_0`` bytes (the inverse of :func:`pack`).

    Args:
        raw: uint8 block bytes, exactly ``n * row_bytes(k, group)`` of them
            (1-D, as in :attr:`Q2Weight.raw`).
        n: rows (output features).
        k: codes per row, a multiple of ``group``.
        group: codes per block, 64 or 128.

    Returns:
        uint8 [n, k], values 0..3, code j of a row taken LSB-first from
        ``qs[j // 4]`` of its block (a new array).

    Raises:
        ValueError: when ``group`` is not 64 or 128, or ``raw`` does not hold
        exactly that many bytes (NumPy's reshape error).
    """
    qs = _blocks(raw, n, k, group)[:, :, SCALE_BYTES:]
    shifts = np.arange(4, dtype=np.uint8) * 2
    return ((qs[..., None] >> shifts) & 3).reshape(n, k).astype(np.uint8)


def unpack_scales(raw: np.ndarray, n: int, k: int, group: int) -> np.ndarray:
    """Extract the per-block fp16 scales ``d`` of ``n`` rows of ``block_q2_0`` bytes.

    Args (``raw``, ``n``, ``k``, ``group``) and Raises: as for :func:`unpack_codes`.

    Returns:
        float16 [n, k // group], the bytes 0..1 of each block read
        little-endian, bit patterns unchanged (NaN and Inf kept; a new array).
    """
    d = np.ascontiguousarray(_blocks(raw, n, k, group)[:, :, :SCALE_BYTES])
    return d.view("<f2").reshape(n, k // group).astype(np.float16)


def _buffer_bytes(raw) -> np.ndarray:
    """The bytes of any buffer-protocol object as a 1-D uint8 array over its memory (no copy).

    Goes through ``memoryview`` (Python 3.10+), not ``__buffer__`` (3.12+ only).
    The array's base is the memoryview, which keeps ``raw`` alive and tells
    :mod:`q2gemv.formats._frozen` whether ``raw`` is writeable.
    """
    try:
        mv = memoryview(raw)
    except TypeError:
        raise TypeError(
            "raw: expected a buffer (bytes, bytearray, memoryview, mmap, array.array, ...) "
            f"or a uint8 ndarray, got {type(raw).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise ValueError("raw: expected a C-contiguous buffer")
    return np.frombuffer(mv, np.uint8)  # the raw bytes, whatever mv's item format


@dataclass(frozen=True, eq=False)
class Q2Weight:
    """An immutable ``block_q2_0`` weight matrix [n, k]: the GGUF bytes, unchanged.

    Bytes nothing can write are wrapped without a copy, any other buffer is copied once;
    ``raw`` is never writeable (docs/guarantees.md#ownership-of-weight-bytes).

    Attributes:
        raw: 1-D uint8, exactly ``n * (k // group) * (2 + group // 4)`` bytes,
            row-major blocks (see the module docstring for the bit layout).
        n: output features (rows). k: input features (codes per row).
        group: codes per block, 64 or 128.
    """

    raw: np.ndarray = field(repr=False)
    n: int
    k: int
    group: int = 128

    def __post_init__(self) -> None:
        group = check_group(self.group)
        n, k = _check_nk(self.n, self.k, group)  # Python ints: no fixed-width overflow below
        raw = check_u8(self.raw, "raw", 1, "byte array")
        want = n * row_bytes(k, group)
        if raw.size != want:
            raise ValueError(
                f"raw: expected exactly {want} bytes for n={n} k={k} group={group}, got {raw.size}"
            )
        if not raw.flags.c_contiguous:
            raise ValueError("raw: expected a contiguous byte array")
        object.__setattr__(self, "raw", frozen(raw))  # the ownership rule: class docstring
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "group", group)

    def __reduce__(self):
        """Pickle, ``copy`` and ``deepcopy`` rebuild through the constructor from ``bytes``.

        The default would restore ``raw`` as an array owning its memory, which
        can be flagged writeable again; rebuilt from an immutable ``bytes``
        object, a copy is as read-only as the original.
        """
        return (_rebuild_q2, (type(self), self.raw.tobytes(), self.n, self.k, self.group))

    # -- constructors -------------------------------------------------------
    @classmethod
    def from_bytes(cls, raw, n: int, k: int, group: int = 128) -> Q2Weight:
        """Wrap GGUF ``block_q2_0`` bytes (any buffer: bytes, memoryview, mmap, ndarray).

        Args:
            raw: a buffer-protocol object or 1-D contiguous uint8 ndarray holding exactly
                ``n * (k // group) * (2 + group // 4)`` bytes of a row-major [n, k] matrix.
            n: output features (rows), >= 1.
            k: input features (codes per row), >= 1 and a multiple of ``group``.
            group: codes per block, 64 or 128 (default 128).

        Returns an immutable :class:`Q2Weight`, zero-copy only when nothing can write
        ``raw`` (docs/guarantees.md#ownership-of-weight-bytes).

        Raises:
            ValueError/TypeError naming the argument on a wrong length, dtype,
            shape, ``n``, ``k`` or ``group``; TypeError naming ``raw`` when it
            is not a buffer, ValueError when the buffer is not contiguous.
        """
        if not isinstance(raw, np.ndarray):
            raw = _buffer_bytes(raw)
        return cls(raw, n, k, group)

    @classmethod
    def from_codes(cls, codes: np.ndarray, scales: np.ndarray, group: int = 128) -> Q2Weight:
        """Pack codes uint8 [n, k] (values 0..3) and scales [n, k//group].

        ``scales`` may be float16 (taken as is) or float32 (rounded to fp16,
        round-to-nearest-even, overflow -> Inf).
        """
        group = check_group(group)
        if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8:
            got = codes.dtype if isinstance(codes, np.ndarray) else type(codes).__name__
            raise TypeError(f"codes: expected a uint8 array, got {got}")
        if codes.ndim != 2:
            raise ValueError(f"codes: expected shape [n, k], got {codes.shape}")
        n, k = codes.shape
        _check_nk(n, k, group)
        if codes.size and int(codes.max()) > 3:
            raise ValueError(f"codes: expected values 0..3, found {int(codes.max())}")
        if not isinstance(scales, np.ndarray) or scales.dtype not in (np.float16, np.float32):
            got = scales.dtype if isinstance(scales, np.ndarray) else type(scales).__name__
            raise TypeError(f"scales: expected float16 or float32, got {got}")
        if scales.shape != (n, k // group):
            raise ValueError(f"scales: expected shape {(n, k // group)}, got {scales.shape}")
        with np.errstate(over="ignore"):
            s16 = scales.astype(np.float16)
        return cls(pack(codes, s16, group), n, k, group)

    # -- accessors ----------------------------------------------------------
    @property
    def blocks_per_row(self) -> int:
        """Blocks in one row: ``k // group`` (each block holds one fp16 scale)."""
        return self.k // self.group

    @property
    def nbytes(self) -> int:
        """Bytes of ``raw``: ``n * blocks_per_row * (2 + group // 4)``, what a GEMV streams."""
        return self.raw.size

    def codes(self) -> np.ndarray:
        """uint8 [n, k], values 0..3."""
        return unpack_codes(self.raw, self.n, self.k, self.group)

    def scales(self) -> np.ndarray:
        """float16 [n, k // group], the per-block ``d``."""
        return unpack_scales(self.raw, self.n, self.k, self.group)

    def dequantize(self) -> np.ndarray:
        """float32 [n, k]: exactly ``(code - 1) * float32(d)`` (0 * Inf gives NaN, as in C)."""
        c = self.codes().astype(np.float32) - np.float32(1)
        d = np.repeat(self.scales().astype(np.float32), self.group, axis=1)
        with np.errstate(invalid="ignore"):
            return c * d

    def validate(self) -> list[str]:
        """Problems a GEMV would propagate rather than reject: non-finite scales.

        Returns a list of human-readable findings (empty when clean). Code 3
        is legal and not reported.
        """
        s = self.scales()
        bad = ~np.isfinite(s)
        if not bad.any():
            return []
        rows, blocks = np.nonzero(bad)
        first = ", ".join(
            f"(row {r}, block {b}) = {s[r, b]}" for r, b in zip(rows[:5], blocks[:5], strict=False)
        )
        return [f"{bad.sum()} non-finite scale(s) d: {first}"]

    def to_device(self, stream=0, *, keep_gguf: bool = False):
        """Upload once; returns a :class:`q2gemv.cuda.DeviceQ2Weight` to reuse.

        The device holds the weight in the exact kernel's execution layout
        (:mod:`q2gemv.formats.q2_0_layout`), not these bytes.

        Args:
            stream: the numba CUDA stream the copy is issued on; 0 (the
                default) means the default stream.
            keep_gguf: also upload ``raw`` (the seed contract's kernels read
                it; without, the first seed call rebuilds it on the device).

        The same as :func:`q2gemv.to_device` (``self``): imports numba on first
        use; needs a CUDA device (or the simulator): without either, a one-line
        ValueError saying how to get one.
        """
        from ._upload import upload

        return upload(self, stream, keep_gguf=keep_gguf)


def _rebuild_q2(cls: type[Q2Weight], raw: bytes, n: int, k: int, group: int) -> Q2Weight:
    """Unpickle a :class:`Q2Weight` (:meth:`Q2Weight.__reduce__`): a view of ``raw``, no copy."""
    return cls(np.frombuffer(raw, dtype=np.uint8), n, k, group)


# -- quantizers ---------------------------------------------------------------


def _roundf(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: nearest, halves away from zero (fp32 in, fp32 out)."""
    a = np.abs(v)
    r = np.floor(a)
    r = r + (a - r >= np.float32(0.5)).astype(np.float32)
    return np.copysign(r, v).astype(np.float32)


def quantize_q2_0(
    w: np.ndarray,
    group: int = 128,
    method: Literal["ggml", "absmean"] = "ggml",
    *,
    allow_nonfinite: bool = False,
) -> Q2Weight:
    """Quantize float weights [n, k] to ``block_q2_0``.

    Args:
        w: float array [n, k] (NumPy float or ``ml_dtypes.bfloat16``, rounded to fp32 first).
        group: codes per block, 64 or 128 (default 128); divides ``k``.
        method: ``"ggml"`` (default) or ``"absmean"``, as described below.
        allow_nonfinite: True keeps ggml's bytes for non-finite input (docs/guarantees.md).

    Returns:
        A :class:`Q2Weight` [n, k].

    Raises:
        TypeError: ``w`` is not a float array, or ``allow_nonfinite`` not a bool.
        ValueError: ``w`` is not 2-D, ``k`` is not a multiple of ``group``,
            ``group`` is not 64 or 128, ``method`` is unknown, or (unless
            ``allow_nonfinite``) ``w`` is not finite or a scale overflows fp16.

    ``method="ggml"`` is ggml's ``quantize_row_q2_0_ref`` byte for byte, per block:
    ``amax = max|x|`` (fp32), ``d = fp16(amax)`` (RNE), ``id = 1/amax`` (fp32; 0 when
    amax == 0), ``code = clamp(roundf(x * id) + 1, 0, 3)`` (C ``roundf``: halves away).
    ``method="absmean"`` is BitNet b1.58's recipe (Ma et al. 2024) per block:
    ``gamma = mean|x|`` (float64 sum, rounded to fp32), ``d = fp16(gamma)``,
    ``code = clamp(round_half_even(x / gamma), -1, 1) + 1``; gamma == 0 gives all code 1.
    """
    group = check_group(group)
    w = float_matrix(w)
    n, k = w.shape
    _check_nk(n, k, group)
    if not isinstance(allow_nonfinite, bool):
        raise TypeError(f"allow_nonfinite: expected a bool, got {type(allow_nonfinite).__name__}")
    with np.errstate(over="ignore"):
        x = w.astype(np.float32).reshape(n, k // group, group)
    if not allow_nonfinite and not np.isfinite(x).all():
        r, c = (int(i[0]) for i in np.nonzero(~np.isfinite(x.reshape(n, k))))
        raise ValueError(
            f"w: expected finite weights (after rounding to fp32), got {x.reshape(n, k)[r, c]} "
            f"at [{r}, {c}]"
        )
    with np.errstate(all="ignore"):
        if method == "ggml":
            amax = np.max(np.abs(x), axis=2)
            d = amax.astype(np.float16)
            inv = np.where(amax != 0, np.float32(1) / np.where(amax != 0, amax, 1), 0)
            q = _roundf(x * inv.astype(np.float32)[..., None]) + np.float32(1)
            codes = np.clip(q, 0, 3)
        elif method == "absmean":
            gamma = np.mean(np.abs(x.astype(np.float64)), axis=2).astype(np.float32)
            d = gamma.astype(np.float16)
            safe = np.where(gamma != 0, gamma, np.float32(1))[..., None]
            q = np.rint(x / safe)
            codes = np.where(gamma[..., None] != 0, np.clip(q, -1, 1) + 1, 1)
        else:
            raise ValueError(f"method: expected 'ggml' or 'absmean', got {method!r}")
    if not allow_nonfinite and not np.isfinite(d).all():
        r, b = (int(i[0]) for i in np.nonzero(~np.isfinite(d)))
        stat = "max|x|" if method == "ggml" else "mean|x|"
        value = float(amax[r, b] if method == "ggml" else gamma[r, b])
        raise ValueError(
            f"w: the fp16 scale of row {r}, block {b} (columns {b * group}..{(b + 1) * group - 1}) "
            f"overflows: {stat} = {value} is beyond fp16's 65504; scale the weights down, or "
            "pass allow_nonfinite=True for ggml's bytes (d = Inf)"
        )
    codes = np.nan_to_num(codes, nan=1).astype(np.uint8).reshape(n, k)
    return Q2Weight(pack(codes, d, group), n, k, group)

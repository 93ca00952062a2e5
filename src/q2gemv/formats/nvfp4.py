"""NVFP4 (W4A16 weights): FP4 E2M1 values, FP8 E4M3-fn block scales, an fp32 global scale.

This module is the one place that states the layout and the decode tables;
kernels, references and loaders import these names.

A weight matrix [N, K] (K a multiple of 16) is three pieces:

* ``packed`` uint8 [N, K/2]: two FP4 E2M1 codes a byte, the EVEN element in
  the LOW nibble (the layout ModelOpt and compressed-tensors both write)::

      packed[n, b] bit:  7 | 6 5 4  | 3 | 2 1 0
                         s | e e m  | s | e e m
      element:           k = 2b+1   | k = 2b          (even element = low nibble)

      code(n, k) = (packed[n, k // 2] >> (4 * (k % 2))) & 0xF

* ``scales`` uint8 [N, K/16]: one FP8 E4M3-fn bit pattern per 16 consecutive
  weights of a row (group q covers k = 16q .. 16q+15), row-major, not
  swizzled::

      bit:  7 | 6 5 4 3 | 2 1 0
            s | e (4)   | m (3)      bias 7; e = 0: subnormal m * 2^-9;
                                     0x7F / 0xFF: NaN; no Inf ("fn")

* ``global_scale``: one fp32 per tensor, a MULTIPLIER (ModelOpt
  ``weight_scale_2``)::

      w[n, k] = e2m1(code(n, k)) * e4m3(scales[n, k // 16]) * global_scale

  compressed-tensors stores a DIVISOR instead (``weight_global_scale``,
  ``w = e2m1 * (s / g_ct)``); :func:`global_scale_from_divisor` converts.

E2M1 codes (bit 3 = sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6)::

    code:  0    1    2    3    4    5    6    7
    value: 0   0.5  1.0  1.5  2.0  3.0  4.0  6.0      codes 8..15: the negatives (8 = -0)

E4M3-fn reaches +-448 (0x7E / 0xFE); its smallest subnormal is 2^-9 (0x01).
Every E2M1 x E4M3 product is exact in fp32 (<= 2 x 4 significant bits,
magnitudes in [2^-10, 2688]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from ._frozen import check_u8, frozen
from .bf16 import float_matrix

BLOCK = 16  # weights per E4M3 scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9
E4M3_NAN_BITS = (0x7F, 0xFF)
E4M3_FN = np.dtype(ml_dtypes.float8_e4m3fn)

# The 16 E2M1 values by code, written out (bit 3 is the sign; code 8 is -0.0).
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)
E2M1_VALUES.flags.writeable = False
# 2 * e2m1 by code: exact small ints in [-12, 12] (code 8, -0.0, is 0); the exact contract's
# weights and the execution layout's row sums are made of these.
E2M1_TWICE = (2 * E2M1_VALUES).astype(np.int64)
E2M1_TWICE.flags.writeable = False

# Rounding midpoints between consecutive E2M1 magnitudes (the ModelOpt bounds).
_E2M1_MAGS = E2M1_VALUES[:8].astype(np.float64)
_E2M1_MIDS = (_E2M1_MAGS[:-1] + _E2M1_MAGS[1:]) / 2  # 0.25 0.75 1.25 1.75 2.5 3.5 5


def _e4m3_table() -> np.ndarray:
    """The 256 E4M3-fn values by bit pattern, from the bit fields (exact in fp32)."""
    b = np.arange(256, dtype=np.int64)
    e = (b >> 3) & 0xF
    m = (b & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0**-9, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    val = np.where(b & 0x80, -mag, mag)
    val[(b & 0x7F) == 0x7F] = np.nan
    return val.astype(np.float32)


E4M3_VALUES = _e4m3_table()
E4M3_VALUES.flags.writeable = False

# Non-negative finite E4M3 values in code order 0x00..0x7E (increasing) and their midpoints.
_E4M3_POS = E4M3_VALUES[:0x7F].astype(np.float64)
_E4M3_MIDS = (_E4M3_POS[:-1] + _E4M3_POS[1:]) / 2


# -- decode / encode -----------------------------------------------------------


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes (any unsigned ints; only the low nibble is used) -> float32."""
    return E2M1_VALUES[np.asarray(codes).astype(np.uint8) & 0xF]


def e4m3_decode(bits: np.ndarray) -> np.ndarray:
    """E4M3-fn bit patterns (uint8) -> float32, exact; 0x7F/0xFF -> NaN.

    Args:
        bits: uint8 array (any shape) of E4M3-fn bit patterns; other integer
            dtypes are converted to uint8 first.

    Returns:
        float32 of the same shape, looked up in :data:`E4M3_VALUES`.
    """
    return E4M3_VALUES[np.asarray(bits, dtype=np.uint8)]


def _rne_index(mag: np.ndarray, mids: np.ndarray) -> np.ndarray:
    """Index of the nearest grid point to ``mag`` (>= 0), ties to the even index.

    ``mids[i]`` is the midpoint between grid points i and i+1; values past the
    last midpoint take the last index (saturation). Grid index parity is the
    code's last mantissa bit, so "even index" is round-half-to-even.
    """
    lo = np.searchsorted(mids, mag, side="left")  # number of midpoints < mag
    tie = (lo < mids.size) & (mids[np.minimum(lo, mids.size - 1)] == mag)
    return np.where(tie & (lo % 2 == 1), lo + 1, lo)


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    """float -> E2M1 codes (uint8 0..15): round-to-nearest-even, saturating at +-6.

    The sign bit is set for ``x < 0`` (ModelOpt's ``_cast_fp4``): negatives
    that round to zero give code 8 (-0), while -0.0 itself gives code 0.
    Raises ValueError on NaN (E2M1 has no NaN); +-Inf saturates to +-6.
    """
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    if np.isnan(x).any():
        raise ValueError("x: E2M1 has no NaN; got NaN input")
    mag = np.abs(x)
    # Count the midpoints below |x|; at a midpoint between codes i and i+1,
    # round up only when i is odd (ties to the even code).
    idx = np.zeros(x.shape, np.uint8)
    for i, mid in enumerate(_E2M1_MIDS):
        idx += (mag >= mid) if i % 2 else (mag > mid)
    return np.where(x < 0, idx | np.uint8(8), idx).astype(np.uint8)


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float -> E4M3-fn bit patterns (uint8): clamp to [-448, 448], then round-to-nearest-even.

    Saturating (like ``cvt.rn.satfinite``): values past 448, Inf included,
    become +-448 (0x7E/0xFE). NaN -> 0x7F. The sign bit follows ``signbit``
    (-0.0 -> 0x80). Note ``ml_dtypes``' own cast does NOT saturate (465 ->
    NaN): this function clamps first.

    Args:
        x: real array (any shape), converted to float64 before rounding (so
            float32 input is rounded once).

    Returns:
        uint8 of the same shape: E4M3-fn bit patterns.
    """
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    mag = np.minimum(np.abs(np.where(nan, 0.0, x)), E4M3_MAX)
    idx = _rne_index(mag, _E4M3_MIDS).astype(np.uint8)
    bits = np.where(np.signbit(x), idx | np.uint8(0x80), idx)
    return np.where(nan, np.uint8(0x7F), bits).astype(np.uint8)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes uint8 [n, k] (k even, values 0..15) -> packed uint8 [n, k/2], even k low."""
    c = np.asarray(codes, dtype=np.uint8)
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """packed uint8 [n, k/2] -> E2M1 codes uint8 [n, k] (low nibble first)."""
    p = np.asarray(packed, dtype=np.uint8)
    out = np.empty(p.shape[:-1] + (2 * p.shape[-1],), dtype=np.uint8)
    out[..., 0::2] = p & 0xF
    out[..., 1::2] = p >> 4
    return out


# -- global scale ----------------------------------------------------------------


def check_global_scale(x, name: str = "global_scale") -> float:
    """Validate an NVFP4 global scale and return it as fp32 (a Python float that is exactly one).

    The one validator of every entry point that takes a global scale, so each accepts
    and refuses the same values with the same messages.

    Args:
        x: a real scalar (Python or NumPy int/float) or a size-1 real array,
            rounded to fp32 (RNE) when it is not already one.
        name: the argument named in the error messages.

    Returns:
        ``float(np.float32(x))``.

    Raises:
        TypeError: naming ``name`` for a bool, a complex number, a string or
            any other non-real value.
        ValueError: naming ``name`` for an array of more than one element, or a
            finite value that would round to +-Inf (``1e39``, ``2**2000``) or a
            non-zero one that would round to 0 (``1e-46``) in fp32.

    IEEE specials given as such (``inf``, ``nan``) are kept: they propagate as
    documented (:meth:`Nvfp4Weight.validate` reports them).
    """
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a real number, got bool")
    if isinstance(x, np.ndarray):
        if x.size != 1:
            raise ValueError(f"{name}: expected a scalar or size-1 array, got shape {x.shape}")
        if x.dtype.kind not in "fiu":
            raise TypeError(f"{name}: expected a real number, got dtype {x.dtype}")
        x = x.reshape(-1)[0]
    elif not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")
    try:
        with np.errstate(over="ignore", under="ignore"):
            f = float(np.float32(x))
        finite_in = isinstance(x, (int, np.integer)) or bool(np.isfinite(x))
    except OverflowError:  # a Python int beyond any float
        f, finite_in = math.inf, True
    if finite_in and (not math.isfinite(f) or (f == 0 and x != 0)):
        big_int = isinstance(x, (int, np.integer)) and abs(int(x)) >= 2**128
        shown = f"an int of {int(x).bit_length()} bits" if big_int else repr(x)
        raise ValueError(
            f"{name}: expected a value representable in fp32 (0, or a magnitude in "
            f"2**-149 .. ~3.4e38), got {shown}, which would round to {f}"
        )
    return f


def global_scale_from_divisor(weight_global_scale) -> float:
    """compressed-tensors divisor ``g_ct`` -> the multiplier stored here: ``fp32(1 / g_ct)``.

    compressed-tensors dequantizes ``w = e2m1 * (s / g_ct)``; this package
    (like ModelOpt, and like vLLM after loading a compressed-tensors
    checkpoint, which stores ``1 / weight_global_scale`` in fp32) computes
    ``w = e2m1 * s * g`` with ``g = fp32(1 / g_ct)``, a single fp32 division
    rounded to nearest even. The reciprocal is exact only when ``g_ct`` is a
    power of two; otherwise ``g`` is within half an fp32 ulp (relative error
    <= 2^-24) of ``1 / g_ct``, so each dequantized weight can differ from
    ``fp32(e2m1 * s / g_ct)`` by about one fp32 ulp. ``g_ct = 0`` gives
    ``+Inf``, reported by :meth:`Nvfp4Weight.validate` (IEEE specials given
    as such propagate, as in :func:`check_global_scale`).

    Raises:
        ValueError: naming ``weight_global_scale`` for a finite non-zero
            divisor whose fp32 reciprocal overflows (magnitude below 2**-128,
            e.g. ``1e-40``): a load would otherwise turn a finite checkpoint
            scale into an infinite multiplier.
    """
    g_ct = np.float32(check_global_scale(weight_global_scale, "weight_global_scale"))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        g = np.float32(1.0) / g_ct
    if np.isfinite(g_ct) and g_ct != 0 and not np.isfinite(g):
        raise ValueError(
            f"weight_global_scale: expected a divisor whose fp32 reciprocal is finite "
            f"(magnitude >= 2**-128), got {float(g_ct)!r}, whose reciprocal would be {float(g)}"
        )
    return float(g)


def divisor_from_global_scale(global_scale) -> float | None:
    """The compressed-tensors divisor ``g_ct`` that loads back as ``global_scale``, or None.

    The inverse of :func:`global_scale_from_divisor`: an fp32 ``g_ct`` with
    ``fp32(1 / g_ct) == global_scale`` bit for bit (the nearest such one to
    ``1 / global_scale``). The fp32 reciprocal is not onto: where consecutive
    divisors' reciprocals step by more than one fp32 ulp (multipliers in the upper
    part of a binade, about one in nine of ModelOpt's ``amax / 2688``) some
    multipliers are the reciprocal of no fp32, and None is returned; such a weight
    can be written bit-exactly only in the ModelOpt layout (``weight_scale_2``, the
    multiplier itself). Non-finite or zero multipliers return None.
    """
    g = np.float32(check_global_scale(global_scale))
    if not np.isfinite(g) or g == 0:
        return None
    with np.errstate(all="ignore"):
        first = np.float32(1.0) / g
        if not np.isfinite(first):
            return None
        below = above = first
        candidates = [first]
        for _ in range(2):  # the reciprocal is monotone: +-2 steps cover every hit
            below = np.nextafter(below, np.float32(0))
            above = np.nextafter(above, np.float32(np.inf) * np.sign(first))
            candidates += [below, above]
        for d in candidates:
            if d != 0 and np.isfinite(d) and np.float32(np.float32(1.0) / d) == g:
                return float(d)
    return None


# -- the weight --------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Nvfp4Weight:
    """An immutable NVFP4 weight matrix [n, k] (see the module docstring for the layout).

    Attributes:
        packed: uint8 [n, k // 2], two E2M1 codes a byte, even k in the low
            nibble. Read-only, C-contiguous.
        scales: uint8 [n, k // 16], E4M3-fn bit patterns, row-major, not
            swizzled. Read-only, C-contiguous.
        global_scale: the per-tensor MULTIPLIER ``g`` (a Python float that is
            exactly an fp32 value). A finite value that fp32 cannot hold (it
            would round to +-Inf, or to 0 from non-zero) is refused with a
            ValueError naming ``global_scale``; an explicit ``inf``/``nan`` is
            kept (IEEE semantics, reported by :meth:`validate`).
        n: output features (rows). k: input features, a multiple of 16, >= 16.

    Ownership (:mod:`q2gemv.formats._frozen`): ``packed`` and ``scales`` that
    nothing can write (views of a read-only memory map, as the loaders give,
    or of ``bytes``) are wrapped without a copy; any other array (writeable,
    a read-only view of a writeable one, or strided) is copied once into
    immutable memory. Neither can be flagged writeable again, and later
    writes to the caller's arrays do not reach the weight. ``pickle``,
    ``copy.copy`` and ``copy.deepcopy`` rebuild through the constructor from
    ``bytes``, so a copy is exactly as immutable.
    """

    packed: np.ndarray = field(repr=False)
    scales: np.ndarray = field(repr=False)
    global_scale: float = 1.0

    def __post_init__(self) -> None:
        packed = check_u8(self.packed, "packed", 2)
        scales = check_u8(self.scales, "scales", 2)
        n, half_k = packed.shape
        k = 2 * half_k
        if n < 1:
            raise ValueError(f"packed: expected at least one row, got shape {packed.shape}")
        if k < BLOCK or k % BLOCK:
            raise ValueError(
                f"packed: expected shape [n, k/2] with k a multiple of {BLOCK} (>= {BLOCK}), "
                f"got shape {packed.shape} (k={k})"
            )
        if scales.shape != (n, k // BLOCK):
            raise ValueError(
                f"scales: expected shape {(n, k // BLOCK)} (one E4M3 per {BLOCK} weights), "
                f"got {scales.shape}"
            )
        object.__setattr__(self, "packed", frozen(packed))
        object.__setattr__(self, "scales", frozen(scales))
        object.__setattr__(self, "global_scale", check_global_scale(self.global_scale))

    def __reduce__(self):
        """Pickle, ``copy`` and ``deepcopy`` rebuild through the constructor from ``bytes``.

        The default would restore ``packed``/``scales`` as arrays owning their
        memory, which can be flagged writeable again; rebuilt from immutable
        ``bytes``, a copy is as read-only as the original (the global scale,
        a Python float, keeps its bits).
        """
        state = (self.packed.tobytes(), self.packed.shape, self.scales.tobytes())
        return (_rebuild_nvfp4, (type(self), *state, self.global_scale))

    # -- shape ------------------------------------------------------------------
    @property
    def n(self) -> int:
        """Output features (rows): ``packed.shape[0]``."""
        return int(self.packed.shape[0])

    @property
    def k(self) -> int:
        """Input features: ``2 * packed.shape[1]``, a multiple of 16."""
        return 2 * int(self.packed.shape[1])

    @property
    def groups_per_row(self) -> int:
        """E4M3 scales per row: ``k // 16`` (the second dim of ``scales``)."""
        return self.k // BLOCK

    @property
    def nbytes(self) -> int:
        """Bytes a GEMV streams for this weight: codes + scales (+ 4 for the global scale)."""
        return self.packed.size + self.scales.size + 4

    def to_device(self, stream=0, *, keep_packed: bool = False):
        """Upload once; returns a :class:`q2gemv.cuda.DeviceNvfp4Weight` to reuse.

        The device holds the weight in the exact kernel's execution layout
        (:mod:`q2gemv.formats.nvfp4_layout`), not ``packed`` and ``scales``.

        Args:
            stream: the numba CUDA stream the copies are issued on; 0 (the
                default) means the default stream.
            keep_packed: also upload ``packed`` and ``scales`` (the seed
                contract's kernels read them; without, the first seed call
                rebuilds them on the device).

        The same as :func:`q2gemv.to_device` (``self``): imports numba on first
        use; needs a CUDA device (or the simulator): without either, a one-line
        ValueError saying how to get one.
        """
        from ._upload import upload

        return upload(self, stream, keep_packed=keep_packed)

    # -- constructors -----------------------------------------------------------
    @classmethod
    def from_parts(cls, packed: np.ndarray, scales: np.ndarray, global_scale) -> Nvfp4Weight:
        """Wrap checkpoint tensors: no copy when nothing can write them, else one copy.

        Read-only, C-contiguous parts whose memory nothing can write (the
        loaders' memory-mapped tensors) are wrapped as they are; writeable
        (or strided) arrays are copied once into immutable memory (see the
        class docstring for the ownership rule).

        ``packed`` is uint8 [n, k // 2], two E2M1 codes a byte (even k in the
        low nibble), k a multiple of 16; ``scales`` is [n, k // 16].
        ``scales`` may be uint8 E4M3 bit patterns or an ``ml_dtypes.float8_e4m3fn``
        array (viewed as uint8, no copy). ``global_scale`` is the multiplier
        (ModelOpt ``weight_scale_2``): a real scalar or size-1 array, rounded
        to fp32 (RNE) if it is not already one. For a compressed-tensors
        divisor use :meth:`from_compressed_tensors`.
        """
        if isinstance(scales, np.ndarray) and scales.dtype == E4M3_FN:
            scales = scales.view(np.uint8)
        return cls(packed, scales, global_scale)

    @classmethod
    def from_compressed_tensors(
        cls, packed: np.ndarray, scales: np.ndarray, weight_global_scale
    ) -> Nvfp4Weight:
        """Wrap compressed-tensors ``weight_packed``, ``weight_scale``, ``weight_global_scale``.

        The global scale there is a divisor; it becomes the multiplier
        ``fp32(1 / weight_global_scale)`` (see :func:`global_scale_from_divisor`
        for the rounding that implies).

        Args:
            packed: ``weight_packed``, uint8 [n, k // 2] (even k in the low
                nibble), k a multiple of 16.
            scales: ``weight_scale``, [n, k // 16] as uint8 E4M3 bit patterns
                or ``ml_dtypes.float8_e4m3fn``.
            weight_global_scale: the divisor ``g_ct``, a real scalar or
                size-1 array.

        Raises:
            TypeError/ValueError naming the argument, as :meth:`from_parts`.
        """
        return cls.from_parts(packed, scales, global_scale_from_divisor(weight_global_scale))

    @classmethod
    def from_codes(cls, codes: np.ndarray, scales: np.ndarray, global_scale) -> Nvfp4Weight:
        """Pack E2M1 codes uint8 [n, k] (values 0..15) with E4M3 scale bits [n, k/16].

        Args:
            codes: uint8 [n, k], values 0..15 (bit 3 = sign), k a multiple of 16.
            scales: [n, k // 16], uint8 E4M3 bit patterns or
                ``ml_dtypes.float8_e4m3fn``.
            global_scale: the per-tensor multiplier ``g`` (real scalar or
                size-1 array, rounded to fp32).

        Raises:
            TypeError: ``codes`` is not a uint8 ndarray (or as :meth:`from_parts`).
            ValueError: ``codes`` is not 2-D, a code above 15, an odd k, or
                shapes that disagree.
        """
        codes = check_u8(codes, "codes", 2)
        if codes.size and int(codes.max()) > 15:
            raise ValueError(f"codes: expected values 0..15, found {int(codes.max())}")
        if codes.shape[1] % 2:
            raise ValueError(f"codes: expected an even k, got shape {codes.shape}")
        return cls.from_parts(pack_nibbles(codes), scales, global_scale)

    @classmethod
    def from_float(cls, w: np.ndarray) -> Nvfp4Weight:
        """Quantize finite float weights [n, k] with the ModelOpt NVFP4 recipe.

        Every step is an fp32 operation rounded to nearest even, in this order:

        1. ``x = fp32(w)``; ``amax = max|x|`` over the tensor.
        2. ``g = amax / 2688`` (2688 = 6 * 448). If ``g`` is 0 (an all-zero
           tensor, or amax so small that g underflows), ``g = 1.0`` instead;
           every weight then encodes as zero.
        3. Per group of 16: ``amax_blk = max|x|``;
           ``sb = amax_blk / fp32(6 * g)``; ``sb = clamp(sb, 2^-9, 448)``;
           ``s = e4m3(sb)`` (RNE; the clamp keeps it finite and non-zero).
        4. ``q = x / fp32(e4m3_value(s) * g)``; code = E2M1 round-to-nearest-even
           of ``q`` saturating at +-6 (:func:`e2m1_encode`; sign bit for q < 0).

        Raises ValueError for non-finite weights or a shape that is not
        [n, k] with k a multiple of 16.
        """
        w = float_matrix(w)
        n, k = w.shape
        if n < 1 or k < BLOCK or k % BLOCK:
            raise ValueError(
                f"w: expected shape [n, k] with n >= 1 and k a multiple of {BLOCK} (>= {BLOCK}), "
                f"got {w.shape}"
            )
        with np.errstate(over="ignore"):
            x = w.astype(np.float32)
        if not np.isfinite(x).all():
            raise ValueError("w: expected finite weights (after rounding to fp32)")
        f32 = np.float32
        with np.errstate(all="ignore"):
            amax = np.max(np.abs(x))
            g = f32(amax / f32(6.0 * 448.0))
            if g == 0:
                g = f32(1.0)
            xb = x.reshape(n, k // BLOCK, BLOCK)
            amax_blk = np.max(np.abs(xb), axis=2)
            sb = amax_blk / f32(f32(6.0) * g)
            sb = np.clip(sb, f32(E4M3_MIN_SUBNORMAL), f32(E4M3_MAX)).astype(np.float32)
            s_bits = e4m3_encode(sb)
            denom = (e4m3_decode(s_bits) * g).astype(np.float32)
            q = (xb / denom[..., None]).astype(np.float32)
        codes = e2m1_encode(q).reshape(n, k)
        return cls(pack_nibbles(codes), s_bits, float(g))

    # -- accessors --------------------------------------------------------------
    def codes(self) -> np.ndarray:
        """E2M1 codes uint8 [n, k] (0..15, bit 3 = sign)."""
        return unpack_nibbles(self.packed)

    def scale_values(self) -> np.ndarray:
        """float32 [n, k // 16]: the decoded E4M3 block scales (NaN for 0x7F/0xFF)."""
        return e4m3_decode(self.scales)

    def dequantize(self) -> np.ndarray:
        """float32 [n, k]: ``fp32(fp32(e2m1 * e4m3) * g)``.

        The first product is exact (see the module docstring); only the
        multiply by ``g`` rounds. NaN scales give NaN, and an Inf ``g`` makes
        zero weights NaN (0 * Inf), as in C.
        """
        v = e2m1_decode(self.codes()).reshape(self.n, self.groups_per_row, BLOCK)
        with np.errstate(invalid="ignore", over="ignore"):
            ws = v * self.scale_values()[..., None]
            return (ws * np.float32(self.global_scale)).astype(np.float32).reshape(self.n, self.k)

    def validate(self) -> list[str]:
        """Problems a GEMV would propagate rather than reject.

        Returns human-readable findings (empty when clean): NaN scale bytes
        (0x7F / 0xFF; E4M3-fn has no Inf) and a non-finite global scale.
        """
        findings = []
        nan = (self.scales & 0x7F) == 0x7F
        if nan.any():
            rows, groups = np.nonzero(nan)
            first = ", ".join(
                f"(row {r}, group {q}) = 0x{self.scales[r, q]:02X}"
                for r, q in zip(rows[:5], groups[:5], strict=True)
            )
            findings.append(f"{int(nan.sum())} NaN E4M3 scale byte(s): {first}")
        if not math.isfinite(self.global_scale):
            findings.append(f"non-finite global scale: {self.global_scale}")
        return findings


def _rebuild_nvfp4(
    cls: type[Nvfp4Weight], packed: bytes, shape: tuple[int, int], scales: bytes, global_scale
) -> Nvfp4Weight:
    """Unpickle an :class:`Nvfp4Weight` (:meth:`Nvfp4Weight.__reduce__`): views of the bytes."""
    n, half_k = shape
    p = np.frombuffer(packed, dtype=np.uint8).reshape(n, half_k)
    s = np.frombuffer(scales, dtype=np.uint8).reshape(n, 2 * half_k // BLOCK)
    return cls(p, s, global_scale)

"""BF16 on the host: the one place that defines how fp32 becomes bf16.

Bit layout (IEEE-like, 1 sign, 8 exponent, 7 mantissa bits)::

    bit  15 | 14 ........ 7 | 6 ....... 0
        sign|  exponent (8) | mantissa (7)

A bf16 is the top half of an fp32: ``f32_bits = bf16_bits << 16`` is exact.

fp32 -> bf16 is round-to-nearest-even on the bit pattern::

    bf16 = (f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) >> 16

which also rounds values past the bf16 maximum to +-Inf. Every NaN becomes
the single canonical pattern :data:`BF16_NAN` (0x7FC0, sign dropped): the
GPU canonicalises NaN payloads in fp32 arithmetic and NumPy does not, so the
output pattern is fixed here and used by every backend.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
BF16_NAN = 0x7FC0
BF16_MAX = 0x7F7F  # 3.3895314e38


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), round-to-nearest-even, NaN -> 0x7FC0.

    Args:
        x: float32 array (any shape); other dtypes are converted to float32
            first (float64 input is thus rounded twice).

    Returns:
        uint16 of the same shape; values past the bf16 maximum become +-Inf.
    """
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(BF16_NAN), r)


def bf16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> fp32, exact.

    Args:
        h: uint16 array (any shape) of bf16 bit patterns.

    Returns:
        float32 of the same shape, ``h << 16`` reinterpreted (NaN payloads kept).
    """
    h = np.asarray(h, dtype=np.uint16)
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


def as_bf16_bits(a: np.ndarray, name: str = "a") -> np.ndarray:
    """View a ``ml_dtypes.bfloat16`` array as its uint16 bit patterns (no copy).

    Raises TypeError naming ``name`` for any other dtype: float16/float32
    activations are refused rather than silently rounded.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"{name}: expected a numpy ml_dtypes.bfloat16 array, got {type(a).__name__}"
        )
    if a.dtype != BF16:
        raise TypeError(f"{name}: expected dtype bfloat16 (ml_dtypes.bfloat16), got {a.dtype}")
    return a.view(np.uint16)


def bits_to_bf16(h: np.ndarray) -> np.ndarray:
    """uint16 bit patterns -> ``ml_dtypes.bfloat16`` array (a view, no copy).

    Args:
        h: uint16 array (any shape) of bf16 bit patterns; other dtypes are
            converted to uint16 first (then the result views that copy).

    Returns:
        ``ml_dtypes.bfloat16`` of the same shape.
    """
    return np.asarray(h, dtype=np.uint16).view(BF16)


def as_bf16_rows(a: np.ndarray, k: int, name: str = "a") -> tuple[np.ndarray, bool]:
    """Activations ``a`` (bfloat16 [K] or [M, K]) as uint16 bits [M, K], plus whether ``a`` was 1-D.

    Args:
        a: ``ml_dtypes.bfloat16`` numpy array, [K] or [M, K].
        k: the K the weight expects.
        name: the argument name used in error messages.

    Raises TypeError for any other dtype and ValueError for another rank or K,
    each naming ``name``. No copy.
    """
    return bit_rows(as_bf16_bits(a, name), k, name)


def bit_rows(bits: np.ndarray, k: int, name: str = "a") -> tuple[np.ndarray, bool]:
    """Activation bits ``bits`` [K] or [M, K] (uint16, any 16-bit format) as [M, K], plus
    whether they were 1-D; ValueError naming ``name`` for another rank or for a row length
    other than ``k`` (the weight's K). No copy."""
    if bits.ndim not in (1, 2):
        raise ValueError(f"{name}: expected shape [K] or [M, K], got {bits.shape}")
    was_1d = bits.ndim == 1
    bits2 = bits.reshape(1, -1) if was_1d else bits
    if bits2.shape[1] != k:
        raise ValueError(f"{name}: expected K={k} columns (the weight's k), got {bits2.shape[1]}")
    return bits2, was_1d


def float_matrix(w, name: str = "w") -> np.ndarray:
    """``w`` as a 2-D float array (any NumPy float or ``ml_dtypes.bfloat16``), as the
    quantizers take it; TypeError/ValueError naming ``name``."""
    w = np.asarray(w)
    if w.dtype.kind != "f" and w.dtype != np.dtype(ml_dtypes.bfloat16):
        raise TypeError(f"{name}: expected a float array, got {w.dtype}")
    if w.ndim != 2:
        raise ValueError(f"{name}: expected shape [n, k], got {w.shape}")
    return w

"""Activation formats of the exact contract: bf16 and fp16, one parameter for every backend.

Both are IEEE-like 16-bit floats, 1 sign bit, ``exp_bits`` exponent bits, ``mant_bits``
mantissa bits::

    bf16:  bit 15 sign | 14 ... 7 exponent (8, bias 127) | 6 ... 0 mantissa (7)
    fp16:  bit 15 sign | 14 ... 10 exponent (5, bias 15) | 9 ... 0 mantissa (10)

Every field the exact contract reads (:mod:`q2gemv.reference.exact`, and its device code
:mod:`q2gemv.cuda.exact_contract`) derives from these two widths here, so the reference and
the kernels take the format as one argument (:class:`ActFormat`) and hold no per-dtype copy
of the arithmetic. The host dtypes: ``ml_dtypes.bfloat16`` and ``np.float16``; raw ``uint16``
bits are bf16 wherever they are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from .bf16 import bit_rows


@dataclass(frozen=True)
class ActFormat:
    """A 16-bit float activation (and output) format: ``name``, ``exp_bits``, ``mant_bits``,
    its canonical NaN ``nan`` (the one pattern every backend writes) and its NumPy ``dtype``.
    Hashable: a kernel build's cache key."""

    name: str
    exp_bits: int
    mant_bits: int
    nan: int
    dtype: np.dtype = field(compare=False, repr=False)

    @property
    def exp_max(self) -> int:
        """The exponent field of Inf and NaN (all ones)."""
        return (1 << self.exp_bits) - 1

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def inf(self) -> int:
        """+Inf's bits; ``bits & 0x7FFF >= inf`` is a NaN or an Inf."""
        return self.exp_max << self.mant_bits

    @property
    def min_quantum(self) -> int:
        """Exponent of the subnormal step (the smallest ulp): ``1 - bias - mant_bits``."""
        return 1 - self.bias - self.mant_bits

    def bits(self, x: np.ndarray) -> np.ndarray:
        """An array of this format's dtype as its uint16 bit patterns (a view)."""
        return np.asarray(x).view(np.uint16)

    def from_bits(self, h: np.ndarray) -> np.ndarray:
        """uint16 bit patterns -> an array of this format's dtype (a view of ``h`` as uint16)."""
        return np.asarray(h, dtype=np.uint16).view(self.dtype)


BF16 = ActFormat("bf16", 8, 7, 0x7FC0, np.dtype(ml_dtypes.bfloat16))
FP16 = ActFormat("fp16", 5, 10, 0x7E00, np.dtype(np.float16))
FORMATS = (BF16, FP16)


def act_of_dtype(dtype) -> ActFormat | None:
    """The format of a NumPy dtype (``bfloat16`` or ``float16``), or None."""
    dtype = np.dtype(dtype)
    for f in FORMATS:
        if dtype == f.dtype:
            return f
    return None


def act_named(name: str) -> ActFormat:
    """The format called ``name`` (``"bf16"`` or ``"fp16"``); ValueError naming ``act``."""
    for f in FORMATS:
        if name == f.name:
            return f
    raise ValueError(f"act: expected one of {[f.name for f in FORMATS]}, got {name!r}")


def as_act_rows(a, k: int, name: str = "a") -> tuple[np.ndarray, bool, ActFormat]:
    """Host activations ``a`` (bfloat16 or float16, [K] or [M, K]) as uint16 bits [M, K], whether
    ``a`` was 1-D, and their format. No copy.

    Raises TypeError for any other dtype (uint16 bits included: on the host a bf16 array says
    what it holds) and ValueError for another rank or K, each naming ``name``.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"{name}: expected a numpy ml_dtypes.bfloat16 array, got {type(a).__name__}"
        )
    act = act_of_dtype(a.dtype)
    if act is None:
        raise TypeError(
            f"{name}: expected dtype bfloat16 (ml_dtypes.bfloat16) or float16, got {a.dtype}"
        )
    bits2, was_1d = bit_rows(a.view(np.uint16), k, name)
    return bits2, was_1d, act


__all__ = ["ActFormat", "BF16", "FP16", "FORMATS", "act_of_dtype", "act_named", "as_act_rows"]

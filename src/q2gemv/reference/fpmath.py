"""fp32 arithmetic for the NumPy references, in the kernels' exact rounding.

NumPy float32 ``*`` and ``+`` are correctly rounded single operations, so
``fmul_rn``/``fadd_rn`` on the device are plain float32 ops here. Two things
need care:

* ``fma_f32`` — a fused multiply-add rounds once. It is emulated as
  ``float32(float64(x) * float64(y) + float64(z))``. The f64 product of two
  fp32 numbers is exact (48 bits). The f64 sum can round, and a second
  rounding to fp32 could then land on a false tie; in q2gemv every fma has a
  product factor of at most 3 significant bits (a Q2_0 code minus one, or an
  E2M1 value), so the product has at most 11 bits. If the f64 sum is
  inexact, the smaller term is below 2^-29 of the larger, far from any fp32
  rounding midpoint of the larger, so the double rounding cannot change the
  fp32 result. Callers with wider products must not use this helper.
* ``warp_tree_sum_f32`` — the butterfly reduction the kernels do with
  ``shfl_xor`` offsets 16, 8, 4, 2, 1. fp32 addition is commutative, so every
  lane ends with the same bits; this reproduces them.

``np.sum``/``np.dot`` are never used: they reorder additions.
"""

from __future__ import annotations

import numpy as np

WARP = 32
SHFL_XOR_OFFSETS = (16, 8, 4, 2, 1)


def fma_f32(x, y, z) -> np.ndarray:
    """Single-rounding fp32 fma (see module docstring for when this is exact)."""
    with np.errstate(all="ignore"):
        r = np.asarray(x, np.float64) * np.asarray(y, np.float64) + np.asarray(z, np.float64)
        return r.astype(np.float32)


def fmul_rn(x, y) -> np.ndarray:
    """fp32 multiply, rounded to nearest even (the device's ``fmul_rn``)."""
    with np.errstate(all="ignore"):
        return np.multiply(x, y, dtype=np.float32)


def fadd_rn(x, y) -> np.ndarray:
    """fp32 add, rounded to nearest even (the device's ``fadd_rn``)."""
    with np.errstate(all="ignore"):
        return np.add(x, y, dtype=np.float32)


def warp_tree_sum_f32(v: np.ndarray) -> np.ndarray:
    """Reduce the last axis (length 32, lane order) by the shfl_xor butterfly."""
    v = np.asarray(v, np.float32)
    if v.shape[-1] != WARP:
        raise ValueError(f"v: expected a last axis of {WARP} lanes, got {v.shape}")
    for off in SHFL_XOR_OFFSETS:
        v = fadd_rn(v[..., :off], v[..., off : 2 * off])
    return v[..., 0]

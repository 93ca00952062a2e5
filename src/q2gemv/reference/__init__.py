"""Bit-exact NumPy references: one function per kernel, same signature.

Seed contract (``q2_0``, ``w4a16``): each reproduces its kernel's fp32 order.
Exact contract (``exact``): the value every exact kernel computes, in exact integers.
"""

from .exact import q2_0_gemv_exact
from .nvfp4 import (
    w4a16_gemv,
    w4a16_gemv_batch4,
    w4a16_gemv_batch5,
    w4a16_gemv_batch6,
    w4a16_gemv_batch7,
    w4a16_gemv_batch8,
    w4a16_gemv_batch8_rt2,
    w4a16_gemv_batch16,
    w4a16_gemv_batch32,
    w4a16_gemv_batchm,
)
from .q2_0 import (
    q2_0_gemv,
    q2_0_gemv_vec,
    q2_0_gemv_vec_batchm,
    q2_0_gemv_vec_batchm_rt2,
    q2_0_gemv_vec_rt4,
)

__all__ = [
    "q2_0_gemv_exact",
    "q2_0_gemv",
    "q2_0_gemv_vec",
    "q2_0_gemv_vec_batchm",
    "q2_0_gemv_vec_rt4",
    "q2_0_gemv_vec_batchm_rt2",
    "w4a16_gemv",
    "w4a16_gemv_batchm",
    "w4a16_gemv_batch4",
    "w4a16_gemv_batch5",
    "w4a16_gemv_batch6",
    "w4a16_gemv_batch7",
    "w4a16_gemv_batch8",
    "w4a16_gemv_batch8_rt2",
    "w4a16_gemv_batch16",
    "w4a16_gemv_batch32",
]

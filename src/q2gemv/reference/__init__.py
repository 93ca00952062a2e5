"""Bit-exact NumPy references: one function per kernel, same signature, same fp32 order."""

from .q2_0 import (
    q2_0_gemv,
    q2_0_gemv_vec,
    q2_0_gemv_vec_batchm,
    q2_0_gemv_vec_batchm_rt2,
    q2_0_gemv_vec_rt4,
)
from .w4a16 import (
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

__all__ = [
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

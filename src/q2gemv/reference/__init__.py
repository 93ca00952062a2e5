"""Bit-exact NumPy references: one function per kernel, same signature, same fp32 order."""

from .q2_0 import (
    q2_0_gemv,
    q2_0_gemv_vec,
    q2_0_gemv_vec_batchm,
    q2_0_gemv_vec_batchm_rt2,
    q2_0_gemv_vec_rt4,
)

__all__ = [
    "q2_0_gemv",
    "q2_0_gemv_vec",
    "q2_0_gemv_vec_batchm",
    "q2_0_gemv_vec_rt4",
    "q2_0_gemv_vec_batchm_rt2",
]

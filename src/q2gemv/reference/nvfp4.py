"""NumPy reference of the W4A16 NVFP4 GEMV kernels, reproducing their fp32 order bit for bit.

One reference serves every kernel of the family (``w4a16_gemv_batch4`` ..
``_batch8``, ``_batch8_rt2``, ``_batch16``, ``_batch32``): the order below
depends only on (column n, K, the thread map), never on M, on the tier's
MAX_M, on register tiling or on how rows are chunked into launches.

THE CONTRACT (``y[m, n] = sum_k a[m, k] * w[n, k]``, weights as in
:mod:`q2gemv.formats.nvfp4`):

1. Thread map: one warp per output column n; lane l (0..31) owns the
   16-weight scale groups q = l, l+32, l+64, ... (q < K/16), visited in
   increasing q.
2. Per group q, per activation row m, ``e_i = e2m1(n, 16q+i)`` and
   ``a_i = bf16 a[m, 16q+i]`` widened to fp32 (exact)::

       s = +0.0f
       for i in 0..15:  s = fma(e_i, a_i, s)          # fma.rn.f32: one rounding

   ``e_i * a_i`` is always exact in fp32 when finite (<= 2 x 8 significant
   bits; the smallest bf16 subnormal 2^-133 times 0.5 is still an fp32
   subnormal), so an fma equals a multiply then add EXCEPT where the product
   overflows fp32 and the running sum brings it back (-bf16max + 2*bf16max):
   the fma keeps it finite. Kernels use ``fma``; this reference emulates it
   exactly (:func:`q2gemv.reference.fpmath.fma_f32`).
3. Then ``acc_l = fadd_rn(acc_l, fmul_rn(s, e4m3(n, q)))``: two explicitly
   rounded fp32 ops (the product is inexact in general); ``acc_l`` starts at
   +0.0f. So ``acc_l`` is never -0.0.
4. Warp reduction: ``v = v + shfl_xor(v, off)`` for off = 16, 8, 4, 2, 1
   (:func:`q2gemv.reference.fpmath.warp_tree_sum_f32`); all lanes end equal.
5. ``y = fmul_rn(total, g)``: the global scale once, at the end.
6. Output bf16, round-to-nearest-even; every NaN -> 0x7FC0.

Implementation: float32 arrays vectorised over (M, weight rows, groups);
the 16-step fma chain, the per-lane accumulation over group strides of 32
and the tree are explicit loops (never ``np.sum``/``np.dot``, which reorder).
"""

from __future__ import annotations

import numpy as np

from ..formats.bf16 import as_bf16_rows, bf16_bits_to_f32, bits_to_bf16, f32_to_bf16_bits
from ..formats.nvfp4 import BLOCK, Nvfp4Weight, e2m1_decode, e4m3_decode, unpack_nibbles
from .fpmath import WARP, fadd_rn, fma_f32, fmul_rn, warp_tree_sum_f32

_CHUNK_ELEMS = 1 << 21  # M * rows * groups handled at once (bounds memory, keeps it fast)


def _prep(a, weight: Nvfp4Weight) -> tuple[np.ndarray, bool]:
    """uint16 bf16 bits [M, K] of ``a`` (no copy), and whether ``a`` was 1-D."""
    if not isinstance(weight, Nvfp4Weight):
        raise TypeError(f"weight: expected an Nvfp4Weight, got {type(weight).__name__}")
    return as_bf16_rows(a, weight.k)


def lane_partials(a32: np.ndarray, weight: Nvfp4Weight, r0: int, r1: int) -> np.ndarray:
    """Per-lane fp32 accumulators ``acc_l`` [M, r1 - r0, 32] of weight rows r0..r1-1 (steps 1-3).

    ``a32`` is the fp32 activation [M, K] (bf16 widened exactly).
    """
    m = a32.shape[0]
    groups = weight.k // BLOCK
    rows = r1 - r0
    e = e2m1_decode(unpack_nibbles(weight.packed[r0:r1])).astype(np.float64)
    e = e.reshape(rows, groups, BLOCK)
    a64 = a32.astype(np.float64).reshape(m, groups, BLOCK)
    s = np.zeros((m, rows, groups), np.float32)
    for i in range(BLOCK):
        s = fma_f32(e[None, :, :, i], a64[:, None, :, i], s)
    p = fmul_rn(s, e4m3_decode(weight.scales[r0:r1])[None])
    acc = np.zeros((m, rows, WARP), np.float32)
    for q0 in range(0, groups, WARP):  # lane l takes group q0 + l, if it exists
        cnt = min(WARP, groups - q0)
        acc[..., :cnt] = fadd_rn(acc[..., :cnt], p[..., q0 : q0 + cnt])
    return acc


def w4a16_gemv(a: np.ndarray, weight: Nvfp4Weight) -> np.ndarray:
    """Reference of every ``w4a16_gemv_*`` kernel: ``a @ w.T`` in the contract's fp32 order.

    ``a`` is bf16 (``ml_dtypes.bfloat16``) [K] or [M, K]; returns bf16 [N]
    or [M, N]. M = 0 returns an empty [0, N]. Row m of the result depends
    only on row m of ``a`` (batch invariance).

    Args:
        a: bf16 (``ml_dtypes.bfloat16``) [K] or [M, K] activations.
        weight: the :class:`~q2gemv.formats.nvfp4.Nvfp4Weight` [N, K].

    Raises:
        TypeError: ``weight`` is not an Nvfp4Weight, or ``a`` is not bfloat16.
        ValueError: ``a`` is not 1-D/2-D or its K differs from ``weight.k``.
    """
    bits, squeeze = _prep(a, weight)
    m = bits.shape[0]
    n, groups = weight.n, weight.k // BLOCK
    out = np.empty((m, n), np.uint16)  # each chunk is rounded to bf16 as it is done
    m_per = max(1, _CHUNK_ELEMS // max(1, WARP * groups))  # memory does not grow with M
    g = np.float32(weight.global_scale)
    for m0 in range(0, m, m_per):
        m1 = min(m, m0 + m_per)
        a32 = bf16_bits_to_f32(bits[m0:m1])
        step = max(1, _CHUNK_ELEMS // ((m1 - m0) * max(WARP, groups)))
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            total = warp_tree_sum_f32(lane_partials(a32, weight, r0, r1))
            out[m0:m1, r0:r1] = f32_to_bf16_bits(fmul_rn(total, g))
    out = bits_to_bf16(out)
    return out[0] if squeeze else out


# One reference per kernel name (``getattr(reference, kernel)`` works), all the
# same function: the order does not depend on MAX_M, register tiling or chunking.
w4a16_gemv_batchm = w4a16_gemv
w4a16_gemv_batch4 = w4a16_gemv
w4a16_gemv_batch5 = w4a16_gemv
w4a16_gemv_batch6 = w4a16_gemv
w4a16_gemv_batch7 = w4a16_gemv
w4a16_gemv_batch8 = w4a16_gemv
w4a16_gemv_batch8_rt2 = w4a16_gemv
w4a16_gemv_batch16 = w4a16_gemv
w4a16_gemv_batch32 = w4a16_gemv

"""NumPy references for the Q2_0 kernels, reproducing each kernel's fp32 order bit for bit.

Shared by all three (and stated once here):

* ``cm1 = code - 1`` in {-1, 0, 1, 2} as fp32 (exact); ``a`` is the bf16
  activation widened to fp32 (exact); ``d`` the block's fp16 scale widened
  to fp32 (exact).
* Per thread and per 16-bit half (baseline, 8 codes) or 32-bit word (vec,
  16 codes) of one block: ``s = +0.0; s = fma(cm1_i, a_i, s)`` for the codes
  in increasing k. The products are exact (a times -1, 0, 1 or 2), so each
  fma rounds only its addition; it also avoids the overflow of ``2 * a``
  near the bf16 maximum that a separate multiply would hit.
* Then ``acc = fadd_rn(acc, fmul_rn(s, d))``: the scale is applied once per
  half/word, with both roundings explicit; ``acc`` starts at +0.0.
* Per warp: the butterfly ``fpmath.warp_tree_sum_f32`` (xor 16, 8, 4, 2, 1).
* Output: bf16 round-to-nearest-even, NaN -> 0x7FC0.

The order of one output row depends only on (row, K, group, kernel thread
map); never on M or on how rows are chunked into launches.
"""

from __future__ import annotations

import numpy as np

from ..formats.bf16 import as_bf16_rows, bf16_bits_to_f32, bits_to_bf16, f32_to_bf16_bits
from ..formats.q2_0 import Q2Weight, row_bytes, unpack_codes, unpack_scales
from .fpmath import fadd_rn, fma_f32, fmul_rn, warp_tree_sum_f32

# Memory bounds (peak ~40 bytes per element of one step, f64 fma temporaries included):
# weight rows decoded at once, and activation rows x weight rows x lanes per step. Both
# loops only cut independent outputs apart, so the bits do not depend on them. The W4A16
# reference is chunked the same way. Before, only weight rows were chunked: q2_0_gemv at
# M=4000, N=512, K=128 peaked at 3.0 GB (tracemalloc; 71 MB now) and M=10**6, N=7 failed
# to allocate (241 MB, 55 s now, on a 2-core CPU).
_ROW_CHUNK = 512
_CHUNK_ELEMS = 1 << 20


def _prep(a, weight: Q2Weight):
    """uint16 bf16 bits [M, K] of ``a`` (no copy), and whether ``a`` was 1-D."""
    if not isinstance(weight, Q2Weight):
        raise TypeError(f"weight: expected a Q2Weight, got {type(weight).__name__}")
    return as_bf16_rows(a, weight.k)


def _finish(bits: np.ndarray, squeeze: bool) -> np.ndarray:
    out = bits_to_bf16(bits)
    return out[0] if squeeze else out


def _weight_units(weight: Q2Weight, r0: int, r1: int, lanes: int, width: int):
    """``(cm1, d_unit)`` of weight rows r0..r1-1, padded and split by (step, lane).

    ``cm1`` [rows, steps, lanes, width] is ``code - 1`` as fp32 (0 past K);
    ``d_unit`` [rows, steps, lanes] the fp32 scale of each unit. Unit u of a
    row (codes u*width .. u*width+width-1) belongs to lane u % lanes at step
    u // lanes. Only these rows' bytes are decoded.
    """
    k, g = weight.k, weight.group
    rows = r1 - r0
    units = k // width
    steps = -(-units // lanes)
    pad = steps * lanes * width
    rb = row_bytes(k, g)
    raw = weight.raw[r0 * rb : r1 * rb]
    cm1 = np.zeros((rows, pad), np.float32)
    cm1[:, :k] = unpack_codes(raw, rows, k, g).astype(np.float32) - np.float32(1)
    d_unit = np.zeros((rows, steps * lanes), np.float32)
    d_unit[:, :units] = np.repeat(
        unpack_scales(raw, rows, k, g).astype(np.float32), g // width, axis=1
    )
    return cm1.reshape(rows, steps, lanes, width), d_unit.reshape(rows, steps, lanes)


def _lane_partials(a32: np.ndarray, cm1: np.ndarray, d_unit: np.ndarray, units: int):
    """Per-lane fp32 accumulators [M, rows, lanes] of activations ``a32`` [M, K].

    Each lane visits its units in increasing step: ``s`` over the unit's
    codes by fma, then ``acc = fadd_rn(acc, fmul_rn(s, d))``.
    """
    m, k = a32.shape
    rows, steps, lanes, width = cm1.shape
    ap = np.zeros((m, steps * lanes * width), np.float32)
    ap[:, :k] = a32
    ap = ap.reshape(m, steps, lanes, width)
    acc = np.zeros((m, rows, lanes), np.float32)
    for t in range(steps):
        valid = (t * lanes + np.arange(lanes)) < units  # lanes with a unit at this step
        s = np.zeros((m, rows, lanes), np.float32)
        for i in range(width):
            s = fma_f32(cm1[None, :, t, :, i], ap[:, None, t, :, i], s)
        new = fadd_rn(acc, fmul_rn(s, d_unit[None, :, t, :]))
        acc = np.where(valid, new, acc)
    return acc


def _rows(a, weight: Q2Weight, lanes: int, width: int, combine) -> np.ndarray:
    bits, squeeze = _prep(a, weight)
    m, k = bits.shape
    units = k // width
    out = np.empty((m, weight.n), np.uint16)  # each chunk is rounded to bf16 as it is done
    for r0 in range(0, weight.n, _ROW_CHUNK):
        r1 = min(weight.n, r0 + _ROW_CHUNK)
        cm1, d_unit = _weight_units(weight, r0, r1, lanes, width)
        per_row = max((r1 - r0) * lanes, cm1[0].size)  # a step's elements per activation row
        mstep = max(1, _CHUNK_ELEMS // per_row)
        for m0 in range(0, m, mstep):
            m1 = min(m, m0 + mstep)
            a32 = bf16_bits_to_f32(bits[m0:m1])
            out[m0:m1, r0:r1] = f32_to_bf16_bits(combine(_lane_partials(a32, cm1, d_unit, units)))
    return _finish(out, squeeze)


def q2_0_gemv(a: np.ndarray, weight: Q2Weight) -> np.ndarray:
    """Reference of the baseline kernel ``q2_0_gemv`` (2 warps per row).

    Thread t in 0..63 of a row (warp t // 32, lane t % 32) owns the 16-bit
    halves h = t, t+64, ... (8 codes each, codes 8h..8h+7) in increasing h;
    per half: ``s`` over its 8 codes, then ``acc = fadd_rn(acc, fmul_rn(s, d))``.
    Each warp reduces its 32 lanes by the butterfly; the row result is
    ``fadd_rn(warp0, warp1)``. ``a`` is bf16 [K] or [M, K] (each activation
    row is one M=1 launch); returns bf16 [N] or [M, N].

    Args:
        a: bf16 (``ml_dtypes.bfloat16``) [K] or [M, K] activations.
        weight: the :class:`~q2gemv.formats.q2_0.Q2Weight` [N, K] (either group).

    Returns:
        bf16 [N] for a 1-D ``a``, else [M, N].

    Raises:
        TypeError: ``weight`` is not a Q2Weight, or ``a`` is not bfloat16.
        ValueError: ``a`` is not 1-D/2-D or its K differs from ``weight.k``.
    """

    def combine(acc):  # [M, rows, 64]
        return fadd_rn(warp_tree_sum_f32(acc[..., :32]), warp_tree_sum_f32(acc[..., 32:]))

    return _rows(a, weight, 64, 8, combine)


def q2_0_gemv_vec(a: np.ndarray, weight: Q2Weight) -> np.ndarray:
    """Reference of ``q2_0_gemv_vec`` (candidate B: 1 warp per row).

    Lane l in 0..31 owns the 32-bit words w = l, l+32, ... (16 codes each,
    codes 16w..16w+15, always inside one block) in increasing w; per word:
    ``s`` over its 16 codes, then ``acc = fadd_rn(acc, fmul_rn(s, d))``; the
    row result is the butterfly over the 32 lanes. Shared-memory tiling of
    the activations does not change this order. ``a`` is bf16 [K] or [M, K];
    returns bf16 [N] or [M, N].

    Args (``a``, ``weight``), Returns, Raises: as for :func:`q2_0_gemv`.
    """
    return _rows(a, weight, 32, 16, warp_tree_sum_f32)


def q2_0_gemv_vec_batchm(a: np.ndarray, weight: Q2Weight) -> np.ndarray:
    """Reference of ``q2_0_gemv_vec_batchm``: row for row, exactly :func:`q2_0_gemv_vec`.

    The batched kernel keeps M independent accumulators over the same
    per-lane order and reduction, so every output row equals the M=1
    kernel's bit for bit (batch invariance); chunking M into launches of at
    most 8 rows is inert.

    Args (``a``, ``weight``), Returns, Raises: as for :func:`q2_0_gemv`.
    """
    return q2_0_gemv_vec(a, weight)


def q2_0_gemv_vec_rt4(a: np.ndarray, weight: Q2Weight) -> np.ndarray:
    """Reference of the register-tiled candidate ``q2_0_gemv_vec_rt4``: :func:`q2_0_gemv_vec`.

    Each warp computes 4 rows, but every row keeps candidate B's per-lane
    word order and butterfly, so the bits are those of ``q2_0_gemv_vec``.

    Args (``a``, ``weight``), Returns, Raises: as for :func:`q2_0_gemv`.
    """
    return q2_0_gemv_vec(a, weight)


def q2_0_gemv_vec_batchm_rt2(a: np.ndarray, weight: Q2Weight) -> np.ndarray:
    """Reference of ``q2_0_gemv_vec_batchm_rt2`` (2 rows per warp): :func:`q2_0_gemv_vec`.

    Each warp computes 2 rows for up to 8 activation rows, but every row
    keeps candidate B's per-lane word order and butterfly, so the bits are
    those of ``q2_0_gemv_vec`` for any M.

    Args (``a``, ``weight``), Returns, Raises: as for :func:`q2_0_gemv`.
    """
    return q2_0_gemv_vec(a, weight)

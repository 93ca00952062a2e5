"""The execution layout of a Q2_0 weight on the device: codes in IMMA fragment order.

The GGUF bytes (:mod:`q2gemv.formats.q2_0`) stay the storage and golden
format; this module is the one place that states the layout the exact
kernel (``q2_0_gemv_exact``) reads, made once at upload, and its inverse.

Rows are grouped in tiles of :data:`TILE_ROWS` = 16 (the m16 of
``mma.m16n8k32``); the last tile is padded with rows of code 0 and scale 0
(never stored by a kernel). A row's K codes are cut in units of :data:`UNIT`
= 64 codes, and a unit in 4 words of 16 codes (word ``t`` = codes
``16t .. 16t+15`` of the unit, the GGUF ``qs`` word as it is: byte ``b`` of
it holds codes ``16t+4b .. 16t+4b+3``, LSB first). Units go in pairs (a
*step*: 128 codes; the last step of an odd unit count is padded with code
0)::

    codes: uint32 [tiles, steps, 32 lanes, 4]
        lane l = 4g + t (g = l // 4, t = l % 4) of step p holds
        [ row g,   unit 2p,   word t | row g+8, unit 2p,   word t |
          row g,   unit 2p+1, word t | row g+8, unit 2p+1, word t ]

So one 16-byte load per lane brings the warp exactly the 16 x 128 codes of a
step, and ``(word >> 2j) & 0x03030303`` is an A fragment of
``mma.m16n8k32`` as it stands (rows g, g+8; k ``4t..4t+3`` and
``16+4t..``): the kernel's activation operand uses the same permutation of
k inside a unit.

Scales stay fp16 bits, one per (row, block), as their own array::

    scales: uint16 [tiles, blocks, 16 rows]

The two arrays together hold exactly the GGUF bytes (plus the padding):
:func:`from_exec_layout` rebuilds them bit for bit.
"""

from __future__ import annotations

import numpy as np

from ..dispatch.registry import Q2_EXACT_UNIT as UNIT  # codes per unit: 4 words of 16 codes
from . import q2_0 as fmt

TILE_ROWS = 16  # weight rows per tile: the m16 of mma.m16n8k32 (q2_0_gemv_exact's rows per CTA)
STEP_UNITS = 2  # units per 16-byte lane load (128 codes of 16 rows)
LANES = 32
WORDS_PER_LANE = 4


def tiles(n: int) -> int:
    """Row tiles of ``n`` rows (the last one padded)."""
    return -(-int(n) // TILE_ROWS)


def steps(k: int) -> int:
    """Steps (pairs of 64-code units) of a row of ``k`` codes (the last one padded if odd)."""
    return -(-int(k) // (UNIT * STEP_UNITS))


def code_words(n: int, k: int) -> int:
    """uint32 words of the codes array: 128 (32 lanes x 4) per tile and step."""
    return tiles(n) * steps(k) * LANES * WORDS_PER_LANE


def scale_halves(n: int, k: int, group: int) -> int:
    """uint16 entries of the scales array: 16 per tile and block."""
    return tiles(n) * (int(k) // fmt.check_group(group)) * TILE_ROWS


def _words(raw: np.ndarray, n: int, k: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF bytes -> (codes uint32 [n, K/16] in row order, scale bits uint16 [n, K/group])."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    blocks = fmt._blocks(raw, n, k, group)
    qs = np.ascontiguousarray(blocks[:, :, fmt.SCALE_BYTES :]).view("<u4").reshape(n, k // 16)
    return qs, fmt.unpack_scales(raw, n, k, group).view(np.uint16)


def to_exec_layout(raw, n: int, k: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """GGUF ``block_q2_0`` bytes of an [n, k] weight -> ``(codes, scales)`` (the layout above).

    Returns new, C-contiguous arrays: ``codes`` uint32 [:func:`code_words`],
    ``scales`` uint16 [:func:`scale_halves`].
    """
    group = fmt.check_group(group)
    n, k = int(n), int(k)
    fmt._check_nk(n, k, group)
    qs, d = _words(raw, n, k, group)
    nt, ns, nb = tiles(n), steps(k), k // group
    w = np.zeros((nt * TILE_ROWS, ns * STEP_UNITS, 4), np.uint32)  # row, unit, word t
    w[:n, : k // UNIT] = qs.reshape(n, k // UNIT, 4)
    # [tile, half (g / g+8), g, step, unit in step, t] -> [tile, step, g, t, unit, half]
    w = w.reshape(nt, 2, 8, ns, STEP_UNITS, 4).transpose(0, 3, 2, 5, 4, 1)
    s = np.zeros((nt * TILE_ROWS, nb), np.uint16)
    s[:n] = d
    s = s.reshape(nt, TILE_ROWS, nb).transpose(0, 2, 1)
    return np.ascontiguousarray(w).reshape(-1), np.ascontiguousarray(s).reshape(-1)


def from_exec_layout(codes, scales, n: int, k: int, group: int) -> np.ndarray:
    """The inverse of :func:`to_exec_layout`: the GGUF bytes (uint8 [n * row_bytes]), bit for bit."""
    group = fmt.check_group(group)
    n, k = int(n), int(k)
    fmt._check_nk(n, k, group)
    nt, ns, nb = tiles(n), steps(k), k // group
    codes = np.asarray(codes, np.uint32)
    scales = np.asarray(scales, np.uint16)
    if codes.size != code_words(n, k):
        raise ValueError(f"codes: expected {code_words(n, k)} uint32 words, got {codes.size}")
    if scales.size != scale_halves(n, k, group):
        raise ValueError(
            f"scales: expected {scale_halves(n, k, group)} uint16 entries, got {scales.size}"
        )
    w = codes.reshape(nt, ns, 8, 4, STEP_UNITS, 2).transpose(0, 5, 2, 1, 4, 3)
    qs = w.reshape(nt * TILE_ROWS, ns * STEP_UNITS * 4)[:n, : k // 16]
    d = scales.reshape(nt, nb, TILE_ROWS).transpose(0, 2, 1).reshape(nt * TILE_ROWS, nb)[:n]
    out = np.empty((n, nb, fmt.block_bytes(group)), np.uint8)
    out[:, :, : fmt.SCALE_BYTES] = np.ascontiguousarray(d).view(np.uint8).reshape(n, nb, 2)
    out[:, :, fmt.SCALE_BYTES :] = (
        np.ascontiguousarray(qs).view(np.uint8).reshape(n, nb, group // 4)
    )
    return out.reshape(-1)


# -- one-word accumulators -------------------------------------------------------------
# A block's exact sum S = sum_k (code_k - 1) * A_k has |S| < 2**31 (at most 128 codes, |code - 1|
# <= 2, |A_k| < 2**23). Its scale d_b = mant_b * 2**(shift_b - 24) (scale_parts of the kernels).
# Against a tile's base shift b, m_b = +-mant_b * 2**(shift_b - b) is an integer, and if
# sum_b |m_b| < 2**32 along every row, every partial sum of S_b * m_b stays below 2**63: one
# int64 accumulator and one multiply-add a block hold the row's exact sum (in units of
# 2**(b - 24)), where the general accumulator rescales each term into two words.
NO_BASE = -1  # a tile whose rows need the general accumulator


def _scale_fields(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fp16 bits -> ``(mantissa, shift, finite)`` as the kernels' ``scale_parts`` reads them."""
    bits = bits.astype(np.int64)
    e = (bits >> 10) & 31
    f = bits & 1023
    mant = np.where(e > 0, f | 1024, f)
    return mant, np.maximum(e, 1) - 1, e != 31


def accumulator_bases(scales, n: int, k: int, group: int) -> np.ndarray:
    """Each row tile's base shift for one-word accumulators, or :data:`NO_BASE`.

    ``scales`` is the layout's scales array (uint16 [:func:`scale_halves`]). A tile's base
    is the smallest shift of its nonzero scales (0 if it has none); the tile takes it if
    every scale is finite and along each of its rows ``sum_b |m_b| < 2**32`` and
    ``|m_b| < 2**31`` (the bound above); otherwise :data:`NO_BASE`. Returns int32 [tiles].
    """
    group = fmt.check_group(group)
    nt, nb = tiles(n), int(k) // group
    s = np.asarray(scales, np.uint16)
    if s.size != scale_halves(n, k, group):
        raise ValueError(f"scales: expected {scale_halves(n, k, group)} entries, got {s.size}")
    mant, shift, finite = _scale_fields(s.reshape(nt, nb, TILE_ROWS))
    big = np.int64(99)  # above every shift (at most 29)
    base = np.where(mant > 0, shift, big).min(axis=(1, 2))
    base = np.where(base == big, 0, base)
    m = np.where(mant > 0, mant << np.maximum(shift - base[:, None, None], 0), 0)  # < 2**40
    ok = (
        finite.all(axis=(1, 2)) & (m.max(axis=(1, 2)) < 2**31) & (m.sum(axis=1).max(axis=1) < 2**32)
    )
    return np.where(ok, base, NO_BASE).astype(np.int32)

"""The execution layout of an NVFP4 weight on the device: codes in MMA fragment order.

The ``packed``/``scales`` pair (:mod:`q2gemv.formats.nvfp4`) stays the
storage and golden format; this module is the one place that states the
layout the exact kernel (``w4a16_gemv_exact``) reads, made once at upload,
and its inverse.

Rows are grouped in tiles of :data:`TILE_ROWS` = 16 (the m16 of
``mma.m16n8k16``); the last tile is padded with rows of code 0 and scale
byte 0 (never stored by a kernel). A row's K elements are cut in *steps* of
:data:`STEP` = 64 elements, :data:`BLOCKS_PER_STEP` = 4 blocks of 16 (one
E4M3 scale each); the last step is padded with code 0 and scale byte 0
when ``k % 64 != 0``. Lane ``l = 4g + t`` (``g = l // 4`` in 0..7,
``t = l % 4``) of a step owns rows ``g`` and ``g + 8`` of the tile and, in
block ``b``, the four elements ``16b + 4t .. 16b + 4t + 3``::

    codes: uint32 [tiles, steps, 32 lanes, 4 blocks b]
        bits  4i .. 4i+3     code of row 16 tile + g,     k = 64 step + 16b + 4t + i
        bits 16+4i .. 16+4i+3  code of row 16 tile + g + 8, the same k      (i = 0..3)

Each half is one aligned uint16 of ``packed`` as it is (two bytes, even
element in the low nibble). So one 16-byte load per lane brings the warp the
16 rows x 64 elements of a step, and the low / high halves of a word, once
decoded, are the A fragments a0 / a1 of ``mma.m16n8k16`` (rows g, g+8;
k ``4t .. 4t+3`` of block b): the kernel's activation operand uses the same
permutation of k inside a block.

The scales stay E4M3 bits, eight per lane and step (one uint64 load)::

    xscales: uint8 [tiles, steps, 8 g, 2 h, 4 b]
        E4M3 bits of row 16 tile + g + 8h, block 4 step + b

Both arrays together hold exactly ``packed`` and ``scales`` (plus the
padding): :func:`from_exec_layout` rebuilds them bit for bit. A third,
derived array is the row sums the exact kernel subtracts (its activation
limbs carry an offset of 2**23)::

    zsum: int64 [tiles * 16]
        zsum[row] = sum over blocks j of scale_units(scales[row, j])
                    * sum over k in block j of 2 * e2m1(code[row, k])

the row's sum of weights in units of 2**-10, without the global scale
(:func:`scale_units`; padding rows are 0), or :data:`ZSUM_NAN` for a row
with a NaN scale byte (0x7F / 0xFF): the kernel writes that row's outputs
NaN without scanning the scales itself (|zsum| < 2**44 otherwise).
"""

from __future__ import annotations

import numpy as np

from . import nvfp4 as fmt

TILE_ROWS = 16  # weight rows per tile: the m16 of mma.m16n8k16 (w4a16_gemv_exact's rows per tile)
STEP = 64  # elements of a row per step (one 16-byte load per lane)
BLOCKS_PER_STEP = STEP // fmt.BLOCK  # 4 E4M3 blocks of 16
LANES = 32
ZSUM_NAN = -(2**63)  # zsum of a row holding a NaN scale: every output of the row is NaN
QUADS_PER_BLOCK = fmt.BLOCK // 4  # 4 elements (one uint16 of packed) per lane and block

# sum of 2 * e2m1 of both codes of a packed byte
_PAIR_TWICE = (fmt.E2M1_TWICE[np.arange(256) & 0xF] + fmt.E2M1_TWICE[np.arange(256) >> 4]).astype(
    np.int16
)


def tiles(n: int) -> int:
    """Row tiles of ``n`` rows (the last one padded)."""
    return -(-int(n) // TILE_ROWS)


def steps(k: int) -> int:
    """Steps of 64 elements of a row of ``k`` elements (the last one padded if partial)."""
    return -(-int(k) // STEP)


def code_words(n: int, k: int) -> int:
    """uint32 words of the codes array: 128 (32 lanes x 4 blocks) per tile and step."""
    return tiles(n) * steps(k) * LANES * BLOCKS_PER_STEP


def scale_bytes(n: int, k: int) -> int:
    """uint8 entries of the xscales array: 64 (16 rows x 4 blocks) per tile and step."""
    return tiles(n) * steps(k) * TILE_ROWS * BLOCKS_PER_STEP


def zsum_entries(n: int) -> int:
    """int64 entries of the zsum array: one per (padded) row."""
    return tiles(n) * TILE_ROWS


def scale_units(s) -> np.ndarray:
    """E4M3-fn bits -> the scale in units of 2**-9, as int64 (0 for the NaN bytes 0x7F/0xFF).

    ``+-(mant << (max(e, 1) - 1))`` with ``e = (s >> 3) & 15`` and
    ``mant = (s & 7) | (8 if e > 0 else 0)``, negative when ``s & 0x80``:
    exact (|value| at most 448 * 2**9 = 14 << 14).
    """
    b = np.asarray(s, np.uint8).astype(np.int64)
    e = (b >> 3) & 15
    mant = np.where(e > 0, (b & 7) | 8, b & 7)
    v = mant << (np.maximum(e, 1) - 1)
    v = np.where(b & 0x80, -v, v)
    return np.where((b & 0x7F) == 0x7F, 0, v)


def _check_nk(n: int, k: int) -> tuple[int, int]:
    for name, v in (("n", n), ("k", k)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
        if v < 1:
            raise ValueError(f"{name}: expected >= 1, got {v}")
    if k % fmt.BLOCK:
        raise ValueError(f"k: expected a multiple of {fmt.BLOCK}, got {k}")
    return int(n), int(k)


def _host_u8(x, name: str, shape: tuple[int, int]) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise TypeError(f"{name}: expected dtype uint8, got {x.dtype}")
    if x.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {x.shape}")
    return np.ascontiguousarray(x)


def row_sums(packed, scales, n: int, k: int) -> np.ndarray:
    """``zsum`` (int64 [:func:`zsum_entries`]) of ``packed``/``scales`` (see the module docstring)."""
    n, k = _check_nk(n, k)
    packed = _host_u8(packed, "packed", (n, k // 2))
    scales = _host_u8(scales, "scales", (n, k // fmt.BLOCK))
    blocks = _PAIR_TWICE[packed].reshape(n, k // fmt.BLOCK, fmt.BLOCK // 2).sum(axis=2)
    z = np.zeros(zsum_entries(n), np.int64)
    z[:n] = (blocks.astype(np.int64) * scale_units(scales)).sum(axis=1)
    z[:n][((scales & 0x7F) == 0x7F).any(axis=1)] = ZSUM_NAN
    return z


def to_exec_layout(packed, scales, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``packed`` uint8 [n, k/2] and ``scales`` uint8 [n, k/16] -> ``(codes, xscales, zsum)``.

    Returns new, C-contiguous arrays laid out as the module docstring states:
    ``codes`` uint32 [:func:`code_words`], ``xscales`` uint8 [:func:`scale_bytes`],
    ``zsum`` int64 [:func:`zsum_entries`].
    """
    n, k = _check_nk(n, k)
    packed = _host_u8(packed, "packed", (n, k // 2))
    scales = _host_u8(scales, "scales", (n, k // fmt.BLOCK))
    nt, ns = tiles(n), steps(k)
    q = np.zeros((nt * TILE_ROWS, ns * STEP // 4), "<u2")  # row, quad of 4 elements
    q[:n, : k // 4] = packed.view("<u2")
    # [tile, h (g / g+8), g, step, b, t] -> [tile, step, g, t, b, h]: h = 0 the low half
    q = q.reshape(nt, 2, 8, ns, BLOCKS_PER_STEP, QUADS_PER_BLOCK).transpose(0, 3, 2, 5, 4, 1)
    s = np.zeros((nt * TILE_ROWS, ns * BLOCKS_PER_STEP), np.uint8)
    s[:n, : k // fmt.BLOCK] = scales
    # [tile, h, g, step, b] -> [tile, step, g, h, b]
    s = s.reshape(nt, 2, 8, ns, BLOCKS_PER_STEP).transpose(0, 3, 2, 1, 4)
    codes = np.ascontiguousarray(q).view("<u4").reshape(-1).astype(np.uint32, copy=False)
    return codes, np.ascontiguousarray(s).reshape(-1), row_sums(packed, scales, n, k)


def from_exec_layout(codes, xscales, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`to_exec_layout`: ``(packed uint8 [n, k/2], scales uint8 [n, k/16])``,
    bit for bit (``zsum`` is derived: not needed)."""
    n, k = _check_nk(n, k)
    nt, ns = tiles(n), steps(k)
    codes = np.asarray(codes)
    xscales = np.asarray(xscales)
    if codes.dtype != np.uint32:
        raise TypeError(f"codes: expected dtype uint32, got {codes.dtype}")
    if xscales.dtype != np.uint8:
        raise TypeError(f"xscales: expected dtype uint8, got {xscales.dtype}")
    if codes.size != code_words(n, k):
        raise ValueError(f"codes: expected {code_words(n, k)} uint32 words, got {codes.size}")
    if xscales.size != scale_bytes(n, k):
        raise ValueError(f"xscales: expected {scale_bytes(n, k)} uint8 bytes, got {xscales.size}")
    q = np.ascontiguousarray(codes, "<u4").view("<u2")
    q = q.reshape(nt, ns, 8, QUADS_PER_BLOCK, BLOCKS_PER_STEP, 2).transpose(0, 5, 2, 1, 4, 3)
    q = q.reshape(nt * TILE_ROWS, ns * STEP // 4)[:n, : k // 4]
    s = xscales.reshape(nt, ns, 8, 2, BLOCKS_PER_STEP).transpose(0, 3, 2, 1, 4)
    s = s.reshape(nt * TILE_ROWS, ns * BLOCKS_PER_STEP)[:n, : k // fmt.BLOCK]
    packed = np.ascontiguousarray(q).view(np.uint8).reshape(n, k // 2)
    return packed, np.ascontiguousarray(s)

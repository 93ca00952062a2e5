"""The NVFP4 execution layout on the device: packed codes and scales -> layout, and back, bit for bit.

The layout is stated in :mod:`q2gemv.formats.nvfp4_layout` (with the host
builder and inverse these kernels must equal). Used by
:class:`~q2gemv.cuda.nvfp4.weight.DeviceNvfp4Weight` when its codes are already
on the device (``from_buffers``, a hand-built weight) and to rebuild
``wp``/``scales`` for the seed contract's kernels from a weight uploaded
without them.

One thread per output element, plain integer code (the same on the GPU and
in the simulator): a layout word is two uint16 halves of the packed codes
(four elements each), read from and written to ``wp`` (uint32 [n, k/8]: two
halves a word); ``zsum`` takes one thread per padded row, looping over its
blocks (it runs once per weight).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, int64, uint8, uint32

from ...dispatch import plan
from ...formats import nvfp4_layout as lay
from ...formats.nvfp4 import BLOCK
from ..runtime.interop import visible_to_all_streams
from .scales import scale_entry

THREADS = 256
_BPS = lay.BLOCKS_PER_STEP
_QPB = lay.QUADS_PER_BLOCK
_E2M1_TWICE_NIBBLES = 0xC8643210  # 2 * e2m1 of magnitude code m in nibble m: 0 1 2 3 4 6 8 12


def _half(WP, row, q):  # noqa: N803
    """Elements ``4q .. 4q+3`` of ``row``: one uint16 of the packed codes, from ``wp``."""
    w = WP[row, q >> int64(1)]
    return (w >> uint32(16 * (q & int64(1)))) & uint32(0xFFFF)


def _quad_word(row, q, ns):
    """Element quad ``q`` of ``row`` -> the index of its layout word (its half: ``(row // 8) % 2``)."""
    tile = row // lay.TILE_ROWS
    g = row % 8
    step = q // (_BPS * _QPB)
    b = (q // _QPB) % _BPS
    t = q % _QPB
    return ((tile * ns + step) * lay.LANES + 4 * g + t) * _BPS + b


def _scale_index(row, j, ns):
    """Scale of ``row``, block ``j`` -> its index in ``xscales``."""
    tile = row // lay.TILE_ROWS
    g = row % 8
    h = (row // 8) % 2
    step = j // _BPS
    b = j % _BPS
    return ((tile * ns + step) * 8 + g) * 8 + h * _BPS + b


def _word_twice(w):
    """Sum of 2 * e2m1 of the eight codes of packed word ``w``."""
    acc = int64(0)
    for i in range(8):
        c = (w >> uint32(4 * i)) & uint32(0xF)
        v = int64((uint32(_E2M1_TWICE_NIBBLES) >> (uint32(4) * (c & uint32(7)))) & uint32(0xF))
        acc += -v if c & uint32(8) else v
    return acc


def _pack_body(WP, SC, CODES, XSCALES, ZSUM, N, K):  # noqa: N803
    """``WP`` (uint32 [n, k/8]) and ``SC`` (uint8 [n, k/16]) -> the layout's three arrays."""
    i = int64(cuda.grid(1))
    n, k = int64(N), int64(K)
    ns = (k + lay.STEP - 1) // lay.STEP
    if i < CODES.size:
        b = i % _BPS
        t = (i // _BPS) % 4
        g = (i // (_BPS * 4)) % 8
        step = (i // (_BPS * lay.LANES)) % ns
        tile = i // (_BPS * lay.LANES * ns)
        row = tile * lay.TILE_ROWS + g
        q = step * (_BPS * _QPB) + b * _QPB + t
        w = uint32(0)
        if q < k // 4:
            if row < n:
                w = _half(WP, row, q)
            if row + 8 < n:
                w |= _half(WP, row + 8, q) << uint32(16)
        CODES[i] = w
    if i < XSCALES.size:
        b = i % _BPS
        h = (i // _BPS) % 2
        g = (i // (_BPS * 2)) % 8
        step = (i // (_BPS * 16)) % ns
        tile = i // (_BPS * 16 * ns)
        row = tile * lay.TILE_ROWS + g + 8 * h
        j = step * _BPS + b
        XSCALES[i] = SC[row, j] if row < n and j < k // BLOCK else uint8(0)
    if i < ZSUM.size:
        z = int64(0)
        nan = False
        if i < n:
            for j in range(k // BLOCK):
                sb = SC[i, j]
                nan = nan or (sb & uint8(0x7F)) == uint8(0x7F)
                s = int64(scale_entry(sb, 0))
                z += s * (_word_twice(WP[i, 2 * j]) + _word_twice(WP[i, 2 * j + 1]))
        ZSUM[i] = int64(lay.ZSUM_NAN) if nan else z


def _unpack_body(CODES, XSCALES, WP, SC, N, K):  # noqa: N803
    """The inverse: every word of ``WP`` and byte of ``SC`` from the layout (padding never read)."""
    i = int64(cuda.grid(1))
    n, k = int64(N), int64(K)
    ns = (k + lay.STEP - 1) // lay.STEP
    if i < n * (k // 8):
        row = i // (k // 8)
        col = i % (k // 8)
        shift = uint32(16 * ((row // 8) % 2))
        lo = (CODES[_quad_word(row, 2 * col, ns)] >> shift) & uint32(0xFFFF)
        hi = (CODES[_quad_word(row, 2 * col + 1, ns)] >> shift) & uint32(0xFFFF)
        WP[row, col] = lo | (hi << uint32(16))
    if i < n * (k // BLOCK):
        row = i // (k // BLOCK)
        j = i % (k // BLOCK)
        SC[row, j] = XSCALES[_scale_index(row, j, ns)]


_device = cuda.jit(device=True, inline="always")
_half = _device(_half)
_quad_word = _device(_quad_word)
_scale_index = _device(_scale_index)
_word_twice = _device(_word_twice)
PACK_SIGNATURE = (
    "void(uint32[:, ::1], uint8[:, ::1], uint32[::1], uint8[::1], int64[::1], int32, int32)"
)
UNPACK_SIGNATURE = "void(uint32[::1], uint8[::1], uint32[:, ::1], uint8[:, ::1], int32, int32)"


@functools.cache
def _pack_kernel():
    return cuda.jit(PACK_SIGNATURE)(_pack_body)


@functools.cache
def _unpack_kernel():
    return cuda.jit(UNPACK_SIGNATURE)(_unpack_body)


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of both kernels, for the PTX tests."""
    return [
        ("w4a16_layout_pack", _pack_body, PACK_SIGNATURE),
        ("w4a16_layout_unpack", _unpack_body, UNPACK_SIGNATURE),
    ]


def _blocks(total: int) -> int:
    return max(1, plan.div_ceil(total, THREADS))


def pack(wp, scales, n: int, k: int, stream=0) -> tuple:
    """Device ``wp`` (uint32 [n, k/8]) and ``scales`` (uint8 [n, k/16]) -> new device
    ``(codes, xscales, zsum)``.

    Returns once the layout is written, visible to every stream
    (:func:`~q2gemv.cuda.runtime.interop.visible_to_all_streams`): a weight is made
    once, and later calls may come on other streams.
    """
    codes = cuda.device_array(lay.code_words(n, k), np.uint32, stream=stream)
    xscales = cuda.device_array(lay.scale_bytes(n, k), np.uint8, stream=stream)
    zsum = cuda.device_array(lay.zsum_entries(n), np.int64, stream=stream)
    total = max(codes.size, xscales.size, zsum.size)
    _pack_kernel()[_blocks(total), THREADS, stream](wp, scales, codes, xscales, zsum, n, k)
    visible_to_all_streams(stream)
    return codes, xscales, zsum


def unpack(codes, xscales, n: int, k: int, stream=0) -> tuple:
    """Device ``(codes, xscales)`` -> new device ``(wp uint32 [n, k/8], scales uint8 [n, k/16])``.

    Returns once they are written, as :func:`pack`.
    """
    wp = cuda.device_array((n, k // 8), np.uint32, stream=stream)
    scales = cuda.device_array((n, k // BLOCK), np.uint8, stream=stream)
    _unpack_kernel()[_blocks(n * (k // 8)), THREADS, stream](codes, xscales, wp, scales, n, k)
    visible_to_all_streams(stream)
    return wp, scales

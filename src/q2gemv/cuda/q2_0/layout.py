"""The Q2_0 execution layout on the device: GGUF bytes -> layout, and back, bit for bit.

The layout is stated in :mod:`q2gemv.formats.q2_0_layout` (with the host
builder and inverse these kernels must equal). Used by
:class:`~q2gemv.cuda.q2_0.weight.DeviceQ2Weight` when its bytes are already on the
device (``from_buffers``, a hand-built weight) and to rebuild the GGUF bytes
for the seed contract's kernels from a weight uploaded without them.

One thread per output element, plain integer code (the same on the GPU and
in the simulator); the GGUF bytes are read and written as 16-bit halves
(a block's ``qs`` is only 2-byte aligned).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda, int64, uint16, uint32

from ...dispatch import plan
from ...formats import q2_0 as fmt
from ...formats import q2_0_layout as lay
from ..runtime.interop import visible_to_all_streams

THREADS = 256
_WPL = lay.WORDS_PER_LANE


def _code_source(i, n, k, group):
    """Layout word ``i`` -> the index of its first GGUF half, or -1 for padding."""
    ns = (k // lay.UNIT + 1) // 2
    half = i % 2
    unit_in_step = (i // 2) % 2
    t = (i // _WPL) % 4
    g = (i // (_WPL * 4)) % 8
    step = (i // (_WPL * lay.LANES)) % ns
    tile = i // (_WPL * lay.LANES * ns)
    row = tile * lay.TILE_ROWS + half * 8 + g
    unit = step * lay.STEP_UNITS + unit_in_step
    if row >= n or unit >= k // lay.UNIT:
        return int64(-1)
    code0 = unit * lay.UNIT + 16 * t  # first code of the word in the row
    bb = 2 + group // 4  # block bytes
    byte = row * (k // group) * bb + (code0 // group) * bb + 2 + (code0 % group) // 4
    return int64(byte // 2)


def _scale_source(i, n, k, group):
    """Layout scale ``i`` -> the index of its GGUF half (the block's d), or -1 for padding."""
    nb = k // group
    r = i % lay.TILE_ROWS
    b = (i // lay.TILE_ROWS) % nb
    tile = i // (lay.TILE_ROWS * nb)
    row = tile * lay.TILE_ROWS + r
    if row >= n:
        return int64(-1)
    return int64((row * nb + b) * ((2 + group // 4) // 2))


def _pack_body(B16, CODES, SCALES, N, K, G):  # noqa: N803
    """GGUF halves ``B16`` -> ``CODES`` (uint32) and ``SCALES`` (uint16) of the layout."""
    i = int64(cuda.grid(1))
    n, k, group = int64(N), int64(K), int64(G)
    if i < CODES.size:
        src = _code_source(i, n, k, group)
        w = uint32(0)
        if src >= 0:
            w = uint32(B16[src]) | (uint32(B16[src + 1]) << uint32(16))
        CODES[i] = w
    if i < SCALES.size:
        src = _scale_source(i, n, k, group)
        SCALES[i] = B16[src] if src >= 0 else uint16(0)


def _unpack_body(CODES, SCALES, B16, N, K, G):  # noqa: N803
    """The inverse: every GGUF half of ``B16`` from the layout (padding is never read)."""
    i = int64(cuda.grid(1))
    n, k, group = int64(N), int64(K), int64(G)
    if i < CODES.size:
        src = _code_source(i, n, k, group)
        if src >= 0:
            w = CODES[i]
            B16[src] = uint16(w & uint32(0xFFFF))
            B16[src + 1] = uint16(w >> uint32(16))
    if i < SCALES.size:
        src = _scale_source(i, n, k, group)
        if src >= 0:
            B16[src] = SCALES[i]


_device = cuda.jit(device=True, inline="always")
_code_source = _device(_code_source)
_scale_source = _device(_scale_source)
PACK_SIGNATURE = "void(uint16[::1], uint32[::1], uint16[::1], int32, int32, int32)"
UNPACK_SIGNATURE = "void(uint32[::1], uint16[::1], uint16[::1], int32, int32, int32)"


@functools.cache
def _pack_kernel():
    return cuda.jit(PACK_SIGNATURE)(_pack_body)


@functools.cache
def _unpack_kernel():
    return cuda.jit(UNPACK_SIGNATURE)(_unpack_body)


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of both kernels, for the PTX tests."""
    return [
        ("q2_0_layout_pack", _pack_body, PACK_SIGNATURE),
        ("q2_0_layout_unpack", _unpack_body, UNPACK_SIGNATURE),
    ]


def _grid(n: int, k: int, group: int) -> int:
    total = max(lay.code_words(n, k), lay.scale_halves(n, k, group))
    return max(1, plan.div_ceil(total, THREADS))


def pack(b16, n: int, k: int, group: int, stream=0) -> tuple:
    """Device GGUF halves (uint16 [n * row_bytes / 2]) -> new device ``(codes, scales)``.

    Returns once the layout is written, visible to every stream
    (:func:`~q2gemv.cuda.runtime.interop.visible_to_all_streams`): a weight is made
    once, and later calls may come on other streams.
    """
    codes = cuda.device_array(lay.code_words(n, k), np.uint32, stream=stream)
    scales = cuda.device_array(lay.scale_halves(n, k, group), np.uint16, stream=stream)
    _pack_kernel()[_grid(n, k, group), THREADS, stream](b16, codes, scales, n, k, group)
    visible_to_all_streams(stream)
    return codes, scales


def unpack(codes, scales, n: int, k: int, group: int, stream=0):
    """Device ``(codes, scales)`` -> new device GGUF halves (uint16 [n * row_bytes / 2]).

    Returns once they are written, as :func:`pack`.
    """
    b16 = cuda.device_array(n * fmt.row_bytes(k, group) // 2, np.uint16, stream=stream)
    _unpack_kernel()[_grid(n, k, group), THREADS, stream](codes, scales, b16, n, k, group)
    visible_to_all_streams(stream)
    return b16

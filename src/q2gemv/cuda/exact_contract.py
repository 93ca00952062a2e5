"""The exact contract's shared device code: what every exact kernel computes the same way.

The contract (:mod:`q2gemv.reference.exact`, ``docs/numerics.md``): each
activation row m has an exponent ``E_m`` (the largest of its bf16
exponents, or :data:`SPECIAL_ROW` for a row holding NaN or Inf); each
activation becomes the integer ``A_k = round_half_even(a_k * 2**(FRAC_BITS -
E_m))``; the exact integer sum is rounded once to bf16. Every family's
exact module (:mod:`q2gemv.cuda.q2_0.exact`, :mod:`q2gemv.cuda.nvfp4.exact`)
prepares its activations with :func:`row_exponent` and :func:`fixed_point_one`
and ends with :func:`round_fixed_bf16`; a new exact kernel imports them from
here (plain integer code: identical on the GPU and in the simulator).
"""

from __future__ import annotations

from numba import cuda, int32, int64, uint32, uint64

from .runtime.dev import bitlen64, ld_bf16x8, shfl_xor

OFFSET = 1 << 23  # A_k + OFFSET is stored as unsigned byte limbs (in [0, 2**24))
FRAC_BITS = 22  # A_k = a_k * 2**(FRAC_BITS - E_m), rounded half to even
SPECIAL_ROW = -(1 << 30)  # E_m of a row that holds NaN or Inf
BF16_NAN = 0x7FC0
BF16_INF = 0x7F80

_device = cuda.jit(device=True, inline="always")


@_device
def fixed_point_one(h, E):  # noqa: N803
    """``A = round_half_even(a * 2**(22 - E))`` of the bf16 bits ``h`` (int64)."""
    h = uint32(h)
    e = int64((h >> uint32(7)) & uint32(0xFF))
    f = int64(h & uint32(0x7F))
    mant = f | int64(128) if e > 0 else f
    s = max(e, int64(1)) - int64(112) - int64(E)
    if s >= 0:
        a = mant << s
    elif s <= -10:  # mant < 2**8 <= half of 2**10: rounds to 0
        a = int64(0)
    else:
        r = -s
        q = mant >> r
        rem = mant - (q << r)
        half = int64(1) << (r - int64(1))
        if rem > half or (rem == half and (q & int64(1)) == 1):
            q += int64(1)
        a = q
    if (h & uint32(0x8000)) != 0:
        a = -a
    return a


@_device
def round_fixed_bf16(hi32, lo, p):
    """bf16 bits nearest to ``(hi32 * 2**32 + lo) * 2**p``, ties to even (the contract's step 4).

    ``hi32`` int64, ``lo`` uint64 below 2**62; the same rule as
    :func:`q2gemv.reference.exact.bf16_nearest`: +0 for zero, sign kept when
    rounding to zero, +-Inf past the largest bf16.
    """
    t = int64(hi32) + int64(lo >> uint64(32))
    hi = t >> int64(32)  # the value as a 128-bit two's complement (hi, lo)
    lo = (uint64(t & int64(0xFFFFFFFF)) << uint64(32)) | (lo & uint64(0xFFFFFFFF))
    neg = hi < 0
    if neg:
        if lo == 0:
            hi = -hi
        else:
            lo = ~lo + uint64(1)
            hi = ~hi
    uh = uint64(hi)
    if uh == 0 and lo == 0:
        return uint32(0)
    p = int64(p)
    if uh != 0:  # keep the top 64 bits; the rest only as a sticky bit far below the round bit
        nb = bitlen64(uh)
        top = (uh << uint64(64 - nb)) | (lo >> uint64(nb))
        if (lo << uint64(64 - nb)) != 0:
            top |= uint64(1)
        p += nb
    else:
        top = lo
    q = max(bitlen64(top) - int64(1) + p - int64(7), int64(-133))
    r = q - p
    if r <= 0:
        mant = top << uint64(-r)
    elif r > 64:
        mant = uint64(0)
    elif r == 64:
        mant = uint64(1) if top > uint64(0x8000000000000000) else uint64(0)
    else:
        mant = top >> uint64(r)
        rem = top & ((uint64(1) << uint64(r)) - uint64(1))
        half = uint64(1) << uint64(r - 1)
        if rem > half or (rem == half and (mant & uint64(1)) != 0):
            mant += uint64(1)
    bits = min(((q + int64(133)) << int64(7)) + int64(mant), int64(BF16_INF))
    if neg:
        bits |= int64(0x8000)
    return uint32(bits)


@_device
def _bf16_lg(h):
    """``floor(log2 |a|)`` of bf16 bits ``h`` (nonzero, finite), subnormals by their value."""
    e = int64((h >> uint32(7)) & uint32(0xFF))
    return e - int64(127) if e > 0 else bitlen64(uint64(h & uint32(0x7F))) - int64(134)


WIDE_MAX_TILES = 2 * 132  # 16-row tiles up to which a grid leaves an H200 (132 SMs) half empty


def wide_warps(tiles: int, steps: int, wide: int, rows: int, max_rows: int) -> bool:
    """Should an exact GEMV launch of ``tiles`` CTAs (16 weight rows each), ``steps`` K steps a
    row and ``rows`` activation rows take ``wide`` warps a CTA instead of the usual 8? Yes when
    the grid is too small to fill the GPU (at most :data:`WIDE_MAX_TILES`), K has two steps or
    more for each of the ``wide`` warps, and the launch has at most ``max_rows`` rows (the
    family's: with more, the larger per-warp register set of the wide build costs more than
    the warps gain). Any choice gives the same bits (the warps' sums are exact integers)."""
    return tiles <= WIDE_MAX_TILES and steps >= 2 * wide and rows <= max_rows


def tile_counts(tiles_for, max_rows: int) -> tuple[int, ...]:
    """The distinct B tile counts ``tiles_for(m)`` of launches of 1..``max_rows`` rows: the
    builds of a family's exact GEMV that a launch of at most that many rows can take."""
    return tuple(sorted({tiles_for(m) for m in range(1, max_rows + 1)}))


ROW_LOADS = 4  # 16-byte loads a thread has in flight while finding a row's maximum
_ROW_WORDS = 4 * ROW_LOADS  # their 32-bit words


@_device
def row_exponent(A, s_lg, K):  # noqa: N803
    """E_m of activation row ``blockIdx.x`` (or :data:`SPECIAL_ROW`), by the whole CTA.

    bf16 bits without the sign grow with the magnitude, so the largest of
    them gives ``max floor(log2 |a|)`` (and a NaN/Inf, exponent field 255,
    is the largest of all): thread ``tid`` takes the maximum of the 8-code
    vectors ``tid, tid + blockDim, ...``, :data:`ROW_LOADS` loads issued
    before any is used (an index past the row reads the row's last vector
    again: the maximum does not change, and no load waits on a branch), then
    warp butterflies and the warps' results in ``s_lg`` (a shared int32[32]).
    Every thread returns E.
    """
    m = cuda.blockIdx.x
    tid = int32(cuda.threadIdx.x)
    nth = int32(cuda.blockDim.x)
    nv = int32(K // 8)
    mx = int32(0)
    for v0 in range(tid, nv, ROW_LOADS * nth):
        hs = cuda.local.array(_ROW_WORDS, uint32)
        for u in range(ROW_LOADS):
            v = min(int32(v0 + u * nth), nv - int32(1))
            hs[4 * u], hs[4 * u + 1], hs[4 * u + 2], hs[4 * u + 3] = ld_bf16x8(A, m, v * 8)
        for i in range(_ROW_WORDS):
            x = hs[i]
            mx = max(mx, max(int32(x & uint32(0x7FFF)), int32((x >> uint32(16)) & uint32(0x7FFF))))
    for off in (16, 8, 4, 2, 1):
        mx = max(mx, int32(shfl_xor(mx, off)))
    if tid % 32 == 0:
        s_lg[tid // 32] = mx
    cuda.syncthreads()
    for i in range((nth + 31) // 32):
        mx = max(mx, s_lg[i])
    if mx >= 0x7F80:
        return int32(SPECIAL_ROW)
    return int32(0) if mx == 0 else int32(_bf16_lg(uint32(mx)))


__all__ = [
    "OFFSET",
    "FRAC_BITS",
    "SPECIAL_ROW",
    "BF16_NAN",
    "BF16_INF",
    "fixed_point_one",
    "round_fixed_bf16",
    "row_exponent",
    "tile_counts",
    "wide_warps",
]

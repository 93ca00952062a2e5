"""The exact contract's shared device code: what every exact kernel computes the same way.

The contract (:mod:`q2gemv.reference.exact`, ``docs/numerics.md``): each
activation row m has an exponent ``E_m`` (the largest of its activations'
exponents, or :data:`SPECIAL_ROW` for a row holding NaN or Inf); each
activation becomes the integer ``A_k = round_half_even(a_k * 2**(FRAC_BITS -
E_m))``; the exact integer sum is rounded once to the activation format.

The activation format (bf16 or fp16, :class:`q2gemv.formats.act.ActFormat`) is a build
parameter: :func:`device_contract` returns the format's :class:`ExactDevice`
(``fixed_point_one``, ``row_exponent``, ``round_fixed``, its NaN and Inf bits), built once per
format from one source (the format's field widths are compile-time constants). Every family's
exact module (:mod:`q2gemv.cuda.q2_0.exact`, :mod:`q2gemv.cuda.nvfp4.exact`) takes the
format as a build argument, prepares its activations with ``row_exponent`` and
``fixed_point_one`` and ends with ``round_fixed``; a new exact kernel does the same (plain
integer code: identical on the GPU and in the simulator). The bf16 builds keep their
module-level names :func:`fixed_point_one`, :func:`row_exponent`, :func:`round_fixed_bf16`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from numba import cuda, int32, int64, uint32, uint64

from ..formats.act import BF16, ActFormat
from .runtime.dev import bitlen64, ld_bf16x8, shfl_xor

OFFSET = 1 << 23  # A_k + OFFSET is stored as unsigned byte limbs (in [0, 2**24))
FRAC_BITS = 22  # A_k = a_k * 2**(FRAC_BITS - E_m), rounded half to even
SPECIAL_ROW = -(1 << 30)  # E_m of a row that holds NaN or Inf
BF16_NAN = BF16.nan  # 0x7FC0
BF16_INF = BF16.inf  # 0x7F80

ROW_LOADS = 4  # 16-byte loads a thread has in flight while finding a row's maximum
_ROW_WORDS = 4 * ROW_LOADS  # their 32-bit words

_device = cuda.jit(device=True, inline="always")


@dataclass(frozen=True)
class ExactDevice:
    """The contract's device functions for one activation format (:func:`device_contract`).

    ``fixed_point_one(h, E)``, ``row_exponent(A, s_lg, K)``, ``round_fixed(hi32, lo, p)``
    (the format's bits, a uint32) and the format's ``nan`` / ``inf`` bits; ``act`` the format.
    """

    act: ActFormat
    fixed_point_one: object
    row_exponent: object
    round_fixed: object
    nan: int
    inf: int


@functools.cache
def device_contract(act: ActFormat = BF16) -> ExactDevice:
    """The exact contract's device functions for activation format ``act`` (bf16 or fp16), built
    once per format from one source: the format's field widths are compile-time constants."""
    MB = act.mant_bits  # noqa: N806
    EXP_MAX = act.exp_max  # noqa: N806
    MANT_MASK = (1 << MB) - 1  # noqa: N806
    IMPLICIT = 1 << MB  # noqa: N806 - the hidden bit of a normal
    BIAS = act.bias  # noqa: N806
    QMIN = act.min_quantum  # noqa: N806 - exponent of the subnormal step
    SUB_LG = QMIN - 1  # noqa: N806 - floor(log2 |a|) = bitlen(f) + SUB_LG for a subnormal
    SHIFT = QMIN - 1 + FRAC_BITS  # noqa: N806 - |a| * 2**(22 - E) = mant * 2**(max(e,1)+SHIFT-E)
    DROP = MB + 3  # noqa: N806 - dropped bits from which any mantissa rounds to 0
    INF = act.inf  # noqa: N806

    @_device
    def fixed_point_one(h, E):  # noqa: N803
        """``A = round_half_even(a * 2**(22 - E))`` of the activation bits ``h`` (int64)."""
        h = uint32(h)
        e = int64((h >> uint32(MB)) & uint32(EXP_MAX))
        f = int64(h & uint32(MANT_MASK))
        mant = f | int64(IMPLICIT) if e > 0 else f
        s = max(e, int64(1)) + int64(SHIFT) - int64(E)
        if s >= 0:
            a = mant << s
        elif s <= -DROP:  # mant < 2**(MB + 1) <= half of 2**DROP: rounds to 0
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
    def round_fixed(hi32, lo, p):
        """The format's bits nearest to ``(hi32 * 2**32 + lo) * 2**p``, ties to even (step 4).

        ``hi32`` int64, ``lo`` uint64 below 2**62; the same rule as
        :func:`q2gemv.reference.exact.nearest_bits`: +0 for zero, sign kept when
        rounding to zero, +-Inf past the largest finite value.
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
        q = max(bitlen64(top) - int64(1) + p - int64(MB), int64(QMIN))
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
        bits = min(((q - int64(QMIN)) << int64(MB)) + int64(mant), int64(INF))
        if neg:
            bits |= int64(0x8000)
        return uint32(bits)

    @_device
    def act_lg(h):
        """``floor(log2 |a|)`` of bits ``h`` (nonzero, finite), subnormals by their value."""
        e = int64((h >> uint32(MB)) & uint32(EXP_MAX))
        return e - int64(BIAS) if e > 0 else bitlen64(uint64(h & uint32(MANT_MASK))) + int64(SUB_LG)

    @_device
    def row_exponent(A, s_lg, K):  # noqa: N803
        """E_m of activation row ``blockIdx.x`` (or :data:`SPECIAL_ROW`), by the whole CTA.

        Bits without the sign grow with the magnitude, so the largest of
        them gives ``max floor(log2 |a|)`` (and a NaN/Inf, exponent field all ones,
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
                mx = max(
                    mx, max(int32(x & uint32(0x7FFF)), int32((x >> uint32(16)) & uint32(0x7FFF)))
                )
        for off in (16, 8, 4, 2, 1):
            mx = max(mx, int32(shfl_xor(mx, off)))
        if tid % 32 == 0:
            s_lg[tid // 32] = mx
        cuda.syncthreads()
        for i in range((nth + 31) // 32):
            mx = max(mx, s_lg[i])
        if mx >= INF:
            return int32(SPECIAL_ROW)
        return int32(0) if mx == 0 else int32(act_lg(uint32(mx)))

    return ExactDevice(act, fixed_point_one, row_exponent, round_fixed, act.nan, act.inf)


def act_suffix(act: ActFormat) -> str:
    """The suffix of a build's name (PTX specs) for activation format ``act``: none for bf16
    (the names as before fp16 existed), ``+fp16`` for fp16."""
    return "" if act == BF16 else f"+{act.name}"


NARROW_WARPS, WARPS, WIDE_WARPS = 4, 8, 16  # the CTA sizes of the exact GEMVs


def cta_warps(tiles: int, steps: int, m: int, knobs: dict) -> int:
    """Warps a CTA of an exact GEMV launch (either format) of ``m`` rows on a grid of ``tiles``
    row tiles (16 weight rows each) with ``steps`` K steps a row, by the family's ``knobs``
    measured on this GPU (its ``tuning.json``, :mod:`q2gemv.cuda.runtime.tuning`):

    * :data:`WIDE_WARPS` where K has at least 2 steps for each of them and the grid is small:
      at most ``wide_tiles`` row tiles at any M, or ``wide_tiles_few_rows`` at up to
      ``wide_max_m`` rows;
    * :data:`NARROW_WARPS` on a K of at most ``narrow_max_steps`` steps and a large grid: at
      least ``narrow_min_tiles[r]`` row tiles for the smallest key ``r >= m`` (the largest
      key past the last);
    * else :data:`WARPS`.

    Any choice gives the same bits (the warps' sums are exact integers)."""
    if steps >= 2 * WIDE_WARPS and (
        tiles <= knobs["wide_tiles"]
        or (m <= knobs["wide_max_m"] and tiles <= knobs["wide_tiles_few_rows"])
    ):
        return WIDE_WARPS
    if steps <= knobs["narrow_max_steps"]:
        table = sorted((int(r), t) for r, t in knobs["narrow_min_tiles"].items())
        least = next((t for r, t in table if r >= m), table[-1][1])
        if tiles >= least:
            return NARROW_WARPS
    return WARPS


def tile_counts(tiles_for, max_rows: int) -> tuple[int, ...]:
    """The distinct B tile counts ``tiles_for(m)`` of launches of 1..``max_rows`` rows: the
    builds of a family's exact GEMV that a launch of at most that many rows can take."""
    return tuple(sorted({tiles_for(m) for m in range(1, max_rows + 1)}))


# The bf16 builds under their historical names (every exact kernel of bf16 activations).
_BF16 = device_contract(BF16)
fixed_point_one = _BF16.fixed_point_one
round_fixed_bf16 = _BF16.round_fixed
row_exponent = _BF16.row_exponent


__all__ = [
    "OFFSET",
    "FRAC_BITS",
    "SPECIAL_ROW",
    "BF16_NAN",
    "BF16_INF",
    "ExactDevice",
    "act_suffix",
    "device_contract",
    "fixed_point_one",
    "round_fixed_bf16",
    "row_exponent",
    "cta_warps",
    "tile_counts",
]

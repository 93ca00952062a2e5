"""``w4a16_gemv_exact``: NVFP4 weights under the exact contract, on the int8 tensor cores.

The contract (a value, :mod:`q2gemv.reference.exact`) is the same as for
Q2_0: activations in the 22-bit fixed point of their row, weights as exact
values ``e2m1 * e4m3(s_b) * g``, one rounding. Here ``2 * e2m1`` is an int8
in [-12, 12], so a 16-element block's sum ``S = sum (2 e2m1) A_k`` is an
exact integer from the tensor cores, and ``S * mant(s_b) << exp(s_b)`` goes
into an exact 64-bit accumulator; ``g`` (``gm * 2**ge``, 24-bit ``gm``)
multiplies the exact total once, before the rounding.

Two kernels:

* ``w4a16_exact_prepare`` -- CTAs over (activation row, span of 2048
  elements) (rows padded to a multiple of 4 with zeros): E_m
  (:func:`q2gemv.cuda.exact_contract.row_exponent`) and three byte limbs with
  ``A_k = L0 + 2**8 L1 + 2**16 L2`` (L0, L1 unsigned, L2 signed), written in
  the order the GEMV's B fragments are read (:func:`limb_word`): for a step
  of 128 elements and block j of each half, the 16 lanes that hold B read
  128 consecutive bytes.
* ``w4a16_gemv_exact`` -- tiles of 16 weight rows (1 or 2 a CTA) of
  :data:`WARPS` warps; the warps split K in steps of 128 elements.
  Lane (g, t) (g = lane / 4, t = lane % 4) loads 16 bytes of rows g and g + 8
  (blocks 2t and 2t + 1 of the step; one exchange with lane t ^ 1 leaves it
  word ``t % 2`` of block ``4 (t // 2) + j``, j = 0..3). Each word is 8 codes
  = the lane's 8 k slots of one ``mma.m16n8k32`` (s8 x u8): the B matrix is
  block-diagonal, so columns 0-3 (activation rows 4q..4q+3 of group q) sum
  block j of the first half and columns 4-7 block 4 + j of the second half:
  every D entry is one block's sum, for its own scale. One IMMA per limb
  (s8 x u8 for L0, L1; s8 x s8 for L2): ``S = D0 + 2**8 D1 + 2**16 D2`` is
  ``sum_k (2 e2m1) A_k``, exact in 32 bits.

Codes to int8 without a branch: ``prmt`` looks up the 8 magnitudes (its
selector nibbles are the codes; a set sign bit selects 0 instead), once for
the codes and once with their sign bits flipped; ``(P + 0x80 - Q) ^ 0x80``
per byte is the signed value.

Up to :data:`MAX_M` activation rows per launch (built for 1, 2 or 4 groups of
4 rows); the launcher chunks more. K up to :data:`MAX_K` (a lane's 64-bit
accumulator then cannot overflow). Two load paths: ``fast`` (16-byte weight
loads, 4-byte scale loads: K a multiple of 128 and aligned buffers) and
``generic`` (any K a multiple of 16: word and byte loads with the tail
blocks predicated to zero).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda, int32, int64, uint16, uint32, uint64

from ... import kernels, launch
from ...formats.nvfp4 import BLOCK
from ..exact_contract import (
    BF16_NAN,
    FRAC_BITS,
    OFFSET,
    SPECIAL_ROW,
    fixed_point_one,
    round_fixed_bf16,
    row_exponent,
)
from ..runtime.dev import (
    grid_dep_launch,
    grid_dep_wait,
    ld_bf16x8,
    ld_u32x4,
    mma_s8s8,
    mma_s8u8,
    mul_wide,
    prmt,
    shfl_xor,
)

WARPS = 8
THREADS = 32 * WARPS
ROWS_PER_CTA = kernels.get("w4a16_gemv_exact").rows_per_cta  # 16: weight rows per CTA tile
STEP = 128  # elements of a row per warp step: 8 blocks, 64 bytes
MGROUP = 4  # activation rows per group (columns 0-3 and 4-7 of one IMMA)
MAX_M = kernels.W4_EXACT_MAX_M
MAX_K = 1 << 22  # per-lane accumulator bound: |S * scale| < 2**48.5, at most 2**14 terms
LIMBS = 3
SCALE_LSB = 10  # e4m3 = mant << shift * 2**-9, and the weight carries 2 e2m1 = 2 * e2m1
LUT_LO = 0x03020100  # 2 * e2m1 magnitudes of codes 0-3 ...
LUT_HI = 0x0C080604  # ... and 4-7: 0 1 2 3 4 6 8 12
SIGNS = 0x88888888
BIAS = 0x80808080

_device = cuda.jit(device=True, inline="always")


def padded_m(m: int) -> int:
    return -(-m // MGROUP) * MGROUP


def padded_k(k: int) -> int:
    return -(-k // STEP) * STEP


def limb_word(m: int, k: int, limb: int, mp: int) -> int:
    """Index (uint32 words) of the word holding limb ``limb`` of element (m, k), byte ``k % 4``.

    Layout, outermost first: step ``k // 128``, group ``m // 4``, block j =
    ``(k % 128 // 16) % 4``, limb, row ``m % 4``, half ``k % 128 // 64``,
    word pair ``k % 16 // 8``, then the 8 elements (two words). So one (step,
    group) is 1536 contiguous bytes with constant offsets inside, the 16
    lanes that read one (j, limb) read 128 consecutive bytes, and the lanes
    of one activation row read one 32-byte sector (M = 1 moves no padding).
    ``mp``: rows padded to 4.
    """
    st, r = divmod(k, STEP)
    blk, e16 = divmod(r, 16)
    h, j = divmod(blk, 4)
    u64 = (
        ((st * (mp // MGROUP) + m // MGROUP) * 4 + j) * LIMBS * 16
        + limb * 16
        + (m % MGROUP) * 4
        + h * 2
        + e16 // 8
    )
    return 2 * u64 + (e16 % 8) // 4


# -- prepare -------------------------------------------------------------------------------


def _prepare_body(A, P32, EROW, M, K, MP):  # noqa: N803
    """Padded activation row ``blockIdx.x``, span ``blockIdx.y``: the limbs in GEMV order.

    Every CTA of the row finds E_m (:func:`~q2gemv.cuda.exact_contract.row_exponent`,
    the whole row: cheap, and no second kernel); span y's threads then
    convert one group of 8 elements each, ``q = y * blockDim + tid``. Limbs
    0 and 1 are the unsigned bytes of ``A_k + 2**23``, limb 2 its top byte
    minus 128 as a signed byte, so that ``L0 + 2**8 L1 + 2**16 L2 = A_k``
    exactly (|A_k| <= 255 * 2**15 < 2**23). Rows ``>= M`` and elements
    ``>= K`` are written as zeros; span 0 writes ``EROW[m]``.
    """
    s_lg = cuda.shared.array(32, int32)
    grid_dep_launch()  # the GEMV may start now; it waits (grid_dep_wait) for this to finish
    m = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    real = m < M
    E = row_exponent(A, s_lg, K) if real else int32(0)  # noqa: N806
    if tid == 0 and cuda.blockIdx.y == 0:
        EROW[m] = E
    kp = (K + STEP - 1) // STEP * STEP
    q = cuda.blockIdx.y * cuda.blockDim.x + tid
    if q * 8 >= kp:
        return
    hv = cuda.local.array(4, uint32)
    limb = cuda.local.array(6, uint32)
    k = q * 8
    for i in range(6):
        limb[i] = uint32(0)
    if real and k < K:
        hv[0], hv[1], hv[2], hv[3] = ld_bf16x8(A, m, k)
        for c in range(8):
            h = (hv[c >> 1] >> uint32(16 * (c & 1))) & uint32(0xFFFF)
            a = int64(0) if E == SPECIAL_ROW else fixed_point_one(h, E)
            ap = uint32(a + int64(OFFSET)) ^ uint32(0x800000)  # top byte - 128, as s8
            for li in range(LIMBS):
                byte = (ap >> uint32(8 * li)) & uint32(0xFF)
                limb[2 * li + (c >> 2)] |= byte << uint32(8 * (c & 3))
    st = k // STEP
    blk = (k % STEP) // 16
    u64 = ((st * (MP // MGROUP) + m // MGROUP) * 4 + blk % 4) * LIMBS * 16
    u64 += (m % MGROUP) * 4 + (blk // 4) * 2 + (k % 16) // 8
    for li in range(LIMBS):
        w = 2 * (u64 + li * 16)
        P32[w] = limb[2 * li]
        P32[w + 1] = limb[2 * li + 1]


# -- the GEMV --------------------------------------------------------------------------------


@_device
def decode_codes(w, t_lo, t_hi):
    """8 E2M1 codes (a uint32, code i in bits 4i..4i+3) -> two registers of 4 int8 ``2 * e2m1``.

    ``lo`` holds codes 0-3, ``hi`` codes 4-7, byte i = code i of the half;
    ``t_lo``, ``t_hi``: :data:`LUT_LO`, :data:`LUT_HI` (registers).
    """
    w = uint32(w)
    x = w ^ uint32(SIGNS)
    p_lo = prmt(t_lo, t_hi, w)
    q_lo = prmt(t_lo, t_hi, x)
    p_hi = prmt(t_lo, t_hi, w >> uint32(16))
    q_hi = prmt(t_lo, t_hi, x >> uint32(16))
    lo = uint32(p_lo + uint32(BIAS) - q_lo) ^ uint32(BIAS)
    hi = uint32(p_hi + uint32(BIAS) - q_hi) ^ uint32(BIAS)
    return lo, hi


@_device
def scale_entry(b, gsign):
    """The scale table's entry of E4M3 bits ``b``: ``+-mant << (max(e, 1) - 1)`` (0 for NaN)."""
    b = int32(b)
    if (b & 0x7F) == 0x7F:
        return int32(0)  # NaN: flagged from the scale words, contributes nothing
    e = (b >> 3) & 15
    f = b & 7
    mant = f | 8 if e > 0 else f
    v = int32(mant << (max(e, 1) - 1))
    return -v if ((b >> 7) ^ gsign) != 0 else v


@_device
def has_nan_scale(sw):
    """Does any byte of ``sw`` (4 E4M3 scales) hold NaN (``0x7F`` / ``0xFF``)?

    ``x``: a NaN byte becomes 0, every other byte 1..0x7F; ``x + 0x7F`` per
    byte (no carries) sets each byte's top bit except where ``x`` was 0.
    """
    x = (uint32(sw) & uint32(0x7F7F7F7F)) ^ uint32(0x7F7F7F7F)
    return (~((x + uint32(0x7F7F7F7F)) | uint32(0x7F7F7F7F)) & uint32(0x80808080)) != 0


def _make_gemv_body(ng: int, fast: bool, rt: int = 1):
    """``w4a16_gemv_exact`` for ``ng`` groups of 4 activation rows; ``fast``: the 16-byte loads.

    ``rt`` tiles of 16 weight rows per CTA: warp w takes tile ``w % rt`` and
    the steps ``w // rt, w // rt + KS, ...`` (KS = WARPS / rt), so the rt
    warps of one K slice read the same activation operands at about the same
    time (L1 hits instead of rt reads from L2) -- worth it for many rows.
    """
    MM = MGROUP * ng  # noqa: N806
    KS = WARPS // rt  # noqa: N806 - warps splitting K per tile
    TROWS = ROWS_PER_CTA * rt  # noqa: N806
    RED = KS * 2 * TROWS * MM  # noqa: N806
    NACC = 4 * ng  # noqa: N806
    FLAGS = KS * 2 * TROWS  # noqa: N806
    GSTRIDE = 4 * LIMBS * 16  # noqa: N806 - uint64 words per (step, group)

    @cuda.jit(device=True, inline="always")
    def load_row(WP, SC, qw, qs, st, t, nb, wv, o):  # noqa: N803
        """Words of blocks 2t, 2t + 1 of step ``st`` in ``wv[o..o+3]``; returns the scale word.

        ``qw``, ``qs``: this lane's first weight word and scale (word or byte)
        of the step. The scale word holds the E4M3 bytes of blocks
        ``4 (t // 2) + j``, j = 0..3.
        """
        if fast:
            wv[o], wv[o + 1], wv[o + 2], wv[o + 3] = ld_u32x4(WP, qw)
            return uint32(SC[uint64(qs)])  # unsigned index: no wraparound code
        b0 = st * 8 + 2 * t
        for i in range(4):
            bb = b0 + (i >> 1)
            wv[o + i] = uint32(WP[uint64(qw + i)]) if bb < nb else uint32(0)
        sw = uint32(0)
        for j in range(4):
            if st * 8 + 4 * (t >> 1) + j < nb:
                sw |= uint32(SC[uint64(qs + j)]) << uint32(8 * j)
        return sw

    @cuda.jit(device=True, inline="always")
    def exchange(wv, o, odd, jw):
        """Word ``t % 2`` of blocks 0..3 of this lane's half (see the module docstring) into ``jw``."""
        x0 = uint32(shfl_xor(int32(wv[o] if odd else wv[o + 1]), 1))  # shuffles take int32
        x1 = uint32(shfl_xor(int32(wv[o + 2] if odd else wv[o + 3]), 1))
        jw[0] = x0 if odd else wv[o]
        jw[1] = x1 if odd else wv[o + 2]
        jw[2] = wv[o + 1] if odd else x0
        jw[3] = wv[o + 3] if odd else x1

    def body(P64, EROW, WP, SC, C, N, K, M, M0, MP, GM, GE, GSPECIAL, GSIGN):  # noqa: N803
        lut = cuda.shared.array(256, int32)
        red = cuda.shared.array(RED, int64)
        s_bad = cuda.shared.array(FLAGS, int32)
        acc = cuda.local.array(NACC, int64)
        wv = cuda.local.array(8, uint32)
        nx = cuda.local.array(8, uint32)
        jg = cuda.local.array(4, uint32)
        j8 = cuda.local.array(4, uint32)
        bq = cuda.local.array(6, uint32)
        tid = cuda.threadIdx.x
        lut[tid] = scale_entry(tid, GSIGN)  # THREADS == 256 entries
        # the prmt tables in registers: blockIdx.y is 0 (a 1-D grid) but not a compile-time
        # constant, so the compiler keeps them instead of rematerialising both at every prmt
        y = uint32(cuda.blockIdx.y)
        t_lo = uint32(LUT_LO) | y
        t_hi = uint32(LUT_HI) | y
        warp = tid >> 5
        ks = warp // rt
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        odd = (t & 1) != 0
        half = t >> 1
        row0 = cuda.blockIdx.x * TROWS + (warp % rt) * ROWS_PER_CTA  # this warp's tile
        rg = min(row0 + g, N - 1)  # rows past N read row N-1 and are never stored
        r8 = min(row0 + g + 8, N - 1)
        nb = K // BLOCK
        nsteps = (K + STEP - 1) // STEP
        # running indices (64-bit: constant offsets from one index share one address)
        if fast:
            sg_ = int64(rg) * (K // 64) + ks * 2 + half
            s8_ = int64(r8) * (K // 64) + ks * 2 + half
            ds = KS * 2
        else:
            sg_ = int64(rg) * nb + ks * 8 + 4 * half
            s8_ = int64(r8) * nb + ks * 8 + 4 * half
            ds = KS * 8
        qg = int64(rg) * (K // 8) + ks * 16 + 4 * t
        q8 = int64(r8) * (K // 8) + ks * 16 + 4 * t
        dq = KS * 16
        # this lane's B column: activation row 4 * grp + (g % 4); its k slots hold data
        # only for the column's own half (block-diagonal B), and only for rows < M
        live = 0
        for grp in range(ng):
            if (g >> 2) == half and grp * MGROUP + (g & 3) < M:
                live |= 1 << grp
        pb = int64(ks * (MP // MGROUP) + M0 // MGROUP) * GSTRIDE + (g & 3) * 4
        pb += half * 2 + (t & 1)
        dpb = int64(KS * (MP // MGROUP)) * GSTRIDE
        for i in range(NACC):
            acc[i] = int64(0)
        bad_g = False
        bad_8 = False
        cuda.syncthreads()  # the scale table
        st = ks
        if st < nsteps:
            nsg = load_row(WP, SC, qg, sg_, st, t, nb, nx, 0)
            ns8 = load_row(WP, SC, q8, s8_, st, t, nb, nx, 4)
        grid_dep_wait()  # the prepared operands are read from here on (PDL: see the prepare)
        while st < nsteps:
            for i in range(8):
                wv[i] = nx[i]
            swg = nsg
            sw8 = ns8
            qg += dq
            q8 += dq
            sg_ += ds
            s8_ += ds
            if st + KS < nsteps:  # the next step's loads fly while this one computes
                nsg = load_row(WP, SC, qg, sg_, st + KS, t, nb, nx, 0)
                ns8 = load_row(WP, SC, q8, s8_, st + KS, t, nb, nx, 4)
            bad_g = bad_g or has_nan_scale(swg)
            bad_8 = bad_8 or has_nan_scale(sw8)
            exchange(wv, 0, odd, jg)
            exchange(wv, 4, odd, j8)
            for j in range(4):
                lo_g, hi_g = decode_codes(jg[j], t_lo, t_hi)
                lo_8, hi_8 = decode_codes(j8[j], t_lo, t_hi)
                sc_g = lut[(swg >> uint32(8 * j)) & uint32(0xFF)]  # 0 for NaN (flagged above)
                sc_8 = lut[(sw8 >> uint32(8 * j)) & uint32(0xFF)]
                for grp in range(ng):
                    for li in range(LIMBS):
                        if (live >> grp) & 1:
                            v = P64[uint64(pb + grp * GSTRIDE + j * LIMBS * 16 + li * 16)]
                            bq[2 * li] = uint32(v & uint64(0xFFFFFFFF))
                            bq[2 * li + 1] = uint32(v >> uint64(32))
                        else:
                            bq[2 * li] = uint32(0)
                            bq[2 * li + 1] = uint32(0)
                    d00, d01, d02, d03 = mma_s8u8(lo_g, lo_8, hi_g, hi_8, bq[0], bq[1], 0, 0, 0, 0)
                    d10, d11, d12, d13 = mma_s8u8(lo_g, lo_8, hi_g, hi_8, bq[2], bq[3], 0, 0, 0, 0)
                    d20, d21, d22, d23 = mma_s8s8(lo_g, lo_8, hi_g, hi_8, bq[4], bq[5], 0, 0, 0, 0)
                    # the block's sum_k (2 e2m1) A_k, exact: |S| <= 16 * 12 * 255 * 2**15 < 2**31
                    s0 = int32(d00 + (d10 << 8) + (d20 << 16))
                    s1 = int32(d01 + (d11 << 8) + (d21 << 16))
                    s2 = int32(d02 + (d12 << 8) + (d22 << 16))
                    s3 = int32(d03 + (d13 << 8) + (d23 << 16))
                    acc[4 * grp] += mul_wide(s0, sc_g)
                    acc[4 * grp + 1] += mul_wide(s1, sc_g)
                    acc[4 * grp + 2] += mul_wide(s2, sc_8)
                    acc[4 * grp + 3] += mul_wide(s3, sc_8)
            st += KS
            pb += dpb
        # partial sums -> shared memory (per K slice and half) -> one rounding per output
        tr = (warp % rt) * ROWS_PER_CTA + g  # this lane's first row within the CTA
        for grp in range(ng):
            for q in range(4):
                r = tr + 8 * (q >> 1)
                m = grp * MGROUP + 2 * (t & 1) + (q & 1)
                red[((ks * 2 + half) * TROWS + r) * MM + m] = acc[4 * grp + q]
        if not odd:
            s_bad[(ks * 2 + half) * TROWS + tr] = int32(1) if bad_g else int32(0)
            s_bad[(ks * 2 + half) * TROWS + tr + 8] = int32(1) if bad_8 else int32(0)
        cuda.syncthreads()
        for idx in range(tid, TROWS * MM, THREADS):
            r = idx // MM
            m = idx % MM
            row = cuda.blockIdx.x * TROWS + r
            if m < M and row < N:
                hsum = int64(0)
                lsum = uint64(0)
                flag = int32(0)
                for wh in range(2 * KS):
                    v = red[(wh * TROWS + r) * MM + m]
                    hsum += v >> 32
                    lsum += uint64(v & int64(0xFFFFFFFF))
                    flag |= s_bad[wh * TROWS + r]
                e = EROW[M0 + m]
                if flag != 0 or e == SPECIAL_ROW or GSPECIAL != 0:
                    C[m, row] = uint16(BF16_NAN)
                else:
                    p = int64(e) - int64(FRAC_BITS + SCALE_LSB) + int64(GE)
                    C[m, row] = uint16(round_fixed_bf16(hsum * GM, lsum * uint64(GM), p))

    return body


PREPARE_SIGNATURE = "void(uint16[:, ::1], uint32[::1], int32[::1], int32, int32, int32)"
_GEMV_ARGS = "int32, int32, int32, int32, int32, int64, int32, int32, int32"
GEMV_SIGNATURES = {
    True: f"void(uint64[::1], int32[::1], uint32[::1], uint32[::1], uint16[:, ::1], {_GEMV_ARGS})",
    False: f"void(uint64[::1], int32[::1], uint32[::1], uint8[::1], uint16[:, ::1], {_GEMV_ARGS})",
}
GROUPS = (1, 2, 4)


@functools.cache
def prepare_kernel():
    """The compiled prepare (one CTA per padded row and 2048-element span)."""
    return cuda.jit(PREPARE_SIGNATURE)(_prepare_body)


@functools.cache
def _gemv_kernel(ng: int, fast: bool, rt: int):
    return cuda.jit(GEMV_SIGNATURES[fast])(_make_gemv_body(ng, fast, rt))


def builds() -> list[tuple[int, bool, int]]:
    """Every ``(groups, fast, row tiles)`` the launcher can pick."""
    return [(ng, fast, rt) for ng in GROUPS for fast in (True, False) for rt in tiles_options(ng)]


def tiles_options(ng: int) -> tuple[int, ...]:
    return (1, 2) if ng == 4 else (1,)


def row_tiles(ng: int, n: int) -> int:
    """Tiles of 16 rows per CTA: 2 for 16-row launches of a tall weight, else 1.

    Measured on the H200 (``benchmarks/bench_exact_w4a16.py --rt``, 16384 x
    16384, GEMV alone): M = 16 took 460 us with one tile and 305 us with two
    (the activation operands of 16 rows do not fit L1; two tiles a CTA halve
    their reads from L2); M = 8 took 222 us with one and 237 us with two.
    With few rows two-tile CTAs would not fill the chip.
    """
    return 2 if ng == 4 and n >= 8192 else 1


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of each build, for the PTX tests."""
    specs = [("w4a16_exact_prepare", _prepare_body, PREPARE_SIGNATURE)]
    for ng, fast, rt in builds():
        name = f"w4a16_gemv_exact@m{MGROUP * ng}t{rt}{'' if fast else '_generic'}"
        specs.append((name, _make_gemv_body(ng, fast, rt), GEMV_SIGNATURES[fast]))
    return specs


def groups_for(m: int) -> int:
    """Groups of 4 rows a launch of ``m`` rows (1..MAX_M) is built with."""
    if not 1 <= m <= MAX_M:
        raise ValueError(f"m: w4a16_gemv_exact serves 1..{MAX_M} rows per launch, got {m}")
    ng = -(-m // MGROUP)
    return 1 << (ng - 1).bit_length()


# -- host side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class W4Operands:
    """Activations converted once for any number of ``w4a16_gemv_exact`` calls.

    ``limbs`` uint32 [3 * Mp * Kp / 4] in :func:`limb_word` order; ``exponents``
    int32 [Mp] (E_m, or ``SPECIAL_ROW``); Mp, Kp: M and K padded to 4 and 128.
    """

    limbs: object
    exponents: object
    m: int
    k: int

    @property
    def mp(self) -> int:
        return padded_m(self.m)

    @classmethod
    def allocate(cls, m: int, k: int, stream=0) -> W4Operands:
        check_k(k)
        mp, kp = padded_m(m), padded_k(k)
        return cls(
            cuda.device_array((max(2, LIMBS * mp * kp // 4),), np.uint32, stream=stream),
            cuda.device_array((max(1, mp),), np.int32, stream=stream),
            m,
            k,
        )

    def prepare_args(self, d_a) -> tuple:
        return (
            d_a,
            self.limbs,
            self.exponents,
            np.int32(self.m),
            np.int32(self.k),
            np.int32(self.mp),
        )


# The exact-family interface (q2gemv.cuda.runtime.launcher.ExactFamily); the kernel is the
# family spec's exact_kernel (q2gemv.kernels).
PREPARE = "w4a16_exact_prepare"
Operands = W4Operands


def prepare_launch(m: int, k: int) -> tuple:
    """``(kernel, grid, block)`` of the prepare for ``m`` rows of ``k``."""
    return prepare_kernel(), prepare_grid(m, k), PREP_THREADS


def chunk_launches(ops, dw, d_out, rows_of) -> list[tuple]:
    return w4_launches(ops, dw, d_out, rows_of)


def check_k(k: int) -> None:
    if k % BLOCK or k < BLOCK:
        raise ValueError(f"a: w4a16_gemv_exact needs K a positive multiple of {BLOCK}, got {k}")
    if k > MAX_K:
        raise ValueError(f"a: w4a16_gemv_exact serves K <= {MAX_K}, got {k}")


PREP_THREADS = 256  # the prepare's CTA: 2048 elements of a row per CTA


def prepare_grid(m: int, k: int) -> tuple[int, int]:
    """The prepare's grid: padded rows x spans of ``8 * PREP_THREADS`` elements."""
    return padded_m(m), launch.div_ceil(padded_k(k) // 8, PREP_THREADS)


def prepare_device(d_a, stream=0, ops: W4Operands | None = None) -> W4Operands:
    """Run the prepare on device bf16 bits ``d_a`` (uint16 [M, K]); returns the operands."""
    from ..runtime import launcher

    return launcher.prepare_device("w4a16", d_a, stream, ops)


def fast_path(dw) -> bool:
    """16-byte weight and 4-byte scale loads: K a multiple of 128, aligned buffers."""
    if dw.k % STEP:
        return False
    wa = launch.device_address(dw.wp)
    sa = launch.device_address(dw.scales)
    return (wa is None or wa % 16 == 0) and (sa is None or sa % 4 == 0)


def global_parts(g) -> tuple[int, int, int, int]:
    """fp32 global scale -> ``(|gm|, ge, special, sign)`` with ``g = +-gm * 2**ge``.

    The contract's own decomposition (:func:`q2gemv.reference.exact.f32_parts`);
    the sign goes into every scale of the table, ``special`` (NaN/Inf) makes
    every output NaN. (A -0 scale gives sign 0: every sum is then exactly 0,
    written +0 either way.)
    """
    from ...reference.exact import f32_parts

    gm, ge, finite = f32_parts(g)
    return abs(gm), ge, int(not finite), int(gm < 0)


def w4_launches(ops: W4Operands, dw, d_out, rows_of=None) -> list[tuple]:
    """``(kernel, grid, block, args)`` of each ``w4a16_gemv_exact`` launch.

    ``rows_of``: the plan's ``(row0, rows)`` (:func:`q2gemv.launch.check_chunks`:
    rows <= :data:`MAX_M`, row0 a multiple of 4, the prepared groups); None:
    chunks of :data:`MAX_M`.
    Validates before anything is launched: ``dw`` a DeviceNvfp4Weight of
    ``ops.k`` columns, ``d_out`` uint16 [M, N], the chunks.
    """
    from .weight import DeviceNvfp4Weight

    if not isinstance(dw, DeviceNvfp4Weight):
        raise TypeError(f"weight: expected a DeviceNvfp4Weight, got {type(dw).__name__}")
    if ops.k != dw.k:
        raise ValueError(f"a: expected K={dw.k} columns (the weight's k), got {ops.k}")
    if np.dtype(d_out.dtype) != np.uint16 or tuple(d_out.shape) != (ops.m, dw.n):
        raise ValueError(
            f"out: expected uint16 of shape {(ops.m, dw.n)}, got {d_out.dtype} {tuple(d_out.shape)}"
        )
    fast = fast_path(dw)
    wp = dw.wp.reshape(dw.wp.size)
    sc = dw.scales.reshape(dw.scales.size)
    if fast:
        sc = sc.view(np.uint32)
    gm, ge, special, sign = global_parts(dw.global_scale)
    tail = (np.int32(dw.n), np.int32(dw.k))
    rows_of = launch.check_chunks(rows_of, ops.m, MAX_M, multiple=MGROUP)
    launches = []
    for r0, rows in rows_of:
        ng = groups_for(rows)
        rt = row_tiles(ng, dw.n)
        launches.append(
            (
                _gemv_kernel(ng, fast, rt),
                launch.div_ceil(dw.n, ROWS_PER_CTA * rt),
                THREADS,
                (ops.limbs.view(np.uint64), ops.exponents, wp, sc, d_out[r0 : r0 + rows], *tail)
                + (np.int32(rows), np.int32(r0), np.int32(ops.mp), np.int64(gm), np.int32(ge))
                + (np.int32(special), np.int32(sign)),
            )
        )
    return launches

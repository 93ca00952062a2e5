"""``w4a16_gemv_exact``: NVFP4 weights under the exact contract, on the int8 tensor cores.

The contract (a value, :mod:`q2gemv.reference.exact`) is the same as for
Q2_0: activations in the 22-bit fixed point of their row, weights as exact
values ``e2m1 * e4m3(s_b) * g``, one rounding. Here ``2 * e2m1`` is an int8
in [-12, 12], so a 16-element block's sum ``S = sum (2 e2m1) A_k`` is an
exact integer from the tensor cores, and ``S * mant(s_b) << exp(s_b)`` goes
into an exact 64-bit accumulator; ``g`` (``gm * 2**ge``, 24-bit ``gm``)
multiplies the exact total once, before the rounding.

Two kernels:

* ``w4a16_exact_prepare`` -- one CTA per activation row (rows padded to a
  multiple of 4 with zeros): E_m (:func:`q2gemv.cuda.exact.row_exponent`) and
  the three unsigned byte limbs of ``A_k + 2**23``, written in the order the
  GEMV's B fragments are read (:func:`limb_word`): for a step of 128 elements
  and block j of each half, the 16 lanes that hold B read 128 consecutive
  bytes.
* ``w4a16_gemv_exact`` -- 16 weight rows per CTA of :data:`WARPS` warps; the
  warps split K in steps of 128 elements (warp w takes steps w, w + 8, ...).
  Lane (g, t) (g = lane / 4, t = lane % 4) loads 16 bytes of rows g and g + 8
  (blocks 2t and 2t + 1 of the step; one exchange with lane t ^ 1 leaves it
  word ``t % 2`` of block ``4 (t // 2) + j``, j = 0..3). Each word is 8 codes
  = the lane's 8 k slots of one ``mma.m16n8k32`` (s8 x u8): the B matrix is
  block-diagonal, so columns 0-3 (activation rows 4q..4q+3 of group q) sum
  block j of the first half and columns 4-7 block 4 + j of the second half:
  every D entry is one block's sum, for its own scale. One IMMA per limb;
  ``S = D0 + 2**8 D1 + 2**16 (D2 - 128 sum(w))`` (``sum(w)``: dp4a over the
  lane's codes plus its pair's, by one exchange) is ``sum_k (2 e2m1) A_k``,
  exact in 32 bits.

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

from .. import launch
from ..formats.nvfp4 import BLOCK
from ._dev import dp4a, ld_bf16x8, ld_u32x4, mma_s8u8, prmt, shfl_xor
from .exact import (
    BF16_NAN,
    FRAC_BITS,
    OFFSET,
    PREP_MAX_THREADS,
    SPECIAL_ROW,
    fixed_point_one,
    round_fixed_bf16,
    row_exponent,
)

WARPS = 8
THREADS = 32 * WARPS
ROWS_PER_CTA = 16
STEP = 128  # elements of a row per warp step: 8 blocks, 64 bytes
MGROUP = 4  # activation rows per group (columns 0-3 and 4-7 of one IMMA)
MAX_M = 16
MAX_K = 1 << 22  # per-lane accumulator bound: |S * scale| < 2**48.5, at most 2**14 terms
LIMBS = 3
SC_NAN = -(1 << 31)  # the scale table's entry for E4M3 NaN
SCALE_LSB = 10  # e4m3 = mant << shift * 2**-9, and the weight carries 2 e2m1 = 2 * e2m1
LUT_LO = 0x03020100  # 2 * e2m1 magnitudes of codes 0-3 ...
LUT_HI = 0x0C080604  # ... and 4-7: 0 1 2 3 4 6 8 12
SIGNS = 0x88888888
BIAS = 0x80808080
ONES = 0x01010101

_device = cuda.jit(device=True, inline="always")


def padded_m(m: int) -> int:
    return -(-m // MGROUP) * MGROUP


def padded_k(k: int) -> int:
    return -(-k // STEP) * STEP


def limb_word(m: int, k: int, limb: int, mp: int) -> int:
    """Index (uint32 words) of the word holding limb ``limb`` of element (m, k), byte ``k % 4``.

    Layout, outermost first: step ``k // 128``, block j = ``(k % 128 // 16) % 4``,
    limb, group ``m // 4``, half ``k % 128 // 64``, word pair ``k % 16 // 8``,
    row ``m % 4``, then the 8 elements (two words). ``mp``: rows padded to 4.
    """
    st, r = divmod(k, STEP)
    blk, e16 = divmod(r, 16)
    h, j = divmod(blk, 4)
    return (
        ((st * 4 + j) * LIMBS + limb) * 8 * mp
        + (m // MGROUP) * 32
        + (h * 2 + e16 // 8) * 8
        + (m % MGROUP) * 2
        + (e16 % 8) // 4
    )


# -- prepare -------------------------------------------------------------------------------


def _prepare_body(A, P32, EROW, M, K, MP):  # noqa: N803
    """Padded activation row ``blockIdx.x``: E_m and the limbs in GEMV order (:func:`limb_word`).

    Thread ``tid`` converts groups of 8 elements ``q = tid, tid + blockDim, ...``
    of the padded K; rows ``>= M`` and elements ``>= K`` are written as zeros.
    """
    s_lg = cuda.shared.array(32, int32)
    m = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nth = cuda.blockDim.x
    real = m < M
    E = row_exponent(A, s_lg, K) if real else int32(0)  # noqa: N806
    if tid == 0:
        EROW[m] = E
    kp = (K + STEP - 1) // STEP * STEP
    hv = cuda.local.array(4, uint32)
    limb = cuda.local.array(6, uint32)
    for q in range(tid, kp // 8, nth):
        k = q * 8
        for i in range(6):
            limb[i] = uint32(0)
        if real and k < K:
            hv[0], hv[1], hv[2], hv[3] = ld_bf16x8(A, m, k)
            for c in range(8):
                h = (hv[c >> 1] >> uint32(16 * (c & 1))) & uint32(0xFFFF)
                a = int64(0) if E == SPECIAL_ROW else fixed_point_one(h, E)
                ap = uint32(a + int64(OFFSET))
                for li in range(LIMBS):
                    byte = (ap >> uint32(8 * li)) & uint32(0xFF)
                    limb[2 * li + (c >> 2)] |= byte << uint32(8 * (c & 3))
        st = k // STEP
        blk = (k % STEP) // 16
        base = (m // MGROUP) * 32 + ((blk // 4) * 2 + (k % 16) // 8) * 8 + (m % MGROUP) * 2
        for li in range(LIMBS):
            w = ((st * 4 + blk % 4) * LIMBS + li) * 8 * MP + base
            P32[w] = limb[2 * li]
            P32[w + 1] = limb[2 * li + 1]


# -- the GEMV --------------------------------------------------------------------------------


@_device
def decode_codes(w):
    """8 E2M1 codes (a uint32, code i in bits 4i..4i+3) -> two registers of 4 int8 ``2 * e2m1``.

    ``lo`` holds codes 0-3, ``hi`` codes 4-7, byte i = code i of the half.
    """
    w = uint32(w)
    x = w ^ uint32(SIGNS)
    p_lo = prmt(LUT_LO, LUT_HI, w)
    q_lo = prmt(LUT_LO, LUT_HI, x)
    p_hi = prmt(LUT_LO, LUT_HI, w >> uint32(16))
    q_hi = prmt(LUT_LO, LUT_HI, x >> uint32(16))
    lo = uint32(p_lo + uint32(BIAS) - q_lo) ^ uint32(BIAS)
    hi = uint32(p_hi + uint32(BIAS) - q_hi) ^ uint32(BIAS)
    return lo, hi


@_device
def scale_entry(b, gsign):
    """The scale table's entry of E4M3 bits ``b``: ``+-mant << (max(e, 1) - 1)``, or :data:`SC_NAN`."""
    b = int32(b)
    if (b & 0x7F) == 0x7F:
        return int32(SC_NAN)
    e = (b >> 3) & 15
    f = b & 7
    mant = f | 8 if e > 0 else f
    v = int32(mant << (max(e, 1) - 1))
    return -v if ((b >> 7) ^ gsign) != 0 else v


def _make_gemv_body(ng: int, fast: bool):
    """``w4a16_gemv_exact`` for ``ng`` groups of 4 activation rows; ``fast``: the 16-byte loads."""
    MM = MGROUP * ng  # noqa: N806
    RED = WARPS * 2 * ROWS_PER_CTA * MM  # noqa: N806
    NACC = 4 * ng  # noqa: N806

    @cuda.jit(device=True, inline="always")
    def load_row(WP, SC, row, st, t, nb, K, wv, o):  # noqa: N803
        """Words of blocks 2t, 2t + 1 of step ``st`` in ``wv[o..o+3]``; returns the scale word.

        The scale word holds the E4M3 bytes of blocks ``4 (t // 2) + j``, j = 0..3.
        """
        if fast:
            wv[o], wv[o + 1], wv[o + 2], wv[o + 3] = ld_u32x4(WP, row * (K // 8) + st * 16 + 4 * t)
            return uint32(SC[row * (K // 64) + st * 2 + (t >> 1)])
        b0 = st * 8 + 2 * t
        for i in range(4):
            bb = b0 + (i >> 1)
            wv[o + i] = uint32(WP[row * (K // 8) + bb * 2 + (i & 1)]) if bb < nb else uint32(0)
        sw = uint32(0)
        for j in range(4):
            bb = st * 8 + 4 * (t >> 1) + j
            if bb < nb:
                sw |= uint32(SC[row * nb + bb]) << uint32(8 * j)
        return sw

    @cuda.jit(device=True, inline="always")
    def exchange(wv, o, odd, jw):
        """Word ``t % 2`` of blocks 0..3 of this lane's half (see the module docstring) into ``jw``."""
        x0 = shfl_xor(wv[o] if odd else wv[o + 1], 1)
        x1 = shfl_xor(wv[o + 2] if odd else wv[o + 3], 1)
        jw[0] = x0 if odd else wv[o]
        jw[1] = x1 if odd else wv[o + 2]
        jw[2] = wv[o + 1] if odd else x0
        jw[3] = wv[o + 3] if odd else x1

    def body(P32, EROW, WP, SC, C, N, K, M, M0, MP, GM, GE, GSPECIAL, GSIGN):  # noqa: N803
        lut = cuda.shared.array(256, int32)
        red = cuda.shared.array(RED, int64)
        s_bad = cuda.shared.array(WARPS * 2 * ROWS_PER_CTA, int32)
        acc = cuda.local.array(NACC, int64)
        wv = cuda.local.array(8, uint32)
        jg = cuda.local.array(4, uint32)
        j8 = cuda.local.array(4, uint32)
        bq = cuda.local.array(6, uint32)
        tid = cuda.threadIdx.x
        lut[tid] = scale_entry(tid, GSIGN)  # THREADS == 256 entries
        warp = tid >> 5
        lane = tid & 31
        g = lane >> 2
        t = lane & 3
        odd = (t & 1) != 0
        half = t >> 1
        row0 = cuda.blockIdx.x * ROWS_PER_CTA
        rg = min(row0 + g, N - 1)  # rows past N read row N-1 and are never stored
        r8 = min(row0 + g + 8, N - 1)
        nb = K // BLOCK
        nsteps = (K + STEP - 1) // STEP
        # this lane's B column: activation row 4 * grp + (g % 4); its k slots hold data
        # only for the column's own half (block-diagonal B)
        b_live = (g >> 2) == half
        b_off = int64(M0 // MGROUP) * 32 + (half * 2 + (t & 1)) * 8 + (g & 3) * 2
        for i in range(NACC):
            acc[i] = int64(0)
        bad_g = False
        bad_8 = False
        cuda.syncthreads()  # the scale table
        st = warp
        while st < nsteps:
            swg = load_row(WP, SC, rg, st, t, nb, K, wv, 0)
            sw8 = load_row(WP, SC, r8, st, t, nb, K, wv, 4)
            exchange(wv, 0, odd, jg)
            exchange(wv, 4, odd, j8)
            for j in range(4):
                lo_g, hi_g = decode_codes(jg[j])
                lo_8, hi_8 = decode_codes(j8[j])
                sg = dp4a(hi_g, ONES, dp4a(lo_g, ONES, 0))
                s8 = dp4a(hi_8, ONES, dp4a(lo_8, ONES, 0))
                o = shfl_xor((uint32(sg) & uint32(0xFFFF)) | (uint32(s8) << uint32(16)), 1)
                cw_g = (sg + (int32(o << uint32(16)) >> 16)) << 7  # 128 * the block's sum(w)
                cw_8 = (s8 + (int32(o) >> 16)) << 7
                sc_g = lut[(swg >> uint32(8 * j)) & uint32(0xFF)]
                sc_8 = lut[(sw8 >> uint32(8 * j)) & uint32(0xFF)]
                if sc_g == SC_NAN:
                    bad_g = True
                    sc_g = int32(0)
                if sc_8 == SC_NAN:
                    bad_8 = True
                    sc_8 = int32(0)
                base = int64((st * 4 + j) * LIMBS) * 8 * MP + b_off
                for grp in range(ng):
                    live = b_live and (grp * MGROUP + (g & 3)) < M
                    for li in range(LIMBS):
                        if live:
                            w = base + li * 8 * MP + grp * 32
                            bq[2 * li] = P32[w]
                            bq[2 * li + 1] = P32[w + 1]
                        else:
                            bq[2 * li] = uint32(0)
                            bq[2 * li + 1] = uint32(0)
                    d00, d01, d02, d03 = mma_s8u8(lo_g, lo_8, hi_g, hi_8, bq[0], bq[1], 0, 0, 0, 0)
                    d10, d11, d12, d13 = mma_s8u8(lo_g, lo_8, hi_g, hi_8, bq[2], bq[3], 0, 0, 0, 0)
                    d20, d21, d22, d23 = mma_s8u8(lo_g, lo_8, hi_g, hi_8, bq[4], bq[5], 0, 0, 0, 0)
                    # sum_k (2 e2m1) A_k = sum_k w (A_k + 2**23) - 2**23 sum(w): |S| < 2**31
                    s0 = int32(d00 + (d10 << 8) + ((d20 - cw_g) << 16))
                    s1 = int32(d01 + (d11 << 8) + ((d21 - cw_g) << 16))
                    s2 = int32(d02 + (d12 << 8) + ((d22 - cw_8) << 16))
                    s3 = int32(d03 + (d13 << 8) + ((d23 - cw_8) << 16))
                    acc[4 * grp] += int64(s0) * int64(sc_g)
                    acc[4 * grp + 1] += int64(s1) * int64(sc_g)
                    acc[4 * grp + 2] += int64(s2) * int64(sc_8)
                    acc[4 * grp + 3] += int64(s3) * int64(sc_8)
            st += WARPS
        # partial sums -> shared memory (per warp and half) -> one rounding per output
        for grp in range(ng):
            for q in range(4):
                r = g + 8 * (q >> 1)
                m = grp * MGROUP + 2 * (t & 1) + (q & 1)
                red[((warp * 2 + half) * ROWS_PER_CTA + r) * MM + m] = acc[4 * grp + q]
        if not odd:
            s_bad[(warp * 2 + half) * ROWS_PER_CTA + g] = int32(1) if bad_g else int32(0)
            s_bad[(warp * 2 + half) * ROWS_PER_CTA + g + 8] = int32(1) if bad_8 else int32(0)
        cuda.syncthreads()
        for idx in range(tid, ROWS_PER_CTA * MM, THREADS):
            r = idx // MM
            m = idx % MM
            row = row0 + r
            if m < M and row < N:
                hsum = int64(0)
                lsum = uint64(0)
                flag = int32(0)
                for wh in range(2 * WARPS):
                    v = red[(wh * ROWS_PER_CTA + r) * MM + m]
                    hsum += v >> 32
                    lsum += uint64(v & int64(0xFFFFFFFF))
                    flag |= s_bad[wh * ROWS_PER_CTA + r]
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
    True: f"void(uint32[::1], int32[::1], uint32[::1], uint32[::1], uint16[:, ::1], {_GEMV_ARGS})",
    False: f"void(uint32[::1], int32[::1], uint32[::1], uint8[::1], uint16[:, ::1], {_GEMV_ARGS})",
}
GROUPS = (1, 2, 4)


@functools.cache
def _prepare_kernel():
    return cuda.jit(PREPARE_SIGNATURE)(_prepare_body)


@functools.cache
def _gemv_kernel(ng: int, fast: bool):
    return cuda.jit(GEMV_SIGNATURES[fast])(_make_gemv_body(ng, fast))


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of each build, for the PTX tests."""
    specs = [("w4a16_exact_prepare", _prepare_body, PREPARE_SIGNATURE)]
    specs += [
        (
            f"w4a16_gemv_exact@m{MGROUP * ng}{'' if fast else '_generic'}",
            _make_gemv_body(ng, fast),
            GEMV_SIGNATURES[fast],
        )
        for ng in GROUPS
        for fast in (True, False)
    ]
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
            cuda.device_array((max(1, LIMBS * mp * kp // 4),), np.uint32, stream=stream),
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


def check_k(k: int) -> None:
    if k % BLOCK or k < BLOCK:
        raise ValueError(f"a: w4a16_gemv_exact needs K a positive multiple of {BLOCK}, got {k}")
    if k > MAX_K:
        raise ValueError(f"a: w4a16_gemv_exact serves K <= {MAX_K}, got {k}")


def prepare_threads(k: int) -> int:
    """The prepare's CTA size: one thread per 8 elements of the padded K, 32..1024."""
    return min(PREP_MAX_THREADS, launch.div_ceil(padded_k(k) // 8, 32) * 32)


def prepare_device(d_a, stream=0, ops: W4Operands | None = None) -> W4Operands:
    """Run the prepare on device bf16 bits ``d_a`` (uint16 [M, K]); returns the operands."""
    m, k = (int(x) for x in d_a.shape)
    if ops is None:
        ops = W4Operands.allocate(m, k, stream)
    elif (ops.m, ops.k) != (m, k):
        raise ValueError(f"ops: expected operands for M={m}, K={k}, got M={ops.m}, K={ops.k}")
    if m:
        _prepare_kernel()[ops.mp, prepare_threads(k), stream](*ops.prepare_args(d_a))
    return ops


def fast_path(dw) -> bool:
    """16-byte weight and 4-byte scale loads: K a multiple of 128, aligned buffers."""
    if dw.k % STEP:
        return False
    wa = launch.device_address(dw.wp)
    sa = launch.device_address(dw.scales)
    return (wa is None or wa % 16 == 0) and (sa is None or sa % 4 == 0)


def global_parts(g) -> tuple[int, int, int, int]:
    """fp32 global scale -> ``(|gm|, ge, special, sign)`` with ``g = +-gm * 2**ge``."""
    bits = int(np.float32(g).view(np.uint32))
    e = (bits >> 23) & 0xFF
    f = bits & 0x7FFFFF
    gm = f | 0x800000 if e else f
    return gm, max(e, 1) - 150, int(e == 0xFF), bits >> 31


def w4_launches(ops: W4Operands, dw, d_out) -> list[tuple]:
    """``(kernel, grid, args)`` of each ``w4a16_gemv_exact`` launch: chunks of :data:`MAX_M` rows.

    Validates before anything is launched: ``dw`` a DeviceNvfp4Weight of
    ``ops.k`` columns, ``d_out`` uint16 [M, N].
    """
    from .w4a16 import DeviceNvfp4Weight

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
    grid = launch.div_ceil(dw.n, ROWS_PER_CTA)
    tail = (np.int32(dw.n), np.int32(dw.k))
    return [
        (
            _gemv_kernel(groups_for(rows), fast),
            grid,
            (ops.limbs, ops.exponents, wp, sc, d_out[r0 : r0 + rows], *tail)
            + (np.int32(rows), np.int32(r0), np.int32(ops.mp), np.int64(gm), np.int32(ge))
            + (np.int32(special), np.int32(sign)),
        )
        for r0, rows in launch.batchm_row_chunks(ops.m, MAX_M)
    ]


def launch_w4(ops: W4Operands, dw, d_out, stream=0) -> None:
    """``w4a16_gemv_exact`` over all of ``ops``' rows into ``d_out`` (uint16 [M, N])."""
    for kernel, grid, args in w4_launches(ops, dw, d_out):
        kernel[grid, THREADS, stream](*args)


def prebind_w4(d_a, dw, d_out, stream=0, ops: W4Operands | None = None) -> list:
    """Pre-bound launches of one exact NVFP4 GEMV: the prepare (unless ``ops``), then each chunk."""
    from .prebound import PreboundLaunch

    launches = []
    if ops is None:
        m, k = (int(x) for x in d_a.shape)
        ops = W4Operands.allocate(m, k)
        launches.append(
            PreboundLaunch(
                _prepare_kernel(),
                ops.mp,
                prepare_threads(k),
                ops.prepare_args(d_a),
                stream=stream,
                name="w4a16_exact_prepare",
            )
        )
    for kernel, grid, args in w4_launches(ops, dw, d_out):
        launches.append(
            PreboundLaunch(kernel, grid, THREADS, args, stream=stream, name="w4a16_gemv_exact")
        )
    return launches


def run_w4(a_bits: np.ndarray, weight, stream=0) -> np.ndarray:
    """Host bf16 bits [M, K] -> uint16 [M, N] through prepare + ``w4a16_gemv_exact``."""
    from .w4a16 import as_device_weight

    dw = as_device_weight(weight, stream)
    if not isinstance(a_bits, np.ndarray) or a_bits.dtype != np.uint16:
        raise TypeError("a_bits: expected uint16 bf16 bits (a numpy array)")
    if a_bits.ndim != 2 or a_bits.shape[1] != dw.k:
        raise ValueError(f"a_bits: expected shape [M, K] = [M, {dw.k}], got {a_bits.shape}")
    m = a_bits.shape[0]
    out = np.empty((m, dw.n), np.uint16)
    if m == 0:
        return out
    d_a = cuda.to_device(np.ascontiguousarray(a_bits), stream=stream)
    d_out = cuda.device_array((m, dw.n), np.uint16, stream=stream)
    launch_w4(prepare_device(d_a, stream), dw, d_out, stream)
    d_out.copy_to_host(out, stream=stream)
    if stream:
        stream.synchronize()
    return out

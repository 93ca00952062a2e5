"""``w4a16_gemv_exact``: NVFP4 weights under the exact contract, on the int8 tensor cores.

The contract (a value, :mod:`q2gemv.reference.exact`) is Q2_0's: activations in the
22-bit fixed point of their row, weights as exact values ``e2m1 * e4m3(s_b) * g``, one
rounding. Here ``2 * e2m1`` is an int8 in [-12, 12] and a block is 16 weights: the k of
one ``mma.m16n8k16`` (s8 x u8 -> s32), so each IMMA computes whole blocks
(``docs/numerics.md``, "NVFP4 on the tensor cores").

* ``w4a16_exact_prepare`` -- CTAs over (activation row, span of :data:`PREP_THREADS`
  groups of 8 elements): E_m (:func:`q2gemv.cuda.exact_contract.row_exponent`) and the
  three unsigned byte limbs of ``A_k + 2**23`` (as for Q2_0), each limb row in the order
  the GEMV's B fragments are read: element ``k = 64 s + 16 b + 4 t + i`` at byte
  ``64 s + 16 t + 4 b + i`` (lane t's B words of a step's 4 blocks are one 16-byte
  load). K is padded to a multiple of 64 with ``A = 0``.
* ``w4a16_gemv_exact`` -- one tile of 16 weight rows per CTA, on the weight's execution
  layout (:mod:`q2gemv.formats.nvfp4_layout`); :func:`warps_for` warps split the row's
  steps of 64 elements (4 blocks). One 16-byte load per lane and step brings the warp
  16 rows x 64 codes: word b of lane (g, t) holds elements ``4t..4t+3`` of block b for
  rows g (low half) and g + 8 (high half), which :func:`decode_codes` turns into the A
  fragments ``a0``, ``a1`` as they stand. B column j of column tile c is limb ``l`` of
  activation row ``r`` with ``3 r + l = 8 c + j`` (1, 2 or 3 tiles for up to 2, 5 or 8
  rows). Each IMMA gives per (weight row, column) ``D = sum_k (2 e2m1_k) L_k`` exactly
  (``|D| < 2**16``); the lane adds ``D * scale_b`` (scale table: ``+-mant << (e - 1)``,
  the global sign folded in) into a 64-bit accumulator per (row, column); rows with a
  NaN scale are marked by the row sums, not by a scan. The warps sum their accumulators
  in shared memory (integer atomics: any order), and one thread per output combines the
  limbs, removes the offset through the weight's row sums (``2**23 * zsum``, made with
  the layout), multiplies by the global scale's mantissa and rounds once
  (``round_fixed`` of :func:`~q2gemv.cuda.exact_contract.device_contract`)::

      sum_k w_k A_k = acc_0 + 2**8 acc_1 + 2**16 acc_2 - 2**23 zsum   (units of 2**-10 g)

The activation format (bf16 or fp16, :mod:`q2gemv.formats.act`) is a build parameter of
both kernels; the operands carry it (:class:`W4Operands`).

Codes to int8 without a branch: ``prmt`` looks up the 8 magnitudes (selector nibbles =
codes; a set sign bit selects 0), once for the codes and once with their sign bits
flipped; ``(P + 0x80 - Q) ^ 0x80`` per byte is the signed value.

The GEMV may start under programmatic dependent launch
(:mod:`q2gemv.cuda.runtime.prebound`) and waits (``grid_dep_wait``) before it reads the
prepared operands. Up to :data:`MAX_M` rows per launch; the launcher chunks more. K up to
:data:`MAX_K` (the 64-bit accumulators then cannot overflow).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import cuda, int32, int64, uint16, uint32, uint64

from ...dispatch import plan, registry
from ...formats import nvfp4_layout as lay
from ...formats.act import BF16, FORMATS, ActFormat
from ...formats.nvfp4 import BLOCK
from ..exact_contract import (
    FRAC_BITS,
    NARROW_WARPS,
    OFFSET,
    SPECIAL_ROW,
    WARPS,
    WIDE_WARPS,
    act_suffix,
    cta_warps,
    device_contract,
    tile_counts,
)
from ..runtime import tuning
from ..runtime.dev import (
    grid_dep_launch,
    grid_dep_wait,
    ld_bf16x8,
    ld_stream_u32x4,
    ld_u32x4,
    mma_k16_s8u8,
    mul_wide,
    prmt,
)
from .scales import scale_entry

CTA_WARPS = (NARROW_WARPS, WARPS, WIDE_WARPS)  # every CTA size warps_for can pick (8 usual)
ROWS_PER_CTA = registry.get("w4a16_gemv_exact").rows_per_cta  # 16: one m16 tile of weight rows
STEP = lay.STEP  # elements of a row per warp step: 4 blocks
ZSUM_NAN = lay.ZSUM_NAN  # the row sum of a weight row with a NaN scale
MAX_M = registry.W4_EXACT_MAX_M
MAX_K = 1 << 22  # 64-bit accumulators: |D * scale| < 2**34, at most 2**18 blocks
LIMBS = 3
COLS = 8  # columns of one B tile (the n8 of the IMMA)
SCALE_LSB = 10  # e4m3 = mant << shift * 2**-9, and the weight carries 2 e2m1 = 2 * e2m1
LUT_LO = 0x03020100  # 2 * e2m1 magnitudes of codes 0-3 ...
LUT_HI = 0x0C080604  # ... and 4-7: 0 1 2 3 4 6 8 12
SIGNS = 0x88888888
BIAS = 0x80808080
MAX_LIMB_WORDS = 2**31  # the GEMV indexes the prepared limbs with int32

_device = cuda.jit(device=True, inline="always")


def padded_k(k: int) -> int:
    """K padded to whole steps (the prepared limbs' row length)."""
    return -(-k // STEP) * STEP


def limb_byte(k: int) -> int:
    """Byte of element ``k`` in its prepared limb row (the B fragment order, module docstring)."""
    s, r = divmod(k, STEP)
    b, r = divmod(r, BLOCK)
    t, i = divmod(r, 4)
    return s * STEP + t * BLOCK + b * 4 + i


def tiles_for(m: int) -> int:
    """B column tiles of 8 a launch of ``m`` rows (1..MAX_M) is built with: 3 limbs a row."""
    if not 1 <= m <= MAX_M:
        raise ValueError(f"m: w4a16_gemv_exact serves 1..{MAX_M} rows per launch, got {m}")
    return -(-LIMBS * m // COLS)


# -- prepare -------------------------------------------------------------------------------


def _make_prepare_body(act: ActFormat = BF16):
    """``w4a16_exact_prepare`` for activations of format ``act`` (bf16 or fp16)."""
    dc = device_contract(act)
    fixed_point_one, row_exponent = dc.fixed_point_one, dc.row_exponent

    def prepare_body(A, P32, EROW, K):  # noqa: N803
        """Activation row ``blockIdx.x``, span ``blockIdx.y``: the limbs in GEMV order.

        Every CTA of the row finds E_m (:func:`~q2gemv.cuda.exact_contract.row_exponent`,
        the whole row: cheap, and no second kernel); thread ``q = y * blockDim + tid``
        then converts elements ``8q .. 8q + 7`` (two groups of 4: positions ``t`` and
        ``t + 1`` of block ``b``) into two words of each limb row. Elements ``>= K``
        (the padding to whole steps) are ``A = 0``; span 0 writes ``EROW[m]``.
        """
        s_lg = cuda.shared.array(32, int32)
        grid_dep_launch()  # the GEMV may start now; it waits (grid_dep_wait) for this to finish
        m = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        kw = P32.shape[1]  # words per limb row: padded K / 4
        q = cuda.blockIdx.y * cuda.blockDim.x + tid
        k = q * 8
        hv = cuda.local.array(4, uint32)  # this thread's 8 elements, loaded before the row's
        hv[0], hv[1], hv[2], hv[3] = ld_bf16x8(A, m, min(k, K - 8))  # maximum: both loads fly
        E = row_exponent(A, s_lg, K)  # noqa: N806
        if tid == 0 and cuda.blockIdx.y == 0:
            EROW[m] = E
        if k >= kw * 4:
            return
        real = k < K
        s = k // STEP
        b = (k % STEP) // BLOCK
        t = (k % BLOCK) // 4  # 0 or 2: this thread's words are positions t and t + 1
        w0 = s * 16 + t * 4 + b
        for h in range(2):
            l0 = uint32(0)
            l1 = uint32(0)
            l2 = uint32(0)
            for i in range(4):
                c = 4 * h + i
                x = (hv[c >> 1] >> uint32(16 * (c & 1))) & uint32(0xFFFF)
                a = fixed_point_one(x, E) if real and E != SPECIAL_ROW else int64(0)
                ap = uint32(a + int64(OFFSET))
                sh = uint32(8 * i)
                l0 |= (ap & uint32(0xFF)) << sh
                l1 |= ((ap >> uint32(8)) & uint32(0xFF)) << sh
                l2 |= ((ap >> uint32(16)) & uint32(0xFF)) << sh
            w = w0 + 4 * h
            P32[m * LIMBS, w] = l0
            P32[m * LIMBS + 1, w] = l1
            P32[m * LIMBS + 2, w] = l2

    return prepare_body


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


def _make_gemv_body(
    nct: int, warps: int = WARPS, prefetch_b: bool | None = None, act: ActFormat = BF16
):
    """``w4a16_gemv_exact`` with ``nct`` B column tiles (up to ``8 nct / 3`` activation rows)
    and ``warps`` warps a CTA splitting K (:func:`warps_for`); ``prefetch_b``: the next
    step's B in flight too (default: with one column tile only; a tuning knob); ``act``:
    the activation (and output) format, bf16 or fp16.

    Warp w takes steps ``w, w + W, ...``; the next step's weights and scales (and, with
    one column tile, its B operand) are in flight while one is multiplied: two
    register sets take turns, :func:`step` is called twice a loop so no set is copied.
    """
    THREADS = 32 * warps  # noqa: N806
    NACC = 4 * nct  # noqa: N806 - accumulators a lane: (tile, row g / g + 8, column 2t / 2t + 1)
    NCOLS = COLS * nct  # noqa: N806
    RED = ROWS_PER_CTA * NCOLS  # noqa: N806
    STEP_WORDS = lay.LANES * 4  # noqa: N806 - code words of one tile and step
    PREFETCH_B = nct == 1 if prefetch_b is None else prefetch_b  # noqa: N806 - few at M <= 2
    dc = device_contract(act)
    round_fixed, NAN = dc.round_fixed, dc.nan  # noqa: N806

    @cuda.jit(device=True, inline="always")
    def load_w(CODES, XS, qc, qx, wv, sv):  # noqa: N803
        """A step's code words (``qc``) and scale bytes (``qx``); returns the next indices."""
        wv[0], wv[1], wv[2], wv[3] = ld_stream_u32x4(CODES, qc)
        x = XS[qx]
        sv[0] = uint32(x & uint64(0xFFFFFFFF))  # row g's 4 scales, then row g + 8's
        sv[1] = uint32(x >> uint64(32))
        return uint32(qc + uint32(warps * STEP_WORDS)), uint32(qx + uint32(warps * 8))

    @cuda.jit(device=True, inline="always")
    def load_b(P32, pidx, bq):  # noqa: N803
        """A step's B words of each column tile (a zero column loads nothing); advances ``pidx``."""
        for c in range(nct):
            if pidx[c] >= 0:
                bq[4 * c], bq[4 * c + 1], bq[4 * c + 2], bq[4 * c + 3] = ld_u32x4(P32, pidx[c])
                pidx[c] = int32(pidx[c] + int32(warps * 16))

    @cuda.jit(device=True, inline="always")
    def mac(lut, t_lo, t_hi, wv, sv, bq, acc):
        """The step's 4 blocks times every column: ``acc += D * scale`` per block."""
        for b in range(4):
            a0, a1 = decode_codes(wv[b], t_lo, t_hi)  # rows g, g + 8: k 4t..4t+3 of block b
            sc_g = lut[(sv[0] >> uint32(8 * b)) & uint32(0xFF)]
            sc_8 = lut[(sv[1] >> uint32(8 * b)) & uint32(0xFF)]
            for c in range(nct):
                d0, d1, d2, d3 = mma_k16_s8u8(a0, a1, bq[4 * c + b], 0, 0, 0, 0)
                acc[4 * c] += mul_wide(d0, sc_g)
                acc[4 * c + 1] += mul_wide(d1, sc_g)
                acc[4 * c + 2] += mul_wide(d2, sc_8)
                acc[4 * c + 3] += mul_wide(d3, sc_8)

    @cuda.jit(device=True, inline="always")
    def step(CODES, XS, P32, lut, t_lo, t_hi, p, ns, qc, qx, pidx,  # noqa: N803
             wv, sv, bq, wn, sn, bn, acc):  # fmt: skip
        """Step ``p`` (operands in ``wv, sv, bq``) with step ``p + warps``'s loaded into ``wn, sn``
        (and ``bn`` at one column tile; with more, this step's B is loaded here, into ``bq``).
        Returns ``(p + warps, qc, qx)``."""
        pn = int32(p + int32(warps))
        if pn < ns:
            qc, qx = load_w(CODES, XS, qc, qx, wn, sn)
            if PREFETCH_B:
                load_b(P32, pidx, bn)
        if not PREFETCH_B:
            load_b(P32, pidx, bq)
        mac(lut, t_lo, t_hi, wv, sv, bq, acc)
        return pn, qc, qx

    def body(P32, EROW, CODES, XS, ZSUM, C, N, K, M, M0, GM, GE, GSPECIAL, GSIGN):  # noqa: N803
        lut = cuda.shared.array(256, int32)
        red = cuda.shared.array(RED, int64)
        acc = cuda.local.array(NACC, int64)
        wv = cuda.local.array(4, uint32)
        wn = cuda.local.array(4, uint32)
        sv = cuda.local.array(2, uint32)
        sn = cuda.local.array(2, uint32)
        bq = cuda.local.array(NACC, uint32)
        bn = cuda.local.array(NACC, uint32)
        pidx = cuda.local.array(nct, int32)
        tid = uint32(cuda.threadIdx.x)
        for i in range(tid, uint32(256), uint32(THREADS)):  # 256 entries, any CTA size
            lut[i] = scale_entry(i, GSIGN)
        for i in range(tid, uint32(RED), uint32(THREADS)):
            red[i] = int64(0)
        # the prmt tables in registers: blockIdx.y is 0 (a 1-D grid) but not a compile-time
        # constant, so the compiler keeps them instead of rematerialising both at every prmt
        y = uint32(cuda.blockIdx.y)
        t_lo = uint32(LUT_LO) | y
        t_hi = uint32(LUT_HI) | y
        warp = tid >> uint32(5)
        lane = tid & uint32(31)
        g = lane >> uint32(2)
        t = lane & uint32(3)
        tile = uint32(cuda.blockIdx.x)
        ns = int32((K + int32(STEP - 1)) // int32(STEP))  # steps (the last one padded)
        kw = int32(ns * int32(16))  # words a prepared limb row
        # running indices of the step to load next (step `warp` first); 32-bit (the launcher
        # refuses weights and operands these cannot index)
        qc = uint32((tile * uint32(ns) + warp) * uint32(STEP_WORDS) + lane * uint32(4))
        qx = uint32((tile * uint32(ns) + warp) * uint32(8) + g)
        for c in range(nct):
            col = int32(COLS * c) + int32(g)  # this lane's B column of tile c: limb l of row r
            r = col // LIMBS
            pr = (M0 + r) * LIMBS + col % LIMBS
            pidx[c] = int32(pr * kw + int32(warp * uint32(16) + t * uint32(4)))
            if r >= M:
                pidx[c] = int32(-1)
        for i in range(NACC):
            acc[i] = int64(0)
            bq[i] = uint32(0)
            bn[i] = uint32(0)
        cuda.syncthreads()  # the scale table, the zeroed sums
        p = int32(warp)
        if p < ns:
            qc, qx = load_w(CODES, XS, qc, qx, wv, sv)
        # the weights are the GEMV's own; the prepared operands (P32, EROW) are the
        # prepare's: launched with PDL, the GEMV may be here before the prepare has finished
        grid_dep_wait()
        if p < ns and PREFETCH_B:
            load_b(P32, pidx, bq)
        b2 = bn if PREFETCH_B else bq  # the second set's B: its own, or the one B set
        while p < ns:
            p, qc, qx = step(
                CODES, XS, P32, lut, t_lo, t_hi, p, ns, qc, qx, pidx, wv, sv, bq, wn, sn, bn, acc
            )
            if p >= ns:
                break
            p, qc, qx = step(
                CODES, XS, P32, lut, t_lo, t_hi, p, ns, qc, qx, pidx, wn, sn, b2, wv, sv, bq, acc
            )
        # the warps' sums -> shared memory (integer atomics: exact in any order)
        for c in range(nct):
            for q in range(4):
                col = COLS * c + 2 * int32(t) + (q & 1)
                if col < LIMBS * M:
                    r = g + uint32(8 * (q >> 1))
                    cuda.atomic.add(red, r * uint32(NCOLS) + uint32(col), acc[4 * c + q])
        cuda.syncthreads()
        row0 = tile * uint32(ROWS_PER_CTA)
        for idx in range(tid, uint32(ROWS_PER_CTA * MAX_M), uint32(THREADS)):
            r = idx // uint32(MAX_M)
            m = int32(idx % uint32(MAX_M))
            row = row0 + r
            if m < M and row < uint32(N):
                hsum = int64(0)
                lsum = uint64(0)
                for li in range(LIMBS):  # acc_0 + 2**8 acc_1 + 2**16 acc_2, as (hi, lo)
                    v = red[r * uint32(NCOLS) + uint32(LIMBS * m + li)]
                    hsum += (v >> int64(32)) << int64(8 * li)
                    lsum += uint64(v & int64(0xFFFFFFFF)) << uint64(8 * li)
                z = ZSUM[row]  # the offset: - 2**23 * (+-zsum); ZSUM_NAN: a NaN scale
                y_ = z if GSIGN != 0 else -z
                hsum += y_ >> int64(9)
                lsum += uint64(y_ & int64(511)) << uint64(23)
                hsum += int64(lsum >> uint64(32))
                lsum &= uint64(0xFFFFFFFF)
                e = EROW[M0 + m]
                if z == int64(ZSUM_NAN) or e == SPECIAL_ROW or GSPECIAL != 0:
                    C[m, row] = uint16(NAN)
                else:
                    pe = int64(e) - int64(FRAC_BITS + SCALE_LSB) + int64(GE)
                    C[m, row] = uint16(round_fixed(hsum * GM, lsum * uint64(GM), pe))

    return body


PREPARE_SIGNATURE = "void(uint16[:, ::1], uint32[:, ::1], int32[::1], int32)"
GEMV_SIGNATURE = (
    "void(uint32[::1], int32[::1], uint32[::1], uint64[::1], int64[::1], uint16[:, ::1], "
    "int32, int32, int32, int32, int64, int32, int32, int32)"
)
TILES = tile_counts(tiles_for, MAX_M)  # the column-tile counts of every build


@functools.cache
def prepare_kernel(act: ActFormat = BF16):
    """The compiled prepare (one CTA per row and span of ``8 * PREP_THREADS`` elements) for
    activations of format ``act``."""
    return cuda.jit(PREPARE_SIGNATURE)(_make_prepare_body(act))


@functools.cache
def _gemv_kernel(
    nct: int, warps: int = WARPS, prefetch_b: bool | None = None, act: ActFormat = BF16
):
    return cuda.jit(GEMV_SIGNATURE)(_make_gemv_body(nct, warps, prefetch_b, act))


def warps_for(n: int, k: int, m: int) -> int:
    """Warps a CTA of a launch of ``m`` rows on an N x K weight:
    :func:`q2gemv.cuda.exact_contract.cta_warps` on steps of 64 elements, with the knobs
    measured on this GPU (``tuning.json`` beside this module; the sweep it names). Any choice
    gives the same bits."""
    kn = tuning.knobs(str(Path(__file__).parent), "w4a16_gemv_exact")
    return cta_warps(plan.div_ceil(n, ROWS_PER_CTA), padded_k(k) // STEP, m, kn)


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of the builds for the PTX tests: every column-tile count at
    :data:`WARPS` in each activation format, and the other CTA sizes :func:`warps_for` can
    pick at the fewest and the most column tiles in bf16 (fp16 builds named with
    :func:`~q2gemv.cuda.exact_contract.act_suffix`). The rest are left out to keep CI short:
    the CTA size changes only loop bounds and the scale table's fill, the activation format
    only the final rounding."""
    specs = []
    for act in FORMATS:
        x = act_suffix(act)
        specs.append((f"w4a16_exact_prepare{x}", _make_prepare_body(act), PREPARE_SIGNATURE))
        for warps in CTA_WARPS if act == BF16 else (WARPS,):
            for nct in TILES:
                if warps != WARPS and nct not in (TILES[0], TILES[-1]):
                    continue
                name = f"w4a16_gemv_exact@c{nct}w{warps}{x}"
                specs.append((name, _make_gemv_body(nct, warps, None, act), GEMV_SIGNATURE))
    return specs


# -- host side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class W4Operands:
    """Activations converted once for any number of ``w4a16_gemv_exact`` calls.

    ``limbs`` uint32 [3 M, Kp / 4]: the three byte limbs of ``A_k + 2**23`` of each row
    in the B fragment order (:func:`limb_byte`), K padded to Kp (a multiple of 64);
    ``exponents`` int32 [M] (E_m, or ``SPECIAL_ROW``); ``act`` the activations' format
    (bf16 or fp16): the GEMV's output format too.
    """

    limbs: object
    exponents: object
    m: int
    k: int
    act: ActFormat = BF16

    @classmethod
    def allocate(cls, m: int, k: int, stream=0, act: ActFormat = BF16) -> W4Operands:
        check_k(k)
        return cls(
            cuda.device_array((LIMBS * m, padded_k(k) // 4), np.uint32, stream=stream),
            cuda.device_array((m,), np.int32, stream=stream),
            m,
            k,
            act,
        )

    def prepare_args(self, d_a) -> tuple:
        return (d_a, self.limbs, self.exponents, np.int32(self.k))


# The exact-family interface (q2gemv.cuda.runtime.launcher.ExactFamily); the kernel is the
# family spec's exact_kernel (q2gemv.dispatch.registry).
PREPARE = "w4a16_exact_prepare"
Operands = W4Operands
PREP_THREADS = 256  # the prepare's CTA: 2048 elements of a row per CTA


def prepare_launch(m: int, k: int, act: ActFormat = BF16) -> tuple:
    """``(kernel, grid, block)`` of the prepare for ``m`` rows of ``k`` activations of format
    ``act``: (row, span) CTAs."""
    threads = min(PREP_THREADS, plan.div_ceil(padded_k(k) // 8, 32) * 32)
    return prepare_kernel(act), (m, plan.div_ceil(padded_k(k) // 8, threads)), threads


def chunk_launches(ops, dw, d_out, rows_of) -> list[tuple]:
    return w4_launches(ops, dw, d_out, rows_of)


def check_k(k: int) -> None:
    if k % BLOCK or k < BLOCK:
        raise ValueError(f"a: w4a16_gemv_exact needs K a positive multiple of {BLOCK}, got {k}")
    if k > MAX_K:
        raise ValueError(f"a: w4a16_gemv_exact serves K <= {MAX_K}, got {k}")


def prepare_device(
    d_a, stream=0, ops: W4Operands | None = None, act: ActFormat = BF16
) -> W4Operands:
    """Run the prepare on device bits ``d_a`` (uint16 [M, K] of format ``act``); returns the
    operands."""
    from ..runtime import launcher

    return launcher.prepare_device("w4a16", d_a, stream, ops, act)


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

    ``rows_of``: the plan's ``(row0, rows)`` (:func:`q2gemv.dispatch.plan.check_chunks`:
    rows <= :data:`MAX_M`); None: chunks of :data:`MAX_M`.
    Validates before anything is launched: ``dw`` a DeviceNvfp4Weight of
    ``ops.k`` columns, ``d_out`` uint16 [M, N], the chunks, the 32-bit indices.
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
    codes, xscales, zsum = dw.exec_layout()
    plan.check_weight_halves("w4a16_gemv_exact", 2 * codes.size)
    if ops.limbs.size >= MAX_LIMB_WORDS:  # the kernel's 32-bit operand index
        raise ValueError(
            f"a: at most {MAX_LIMB_WORDS // LIMBS - 1} x 4 activation values (M * K, K padded "
            f"to {STEP}) per call, got M={ops.m}, K={ops.k}; split M"
        )
    gm, ge, special, sign = global_parts(dw.global_scale)
    grid = plan.div_ceil(dw.n, ROWS_PER_CTA)
    flat = ops.limbs.reshape(ops.limbs.size)
    xs = xscales.reshape(xscales.size).view(np.uint64)
    launches = []
    for r0, rows in plan.check_chunks(rows_of, ops.m, MAX_M):
        warps = warps_for(dw.n, dw.k, rows)
        launches.append(
            (
                _gemv_kernel(tiles_for(rows), warps, None, ops.act),
                grid,
                32 * warps,
                (flat, ops.exponents, codes, xs)
                + (zsum, d_out[r0 : r0 + rows], np.int32(dw.n), np.int32(dw.k))
                + (np.int32(rows), np.int32(r0), np.int64(gm), np.int32(ge))
                + (np.int32(special), np.int32(sign)),
            )
        )
    return launches

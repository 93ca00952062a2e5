"""numba.cuda kernels of the Q2_0 exact contract: int8 tensor cores, exact integer sums.

The contract is a value (:mod:`q2gemv.reference.exact`, ``docs/numerics.md``): any order
of the exact integer additions below gives the same bits, so the kernels may split K
and chunk M freely.

* ``exact_prepare`` — CTAs over (activation row m, span of :data:`PREP_THREADS` limb
  words of 4 codes), each finding ``E_m`` of its whole row (:data:`SPECIAL_ROW` for a
  row holding NaN/Inf), the fixed-point ``A_k`` as three unsigned byte limbs of
  ``A_k + 2**23`` (in ``[0, 2**24)``; three signed limbs cannot hold +255 * 2**15), and
  the sum of ``A_k`` over each unit of :data:`UNIT` codes. Once per activation batch,
  shareable by every GEMV on that input (:class:`ExactOperands`).
* ``q2_0_gemv_exact`` — 16 weight rows per CTA of :data:`WARPS` warps (:func:`warps_for`),
  on the weight's execution layout (:mod:`q2gemv.formats.q2_0_layout`); warp w of W
  takes the steps of 128 codes w, w + W, ..., the next step's operands in flight. One
  16-byte load per lane and step brings the warp 16 x 128 codes: per unit of 64 codes,
  lane (g, t) (g = lane / 4, t = lane % 4) holds word t of rows g and g + 8;
  ``(word >> 2j) & 0x03030303`` puts 4 codes in the bytes of a register, the A operand
  of ``mma.m16n8k32`` (u8 x u8 -> s32) as is. The order of k within a block is free
  (integer sums), so the prepared limbs use the same permutation: byte ``4i + b`` of
  word w holds code ``16w + 4b + i``.

  B tile j's 8 columns are activation rows 2j (columns 0-3) and 2j + 1 (columns 4-7):
  limbs 0, 1, 2 and a column of ones (the block's code sum). Lane (g, t) ends a block
  with columns 2t, 2t + 1 of weight rows g and g + 8, weighs them (1 and 2**8, or 2**16
  and -2**23) into one partial per row, keeps weight row g + 8 * (t % 2) and swaps the
  other with lane t ^ 1::

      S = C0 + 2**8 C1 + 2**16 C2 - 2**23 * sum(codes) - sum(A)   # sum_k (code - 1) A_k

  exact in 32 bits (``|S| < 2**31``). ``S * mantissa(d_b)`` is shifted by the scale's
  exponent into a split accumulator (``hi * 2**32 + lo``, exact for any K); the warps'
  accumulators are summed in shared memory and rounded once (``round_fixed`` of
  :func:`~q2gemv.cuda.exact_contract.device_contract`). With K split across CTAs
  (``gridDim.y`` parts, :func:`parts_for`; off on the H200, where it measured slower),
  each CTA adds its exact sums into a workspace by 64-bit integer atomics and the last
  part of a row tile to finish rounds them.

The activation format (bf16 or fp16, :mod:`q2gemv.formats.act`) is a build parameter of
both kernels (the prepare reads it, the GEMV rounds to it); the operands carry it
(:class:`ExactOperands`), so a launch picks the builds of its format.

The GEMV may start under programmatic dependent launch
(:mod:`q2gemv.cuda.runtime.prebound`) and waits (``grid_dep_wait``) before it reads the
prepared operands. Up to :data:`MAX_M` rows per launch (builds of 1, 2 or 4 B tiles of
2 rows); the launcher chunks more, which changes no bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numba import cuda, int32, int64, types, uint16, uint32, uint64

from ...dispatch import plan, registry
from ...formats import q2_0 as fmt
from ...formats import q2_0_layout as lay
from ...formats.act import BF16, FORMATS, ActFormat
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
    mma_u8,
    mul_wide,
    shfl_xor,
)

PREP_THREADS = 256  # limb words (4 codes each: 1024 codes) per prepare CTA; a multiple of 32
CTA_WARPS = (NARROW_WARPS, WARPS, WIDE_WARPS)  # every CTA size warps_for can pick (8 usual)
ROWS_PER_CTA = registry.get("q2_0_gemv_exact").rows_per_cta  # 16: one m16 tile of weight rows
MAX_M = registry.Q2_EXACT_MAX_M  # activation rows per chunk of a call (32: see there)
BUILD_MAX_M = 8  # activation rows one launch of an unbatched build serves (1, 2 or 4 B tiles)
UNIT = registry.Q2_EXACT_UNIT  # codes per unit: one activation sum per unit
LIMBS = 3  # byte limbs of A_k + 2**23
ZERO_COL, ONES_COL = -1, -2  # B columns that load nothing: zeros, and ones (the code sums)
SCALE_LSB = 24  # fp16 scales in units of 2**-24
CODE_MASK = 0x03030303
ONES = 0x01010101
MAX_LIMB_WORDS = 2**31  # the GEMV indexes the prepared limbs (3 M K / 4 words) with int32

_device = cuda.jit(device=True, inline="always")


# -- device helpers (plain integer code: identical on the GPU and in the simulator) --


@_device
def scale_parts(h):
    """fp16 bits -> ``(mantissa, shift, negative)``: ``|d| = mant * 2**(shift - 24)``.

    A non-finite scale (exponent field 31) is the caller's to catch.
    """
    h = uint32(h)
    e = int32((h >> uint32(10)) & uint32(31))
    f = int32(h & uint32(1023))
    mant = f | int32(1024) if e > 0 else f
    return int32(mant), int32(max(e, int32(1)) - int32(1)), (h & uint32(0x8000)) != 0


@_device
def acc_add(acc_hi, acc_lo, i, p, sh):
    """``acc_hi[i] * 2**32 + acc_lo[i] += p * 2**sh`` exactly (|p| < 2**43, 0 <= sh <= 29).

    ``acc_lo`` takes the low 32 bits of each term (unsigned, no carries kept),
    ``acc_hi`` the rest (an arithmetic shift is a floor): exact for 2**31
    terms, far more than any K gives.
    """
    pl = uint64(p & int64(0xFFFFFFFF))
    acc_lo[i] += (pl << uint64(sh)) & uint64(0xFFFFFFFF)
    acc_hi[i] += p >> int64(int64(32) - int64(sh))


# -- K split across CTAs: the parts' exact sums in a workspace (3 int64 words an output) ---


@_device
def split_add(WS, i3, hsum, lsum, flag):  # noqa: N803
    """One part's exact sum of an output (``hsum * 2**32 + lsum``, units of the accumulators)
    and its non-finite-scale flag into the output's words ``WS[i3 .. i3 + 2]``: integer
    atomics, exact in any order."""
    cuda.atomic.add(WS, i3, hsum)
    cuda.atomic.add(WS, i3 + 1, int64(lsum))
    if flag != 0:
        cuda.atomic.add(WS, i3 + 2, int64(1))


@_device
def last_part(CNT, i, parts, s_last):  # noqa: N803
    """Called by every thread of a CTA after its :func:`split_add`: is this CTA the last of the
    ``parts`` sharing counter ``CNT[i]`` to finish? Then every part's sums are in ``WS`` and
    visible to it (fences on both sides of the counter)."""
    cuda.threadfence()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        s_last[0] = int32(cuda.atomic.add(CNT, i, int32(1)) == parts - int32(1))
    cuda.syncthreads()
    if s_last[0] == 0:
        return False
    cuda.threadfence()
    return True


@_device
def split_take(WS, i3):  # noqa: N803
    """An output's complete sum ``(hsum, lsum, flag)`` out of ``WS``, leaving its words zero for
    the next launch (the last part only)."""
    hsum = cuda.atomic.exch(WS, i3, int64(0))
    lsum = uint64(cuda.atomic.exch(WS, i3 + 1, int64(0)))
    flag = int32(cuda.atomic.exch(WS, i3 + 2, int64(0)) != 0)
    return hsum, lsum, flag


@_device
def split_reset(CNT, i):  # noqa: N803
    """The last part leaves counter ``CNT[i]`` zero for the next launch."""
    if cuda.threadIdx.x == 0:
        cuda.atomic.exch(CNT, i, int32(0))


# -- kernels ---------------------------------------------------------------------


def make_finish(act: ActFormat = BF16):
    """The device function that writes output (``m``, ``row``) of a launch from its exact sum
    ``hsum * 2**32 + lsum`` (units of ``2**(E_m - 46)``), rounded once to ``act``; NaN for a
    flagged (non-finite scale) sum or a special activation row. Shared by the GEMV builds."""
    dc = device_contract(act)
    round_fixed, nan = dc.round_fixed, dc.nan

    @cuda.jit(device=True, inline="always")
    def finish(C, EROW, hsum, lsum, flag, row, m, M0):  # noqa: N803
        e = EROW[M0 + m]
        if flag != 0 or e == SPECIAL_ROW:
            C[m, row] = uint16(nan)
        else:
            pe = int64(e) - int64(FRAC_BITS + SCALE_LSB)
            C[m, row] = uint16(round_fixed(hsum, lsum, pe))

    return finish


def _make_prepare_body(act: ActFormat = BF16):
    """``exact_prepare`` for activations of format ``act`` (bf16 or fp16)."""
    dc = device_contract(act)
    fixed_point_one, row_exponent = dc.fixed_point_one, dc.row_exponent

    def prepare_body(A, P32, ASUM, EROW, K):  # noqa: N803
        """Activation row ``blockIdx.x``, span ``blockIdx.y`` of ``blockDim.x`` limb words.

        Every CTA of the row finds E_m itself (:func:`row_exponent` over the whole
        row: the row is read once from DRAM, then from L2), so the spans need no
        second pass; then thread ``tid`` makes limb word ``q = blockIdx.y *
        blockDim.x + tid`` of each limb row: codes ``16 w + 4 b + i`` (``w = q //
        4``, ``i = q % 4``, byte ``b``), and the 16 threads of a unit of 64 codes
        sum its A by a butterfly. Four codes a thread keep the dependent chain
        short: at K = 4096 this prepare is latency, not work.
        """
        s_lg = cuda.shared.array(32, int32)
        grid_dep_launch()  # the GEMV may start now; it waits (grid_dep_wait) for this to finish
        m = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        nq = K // 4
        q = cuda.blockIdx.y * cuda.blockDim.x + tid
        # (a thread past K converts a copy of the last word, stores nothing)
        w = min(q, nq - 1) >> 2
        hv = cuda.local.array(8, uint32)  # this thread's 16-code word, loaded before the row's
        hv[0], hv[1], hv[2], hv[3] = ld_bf16x8(A, m, w * 16)  # maximum so that both loads fly
        hv[4], hv[5], hv[6], hv[7] = ld_bf16x8(A, m, w * 16 + 8)  # together
        E = row_exponent(A, s_lg, K)  # noqa: N806
        if tid == 0 and cuda.blockIdx.y == 0:
            EROW[m] = E
        total = int32(0)
        odd = (q & 1) != 0
        hi = (q & 2) != 0
        l0 = uint32(0)
        l1 = uint32(0)
        l2 = uint32(0)
        for b in range(4):  # code 4 b + i: byte b of each limb word
            x = hv[2 * b + 1] if hi else hv[2 * b]
            h = (x >> uint32(16)) if odd else (x & uint32(0xFFFF))
            a = int64(0) if E == SPECIAL_ROW else fixed_point_one(h, E)
            total += int32(a)
            ap = uint32(a + int64(OFFSET))
            sh = uint32(8 * b)
            l0 |= (ap & uint32(0xFF)) << sh
            l1 |= ((ap >> uint32(8)) & uint32(0xFF)) << sh
            l2 |= ((ap >> uint32(16)) & uint32(0xFF)) << sh
        if q < nq:
            P32[m * LIMBS, q] = l0
            P32[m * LIMBS + 1, q] = l1
            P32[m * LIMBS + 2, q] = l2
        for off in (1, 2, 4, 8):  # a unit's 16 limb words are 16 aligned lanes (K % 64 == 0)
            total += int32(shfl_xor(total, off))
        if q < nq and q % 16 == 0:
            ASUM[m, q // 16] = total

    return prepare_body


def tiles_for(m: int) -> int:
    """B tiles (8 columns = 2 activation rows) an unbatched launch of ``m`` rows
    (1..:data:`BUILD_MAX_M`) is built with."""
    if not 1 <= m <= BUILD_MAX_M:
        raise ValueError(
            f"m: an unbatched q2_0_gemv_exact build serves 1..{BUILD_MAX_M} rows, got {m}"
        )
    return 1 << (m - 1).bit_length() >> 1 if m > 1 else 1


TILES = tile_counts(tiles_for, BUILD_MAX_M)  # the B tile counts of every unbatched build


def _make_q2_body(nt: int, group: int, warps: int = WARPS, act: ActFormat = BF16):
    """``q2_0_gemv_exact`` with ``nt`` B tiles (up to ``2 * nt`` activation rows) for ``group``,
    ``warps`` warps a CTA splitting K (:func:`warps_for`), rounding to ``act`` (bf16 or fp16);
    the operand map is the module's.

    B tile j, column c: activation row 2j + c // 4 and, for c % 4 = 0, 1, 2, its limb
    c % 4; c % 4 = 3 is the column of ones. Lane (g, t) holds limbs 0, 1 (t even) or limb
    2 and the code sum (t odd) of activation row 2j + t // 2 for weight rows g and g + 8;
    one exchange with lane t ^ 1 gives it one exact block sum for weight row
    ``g + 8 * (t % 2)`` per tile.
    """
    MM = 2 * nt  # noqa: N806 - activation rows per launch at most
    WARPS = warps  # noqa: N806 - this build's warps a CTA
    THREADS = 32 * warps  # noqa: N806
    RED = WARPS * ROWS_PER_CTA * MM  # noqa: N806
    FLAGS = WARPS * ROWS_PER_CTA  # noqa: N806
    BPS = (lay.UNIT * lay.STEP_UNITS) // group  # noqa: N806 - blocks per step (2 at g64, 1 at g128)
    UPB = group // UNIT  # noqa: N806 - units per block
    NB = 4 * lay.STEP_UNITS * nt  # noqa: N806 - B registers held: (unit, tile, 4)
    NC = 4 * nt  # noqa: N806 - C registers: (tile, 4)
    NAV = lay.STEP_UNITS * nt  # noqa: N806 - unit sums held: (unit, tile)
    STEP_WORDS = lay.LANES * lay.WORDS_PER_LANE  # noqa: N806
    # B operands of the next step in flight too, at M <= 2 only: at M = 4 / 8 their
    # registers cost occupancy (measured: docs/design_notes.md)
    PREFETCH_B = nt == 1  # noqa: N806
    QS_STRIDE = WARPS * BPS * ROWS_PER_CTA  # noqa: N806 - scale index advance per load
    PIDX_STRIDE = WARPS * lay.STEP_UNITS * 16  # noqa: N806 - limb-word index advance per load
    TAIL = group == 64  # noqa: N806 - K may be an odd number of units (a half last step)

    @cuda.jit(device=True, inline="always")
    def load_w(CODES, SCALES, qc, qs, p, nb, wv, sv):  # noqa: N803
        """Step ``p``'s codes and scales (``qc``, ``qs`` index them); returns the indices
        of step ``p + WARPS``."""
        wv[0], wv[1], wv[2], wv[3] = ld_stream_u32x4(CODES, qc)
        for i in range(BPS):
            si = uint32(qs + uint32(ROWS_PER_CTA * i))
            if TAIL:  # the second block of a last, half step does not exist: scale 0
                ok = int32(p * int32(BPS) + int32(i)) < nb
                sv[i] = uint32(SCALES[si]) if ok else uint32(0)
            else:
                sv[i] = uint32(SCALES[si])
        return uint32(qc + uint32(WARPS * STEP_WORDS)), uint32(qs + uint32(QS_STRIDE))

    @cuda.jit(device=True, inline="always")
    def load_b(P32, ASUM, pidx, aidx, bload, p, nu, bq, av):  # noqa: N803
        """Step ``p``'s B operand of each tile and unit sums (``pidx``, ``aidx`` index them).

        Lanes of the constant columns (ones, zeros) load nothing: their B
        registers keep the value :func:`fill_b` gave them before the loop (the load
        pipe bounds the kernel when every lane loads its column). A
        unit past K (the padded half of a last step) loads nothing either: its
        codes are 0, so its block sum is 0 whatever B holds. Then ``pidx`` and
        ``aidx`` move to step ``p + WARPS``.
        """
        for v in range(lay.STEP_UNITS):
            here = True
            if TAIL:
                here = int32(p * int32(lay.STEP_UNITS) + int32(v)) < nu
            for j in range(nt):
                o = 4 * (v * nt + j)
                if bload[j] and here:  # (64-bit sums: unit 1's loads reuse unit 0's address)
                    pi = int64(pidx[j]) + int64(16 * v)
                    bq[o], bq[o + 1], bq[o + 2], bq[o + 3] = ld_u32x4(P32, pi)
                av[v * nt + j] = ASUM[uint64(aidx[j]) + uint64(v)] if here else int32(0)
        for j in range(nt):  # constant columns never read their pidx
            pidx[j] = int32(pidx[j] + int32(PIDX_STRIDE))
            aidx[j] = uint32(aidx[j] + uint32(WARPS * lay.STEP_UNITS))

    @cuda.jit(device=True, inline="always")
    def fill_b(pidx, bq):
        """The constant B columns: ones (the code sums) or zeros (rows past M)."""
        for v in range(lay.STEP_UNITS):
            for j in range(nt):
                fill = uint32(ONES) if pidx[j] == ONES_COL else uint32(0)
                for i2 in range(4):
                    bq[4 * (v * nt + j) + i2] = fill

    @cuda.jit(device=True, inline="always")
    def mac_block(t, wv, v0, s16, bq, av, cf, acc_hi, acc_lo):
        """Units ``v0 .. v0 + UPB`` of the step (one block) times every activation row."""
        for i in range(NC):
            cf[i] = int32(0)
        for v in range(v0, v0 + UPB):
            wa = wv[2 * v]
            wb = wv[2 * v + 1]
            for s in range(2):
                a0 = (wa >> uint32(4 * s)) & uint32(CODE_MASK)
                a2 = (wa >> uint32(4 * s + 2)) & uint32(CODE_MASK)
                a1 = (wb >> uint32(4 * s)) & uint32(CODE_MASK)
                a3 = (wb >> uint32(4 * s + 2)) & uint32(CODE_MASK)
                for j in range(nt):
                    o = 4 * (v * nt + j)
                    cf[4 * j], cf[4 * j + 1], cf[4 * j + 2], cf[4 * j + 3] = mma_u8(
                        a0,
                        a1,
                        a2,
                        a3,
                        bq[o + 2 * s],
                        bq[o + 2 * s + 1],
                        cf[4 * j],
                        cf[4 * j + 1],
                        cf[4 * j + 2],
                        cf[4 * j + 3],
                    )
        mant, sh, neg = scale_parts(s16)
        smant = int32(-mant) if neg else mant  # the scale's sign rides on its mantissa
        # Lane t even holds limbs 0, 1 of weight rows g (c0, c1) and g + 8 (c2, c3); its
        # partner t ^ 1 holds limb 2 and the code sum of the same rows. Each lane weighs its
        # two columns (1, 2**8 or 2**16, -2**23), keeps the part of its own row rl and sends
        # the other: one exchange. 32-bit wrapping sums: only the total need fit (|S| < 2**31).
        odd = (t & uint32(1)) != 0
        w_lo = uint32(1 << 16) if odd else uint32(1)
        w_hi = uint32((1 << 32) - (1 << 23)) if odd else uint32(1 << 8)
        for j in range(nt):
            pg = uint32(uint32(cf[4 * j]) * w_lo + uint32(cf[4 * j + 1]) * w_hi)
            p8 = uint32(uint32(cf[4 * j + 2]) * w_lo + uint32(cf[4 * j + 3]) * w_hi)
            x = uint32(shfl_xor(int32(pg if odd else p8), 1))
            asum = int32(0)
            for v in range(v0, v0 + UPB):
                asum += av[v * nt + j]
            s_ = int32(uint32((p8 if odd else pg) + x) - uint32(asum))  # sum_k (code - 1) A_k
            acc_add(acc_hi, acc_lo, j, mul_wide(s_, smant), sh)

    @cuda.jit(device=True, inline="always")
    def step(CODES, SCALES, P32, ASUM, p, pend, nu, nb, t, qc, qs, pidx, aidx, bload,  # noqa: N803
             wv, sv, bq, av, wn, sn, bn, an, cf, acc_hi, acc_lo):  # fmt: skip
        """Step ``p`` (operands in ``wv, sv, bq, av``) times every activation row, with step
        ``p + WARPS``'s operands loaded into ``wn, sn, bn, an`` meanwhile if it is before
        ``pend`` (the end of the CTA's part of K; at M <= 2; above, this step's B is loaded
        here, into ``bq, av``). Returns ``(p + WARPS, qc, qs, bad)``: the next step, the
        advanced weight indices, a NaN/Inf scale seen.
        """
        pn = int32(p + int32(WARPS))
        if pn < pend:  # the next step's operands in flight while this one is multiplied
            qc, qs = load_w(CODES, SCALES, qc, qs, pn, nb, wn, sn)
            if PREFETCH_B:
                load_b(P32, ASUM, pidx, aidx, bload, pn, nu, bn, an)
        if not PREFETCH_B:  # one B set (its registers cost occupancy), loaded for this step
            load_b(P32, ASUM, pidx, aidx, bload, p, nu, bq, av)
        bad = False
        for i in range(BPS):
            mac_block(t, wv, i * UPB, sv[i], bq, av, cf, acc_hi, acc_lo)
            bad = bad or (sv[i] & uint32(0x7C00)) == uint32(0x7C00)
        return pn, qc, qs, bad

    finish = make_finish(act)

    def body(P32, ASUM, EROW, CODES, SCALES, C, WS, CNT, N, K, M, M0):  # noqa: N803
        red_hi = cuda.shared.array(RED, int64)
        red_lo = cuda.shared.array(RED, uint64)
        s_bad = cuda.shared.array(FLAGS, int32)
        s_last = cuda.shared.array(1, int32)
        acc_hi = cuda.local.array(nt, int64)
        acc_lo = cuda.local.array(nt, uint64)
        cf = cuda.local.array(NC, int32)
        bq = cuda.local.array(NB, uint32)
        av = cuda.local.array(NAV, int32)
        wv = cuda.local.array(4, uint32)
        wn = cuda.local.array(4, uint32)
        sv = cuda.local.array(BPS, uint32)
        sn = cuda.local.array(BPS, uint32)
        bn = cuda.local.array(NB, uint32)
        an = cuda.local.array(NAV, int32)
        tid = uint32(cuda.threadIdx.x)
        warp = tid >> uint32(5)
        lane = tid & uint32(31)
        g = lane >> uint32(2)
        t = lane & uint32(3)
        tile = uint32(cuda.blockIdx.x)
        row0 = tile * uint32(ROWS_PER_CTA)
        n_rows = uint32(N)
        nu = int32(K // UNIT)
        nb = int32(K // group)
        ns = int32((nu + int32(1)) >> int32(1))
        # this CTA's part of K (blockIdx.y of gridDim.y): steps p0 .. p1 - 1
        parts = int32(cuda.gridDim.y)
        spl = (ns + parts - int32(1)) // parts
        p0 = int32(cuda.blockIdx.y) * spl
        p1 = int32(min(p0 + spl, ns))
        rl = g + uint32(8) * (t & uint32(1))  # the weight row (in the tile) this lane sums
        # running indices of the step to load next (step `warp` first); each load adds WARPS steps
        # (32-bit: the launcher caps the weight at 2**32 halves, so every index fits; a 32-bit
        # index costs one add and one IMAD.WIDE a load where a 64-bit one costs four)
        pw = uint32(p0) + warp  # the warp's first step
        qc = uint32((tile * uint32(ns) + pw) * uint32(STEP_WORDS) + lane * uint32(4))
        qs = uint32((tile * uint32(nb) + pw * uint32(BPS)) * uint32(ROWS_PER_CTA) + rl)
        pidx = cuda.local.array(nt, int32)
        aidx = cuda.local.array(nt, uint32)
        for j in range(nt):
            # column g of tile j: a limb row of the prepared operand, or ones / zeros
            m = 2 * j + int32(g >> uint32(2))
            c = int32(g & uint32(3))
            pr = (M0 + m) * LIMBS + c
            u0 = pw * uint32(lay.STEP_UNITS)
            pidx[j] = int32(pr * int32(K >> 2) + int32((u0 * uint32(4) + t) * uint32(4)))
            if c == 3:
                pidx[j] = int32(ONES_COL)
            elif m >= M:
                pidx[j] = int32(ZERO_COL)
            # this lane's activation row of tile j, for the unit sums (rows past M read row M-1)
            mc = min(uint32(2 * j) + (t >> uint32(1)), uint32(M - 1))
            aidx[j] = uint32((uint32(M0) + mc) * uint32(nu) + u0)
        for i in range(nt):
            acc_hi[i] = int64(0)
            acc_lo[i] = uint64(0)
        bad = False
        fill_b(pidx, bq)
        bload = cuda.local.array(nt, types.boolean)
        for j in range(nt):
            bload[j] = pidx[j] >= 0  # this lane's column of tile j is a limb row
        if PREFETCH_B:
            fill_b(pidx, bn)
        # Two register sets (wv/sv/bq/av and wn/sn/bn/an) take turns: step() is called
        # twice a loop so that no step copies one set into the other.
        p = int32(pw)
        if p < p1:
            qc, qs = load_w(CODES, SCALES, qc, qs, p, nb, wv, sv)
        # the weights are the GEMV's own; the prepared operands (P32, ASUM, EROW) are the
        # prepare's: launched with PDL, the GEMV may be here before the prepare has finished
        grid_dep_wait()
        if p < p1 and PREFETCH_B:
            load_b(P32, ASUM, pidx, aidx, bload, p, nu, bq, av)
        b2 = bn if PREFETCH_B else bq  # the second set's B: its own, or the one B set
        a2 = an if PREFETCH_B else av
        while p < p1:
            p, qc, qs, bad1 = step(
                CODES, SCALES, P32, ASUM, p, p1, nu, nb, t, qc, qs, pidx, aidx, bload,
                wv, sv, bq, av, wn, sn, bn, an, cf, acc_hi, acc_lo,
            )  # fmt: skip
            bad = bad or bad1
            if p >= p1:
                break
            p, qc, qs, bad1 = step(
                CODES, SCALES, P32, ASUM, p, p1, nu, nb, t, qc, qs, pidx, aidx, bload,
                wn, sn, b2, a2, wv, sv, bq, av, cf, acc_hi, acc_lo,
            )  # fmt: skip
            bad = bad or bad1
        # the warps' partial sums -> shared memory -> one rounding per output
        for j in range(nt):
            slot = (warp * uint32(ROWS_PER_CTA) + rl) * uint32(MM) + uint32(2 * j) + (t >> 1)
            red_hi[slot] = acc_hi[j]
            red_lo[slot] = acc_lo[j]
        if t < 2:
            s_bad[warp * uint32(ROWS_PER_CTA) + rl] = int32(1) if bad else int32(0)
        cuda.syncthreads()
        for idx in range(tid, uint32(ROWS_PER_CTA * MM), uint32(THREADS)):
            r = idx // uint32(MM)
            m = idx % uint32(MM)
            row = row0 + r
            if m < uint32(M) and row < n_rows:
                hsum = int64(0)
                lsum = uint64(0)
                flag = int32(0)
                for w in range(WARPS):
                    slot = (uint32(w * ROWS_PER_CTA) + r) * uint32(MM) + m
                    hsum += red_hi[slot]
                    lsum += red_lo[slot]
                    flag |= s_bad[uint32(w * ROWS_PER_CTA) + r]
                if parts == 1:
                    finish(C, EROW, hsum, lsum, flag, row, m, M0)
                else:  # this part's exact sum into the launch's (3 words an output)
                    split_add(WS, (row * uint32(M) + m) * uint32(3), hsum, lsum, flag)
        if parts == 1:
            return
        # The last part of this row tile to finish rounds every output (its sums are then
        # complete) and leaves WS and CNT zero for the next launch.
        if not last_part(CNT, tile, parts, s_last):
            return
        for idx in range(tid, uint32(ROWS_PER_CTA * MM), uint32(THREADS)):
            r = idx // uint32(MM)
            m = idx % uint32(MM)
            row = row0 + r
            if m < uint32(M) and row < n_rows:
                hsum, lsum, flag = split_take(WS, (row * uint32(M) + m) * uint32(3))
                finish(C, EROW, hsum, lsum, flag, row, m, M0)
        split_reset(CNT, tile)

    return body


PREPARE_SIGNATURE = "void(uint16[:, ::1], uint32[:, ::1], int32[:, ::1], int32[::1], int32)"
Q2_SIGNATURE = (
    "void(uint32[::1], int32[::1], int32[::1], uint32[::1], uint16[::1], uint16[:, ::1], "
    "int64[::1], int32[::1], int32, int32, int32, int32)"
)


@functools.cache
def _prepare_kernel(act: ActFormat = BF16):
    return cuda.jit(PREPARE_SIGNATURE)(_make_prepare_body(act))


@functools.cache
def _q2_kernel(nt: int, group: int, warps: int = WARPS, act: ActFormat = BF16):
    return cuda.jit(Q2_SIGNATURE)(_make_q2_body(nt, group, warps, act))


def _rule_inputs(n: int, k: int) -> tuple[dict, int, int]:
    """``(knobs, row tiles, steps of 128 codes)`` of an N x K weight, what the launch rules
    read: the knobs measured on this GPU (``tuning.json`` beside this module)."""
    kn = tuning.knobs(str(Path(__file__).parent), "q2_0_gemv_exact")
    return kn, plan.div_ceil(n, ROWS_PER_CTA), plan.div_ceil(k // UNIT, lay.STEP_UNITS)


def warps_for(n: int, k: int, m: int) -> int:
    """Warps a CTA of a ``q2_0_gemv_exact`` launch of ``m`` rows on an N x K weight:
    :func:`q2gemv.cuda.exact_contract.cta_warps` on steps of 128 codes, with the knobs measured
    on this GPU (``tuning.json`` beside this module; the sweep it names). Any choice gives
    the same bits."""
    kn, tiles, steps = _rule_inputs(n, k)
    return cta_warps(tiles, steps, m, kn)


def batched_for(n: int, k: int, m: int) -> bool:
    """Whether a chunk of ``m`` rows on an N x K weight runs as one launch of the batched build
    (:mod:`q2gemv.cuda.q2_0.exact_batched`, one pass over the weights for up to 32 rows)
    rather than as launches of :data:`BUILD_MAX_M` rows: for more than :data:`BUILD_MAX_M`
    rows on a weight of at least ``batched_min_tiles`` row tiles, or of at least
    ``batched_min_tiles_long_k`` with at least ``batched_long_k_steps`` steps of 128 codes
    (knobs in ``tuning.json`` beside this module, measured: on smaller weights the 8-row
    launches were faster). Either gives the same bits."""
    if m <= BUILD_MAX_M:
        return False
    kn, tiles, steps = _rule_inputs(n, k)
    if tiles >= kn["batched_min_tiles"]:
        return True
    return tiles >= kn["batched_min_tiles_long_k"] and steps >= kn["batched_long_k_steps"]


def parts_for(n: int, k: int, m: int, warps: int) -> int:
    """The parts a ``q2_0_gemv_exact`` launch of ``m`` rows on an N x K weight splits K into,
    across CTAs (``gridDim.y``): 1, unless the grid of row tiles is smaller than the knob
    ``split_below_tiles``; then enough parts to bring it to about ``target_ctas`` CTAs, each
    part keeping at least ``min_steps_per_warp`` steps of 128 codes for each of the ``warps``
    warps. The knobs are measured per GPU (``tuning.json`` beside this module,
    :mod:`q2gemv.cuda.runtime.tuning`). Any choice gives the same bits: the parts' sums are
    exact integers, added by integer atomics."""
    kn, tiles, steps = _rule_inputs(n, k)
    if tiles >= kn["split_below_tiles"] or m > kn["split_max_m"]:
        return 1
    most = steps // (warps * kn["min_steps_per_warp"])
    return max(1, min(plan.div_ceil(kn["target_ctas"], tiles), most))


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of the builds for the PTX tests: every M group and Q2_0 group
    at :data:`WARPS` in each activation format, and the other CTA sizes :func:`warps_for` can
    pick at every M group in bf16 and group 128 (fp16 builds named with :func:`act_suffix`).
    The rest are left out to keep CI short: the CTA size changes only loop bounds and one
    shared array's size, the group the weight loop (covered at 8 warps), the activation
    format only the final rounding."""
    specs = []
    for act in FORMATS:
        x = act_suffix(act)
        specs.append((f"exact_prepare{x}", _make_prepare_body(act), PREPARE_SIGNATURE))
        specs += [
            (f"q2_0_gemv_exact@m{2 * nt}g{group}{build_suffix(warps)}{x}",
             _make_q2_body(nt, group, warps, act), Q2_SIGNATURE)
            for warps in (CTA_WARPS if act == BF16 else (WARPS,))
            for group in fmt.GROUPS
            for nt in TILES
            if warps == WARPS or group == 128
        ]  # fmt: skip
    return specs


def build_suffix(warps: int) -> str:
    """The part of a build's PTX name that gives its CTA size (none for :data:`WARPS`)."""
    return "" if warps == WARPS else f"w{warps}"


# -- host side -------------------------------------------------------------------


@dataclass(frozen=True)
class ExactOperands:
    """Activations converted once (:func:`prepare_device`) for any number of exact GEMVs.

    ``limbs`` uint32 [3M, K/4]: the three byte-limb rows of each activation
    row in kernel order;
    ``unit_sums`` int32 [M, K/64]; ``exponents`` int32 [M] (E_m, or
    :data:`SPECIAL_ROW`); ``act`` the activations' format (bf16 or fp16): the GEMV's
    output format too.
    """

    limbs: object
    unit_sums: object
    exponents: object
    m: int
    k: int
    act: ActFormat = BF16
    _split: dict = field(default_factory=dict, compare=False, repr=False)

    def split_workspace(self, words: int, counters: int) -> tuple:
        """``(WS, CNT)``: zeroed int64 [``words``] and int32 [``counters``] device arrays for a
        launch whose CTAs sum exact partials across a K split (each launch leaves them zero
        again). Made at the first call of each size and kept: later calls allocate nothing
        (graph capture)."""
        key = (words, counters)
        ws = self._split.get(key)
        if ws is None:
            ws = self._split[key] = (
                cuda.to_device(np.zeros(words, np.int64)),
                cuda.to_device(np.zeros(counters, np.int32)),
            )
        return ws

    @classmethod
    def allocate(cls, m: int, k: int, stream=0, act: ActFormat = BF16) -> ExactOperands:
        check_k(k)
        return cls(
            cuda.device_array((LIMBS * m, k // 4), np.uint32, stream=stream),
            cuda.device_array((m, k // UNIT), np.int32, stream=stream),
            cuda.device_array((m,), np.int32, stream=stream),
            m,
            k,
            act,
        )

    def prepare_args(self, d_a) -> tuple:
        """``exact_prepare``'s arguments for activation bits ``d_a`` (uint16 [M, K], ``act``)."""
        return (d_a, self.limbs, self.unit_sums, self.exponents, np.int32(self.k))


# The exact-family interface (q2gemv.cuda.runtime.launcher.ExactFamily), served to the launcher
# by q2gemv.cuda.q2_0.exact_launch; the kernel is the family spec's exact_kernel.
PREPARE = "exact_prepare"
Operands = ExactOperands


def prepare_launch(m: int, k: int, act: ActFormat = BF16) -> tuple:
    """``(kernel, grid, block)`` of ``exact_prepare`` for ``m`` rows of ``k`` activations of
    format ``act``: (row, span) CTAs."""
    threads = prepare_threads(k)
    return _prepare_kernel(act), (m, plan.div_ceil(k // 4, threads)), threads


def chunk_launches(ops, dw, d_out, rows_of) -> list[tuple]:
    return q2_launches(ops, dw, d_out, rows_of)


def check_k(k: int) -> None:
    if k % UNIT:
        raise ValueError(f"a: the exact kernels need K a multiple of {UNIT}, got {k}")


def prepare_threads(k: int) -> int:
    """``exact_prepare``'s CTA size: one thread per limb word (4 codes), a multiple of 32, at
    most :data:`PREP_THREADS`."""
    return min(PREP_THREADS, plan.div_ceil(k // 4, 32) * 32)


def prepare_device(
    d_a, stream=0, ops: ExactOperands | None = None, act: ActFormat = BF16
) -> ExactOperands:
    """Run ``exact_prepare`` on device bits ``d_a`` (uint16 [M, K] of format ``act``); returns
    the operands.

    ``ops``: operands of the same (M, K) and format to fill instead of allocating new ones
    (a graph-captured or repeated call must not allocate).
    """
    from ..runtime import launcher

    return launcher.prepare_device("q2_0", d_a, stream, ops, act)


def checked_operands(ops: ExactOperands, dw, d_out, name: str) -> tuple:
    """``(codes, scales, (limbs, unit_sums))`` flat, for a launch of kernel ``name``, after
    checking (before anything is launched) that ``dw`` is a DeviceQ2Weight of ``ops.k``
    columns, ``d_out`` uint16 [M, N], and the weight and operands fit 32-bit indices."""
    from .weight import DeviceQ2Weight

    if not isinstance(dw, DeviceQ2Weight):
        raise TypeError(f"weight: expected a DeviceQ2Weight, got {type(dw).__name__}")
    if ops.k != dw.k:
        raise ValueError(f"a: expected K={dw.k} columns (the weight's k), got {ops.k}")
    if np.dtype(d_out.dtype) != np.uint16 or tuple(d_out.shape) != (ops.m, dw.n):
        raise ValueError(
            f"out: expected uint16 of shape {(ops.m, dw.n)}, got {d_out.dtype} {tuple(d_out.shape)}"
        )
    codes, scales = dw.exec_layout()
    plan.check_weight_halves(name, 2 * codes.size)
    if LIMBS * ops.m * (ops.k // 4) >= MAX_LIMB_WORDS:  # the kernel's 32-bit operand index
        raise ValueError(
            f"a: at most {MAX_LIMB_WORDS // LIMBS - 1} x 4 activation values (M * K) per call, "
            f"got M={ops.m}, K={ops.k}; split M"
        )
    return (
        codes,
        scales,
        (ops.limbs.reshape(ops.limbs.size), ops.unit_sums.reshape(ops.unit_sums.size)),
    )


def q2_launches(ops: ExactOperands, dw, d_out, chunks=None) -> list[tuple]:
    """``(kernel, grid, block, args)`` of the unbatched ``q2_0_gemv_exact`` launches: per chunk
    of up to :data:`MAX_M` rows, launches of up to :data:`BUILD_MAX_M` rows, :func:`warps_for`
    warps a CTA (the family's launches, :mod:`q2gemv.cuda.q2_0.exact_launch`, take the
    batched build instead where :func:`batched_for` says so).

    Validates before anything is launched: ``dw`` a DeviceQ2Weight of ``ops.k``
    columns, ``d_out`` uint16 [M, N]. ``chunks``: the ``(row0, rows)`` of each
    chunk (the plan's, from :mod:`q2gemv.cuda.runtime.launcher`); default chunks of
    :data:`MAX_M` rows. They must cover the M rows once, in order.
    """
    operands = checked_operands(ops, dw, d_out, "q2_0_gemv_exact")
    return unbatched(ops, dw, d_out, plan.check_chunks(chunks, ops.m, MAX_M), operands)


def unbatched(ops, dw, d_out, chunks, operands) -> list[tuple]:
    """The launches of the unbatched builds for ``chunks`` (checked ``(row0, rows)``): up to
    :data:`BUILD_MAX_M` rows each, on the ``operands`` :func:`checked_operands` gave."""
    codes, scales, flat = operands
    tiles = plan.div_ceil(dw.n, ROWS_PER_CTA)
    pieces = [
        (s0, min(BUILD_MAX_M, r0 + rows - s0))
        for r0, rows in chunks
        for s0 in range(r0, r0 + rows, BUILD_MAX_M)
    ]
    launches = []
    for r0, rows in pieces:
        warps = warps_for(dw.n, dw.k, rows)
        parts = parts_for(dw.n, dw.k, rows, warps)
        if parts > 1:  # 3 words an output, a counter a row tile
            ws, cnt = ops.split_workspace(3 * dw.n * rows, tiles)
        else:
            ws, cnt = ops.split_workspace(1, 1)
        launches.append(
            (
                _q2_kernel(tiles_for(rows), dw.group, warps, ops.act),
                (tiles, parts),
                32 * warps,
                (*flat, ops.exponents, codes, scales, d_out[r0 : r0 + rows], ws, cnt)
                + (np.int32(dw.n), np.int32(dw.k), np.int32(rows), np.int32(r0)),
            )
        )
    return launches

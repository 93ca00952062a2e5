"""The batched build of the exact Q2_0 GEMV: up to 32 activation rows in one pass.

``q2_0_gemv_exact`` runs it for a chunk of 9..32 rows on wide weights
(:func:`q2gemv.cuda.q2_0.exact.batched_for`, measured; the launches are chosen in
:mod:`q2gemv.cuda.q2_0.exact_launch`); on smaller weights its 8-row launches were faster. It
is also an exact-kernel variant of its own (``docs/architecture.md``, "Where to add things"),
not registered by default: :func:`register` adds its
:class:`~q2gemv.dispatch.registry.KernelSpec` (``golden=False``), after which
``q2gemv.gemv(a, w, kernel="q2_0_gemv_exact_batched")`` runs it on any weight. It computes the
exact contract's value (:mod:`q2gemv.reference.exact`), so its bits equal the unbatched
builds' for every M, shape and launch shape. It reads the same prepared operands
(``exact_prepare``) and the same execution layout as :mod:`q2gemv.cuda.q2_0.exact`, plus each
row tile's base shift for its one-word build (``docs/numerics.md``, one-word accumulators).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import cuda, int32, int64, uint16, uint32, uint64

from ...dispatch import plan, registry
from ...formats import q2_0_layout as lay
from ...formats.act import BF16, FP16, ActFormat
from ..exact_contract import act_suffix
from ..runtime import tuning
from ..runtime.dev import (
    cp_async4,
    cp_async16,
    cp_async_commit,
    cp_async_wait,
    grid_dep_wait,
    ld_vec_u32x4,
    mma_u8,
    mma_u8s8,
    mul_wide,
)
from . import exact
from .exact import (
    CODE_MASK,
    LIMBS,
    ROWS_PER_CTA,
    UNIT,
    acc_add,
    last_part,
    scale_parts,
    split_add,
    split_reset,
    split_take,
)

NAME = "q2_0_gemv_exact_batched"
MAX_M = 32  # activation rows per launch (4 column groups of 8)
GROUP_ROWS = 8  # activation rows a column group holds (the n8 of one limb's B tile)
MAX_GROUPS = MAX_M // GROUP_ROWS

# The exact-family interface (q2gemv.cuda.runtime.launcher.ExactFamily): the default's prepare.
PREPARE = exact.PREPARE
Operands = exact.ExactOperands
check_k = exact.check_k
prepare_launch = exact.prepare_launch


def spec() -> registry.KernelSpec:
    """This variant's registry entry (``golden=False``: the shipped goldens do not list it)."""
    return registry.KernelSpec(
        NAME, "q2_0", "exact", "q2gemv.reference.exact.q2_0_gemv_exact", "q2_0_exact_batched",
        ROWS_PER_CTA, MAX_M, per_m=True, a_align=16, grid_wait=True, golden=False,
        module=__name__,
    )  # fmt: skip


def register() -> registry.KernelSpec:
    """Register :func:`spec` (again: a no-op) and return it."""
    if any(s.name == NAME for s in registry.specs("q2_0", "exact")):
        return registry.get(NAME)
    return registry.register(spec())


def groups_for(m: int) -> int:
    """Column groups (8 activation rows each) a batched launch of ``m`` rows is built with."""
    if not 1 <= m <= GROUP_ROWS * MAX_GROUPS:
        raise ValueError(f"m: the batched build serves 1..{GROUP_ROWS * MAX_GROUPS} rows, got {m}")
    return -(-m // GROUP_ROWS)


STAGES = {1: 6, 2: 4, 3: 3, 4: 2}  # pipeline depth per column-group count (shared memory < 48 KB)


def _make_batch_body(
    ng: int, group: int, warps: int, cols: int = 1, act: ActFormat = BF16, one_word: bool = False
):
    """``q2_0_gemv_exact`` for up to ``8 * ng`` activation rows in one pass over the weights,
    rounding to the activation format ``act`` (bf16 or fp16; the operands' ``act``).

    A CTA of ``warps`` warps holds ``warps / cols`` row tiles of 16 weight rows; the ``cols``
    warps of a tile (warp w: tile ``blockIdx.x * warps / cols + w / cols``) share its staged
    codes and take ``ng / cols`` column groups each (``w % cols``), all walking the same steps
    of 128 codes: the steps
    ``blockIdx.y * spl ..`` of a K split in ``gridDim.y`` parts. Every operand of a step (the
    warp's codes and scales, the CTA's activation limbs and unit sums) is copied into shared
    memory by ``cp.async``, :data:`STAGES` steps ahead, so a CTA keeps many steps of loads in
    flight with one barrier a step. B tile (limb l, group q) holds limb l of activation rows
    ``8q .. 8q + 7`` (``mma.m16n8k32``: u8 x u8 for limbs 0 and 1; for limb 2 the prepare's
    top byte of ``A + 2**23`` becomes the signed top byte of ``A`` by ``^ 0x80``, u8 x s8), so
    lane (g, t) ends a block with, for weight rows g and g + 8 and activation rows
    ``8q + 2t``, ``8q + 2t + 1``, the three limb sums of its own outputs::

        S = C0 + 2**8 C1 + 2**16 C2 - sum(A)     # sum_k (code - 1) A_k, |S| < 2**31

    no exchange between lanes. ``S * mantissa(d_b)`` goes into the split accumulator of the
    output as in the unbatched build. With one part (``gridDim.y == 1``) each lane rounds its
    outputs; with more, the parts' accumulators are summed by integer atomics in ``WS`` (3
    words an output: high, low, a non-finite-scale count) and the last part of a row tile
    group (``CNT``) rounds them and leaves ``WS`` and ``CNT`` zero again.

    A staged limb row is a step's 32 words, its 16-byte chunk c stored at ``c ^ 4`` in odd
    rows: a quarter warp's reads (rows r and r + 1, the same chunks) fall in distinct banks.

    ``one_word``: the build for a weight whose every row tile has a base shift ``b``
    (``BASES``, :func:`q2gemv.formats.q2_0_layout.accumulator_bases`): each output keeps one
    int64 accumulator, ``acc += S * m_b`` with ``m_b = +-mant(d_b) * 2**(shift(d_b) - b)``
    (one multiply-add a block, exact by the bound stated there), turned into the two words
    the rounding reads once, at the end. Its scales are finite (the bases say so), so it
    flags none. The general build ignores ``BASES``.
    """
    if warps % cols or ng % cols:
        raise ValueError(f"cols: {cols} must divide warps ({warps}) and groups ({ng})")
    S = STAGES[ng]  # noqa: N806
    TPC = warps // cols  # noqa: N806 - row tiles a CTA
    NGW = ng // cols  # noqa: N806 - column groups a warp
    M8 = GROUP_ROWS * ng  # noqa: N806 - activation rows of the staged operand
    SROWS = LIMBS * M8  # noqa: N806
    SW = SROWS * 32  # noqa: N806 - words of one B stage
    THREADS = 32 * warps  # noqa: N806
    VPT = -(-SROWS * 8 // THREADS)  # noqa: N806 - 16-byte copies a thread issues per step
    APT = -(-2 * M8 // THREADS)  # noqa: N806 - unit sums a thread copies per step
    BPS = (lay.UNIT * lay.STEP_UNITS) // group  # noqa: N806 - blocks per step
    UPB = group // UNIT  # noqa: N806 - units per block
    NCF = LIMBS * NGW * 4  # noqa: N806 - C registers: (group, limb, 4)
    NOUT = NGW * 4  # noqa: N806 - outputs a lane holds: (group, row g / g + 8, column)
    STEP_WORDS = lay.LANES * lay.WORDS_PER_LANE  # noqa: N806
    SB = S * SW  # noqa: N806 - (array sizes must be plain names)
    SWW1 = TPC * STEP_WORDS  # noqa: N806 - the tiles' codes of one step
    SSH1 = TPC * ROWS_PER_CTA * BPS  # noqa: N806 - the tiles' scales (uint16) of one step
    SWW = S * SWW1  # noqa: N806
    SSH = S * SSH1  # noqa: N806
    SA = S * 2 * M8  # noqa: N806 - unit sums, S steps
    WAIT = cp_async_wait[S - 2] if S >= 2 else cp_async_wait[0]  # noqa: N806

    @cuda.jit(device=True, inline="always")
    def issue(P32, ASUM, CODES, SCALES, sb, sw, ss, sa, p, slot, kw, nu, nb, tid, lane, copies,  # noqa: N803
              bsrc, bdst, asrc, qc, qs, wdst, sdst):  # fmt: skip
        """Step ``p``'s operands into stage ``slot`` (this thread's share of the copies; no
        commit). ``bsrc``/``bdst`` (limb copies), ``asrc`` (unit sums), ``qc``/``qs`` (the
        warp's codes and scales at step 0) and ``wdst``/``sdst`` are this thread's
        step-invariant offsets (:func:`offsets`); -1 marks a copy this thread does not make."""
        po = p * int32(32)
        if (tid & int32(7)) * int32(4) + po < kw:  # (a half last step's 2nd unit: not copied)
            for i in range(VPT):
                if bsrc[i] >= 0:
                    cp_async16(sb, slot * int32(SW) + bdst[i], P32, bsrc[i] + po)
        for i in range(APT):
            f = tid + int32(i * THREADS)
            if asrc[i] >= 0:
                u = int32(2) * p + (f & int32(1))
                d = slot * int32(2 * M8) + f
                if u < nu:
                    cp_async4(sa, d, ASUM, asrc[i] + int32(2) * p)
                else:
                    sa[uint32(d)] = int32(0)
        if copies:  # the first warp of an active tile copies its codes and scales
            cp_async16(sw, slot * int32(SWW1) + wdst, CODES, qc + p * int32(STEP_WORDS))
            if lane < 2 * BPS:
                d = slot * int32(SSH1) + sdst
                if p * int32(BPS) + (lane >> int32(1)) < nb:
                    cp_async16(ss, d, SCALES, qs + p * int32(BPS * ROWS_PER_CTA))
                else:  # a block past K (a half last step): scale 0, no load
                    for j in range(8):
                        ss[uint32(d + int32(j))] = uint16(0)

    @cuda.jit(device=True, inline="always")
    def mac_unit(sb, bs, wa, wb, lo, cf):
        """Unit ``v`` of the step (its two 32-code halves; ``lo`` = this lane's offset of
        the unit in a staged limb row, ``bs`` the stage) times every B tile into ``cf``."""
        a00 = wa & uint32(CODE_MASK)
        a02 = (wa >> uint32(2)) & uint32(CODE_MASK)
        a01 = wb & uint32(CODE_MASK)
        a03 = (wb >> uint32(2)) & uint32(CODE_MASK)
        a10 = (wa >> uint32(4)) & uint32(CODE_MASK)
        a12 = (wa >> uint32(6)) & uint32(CODE_MASK)
        a11 = (wb >> uint32(4)) & uint32(CODE_MASK)
        a13 = (wb >> uint32(6)) & uint32(CODE_MASK)
        fl = uint32(0x80808080)  # A + 2**23's top byte -> A's, signed
        for q in range(NGW):
            for limb in range(LIMBS):
                b0, b1, b2, b3 = ld_vec_u32x4(sb, bs + lo + int32((limb * M8 + 8 * q) * 32))
                o = 4 * (q * LIMBS + limb)
                if limb == LIMBS - 1:
                    cf[o], cf[o + 1], cf[o + 2], cf[o + 3] = mma_u8s8(
                        a00, a01, a02, a03, b0 ^ fl, b1 ^ fl, cf[o], cf[o + 1], cf[o + 2], cf[o + 3]
                    )
                    cf[o], cf[o + 1], cf[o + 2], cf[o + 3] = mma_u8s8(
                        a10, a11, a12, a13, b2 ^ fl, b3 ^ fl, cf[o], cf[o + 1], cf[o + 2], cf[o + 3]
                    )
                else:
                    cf[o], cf[o + 1], cf[o + 2], cf[o + 3] = mma_u8(
                        a00, a01, a02, a03, b0, b1, cf[o], cf[o + 1], cf[o + 2], cf[o + 3]
                    )
                    cf[o], cf[o + 1], cf[o + 2], cf[o + 3] = mma_u8(
                        a10, a11, a12, a13, b2, b3, cf[o], cf[o + 1], cf[o + 2], cf[o + 3]
                    )

    @cuda.jit(device=True, inline="always")
    def multiplier(s16, base):
        """A finite scale's ``m_b`` against the tile's base shift (one-word builds)."""
        mant, sh, neg = scale_parts(s16)
        m = mant << max(sh - base, int32(0))  # (a zero scale: mant 0, any shift)
        return int32(-m) if neg else int32(m)

    @cuda.jit(device=True, inline="always")
    def fold_block(ss, sa, sbase, abase, i, t, cf, acc_hi, acc_lo, bad, base):
        """Block ``i`` of the step: its scales times the limb sums in ``cf`` into the
        accumulators; returns ``bad`` with rows g (bit 0) and g + 8 (bit 1) flagged for a
        non-finite scale (never, in a one-word build)."""
        s_g = uint32(ss[uint32(sbase + int32(ROWS_PER_CTA * i))])  # (unsigned: no wraparound)
        s_h = uint32(ss[uint32(sbase + int32(ROWS_PER_CTA * i + 8))])
        if one_word:
            mg = multiplier(s_g, base)
            mh = multiplier(s_h, base)
            shg = shh = int32(0)
        else:
            if (s_g & uint32(0x7C00)) == uint32(0x7C00):
                bad |= 1
            if (s_h & uint32(0x7C00)) == uint32(0x7C00):
                bad |= 2
            mg, shg, ng_ = scale_parts(s_g)
            mh, shh, nh_ = scale_parts(s_h)
            mg = int32(-mg) if ng_ else mg
            mh = int32(-mh) if nh_ else mh
        for q in range(NGW):
            # unit sums of rows 8q + 2t (u0, u1) and 8q + 2t + 1 (u2, u3): one 16-byte read
            u0, u1, u2, u3 = ld_vec_u32x4(sa, abase + int32(16 * q))
            if UPB == 2:
                a_even = uint32(u0 + u1)
                a_odd = uint32(u2 + u3)
            elif i == 0:
                a_even = u0
                a_odd = u2
            else:
                a_even = u1
                a_odd = u3
            for c in range(2):
                asum = a_even if c == 0 else a_odd
                for h in range(2):
                    x = 2 * h + c
                    o = 4 * q * LIMBS + x
                    s_ = uint32(cf[o]) + (uint32(cf[o + 4]) << uint32(8))
                    s_ = s_ + (uint32(cf[o + 8]) << uint32(16)) - uint32(asum)
                    if one_word:
                        acc_hi[4 * q + x] += mul_wide(int32(s_), mg if h == 0 else mh)
                    elif h == 0:
                        acc_add(acc_hi, acc_lo, 4 * q + x, mul_wide(int32(s_), mg), shg)
                    else:
                        acc_add(acc_hi, acc_lo, 4 * q + x, mul_wide(int32(s_), mh), shh)
        return bad

    @cuda.jit(device=True, inline="always")
    def mac_step(sb, sw, ss, sa, slot, wsrc, sbase0, lo0, lo1, t, q0, cf, acc_hi, acc_lo, bad,
                 base):  # fmt: skip
        """One step (stage ``slot``) into the accumulators (:func:`fold_block` per block)."""
        wv0, wv1, wv2, wv3 = ld_vec_u32x4(sw, slot * int32(SWW1) + wsrc)
        bs = slot * int32(SW)
        sbase = slot * int32(SSH1) + sbase0
        abase = slot * int32(2 * M8) + int32(4) * t + q0 * int32(16)  # row 8 q0 + 2t, each group
        for x in range(NCF):
            cf[x] = int32(0)
        mac_unit(sb, bs, wv0, wv1, lo0, cf)
        if BPS == 2:  # group 64: a block a unit
            bad = fold_block(ss, sa, sbase, abase, 0, t, cf, acc_hi, acc_lo, bad, base)
            for x in range(NCF):
                cf[x] = int32(0)
            mac_unit(sb, bs, wv2, wv3, lo1, cf)
            bad = fold_block(ss, sa, sbase, abase, 1, t, cf, acc_hi, acc_lo, bad, base)
        else:
            mac_unit(sb, bs, wv2, wv3, lo1, cf)
            bad = fold_block(ss, sa, sbase, abase, 0, t, cf, acc_hi, acc_lo, bad, base)
        return bad

    @cuda.jit(device=True, inline="always")
    def offsets(N, K, M, M0, tid, warp, lane, tile, bsrc, bdst, asrc):
        """This thread's step-invariant copy offsets (:func:`issue`); -1 for none."""
        kw = K >> int32(2)
        real = M * LIMBS * 8
        for i in range(VPT):
            f = tid + int32(i * THREADS)
            bsrc[i] = int32(-1)
            bdst[i] = int32(0)
            if f < real:
                r = f >> int32(3)  # the prepare's limb row: m * LIMBS + limb
                c = f & int32(7)
                m = r // int32(LIMBS)
                srow = (r - m * int32(LIMBS)) * int32(M8) + m
                pos = c ^ ((srow & int32(1)) << int32(2))
                bsrc[i] = (M0 * int32(LIMBS) + r) * kw + c * int32(4)
                bdst[i] = srow * int32(32) + pos * int32(4)
        nu = K // int32(UNIT)
        for i in range(APT):
            f = tid + int32(i * THREADS)
            asrc[i] = int32(-1)
            if f < 2 * M:
                asrc[i] = (M0 + (f >> int32(1))) * nu + (f & int32(1))

    @cuda.jit(device=True, inline="always")
    def output_of(tile, g, t, q, x):
        """Output ``4 q + x`` of lane (g, t): ``(weight row, activation row, h)``, h = 0 for
        row g, 1 for g + 8 (the C fragment's order)."""
        h = x >> 1
        return tile * int32(ROWS_PER_CTA) + g + int32(8) * h, int32(8) * q + 2 * t + (x & 1), h

    write_out = exact.make_finish(act)

    @cuda.jit(device=True, inline="always")
    def finish(C, EROW, hi, lo, flag, row, m, N, M, M0):  # noqa: N803
        if m < M and row < N:
            write_out(C, EROW, hi, lo, flag, row, m, M0)

    @cuda.jit(device=True, inline="always")
    def words(acc_hi, acc_lo, i, base):
        """Output ``i``'s exact sum as the rounding's two words (units of ``2**-24``)."""
        if one_word:  # acc * 2**base: its high part and low 32 bits
            a = acc_hi[i]
            return a >> int64(32 - base), uint64(a << int64(base)) & uint64(0xFFFFFFFF)
        return acc_hi[i], acc_lo[i]

    def body(P32, ASUM, EROW, CODES, SCALES, BASES, C, WS, CNT, N, K, M, M0):  # noqa: N803
        sb = cuda.shared.array(SB, uint32)
        sw = cuda.shared.array(SWW, uint32)
        ss = cuda.shared.array(SSH, uint16)
        sa = cuda.shared.array(SA, int32)
        s_last = cuda.shared.array(1, int32)
        acc_hi = cuda.local.array(NOUT, int64)
        acc_lo = cuda.local.array(NOUT, uint64)
        cf = cuda.local.array(NCF, int32)
        bsrc = cuda.local.array(VPT, int32)
        bdst = cuda.local.array(VPT, int32)
        asrc = cuda.local.array(APT, int32)
        tid = int32(cuda.threadIdx.x)
        warp = tid >> int32(5)
        lane = tid & int32(31)
        g = lane >> int32(2)
        t = lane & int32(3)
        wt = warp // int32(cols)  # the warp's row tile in the CTA
        q0 = (warp - wt * int32(cols)) * int32(NGW)  # its first column group
        tile = int32(cuda.blockIdx.x) * int32(TPC) + wt
        active = tile < (N + int32(ROWS_PER_CTA - 1)) // int32(ROWS_PER_CTA)  # warp-uniform
        copies = active and q0 == 0
        base = int32(0)
        if one_word and active:
            base = BASES[tile]
        nu = K // int32(UNIT)
        nb = K // int32(group)
        ns = (nu + int32(1)) >> int32(1)
        kw = K >> int32(2)
        parts = int32(cuda.gridDim.y)
        spl = (ns + parts - int32(1)) // parts
        p0 = int32(cuda.blockIdx.y) * spl
        p1 = int32(min(p0 + spl, ns))
        offsets(N, K, M, M0, tid, warp, lane, tile, bsrc, bdst, asrc)
        qc = (tile * ns) * int32(STEP_WORDS) + lane * int32(4)  # the warp's codes at step 0
        qs = (tile * nb) * int32(ROWS_PER_CTA) + lane * int32(8)  # scales: lanes 0 .. 2 BPS - 1
        wdst = wt * int32(STEP_WORDS) + lane * int32(4)
        sdst = wt * int32(ROWS_PER_CTA * BPS) + lane * int32(8)
        sbase0 = wt * int32(ROWS_PER_CTA * BPS) + g
        swz = (g & int32(1)) << int32(2)
        lq = q0 * int32(8 * 32) + g * int32(32)  # limb row 8 q0 + g of each limb
        lo0 = lq + ((t) ^ swz) * int32(4)  # unit 0's chunk t of limb row g
        lo1 = lq + ((int32(4) + t) ^ swz) * int32(4)  # unit 1's
        for i in range(tid, SB, THREADS):  # the rows past M stay zero
            sb[i] = uint32(0)
        for i in range(NOUT):
            acc_hi[i] = int64(0)
            acc_lo[i] = uint64(0)
        bad = int32(0)
        grid_dep_wait()  # the prepared operands are the prepare's
        cuda.syncthreads()  # the zeroing before any copy lands
        for j in range(S - 1):  # the pipeline's first steps, a group each
            if p0 + int32(j) < p1:
                issue(P32, ASUM, CODES, SCALES, sb, sw, ss, sa, p0 + int32(j), int32(j), kw, nu, nb,
                      tid, lane, copies, bsrc, bdst, asrc, qc, qs, wdst, sdst)  # fmt: skip
            cp_async_commit()
        p = int32(p0)
        slot = int32(0)
        while p < p1:
            WAIT()  # this thread's copies of step p are done (the S - 2 newest groups may fly)
            cuda.syncthreads()  # everyone's copies of step p landed; step p - 1 is done
            pn = p + int32(S - 1)
            if pn < p1:  # into the stage of step p - 1
                sn = slot + int32(S - 1)
                if sn >= S:
                    sn -= int32(S)
                issue(P32, ASUM, CODES, SCALES, sb, sw, ss, sa, pn, sn, kw, nu, nb,
                      tid, lane, copies, bsrc, bdst, asrc, qc, qs, wdst, sdst)  # fmt: skip
            cp_async_commit()
            if active:
                bad = mac_step(sb, sw, ss, sa, slot, wdst, sbase0, lo0, lo1, t, q0, cf, acc_hi,
                               acc_lo, bad, base)  # fmt: skip
            slot += int32(1)
            if slot == S:
                slot = int32(0)
            p += int32(1)
        if parts == 1:
            if active:
                for q in range(NGW):
                    for x in range(4):
                        row, m, h = output_of(tile, g, t, q0 + q, x)
                        flag = (bad >> h) & int32(1)
                        hi, lo = words(acc_hi, acc_lo, 4 * q + x, base)
                        finish(C, EROW, hi, lo, flag, row, m, N, M, M0)
            return
        if active:
            for q in range(NGW):
                for x in range(4):
                    row, m, h = output_of(tile, g, t, q0 + q, x)
                    if m < M:
                        hi, lo = words(acc_hi, acc_lo, 4 * q + x, base)
                        split_add(WS, (row * M + m) * int32(3), hi, lo, (bad >> h) & int32(1))
        if not last_part(CNT, cuda.blockIdx.x, parts, s_last):
            return
        if active:
            for q in range(NGW):
                for x in range(4):
                    row, m, h = output_of(tile, g, t, q0 + q, x)
                    if m < M:
                        hi, lo, fl = split_take(WS, (row * M + m) * int32(3))
                        finish(C, EROW, hi, lo, fl, row, m, N, M, M0)
        split_reset(CNT, cuda.blockIdx.x)

    return body


BATCH_SIGNATURE = (
    "void(uint32[::1], int32[::1], int32[::1], uint32[::1], uint16[::1], int32[::1], "
    "uint16[:, ::1], int64[::1], int32[::1], int32, int32, int32, int32)"
)


@functools.cache
def _batch_kernel(
    ng: int,
    group: int,
    warps: int,
    cols: int = 1,
    max_regs: int | None = None,
    act: ActFormat = BF16,
    one_word: bool = False,
):
    body = _make_batch_body(ng, group, warps, cols, act, one_word)
    if max_regs is None:
        kernel = cuda.jit(BATCH_SIGNATURE)(body)
    else:
        kernel = cuda.jit(BATCH_SIGNATURE, max_registers=max_regs)(body)
    # No programmatic dependent launch after the prepare: its one-wave grids, started early,
    # were placed two CTAs an SM beside the prepare's CTAs (H200, public call at M = 12 and
    # 16 on 16384^2: 148 us with PDL, 97 us without; GEMV alone 92 us).
    kernel.no_pdl = True
    return kernel


@dataclass(frozen=True)
class LaunchRule:
    """A batched launch's CTA shape: ``warps`` warps a CTA, ``cols`` of them a row tile (each
    taking a share of the column groups), K split in ``parts``; ``max_regs`` caps the
    registers a thread (None: the compiler's choice)."""

    warps: int
    parts: int = 1
    cols: int = 1
    max_regs: int | None = None

    def grid(self, n: int) -> tuple[int, int]:
        tiles = plan.div_ceil(n, ROWS_PER_CTA)
        return (plan.div_ceil(tiles, self.warps // self.cols), self.parts)

    def groups(self, m: int) -> int:
        """Column groups the build for ``m`` rows has: a multiple of ``cols``."""
        return plan.div_ceil(groups_for(m), self.cols) * self.cols


def launch_rule(n: int, k: int, m: int) -> LaunchRule:
    """The CTA shape of a launch of ``m`` rows on an N x K weight, from the knobs measured on
    this GPU (``tuning.json`` beside this module, :mod:`q2gemv.cuda.runtime.tuning`): from
    ``wide_tiles`` row tiles on, no K split and ``wide_warps`` warps a CTA, or
    ``narrow_warps`` past ``wide_max_tiles`` (where CTAs of ``wide_warps`` would not fit one
    wave); below, ``narrow_warps`` warps and K split until the grid has about ``target_ctas``
    CTAs, each part keeping at least ``min_steps`` steps of 128 codes. Any rule gives the
    same bits."""
    if not 1 <= m <= MAX_M:
        raise ValueError(f"m: {NAME} serves 1..{MAX_M} rows per launch, got {m}")
    kn = tuning.knobs(str(Path(__file__).parent), NAME)
    tiles = plan.div_ceil(n, ROWS_PER_CTA)
    if tiles >= kn["wide_tiles"]:
        return LaunchRule(
            kn["wide_warps"] if tiles <= kn["wide_max_tiles"] else kn["narrow_warps"], 1
        )
    ctas = plan.div_ceil(tiles, kn["narrow_warps"])
    steps = plan.div_ceil(k // UNIT, lay.STEP_UNITS)
    parts = max(1, min(round(kn["target_ctas"] / ctas), steps // kn["min_steps"]))
    return LaunchRule(kn["narrow_warps"], parts)


def chunk_launches(ops, dw, d_out, rows_of) -> list[tuple]:
    """``(kernel, grid, block, args)`` of each launch: one per chunk of up to :data:`MAX_M`
    rows (:func:`one_launch`). Validates before anything is launched, as
    :func:`q2gemv.cuda.q2_0.exact.q2_launches` does."""
    operands = exact.checked_operands(ops, dw, d_out, NAME)
    return [
        one_launch(ops, dw, d_out, r0, rows, operands)
        for r0, rows in plan.check_chunks(rows_of, ops.m, MAX_M)
    ]


def one_launch(ops, dw, d_out, r0: int, rows: int, operands) -> tuple:
    """``(kernel, grid, block, args)`` of the launch for rows ``r0 .. r0 + rows`` (up to
    :data:`MAX_M`): the CTA shape :func:`launch_rule` picks, the one-word build where every
    row tile of the weight has a base (:meth:`DeviceQ2Weight.accumulator_bases`), on the
    ``operands`` :func:`q2gemv.cuda.q2_0.exact.checked_operands` gave (the caller's check of
    the weight, the prepared operands and ``d_out``, made before anything is launched)."""
    codes, scales, flat = operands
    bases, one_word = dw.accumulator_bases()
    tiles = plan.div_ceil(dw.n, ROWS_PER_CTA)
    rule = launch_rule(dw.n, dw.k, rows)
    grid = rule.grid(dw.n)
    if rule.parts > 1:  # 3 words an output, a counter a CTA column
        ws, cnt = ops.split_workspace(3 * tiles * ROWS_PER_CTA * rows, grid[0])
    else:
        ws, cnt = ops.split_workspace(1, 1)
    groups = rule.groups(rows)
    kernel = _batch_kernel(
        groups, dw.group, rule.warps, rule.cols, rule.max_regs, ops.act, one_word
    )
    args = (*flat, ops.exponents, codes, scales, bases, d_out[r0 : r0 + rows], ws, cnt)
    return kernel, grid, 32 * rule.warps, args + tuple(np.int32(x) for x in (dw.n, dw.k, rows, r0))


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of the builds for the PTX tests: both groups, both CTA
    sizes, and the largest register set (4 groups, 4 warps), in the general and the one-word
    build (``1w``); all 32 would slow CI. Plus one fp16 build
    (:func:`~q2gemv.cuda.exact_contract.act_suffix`): only the final rounding differs."""
    builds = (
        (1, 64, 8, BF16, False), (3, 64, 4, BF16, False), (4, 128, 4, BF16, False),
        (1, 64, 8, FP16, False), (4, 128, 4, BF16, True), (2, 64, 8, BF16, True),
    )  # fmt: skip
    return [
        (f"{NAME}@m{GROUP_ROWS * ng}g{group}w{warps}{'1w' if one else ''}{act_suffix(act)}",
         _make_batch_body(ng, group, warps, 1, act, one), BATCH_SIGNATURE)
        for ng, group, warps, act, one in builds
    ]  # fmt: skip

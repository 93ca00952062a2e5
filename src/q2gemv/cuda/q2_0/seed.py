"""numba.cuda kernels for GGUF ``block_q2_0`` GEMV, and their host launch wrappers.

Three kernels, one per seed kernel, each reproduced bit for bit by the
function of the same name in :mod:`q2gemv.reference.q2_0` (whose docstrings
state the operation order):

* ``q2_0_gemv`` — baseline: 2 warps per row, 4 rows per 256-thread CTA,
  one 16-bit load (8 codes) per thread per step, activations read from
  global memory.
* ``q2_0_gemv_vec`` — candidate B: 1 warp per row, 8 rows per CTA, 16 codes
  (two 16-bit halves) per lane per step. Each lane loads its own words'
  activations (two 16-byte loads per word, :func:`~q2gemv.cuda.runtime.dev.ld_bf16x8`;
  ``a`` must be 16-byte aligned, checked before launch), in the seed's order.
* ``q2_0_gemv_vec_batchm`` — the same thread map and per-row order for up
  to :data:`~q2gemv.dispatch.plan.Q2_BATCHM_MAX_M` activation rows, built once per
  M (:func:`compiled`): at M=1 the direct-load body, from M=2 on activations
  staged in shared memory as fp32 tiles of :func:`tile_k` (M) codes (16-byte
  loads, the next tile's loads in flight while a tile is used, a bank-conflict
  free swizzle; ``a`` must be 16-byte aligned), each weight word read once and
  multiplied into all M accumulators.

Register-tiled candidates with the same per-row order: ``q2_0_gemv_vec_rt4``
(4 rows per warp, M=1) and ``q2_0_gemv_vec_batchm_rt2`` (2 rows per warp).

All of them read the raw GGUF bytes (keep-packed): ``B16`` is the byte buffer
viewed as uint16 (codes), ``Bh`` the same buffer viewed as float16 (the
inline scale ``d`` of block i is half ``i * (1 + group / 8)`` of a row).
``group`` is a run-time argument (64 or 128), as in the seed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
from numba import cuda, float32, uint32

from ...dispatch import plan, registry
from ...formats import q2_0 as fmt
from ..runtime.dev import (
    bf16_hi_to_f32,
    bf16_to_f32,
    f32_to_bf16,
    fadd_rn,
    fma,
    fmul_rn,
    ld_bf16x8,
    ld_f32x4,
    u32_as_f32,
    warp_sum,
)
from .weight import DeviceQ2Weight

SMEM_TILE_BYTES = 32 * 1024  # fp32 activation tile per CTA (static shared memory is 48 KB)


def tile_k(max_m: int) -> int:
    """Codes per staged activation tile: 32 KB of fp32 over ``max_m`` rows, a multiple of 512.

    A multiple of 512 keeps word w on lane w % 32 in every tile (the per-lane
    order of the reference). The batched kernels are built per M, so a launch
    of M rows stages tile_k(M) codes a tile: 4096 at M=2, 2560 at M=3, 2048
    at 4, 1536 at 5, 1024 at 6..8 (M=1 loads its activations directly). Small
    tiles make the barriers dominate (docs/design_notes.md).
    """
    return (SMEM_TILE_BYTES // (4 * max_m)) // 512 * 512


def _code_minus_one(word, i, mags):
    """fp32 ``code_i - 1`` of 2-bit field i (0..15) of ``word``: exact, no shift for i < 8.

    Field i sits at bit 2*(i % 8) of the low (i < 8) or high half. OR-ing it
    into the mantissa of 2^(23 - 2*(i % 8)) makes that float's ulp 1 at the
    field, so the float is 2^(23 - 2s) + code; subtracting 2^(23 - 2s) + 1 is
    exact (Sterbenz). ``mags`` holds those eight magic bit patterns in
    registers (:func:`_fill_magics`), so the mask-and-OR is one LOP3 (an
    immediate mask and a register magic) and the subtraction one FADD with an
    immediate: two instructions per code.
    """
    half = word if i < 8 else word >> uint32(16)
    slot = i & 7
    mag = uint32((150 - 2 * slot) << 23)
    f = u32_as_f32(mags[slot] | (half & uint32(3 << (2 * slot))))
    return f - (u32_as_f32(mag) + float32(1.0))


def _fill_magics(mags, opaque_zero):
    """``mags[s] = bits of 2^(23 - 2s)`` for s = 0..7, OR-ed with ``opaque_zero``.

    The caller passes a value that is always 0 but that the compiler cannot
    prove to be 0 (``uint32(N) >> 31`` of a non-negative int32 argument).
    With plain constants ptxas folds both the mask and the magic into
    immediates, and a LOP3 takes only one immediate: the decode then costs two
    LOP3 per code instead of one (seen in the sm_90 SASS).
    """
    for s in range(8):
        mags[s] = uint32((150 - 2 * s) << 23) | opaque_zero


_code_minus_one = cuda.jit(device=True, inline="always")(_code_minus_one)
_fill_magics = cuda.jit(device=True, inline="always")(_fill_magics)


# -- kernel bodies (plain functions; compiled lazily, cached per knob) --------


def _q2_0_gemv_body(A, B16, Bh, C, N, K, group, M):  # noqa: N803 - seed names
    s_part = cuda.shared.array(8, float32)
    mags = cuda.local.array(8, uint32)
    _fill_magics(mags, uint32(N) >> uint32(31))
    tid = cuda.threadIdx.x
    warp = tid >> 5
    lane = tid & 31
    row = cuda.blockIdx.x * 4 + (warp >> 1)
    t = (warp & 1) * 32 + lane  # 0..63 within the row
    hshift = 4 if group == 128 else 3  # halves of codes per block: group / 8
    hpb = (group >> 3) + 1  # halves per block incl. the scale
    acc = float32(0.0)
    if row < N:
        row_base = row * (K // group) * hpb
        for h in range(t, K >> 3, 64):
            blk = h >> hshift
            hb = row_base + blk * hpb
            d = float32(Bh[hb])
            word = uint32(B16[hb + 1 + (h & ((1 << hshift) - 1))])
            s = float32(0.0)
            for i in range(8):
                s = fma(_code_minus_one(word, i, mags), bf16_to_f32(A[0, h * 8 + i]), s)
            acc = fadd_rn(acc, fmul_rn(s, d))
    v = warp_sum(acc)
    if lane == 0:
        s_part[warp] = v
    cuda.syncthreads()
    if lane == 0 and (warp & 1) == 0 and row < N:
        C[0, row] = f32_to_bf16(fadd_rn(s_part[warp], s_part[warp + 1]))


# Words (16 codes) each lane loads per row before it multiplies any of them (all of a
# batch in flight at once), keyed by (max_m, rows per warp); absent keys take 1. 8 is
# fastest for q2_0_gemv_vec (benchmarks/sweep_words.py; docs/design_notes.md); batches of
# the batchm kernels spill their accumulators to local memory, so they stay at 1.
WORDS_IN_FLIGHT: dict[tuple[int, int], int] = {(1, 1): 8}


def _make_vec_body(
    max_m: int, rows_per_warp: int = 1, words: int | None = None, exact_m: bool = False
):
    """Candidate-B body: 1 warp per row (``rows_per_warp`` rows per warp when register-tiled).

    ``max_m`` sizes the accumulators and the unrolled row loop (a run-time
    ``m < M`` guard skips dead rows; with ``exact_m`` the launch promises
    ``M == max_m`` and the guards compile away) and picks the activation path: ``max_m = 1``
    gives ``body_direct`` (each lane loads its own words' activations, 16 bytes
    at a time, no shared memory), larger ``max_m`` gives ``body`` (activations
    staged in shared-memory tiles of :func:`tile_k` codes). With
    ``rows_per_warp = T > 1`` each lane applies the 16 activations it loaded
    to the same word of T rows; every row keeps the per-lane order of
    ``T = 1``, so the reference is the same.

    Each lane walks its words ``lane, lane + 32, ...`` (of a row, or of a tile) in batches of
    ``words`` (default :data:`WORDS_IN_FLIGHT`): it first loads the batch's
    words and scales for its T rows, then multiplies them in word order; the
    last words that do not fill a batch go one at a time. Batching
    changes when a word is loaded, never the order of the arithmetic.
    Indices are unsigned (no negative-index wraparound code).
    """
    TILE_K = tile_k(max_m)
    smem = max_m * TILE_K
    T = rows_per_warp
    U = WORDS_IN_FLIGHT.get((max_m, T), 1) if words is None else words
    rows_per_cta = 8 * T
    n_acc = max_m * T
    n_cm1 = 16 * T
    n_ld = U * T
    n_aw = 8 * U  # activation words (2 bf16 each) of a batch, M=1 kernels
    CHUNKS = TILE_K // 8  # 16-byte activation chunks per row of a full tile
    STAGE_LOADS = -(-max_m * CHUNKS // 256)  # chunks each thread stages per tile (at most 4)
    n_stg = 4 * STAGE_LOADS

    @cuda.jit(device=True, inline="always")
    def active(m, M):  # noqa: N803
        """Whether activation row ``m`` (a compile-time index) is one of the launch's ``M``."""
        return True if exact_m else m < M

    @cuda.jit(device=True, inline="always")
    def load_word(B16, Bh, rbase, gw, wshift, wmask, hpb, wv, dv, slot):
        """Word ``gw`` of each of the T rows (row base ``rbase[t]``) into ``wv``/``dv[slot*T+t]``."""
        blk_half = uint32((gw >> wshift) * hpb)
        q_off = uint32(uint32(1) + uint32(2) * (gw & wmask))
        for t in range(T):
            hb = uint32(rbase[t] + blk_half)
            q = uint32(hb + q_off)
            dv[slot * T + t] = float32(Bh[hb])
            wv[slot * T + t] = uint32(B16[q]) | (uint32(B16[uint32(q + uint32(1))]) << uint32(16))

    @cuda.jit(device=True, inline="always")
    def decode(wv, slot, cm1, mags):
        """``code - 1`` of the 16 codes of the word in ``slot``, for each of the T rows."""
        for t in range(T):
            word = wv[slot * T + t]
            for i in range(16):
                cm1[t * 16 + i] = _code_minus_one(word, i, mags)

    @cuda.jit(device=True, inline="always")
    def mac16(cm1, av, dv, slot, acc, m):
        """acc[m, t] += (sum of the 16 products, in order) * d, for each of the T rows."""
        for t in range(T):
            s = float32(0.0)
            for i in range(16):
                s = fma(cm1[t * 16 + i], av[i], s)
            acc[m * T + t] = fadd_rn(acc[m * T + t], fmul_rn(s, dv[slot * T + t]))

    @cuda.jit(device=True, inline="always")
    def mac_word(s_a, wl, wv, dv, slot, cm1, mags, av, sv, acc, M):
        """Word ``wl`` of the tile (loaded in ``slot``) times every active row of activations.

        Goes a quarter word (4 codes) at a time: decode the quarter for the T
        rows, then for each activation row read its 4 activations with one
        16-byte shared load (at the swizzled place :func:`store_tile` wrote
        them) and extend the M*T running sums ``sv``. Each sum still takes its
        16 codes in order, then the scale: the order of :func:`mac16`. Holding
        16 decoded codes per row instead would not fit in registers at M=8
        (ptxas re-decodes per activation row).
        """
        sw = (wl >> uint32(1)) & uint32(3)
        for j in range(n_acc):
            sv[j] = float32(0.0)
        for q in range(4):
            for t in range(T):
                word = wv[slot * T + t]
                for e in range(4):
                    cm1[t * 4 + e] = _code_minus_one(word, 4 * q + e, mags)
            for m in range(max_m):
                if active(m, M):
                    p = uint32(m * TILE_K) + wl * uint32(16) + ((uint32(q) ^ sw) << uint32(2))
                    av[0], av[1], av[2], av[3] = ld_f32x4(s_a, p)
                    for t in range(T):
                        for e in range(4):
                            sv[m * T + t] = fma(cm1[t * 4 + e], av[e], sv[m * T + t])
        for m in range(max_m):
            if active(m, M):
                for t in range(T):
                    acc[m * T + t] = fadd_rn(
                        acc[m * T + t], fmul_rn(sv[m * T + t], dv[slot * T + t])
                    )

    @cuda.jit(device=True, inline="always")
    def stage_chunk(r, kt, M):  # noqa: N803
        """This thread's ``r``-th 8-code chunk of a tile of ``kt`` codes: ``(row m, chunk c, live)``.

        Chunk ``threadIdx + 256 r`` of the tile's rows laid end to end; not live
        past the launch's M rows or the tile's last chunk.
        """
        idx = uint32(cuda.threadIdx.x) + uint32(256 * r)
        m = idx // uint32(CHUNKS)
        c = idx % uint32(CHUNKS)
        return m, c, m < uint32(M) and c < (kt >> uint32(3))

    @cuda.jit(device=True, inline="always")
    def load_tile(A, stg, k0, kt, M):  # noqa: N803
        """Issue this thread's 16-byte loads (8 bf16 each) of activation codes ``k0 .. k0+kt-1``.

        Rows ``0..M-1``, :data:`STAGE_LOADS` chunks per thread, into ``stg``.
        Nothing waits on them until :func:`store_tile`: the kernel issues the
        next tile's loads before it computes the current tile, so the L2
        latency hides behind that work.
        """
        for r in range(STAGE_LOADS):
            m, c, ok = stage_chunk(r, kt, M)
            if ok:
                stg[4 * r], stg[4 * r + 1], stg[4 * r + 2], stg[4 * r + 3] = ld_bf16x8(
                    A, m, k0 + c * uint32(8)
                )

    @cuda.jit(device=True, inline="always")
    def store_tile(s_a, stg, kt, M):  # noqa: N803
        """Widen the chunks :func:`load_tile` fetched to fp32 and store them into ``s_a``.

        Code j of row m lands at ``m * TILE_K + swz(j)``, where ``swz`` XORs
        the 16-byte quarter ``(j >> 2) & 3`` of word ``j >> 4`` with
        ``(j >> 5) & 3``: the four 16-byte reads :func:`mac_word` makes per
        word then hit distinct banks across each 8-lane phase (adjacent lanes'
        words are 64 bytes apart). Placement only: the values and their order
        of use are unchanged.
        """
        for r in range(STAGE_LOADS):
            m, c, ok = stage_chunk(r, kt, M)
            if ok:
                w = c >> uint32(1)
                sw = (w >> uint32(1)) & uint32(3)
                for h in range(2):
                    q = ((c & uint32(1)) * uint32(2) + uint32(h)) ^ sw
                    p = m * uint32(TILE_K) + w * uint32(16) + (q << uint32(2))
                    x0 = stg[4 * r + 2 * h]
                    x1 = stg[4 * r + 2 * h + 1]
                    s_a[p] = bf16_to_f32(x0)
                    s_a[p + uint32(1)] = bf16_hi_to_f32(x0)
                    s_a[p + uint32(2)] = bf16_to_f32(x1)
                    s_a[p + uint32(3)] = bf16_hi_to_f32(x1)

    @cuda.jit(device=True, inline="always")
    def load_acts(A, gw, aw, slot):
        """Row 0's 16 activations of word ``gw`` as 8 uint32 (two 16-byte loads) into ``aw``."""
        c = gw * uint32(16)
        aw[slot * 8 + 0], aw[slot * 8 + 1], aw[slot * 8 + 2], aw[slot * 8 + 3] = ld_bf16x8(
            A, uint32(0), c
        )
        aw[slot * 8 + 4], aw[slot * 8 + 5], aw[slot * 8 + 6], aw[slot * 8 + 7] = ld_bf16x8(
            A, uint32(0), c + uint32(8)
        )

    @cuda.jit(device=True, inline="always")
    def mac_word_direct(aw, wv, dv, slot, cm1, mags, av, acc):
        """The word in ``slot`` times row 0's activations loaded with it (M=1 kernels)."""
        decode(wv, slot, cm1, mags)
        for j in range(8):
            av[2 * j] = bf16_to_f32(aw[slot * 8 + j])
            av[2 * j + 1] = bf16_hi_to_f32(aw[slot * 8 + j])
        mac16(cm1, av, dv, slot, acc, 0)

    @cuda.jit(device=True, inline="always")
    def setup(N, K, group, rbase, acc, mags):  # noqa: N803
        """This warp's rows and the block geometry; zeroes ``acc``, fills ``rbase`` and ``mags``.

        Returns ``(lane, row0, n_rows, wshift, wmask, hpb)``: ``row0`` is the
        warp's first row, ``wshift`` log2 of the 16-code words per block
        (group / 16), ``hpb`` the uint16 halves per block, scale included.
        ``rbase[t]`` is the first half of row ``row0 + t``; rows past N (tail
        of the last CTA) point at row N-1 and are never stored. Half indices
        are 32-bit: the launch refuses weights of 2^32 halves or more.
        """
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        row0 = uint32(cuda.blockIdx.x) * uint32(rows_per_cta) + (tid >> uint32(5)) * uint32(T)
        wshift = uint32(3 if group == 128 else 2)
        wmask = (uint32(1) << wshift) - uint32(1)
        hpb = uint32((group >> 3) + 1)
        row_halves = uint32(K // group) * hpb
        n_rows = uint32(N)
        for t in range(T):
            rbase[t] = min(row0 + uint32(t), n_rows - uint32(1)) * row_halves
        _fill_magics(mags, n_rows >> uint32(31))
        for j in range(n_acc):
            acc[j] = float32(0.0)
        return lane, row0, n_rows, wshift, wmask, hpb

    def body_direct(A, B16, Bh, C, N, K, group, M):  # noqa: N803
        """M=1: each lane loads its words' activations itself (16-byte loads, no staging)."""
        acc = cuda.local.array(n_acc, float32)
        cm1 = cuda.local.array(n_cm1, float32)
        av = cuda.local.array(16, float32)
        aw = cuda.local.array(n_aw, uint32)
        wv = cuda.local.array(n_ld, uint32)
        dv = cuda.local.array(n_ld, float32)
        rbase = cuda.local.array(T, uint32)
        mags = cuda.local.array(8, uint32)
        lane, row0, n_rows, wshift, wmask, hpb = setup(N, K, group, rbase, acc, mags)
        if row0 < n_rows and M > 0:
            nw = uint32(K) >> uint32(4)
            wl = lane
            while wl + uint32(32 * (U - 1)) < nw:  # full batches
                for u in range(U):
                    load_word(B16, Bh, rbase, wl + uint32(32 * u), wshift, wmask, hpb, wv, dv, u)
                    load_acts(A, wl + uint32(32 * u), aw, u)
                for u in range(U):
                    mac_word_direct(aw, wv, dv, u, cm1, mags, av, acc)
                wl += uint32(32 * U)
            while wl < nw:  # the row's last words, one at a time
                load_word(B16, Bh, rbase, wl, wshift, wmask, hpb, wv, dv, 0)
                load_acts(A, wl, aw, 0)
                mac_word_direct(aw, wv, dv, 0, cm1, mags, av, acc)
                wl += uint32(32)
        for t in range(T):
            v = warp_sum(acc[t])
            if lane == 0 and row0 + uint32(t) < n_rows and M > 0:
                C[0, row0 + uint32(t)] = f32_to_bf16(v)

    def body(A, B16, Bh, C, N, K, group, M):  # noqa: N803
        s_a = cuda.shared.array(smem, float32)
        stg = cuda.local.array(n_stg, uint32)
        acc = cuda.local.array(n_acc, float32)
        sv = cuda.local.array(n_acc, float32)
        cm1 = cuda.local.array(n_cm1, float32)
        av = cuda.local.array(4, float32)
        wv = cuda.local.array(n_ld, uint32)
        dv = cuda.local.array(n_ld, float32)
        rbase = cuda.local.array(T, uint32)
        mags = cuda.local.array(8, uint32)
        lane, row0, n_rows, wshift, wmask, hpb = setup(N, K, group, rbase, acc, mags)
        load_tile(A, stg, uint32(0), uint32(min(TILE_K, K)), M)
        for k0 in range(0, K, TILE_K):
            kt = uint32(min(TILE_K, K - k0))
            cuda.syncthreads()  # every warp is done with the previous tile
            store_tile(s_a, stg, kt, M)
            cuda.syncthreads()
            if k0 + TILE_K < K:  # the next tile's loads fly while this one is used
                load_tile(A, stg, uint32(k0 + TILE_K), uint32(min(TILE_K, K - k0 - TILE_K)), M)
            if row0 < n_rows:
                nw = kt >> uint32(4)
                gw0 = uint32(k0) >> uint32(4)
                wl = lane
                while wl + uint32(32 * (U - 1)) < nw:  # full batches
                    for u in range(U):
                        load_word(
                            B16, Bh, rbase, gw0 + wl + uint32(32 * u), wshift, wmask, hpb, wv, dv, u
                        )
                    for u in range(U):
                        mac_word(s_a, wl + uint32(32 * u), wv, dv, u, cm1, mags, av, sv, acc, M)
                    wl += uint32(32 * U)
                while wl < nw:  # the tile's last words, one at a time
                    load_word(B16, Bh, rbase, gw0 + wl, wshift, wmask, hpb, wv, dv, 0)
                    mac_word(s_a, wl, wv, dv, 0, cm1, mags, av, sv, acc, M)
                    wl += uint32(32)
        for m in range(max_m):
            if m < M:
                for t in range(T):
                    v = warp_sum(acc[m * T + t])
                    if lane == 0 and row0 + uint32(t) < n_rows:
                        C[m, row0 + uint32(t)] = f32_to_bf16(v)

    return body_direct if max_m == 1 else body


# The batched kernels (spec.per_m) are compiled once per M actually launched (1..8),
# with that M as a compile-time constant: no run-time row guards in the inner loop
# (fewer instructions in the SASS) and activation tiles of
# tile_k(M) codes (fewer barriers at small M). At M=1 that is the direct-load
# body. The thread map and every row's order do not depend on M. The kernels and
# their knobs are the registry's Q2_0 seed specs (q2gemv.dispatch.registry); the vec kernels
# read activations 16 bytes per load (spec.a_align == 16, checked before launch).
TEMPLATES = ("q2_0_gemv", "q2_0_vec")
SIGNATURE = (
    "void(uint16[:, ::1], uint16[::1], float16[::1], uint16[:, ::1], int32, int32, int32, int32)"
)


def _body(spec: registry.KernelSpec, m: int):
    """The kernel body of ``spec`` for launches of ``m`` rows (``m`` ignored unless per_m)."""
    if spec.template == "q2_0_gemv":
        return _q2_0_gemv_body
    if spec.template != "q2_0_vec":
        raise ValueError(
            f"kernel: {spec.name} has template {spec.template!r}, not one of {TEMPLATES}"
        )
    return _make_vec_body(
        m if spec.per_m else spec.max_m, spec.rows_per_warp, spec.words, exact_m=spec.per_m
    )


class _KernelTable(Mapping):
    """Live read-only ``name -> (body factory of M, max_m, per_m)`` of the registry's Q2_0 seed kernels."""

    _names = registry.table("q2_0", "seed")

    def __getitem__(self, name: str) -> tuple:
        if name not in self._names:
            raise KeyError(name)
        spec = registry.get(name)
        return (functools.partial(_body, spec), spec.max_m, spec.per_m)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


KERNELS = _KernelTable()


def spec_of(name: str) -> registry.KernelSpec:
    """The registry spec of Q2_0 seed kernel ``name``; ValueError naming ``kernel`` otherwise."""
    if name not in KERNELS:
        raise ValueError(f"kernel: expected one of {sorted(KERNELS)}, got {name!r}")
    return registry.get(name)


def _variant(name: str, m: int | None) -> int:
    """The M a launch of ``name`` with ``m`` rows is compiled for (0: one build for every M)."""
    spec = spec_of(name)
    if not spec.per_m:
        return 0
    m = spec.max_m if m is None else int(m)
    if not 1 <= m <= spec.max_m:
        raise ValueError(f"m: kernel {name} serves 1..{spec.max_m} rows per launch, got {m}")
    return m


def kernel_body(name: str, m: int | None = None):
    """The plain Python body of kernel ``name`` for ``m`` rows (for ``cuda.compile_ptx``)."""
    return _body(spec_of(name), _variant(name, m) or 1)


def compiled(name: str, m: int | None = None):
    """The ``cuda.jit`` dispatcher of kernel ``name`` for launches of ``m`` rows, built on first use.

    ``m`` matters only for the batched kernels (one build per M, default
    their maximum); every other kernel has one build for all launches.
    """
    return _compiled(spec_of(name), _variant(name, m))


@functools.cache
def _compiled(
    spec: registry.KernelSpec, variant: int
):  # keyed by the spec: re-registered = rebuilt
    return cuda.jit(SIGNATURE)(_body(spec, variant or 1))


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of every kernel here, for PTX compilation tests.

    The batched kernels at their largest M and, as ``NAME@m3``, at M=3 (a
    tile whose staging does not divide evenly among the threads).
    """
    specs = [(name, kernel_body(name), SIGNATURE) for name in KERNELS]
    specs += [(f"{n}@m3", kernel_body(n, 3), SIGNATURE) for n in KERNELS if spec_of(n).per_m]
    return specs


# -- launches ------------------------------------------------------------------


def _max_m(name: str) -> int:
    return spec_of(name).max_m


def launch_args(name: str, d_a, dw: DeviceQ2Weight, d_out, m: int) -> tuple[tuple, tuple]:
    """``(grid, kernel arguments)`` of one launch of ``name``, validated.

    The one place that knows this family's kernel argument list (used by the
    launcher, :mod:`q2gemv.cuda.runtime.launcher`, for every seed launch).
    """
    spec = spec_of(name)
    if not isinstance(dw, DeviceQ2Weight):
        raise TypeError(f"weight: expected a DeviceQ2Weight, got {type(dw).__name__}")
    plan.check_launch_rows(name, d_a, d_out, m, spec.max_m, dw.n, dw.k)
    if spec.a_align > 2:
        plan.check_alignment(name, d_a, spec.a_align)
    plan.check_weight_halves(name, dw.n * fmt.row_bytes(dw.k, dw.group) // 2)
    b16, bh = dw.gguf_halves()
    args = (
        d_a,
        b16,
        bh,
        d_out,
        np.int32(dw.n),
        np.int32(dw.k),
        np.int32(dw.group),
        np.int32(m),
    )
    return spec.grid(dw.n), args


def launch_raw(name: str, d_a, dw: DeviceQ2Weight, d_out, m: int, stream=0) -> None:
    """One launch of kernel ``name`` on device arrays: A [m, K], C [m, N] (bf16 bits).

    Refuses ``m`` beyond what the kernel stages (1 for the M=1 kernels,
    8 for batchm) instead of writing out of bounds. A thin wrapper below the
    road (:mod:`q2gemv.host.call`), for benchmarks and scripts holding device
    arrays: ``launch_all([seed_launch(...)])`` (:mod:`q2gemv.cuda.runtime.launcher`)
    after checking ``name`` is a Q2_0 seed kernel.
    """
    from ..runtime import launcher

    spec_of(name)
    launcher.launch_all([launcher.seed_launch(name, d_a, dw, d_out, m)], stream)

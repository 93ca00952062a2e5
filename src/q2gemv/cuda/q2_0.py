"""numba.cuda kernels for GGUF ``block_q2_0`` GEMV, and their host launch wrappers.

Three kernels, one per seed kernel, each reproduced bit for bit by the
function of the same name in :mod:`q2gemv.reference.q2_0` (whose docstrings
state the operation order):

* ``q2_0_gemv`` — baseline: 2 warps per row, 4 rows per 256-thread CTA,
  one 16-bit load (8 codes) per thread per step, activations read from
  global memory.
* ``q2_0_gemv_vec`` — candidate B: 1 warp per row, 8 rows per CTA, 16 codes
  (two 16-bit halves) per lane per step. Each lane loads its own words'
  activations (two 16-byte loads per word, :func:`~q2gemv.cuda._dev.ld_bf16x8`;
  ``a`` must be 16-byte aligned, checked before launch). The seed staged them
  in shared memory; the order of the arithmetic is the same either way.
* ``q2_0_gemv_vec_batchm`` — the same thread map and per-row order for up
  to :data:`~q2gemv.launch.Q2_BATCHM_MAX_M` activation rows: activations
  staged in shared memory as fp32 tiles of :func:`tile_k` codes, each weight
  word read once and multiplied into all M accumulators.

Register-tiled candidates with the same per-row order: ``q2_0_gemv_vec_rt4``
(4 rows per warp, M=1) and ``q2_0_gemv_vec_batchm_rt2`` (2 rows per warp).

All of them read the raw GGUF bytes (keep-packed): ``B16`` is the byte buffer
viewed as uint16 (codes), ``Bh`` the same buffer viewed as float16 (the
inline scale ``d`` of block i is half ``i * (1 + group / 8)`` of a row).
``group`` is a run-time argument (64 or 128), as in the seed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, uint32, uint64

from .. import launch
from ..formats import q2_0 as fmt
from ._dev import (
    bf16_hi_to_f32,
    bf16_to_f32,
    f32_to_bf16,
    fadd_rn,
    fma,
    fmul_rn,
    ld_bf16x8,
    u32_as_f32,
    warp_sum,
)

SMEM_TILE_BYTES = 32 * 1024  # fp32 activation tile per CTA (static shared memory is 48 KB)


def tile_k(max_m: int) -> int:
    """Codes per staged activation tile: 32 KB of fp32 over ``max_m`` rows, a multiple of 512.

    A multiple of 512 keeps word w on lane w % 32 in every tile (the per-lane
    order of the reference). Measured on the H200 (16384x16384, M=1): with a
    1024-code tile the two barriers per tile dominated (q2_0_gemv_vec 189 us);
    M=1 kernels now stage 8192 codes per tile.
    """
    return (SMEM_TILE_BYTES // (4 * max_m)) // 512 * 512


def _code_minus_one(word, i):
    """fp32 ``code_i - 1`` of 2-bit field i (0..15) of ``word``: exact, no shift for i < 8.

    Field i sits at bit 2*(i % 8) of the low (i < 8) or high half. OR-ing it
    into the mantissa of 2^(23 - 2*(i % 8)) makes that float's ulp 1 at the
    field, so the float is 2^(23 - 2s) + code; subtracting 2^(23 - 2s) + 1 is
    exact (Sterbenz). One LOP3 and one FADD per code, with constants folded.
    """
    half = word if i < 8 else word >> uint32(16)
    slot = i & 7
    mag = uint32((150 - 2 * slot) << 23)
    f = u32_as_f32(mag | (half & uint32(3 << (2 * slot))))
    return f - (u32_as_f32(mag) + float32(1.0))


_code_minus_one = cuda.jit(device=True, inline="always")(_code_minus_one)


# -- kernel bodies (plain functions; compiled lazily, cached per knob) --------


def _q2_0_gemv_body(A, B16, Bh, C, N, K, group, M):  # noqa: N803 - seed names
    s_part = cuda.shared.array(8, float32)
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
                s = fma(_code_minus_one(word, i), bf16_to_f32(A[0, h * 8 + i]), s)
            acc = fadd_rn(acc, fmul_rn(s, d))
    v = warp_sum(acc)
    if lane == 0:
        s_part[warp] = v
    cuda.syncthreads()
    if lane == 0 and (warp & 1) == 0 and row < N:
        C[0, row] = f32_to_bf16(fadd_rn(s_part[warp], s_part[warp + 1]))


# Words (16 codes) each lane loads per row before it multiplies any of them: the
# loads of a batch are all in flight at once. Keyed by (max_m, rows per warp);
# 1 (the default) is one word, then its products. Measured on the H200 with
# benchmarks/sweep_words.py (M=1, results/h200_sweep_words.csv): q2_0_gemv_vec
# 91.9 / 89.9 / 88.9 us at 1 / 4 / 8 words (16384x16384); q2_0_gemv_vec_rt4
# 79.9 / 84.9 / 104.0 us at 1 / 2 / 4 (its 4 rows already give 4 loads in
# flight). Batches of the batchm kernels spill their accumulators to local
# memory (tests/test_ptx.py), so they stay at 1.
WORDS_IN_FLIGHT: dict[tuple[int, int], int] = {(1, 1): 8}


def _make_vec_body(max_m: int, rows_per_warp: int = 1, words: int | None = None):
    """Candidate-B body: 1 warp per row (``rows_per_warp`` rows per warp when register-tiled).

    ``max_m`` sizes the accumulators and the unrolled row loop (a run-time
    ``m < M`` guard skips dead rows) and picks the activation path: ``max_m = 1``
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

    @cuda.jit(device=True, inline="always")
    def load_word(B16, Bh, rbase, gw, wshift, wmask, hpb, wv, dv, slot):
        """Word ``gw`` of each of the T rows (row base ``rbase[t]``) into ``wv``/``dv[slot*T+t]``."""
        blk_half = (gw >> wshift) * hpb
        q_off = uint32(1) + uint32(2) * (gw & wmask)
        for t in range(T):
            hb = rbase[t] + blk_half
            dv[slot * T + t] = float32(Bh[hb])
            wv[slot * T + t] = uint32(B16[hb + q_off]) | (uint32(B16[hb + q_off + 1]) << uint32(16))

    @cuda.jit(device=True, inline="always")
    def decode(wv, slot, cm1):
        """``code - 1`` of the 16 codes of the word in ``slot``, for each of the T rows."""
        for t in range(T):
            word = wv[slot * T + t]
            for i in range(16):
                cm1[t * 16 + i] = _code_minus_one(word, i)

    @cuda.jit(device=True, inline="always")
    def mac16(cm1, av, dv, slot, acc, m):
        """acc[m, t] += (sum of the 16 products, in order) * d, for each of the T rows."""
        for t in range(T):
            s = float32(0.0)
            for i in range(16):
                s = fma(cm1[t * 16 + i], av[i], s)
            acc[m * T + t] = fadd_rn(acc[m * T + t], fmul_rn(s, dv[slot * T + t]))

    @cuda.jit(device=True, inline="always")
    def mac_word(s_a, wl, wv, dv, slot, cm1, av, acc, M):
        """Word ``wl`` of the tile (loaded in ``slot``) times every active row of activations."""
        decode(wv, slot, cm1)
        for m in range(max_m):
            if m < M:
                base = uint32(m * TILE_K) + wl * uint32(16)
                for i in range(16):
                    av[i] = s_a[base + uint32(i)]
                mac16(cm1, av, dv, slot, acc, m)

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
    def mac_word_direct(aw, wv, dv, slot, cm1, av, acc):
        """The word in ``slot`` times row 0's activations loaded with it (M=1 kernels)."""
        decode(wv, slot, cm1)
        for j in range(8):
            av[2 * j] = bf16_to_f32(aw[slot * 8 + j])
            av[2 * j + 1] = bf16_hi_to_f32(aw[slot * 8 + j])
        mac16(cm1, av, dv, slot, acc, 0)

    @cuda.jit(device=True, inline="always")
    def setup(N, K, group, rbase, acc):  # noqa: N803
        """This warp's rows and the block geometry; zeroes ``acc``, fills ``rbase``.

        Returns ``(lane, row0, n_rows, wshift, wmask, hpb)``: ``row0`` is the
        warp's first row, ``wshift`` log2 of the 16-code words per block
        (group / 16), ``hpb`` the uint16 halves per block, scale included.
        ``rbase[t]`` is the first half of row ``row0 + t``; rows past N (tail
        of the last CTA) point at row N-1 and are never stored.
        """
        tid = uint32(cuda.threadIdx.x)
        lane = tid & uint32(31)
        row0 = uint32(cuda.blockIdx.x) * uint32(rows_per_cta) + (tid >> uint32(5)) * uint32(T)
        wshift = uint32(3 if group == 128 else 2)
        wmask = (uint32(1) << wshift) - uint32(1)
        hpb = uint32((group >> 3) + 1)
        row_halves = uint64(K // group) * uint64(hpb)
        n_rows = uint32(N)
        for t in range(T):
            rbase[t] = uint64(min(row0 + uint32(t), n_rows - uint32(1))) * row_halves
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
        rbase = cuda.local.array(T, uint64)
        lane, row0, n_rows, wshift, wmask, hpb = setup(N, K, group, rbase, acc)
        if row0 < n_rows and M > 0:
            nw = uint32(K) >> uint32(4)
            wl = lane
            while wl + uint32(32 * (U - 1)) < nw:  # full batches
                for u in range(U):
                    load_word(B16, Bh, rbase, wl + uint32(32 * u), wshift, wmask, hpb, wv, dv, u)
                    load_acts(A, wl + uint32(32 * u), aw, u)
                for u in range(U):
                    mac_word_direct(aw, wv, dv, u, cm1, av, acc)
                wl += uint32(32 * U)
            while wl < nw:  # the row's last words, one at a time
                load_word(B16, Bh, rbase, wl, wshift, wmask, hpb, wv, dv, 0)
                load_acts(A, wl, aw, 0)
                mac_word_direct(aw, wv, dv, 0, cm1, av, acc)
                wl += uint32(32)
        for t in range(T):
            v = warp_sum(acc[t])
            if lane == 0 and row0 + uint32(t) < n_rows and M > 0:
                C[0, row0 + uint32(t)] = f32_to_bf16(v)

    def body(A, B16, Bh, C, N, K, group, M):  # noqa: N803
        s_a = cuda.shared.array(smem, float32)
        acc = cuda.local.array(n_acc, float32)
        cm1 = cuda.local.array(n_cm1, float32)
        av = cuda.local.array(16, float32)
        wv = cuda.local.array(n_ld, uint32)
        dv = cuda.local.array(n_ld, float32)
        rbase = cuda.local.array(T, uint64)
        lane, row0, n_rows, wshift, wmask, hpb = setup(N, K, group, rbase, acc)
        for k0 in range(0, K, TILE_K):
            kt = uint32(min(TILE_K, K - k0))
            cuda.syncthreads()
            for m in range(max_m):
                if m < M:
                    for j in range(uint32(cuda.threadIdx.x), kt, uint32(256)):
                        s_a[uint32(m * TILE_K) + j] = bf16_to_f32(A[uint32(m), uint32(k0) + j])
            cuda.syncthreads()
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
                        mac_word(s_a, wl + uint32(32 * u), wv, dv, u, cm1, av, acc, M)
                    wl += uint32(32 * U)
                while wl < nw:  # the tile's last words, one at a time
                    load_word(B16, Bh, rbase, gw0 + wl, wshift, wmask, hpb, wv, dv, 0)
                    mac_word(s_a, wl, wv, dv, 0, cm1, av, acc, M)
                    wl += uint32(32)
        for m in range(max_m):
            if m < M:
                for t in range(T):
                    v = warp_sum(acc[m * T + t])
                    if lane == 0 and row0 + uint32(t) < n_rows:
                        C[m, row0 + uint32(t)] = f32_to_bf16(v)

    return body_direct if max_m == 1 else body


# name -> (body factory, max_m per launch)
KERNELS: dict[str, tuple] = {
    "q2_0_gemv": (lambda: _q2_0_gemv_body, 1),
    "q2_0_gemv_vec": (lambda: _make_vec_body(1), 1),
    "q2_0_gemv_vec_batchm": (lambda: _make_vec_body(launch.Q2_BATCHM_MAX_M), 8),
    # register-tiled candidates: same per-row order as q2_0_gemv_vec (same reference)
    "q2_0_gemv_vec_rt4": (lambda: _make_vec_body(1, 4), 1),
    "q2_0_gemv_vec_batchm_rt2": (lambda: _make_vec_body(launch.Q2_BATCHM_MAX_M, 2), 8),
}
# M=1 vec kernels read their activations straight from global memory, 16 bytes per load
DIRECT_LOAD_KERNELS = frozenset(n for n, (_, mm) in KERNELS.items() if mm == 1 and n != "q2_0_gemv")
SIGNATURE = (
    "void(uint16[:, ::1], uint16[::1], float16[::1], uint16[:, ::1], int32, int32, int32, int32)"
)


def kernel_body(name: str):
    """The plain Python body of kernel ``name`` (for ``cuda.compile_ptx``)."""
    return KERNELS[name][0]()


@functools.cache
def compiled(name: str):
    """The ``cuda.jit`` dispatcher of kernel ``name``, built on first use."""
    if name not in KERNELS:
        raise ValueError(f"kernel: expected one of {sorted(KERNELS)}, got {name!r}")
    return cuda.jit(SIGNATURE)(kernel_body(name))


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of every kernel here, for PTX compilation tests."""
    return [(name, kernel_body(name), SIGNATURE) for name in KERNELS]


# -- device-resident weights ---------------------------------------------------


@dataclass(frozen=True)
class DeviceQ2Weight:
    """A :class:`~q2gemv.Q2Weight` uploaded once: reuse it across calls."""

    b16: object  # device uint16 view of the raw bytes
    bh: object  # device float16 view of the same bytes
    n: int
    k: int
    group: int

    @classmethod
    def upload(cls, w: fmt.Q2Weight, stream=0) -> DeviceQ2Weight:
        if not isinstance(w, fmt.Q2Weight):
            raise TypeError(f"weight: expected a Q2Weight, got {type(w).__name__}")
        d = cuda.to_device(w.raw.view(np.uint16), stream=stream)
        return cls(d, d.view(np.float16), w.n, w.k, w.group)


def as_device_weight(weight, stream=0) -> DeviceQ2Weight:
    if isinstance(weight, DeviceQ2Weight):
        return weight
    if isinstance(weight, fmt.Q2Weight):
        return DeviceQ2Weight.upload(weight, stream)
    raise TypeError(f"weight: expected a Q2Weight or DeviceQ2Weight, got {type(weight).__name__}")


# -- launches ------------------------------------------------------------------


def _max_m(name: str) -> int:
    if name not in KERNELS:
        raise ValueError(f"kernel: expected one of {sorted(KERNELS)}, got {name!r}")
    return KERNELS[name][1]


def check_bits(a_bits, k: int) -> None:
    """Activation bits for :func:`run`: a uint16 numpy array [M, k]; raises naming ``a_bits``."""
    if not isinstance(a_bits, np.ndarray) or a_bits.dtype != np.uint16:
        got = a_bits.dtype if isinstance(a_bits, np.ndarray) else type(a_bits).__name__
        raise TypeError(f"a_bits: expected uint16 bf16 bits (a numpy array), got {got}")
    if a_bits.ndim != 2 or a_bits.shape[1] != k:
        raise ValueError(f"a_bits: expected shape [M, K] = [M, {k}], got {a_bits.shape}")


def launch_args(name: str, d_a, dw: DeviceQ2Weight, d_out, m: int) -> tuple[tuple, tuple]:
    """``(grid, kernel arguments)`` of one launch of ``name``, validated.

    The one place that knows this family's kernel argument list (used by
    :func:`launch_raw` and by the pre-bound path in :mod:`q2gemv.cuda.prebound`).
    """
    max_m = _max_m(name)
    if not isinstance(dw, DeviceQ2Weight):
        raise TypeError(f"weight: expected a DeviceQ2Weight, got {type(dw).__name__}")
    launch.check_launch_rows(name, d_a, d_out, m, max_m, dw.n, dw.k)
    if name in DIRECT_LOAD_KERNELS:
        launch.check_alignment(name, d_a, 16)
    args = (
        d_a,
        dw.b16,
        dw.bh,
        d_out,
        np.int32(dw.n),
        np.int32(dw.k),
        np.int32(dw.group),
        np.int32(m),
    )
    return launch.q2_grid(name, dw.n), args


def launch_raw(name: str, d_a, dw: DeviceQ2Weight, d_out, m: int, stream=0) -> None:
    """One launch of kernel ``name`` on device arrays: A [m, K], C [m, N] (bf16 bits).

    Refuses ``m`` beyond what the kernel stages (1 for the M=1 kernels,
    8 for batchm) instead of writing out of bounds.
    """
    grid, args = launch_args(name, d_a, dw, d_out, m)
    compiled(name)[grid, launch.THREADS_PER_CTA, stream](*args)


def run(name: str, a_bits: np.ndarray, weight, stream=0) -> np.ndarray:
    """Run kernel ``name`` over every row of ``a_bits`` (uint16 [M, K]); returns uint16 [M, N].

    The M=1 kernels take one launch per activation row; batchm takes one
    launch per chunk of at most 8 rows (:func:`q2gemv.launch.batchm_row_chunks`).
    """
    max_m = _max_m(name)
    dw = as_device_weight(weight, stream)
    check_bits(a_bits, dw.k)
    m = a_bits.shape[0]
    out = np.empty((m, dw.n), dtype=np.uint16)
    if m == 0:
        return out
    d_a = cuda.to_device(np.ascontiguousarray(a_bits), stream=stream)
    d_out = cuda.device_array((m, dw.n), dtype=np.uint16, stream=stream)
    for r0, rows in launch.batchm_row_chunks(m, max_m):
        launch_raw(name, d_a[r0 : r0 + rows], dw, d_out[r0 : r0 + rows], rows, stream)
    d_out.copy_to_host(out, stream=stream)
    if stream:
        stream.synchronize()
    return out

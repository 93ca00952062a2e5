"""numba.cuda kernels of the W4A16 NVFP4 seed contract, and their host launch wrappers.

Every kernel here is reproduced bit for bit by :func:`q2gemv.reference.nvfp4.w4a16_gemv`,
whose docstring states the contract (thread map and fp32 operation order).

One template, ``w4a16_gemv_batchm`` (:func:`_make_batchm_body`), with the compile-time
knobs of its :class:`KernelSpec` (each compiled kernel is cached by name):

* ``max_m`` sizes the per-row accumulators, the staged activation tile and the unrolled
  per-row loop; a run-time ``m < M`` guard skips dead rows. The tiers
  ``w4a16_gemv_batch4`` .. ``_batch8`` (:mod:`q2gemv.dispatch.nvfp4_tiers`) and the wide ``_batch16`` /
  ``_batch32`` are this template at max_m = 4..8, 16, 32.
* ``cols`` — output columns per warp. ``w4a16_gemv_batch8_rt2`` (cols = 2) loads each
  staged activation once from shared memory for two columns; every column keeps the
  per-lane order, so the bits are identical.
* ``depth`` / ``a_ahead`` — latency hiding only (register look-ahead of weights and of
  the next activation tile); no change to the arithmetic.

Thread map (fixed by the contract): 256-thread CTAs of 8 warps; warp w of CTA b computes
columns ``(8 b + w) * cols + t`` (t < cols); lane l owns the 16-weight groups q = l,
l+32, ... of those columns. Grid ``ceil(N / (8 * cols))``; a warp wholly past N only
helps stage activations; rt2's second column past N reads a valid (clamped) row and
writes nothing.

Per K tile of :data:`TILE_K` = 512 elements (32 groups: lane l takes the tile's group l),
the CTA stages the live activation rows in shared memory transposed to
``[m][i][group]`` with group stride 33, so lane l reading element i of its group hits
consecutive words (``[m][k]`` would be a 16-way bank conflict). Rows are staged as fp32
where that fits the 48 KB static limit (max_m <= 16: 33.8 KB at 16), as raw bf16 bits
otherwise (max_m = 32, 33.8 KB; widened exactly at use). Per group the two words of its
16 nibbles are read once per column, each E2M1 value and the E4M3 scale decoded once
(exact bit tricks) and used for all live rows.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from ...dispatch import nvfp4_tiers, registry
from ...dispatch.nvfp4_tiers import W4a16BatchmTiers, check_plan, plan_w4a16
from ...dispatch.plan import check_launch_rows
from ...formats.bf16 import as_bf16_rows, bits_to_bf16
from ...formats.nvfp4 import BLOCK, Nvfp4Weight
from ...host.backends import simulator_lock
from ..runtime.dev import bf16_to_f32, f32_to_bf16, fadd_rn, fma, fmul_rn, u32_as_f32, warp_sum
from .weight import DeviceNvfp4Weight, as_device_weight

THREADS_PER_CTA = registry.THREADS_PER_CTA
WARPS_PER_CTA = THREADS_PER_CTA // 32
SMEM_STATIC_LIMIT = 48 * 1024
# K elements staged per tile: 32 groups, one per lane, so lane l always meets
# the groups q = l (mod 32). Kept at one group per lane so K = 528 already
# spans two tiles in every tier (the simulator tests reach the tile seam).
TILE_K = 512
_E2M1_RESCALE = 2.0**126  # nibble bits placed at fp32 bits 24..22 read as x * 2^-126
_E4M3_RESCALE = 2.0**120  # byte bits placed at fp32 bits 26..20 read as x * 2^-120
_F32_QNAN = 0x7FC00000


class _SpecView(Mapping):
    """Read-only live view of the registry's specs of one family and contract, by name."""

    def __init__(self, family: str, contract: str):
        self._names = registry.table(family, contract)

    def __getitem__(self, name: str) -> registry.KernelSpec:
        if name not in self._names:
            raise KeyError(name)
        return registry.get(name)

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


# A kernel's identity and compile-time knobs (max_m, cols = rows_per_warp, depth, a_ahead,
# unroll_words, grid): the registry's spec, q2gemv.dispatch.registry.
KernelSpec = registry.KernelSpec


def stage_f32(max_m: int) -> bool:
    """Stage activations as fp32 (True), or as raw bf16 bits where fp32 would pass 48 KB."""
    return max_m * BLOCK * (TILE_K // BLOCK + 1) * 4 <= SMEM_STATIC_LIMIT


# Live read-only view: every W4A16 seed kernel of the registry (its knobs are set there).
SPECS = _SpecView("w4a16", "seed")
KERNEL_NAMES: tuple[str, ...] = tuple(SPECS)
SIGNATURE = (
    "void(uint16[:, ::1], uint32[:, ::1], uint8[:, ::1], uint16[:, ::1], "
    "float32, int32, int32, int32)"
)


# -- device helpers (exact decodes built on _dev's bit casts) -----------------------


@cuda.jit(device=True, inline="always")
def _e2m1_low(word):
    """fp32 value of the E2M1 code in the low nibble of ``word``, exactly.

    ``eem`` goes to fp32 bits 24..22 and the sign to bit 31, which reads as
    the value times 2^-126 (code 1 lands on the fp32 subnormal 2^-127); the
    power-of-two rescale is exact. Constant shifts only: the caller walks a
    word by shifting it right 4 bits per element.
    """
    bits = ((word & uint32(7)) << uint32(22)) | ((word & uint32(8)) << uint32(28))
    return u32_as_f32(bits) * float32(_E2M1_RESCALE)


@cuda.jit(device=True, inline="always")
def _e4m3(b):
    """fp32 value of E4M3-fn bit pattern ``b`` (0..255), exactly; 0x7F/0xFF -> NaN.

    ``eeeemmm`` goes to fp32 bits 26..20 (sign to 31): the value times 2^-120
    (subnormals land on fp32 subnormals); the rescale is exact.
    """
    bits = ((b & uint32(0x7F)) << uint32(20)) | ((b & uint32(0x80)) << uint32(24))
    v = u32_as_f32(bits) * float32(_E4M3_RESCALE)
    if (b & uint32(0x7F)) == uint32(0x7F):
        v = u32_as_f32(uint32(_F32_QNAN))
    return v


@cuda.jit(device=True, inline="always")
def _keep(h):
    return h


# -- the template --------------------------------------------------------------------


def _make_batchm_body(max_m: int, cols: int, depth: int, a_ahead: bool, unroll_words: bool):
    """Kernel body of ``w4a16_gemv_batchm<max_m>`` computing ``cols`` columns per warp.

    Arguments: A uint16 [M, K] (bf16 bits), Wp uint32 [N, K/8] (the packed
    nibbles, two words per group), S uint8 [N, K/16] (E4M3 bits), C uint16
    [M, N] (bf16 bits, written), g fp32 global scale, N, K, M.

    Latency hiding (numerically inert): each lane keeps the words and scale
    bytes of its next ``depth`` groups in registers, loading group
    ``q + 32 * depth`` before it computes group ``q``; with ``a_ahead`` each
    thread also holds its share of the next activation tile in registers
    while the current tile is computed. ``unroll_words`` walks each 32-bit
    word of nibbles with constant shifts (unrolled) instead of one rolled
    16-element loop.
    """
    gstride = TILE_K // BLOCK + 1  # padded: staging writes spread over banks too
    mstride = BLOCK * gstride
    smem = max_m * mstride
    as_f32 = stage_f32(max_m)
    sdtype = float32 if as_f32 else uint16
    stage = bf16_to_f32 if as_f32 else _keep  # on the way into shared memory
    fetch = _keep if as_f32 else bf16_to_f32  # on the way out
    nacc = max_m * cols
    nslot = depth * cols
    per_thread = TILE_K // THREADS_PER_CTA  # activations a thread stages per row per tile
    nra = max_m * per_thread if a_ahead else 1

    def body(A, Wp, S, C, g, N, K, M):  # noqa: N803 - kernel argument names
        s_a = cuda.shared.array(smem, sdtype)
        acc = cuda.local.array(nacc, float32)
        part = cuda.local.array(nacc, float32)
        pw_lo = cuda.local.array(nslot, uint32)  # slot s, column t at s * cols + t
        pw_hi = cuda.local.array(nslot, uint32)
        p_sc = cuda.local.array(nslot, uint32)
        w_lo = cuda.local.array(cols, uint32)
        w_hi = cuda.local.array(cols, uint32)
        scale = cuda.local.array(cols, float32)
        ev = cuda.local.array(cols, float32)
        ra = cuda.local.array(nra, uint16)
        tid = cuda.threadIdx.x
        lane = tid & 31
        col0 = (cuda.blockIdx.x * WARPS_PER_CTA + (tid >> 5)) * cols
        live = col0 < N  # warp-uniform: a warp wholly past N only helps stage
        groups = K >> 4
        for x in range(nacc):
            acc[x] = float32(0.0)
        if live:
            for s in range(depth):
                qs = lane + 32 * s
                if qs < groups:
                    for t in range(cols):
                        r = min(col0 + t, N - 1)  # rt2's column past N: a valid row
                        pw_lo[s * cols + t] = uint32(Wp[r, 2 * qs])
                        pw_hi[s * cols + t] = uint32(Wp[r, 2 * qs + 1])
                        p_sc[s * cols + t] = uint32(S[r, qs])
        if a_ahead:
            for m in range(max_m):
                if m < M:
                    for h in range(per_thread):
                        j = tid + h * THREADS_PER_CTA
                        if j < K:
                            ra[m * per_thread + h] = A[m, j]
        for k0 in range(0, K, TILE_K):
            kt = min(TILE_K, K - k0)
            cuda.syncthreads()
            for m in range(max_m):
                if m < M:
                    for h in range(per_thread):
                        j = tid + h * THREADS_PER_CTA
                        if j < kt:
                            dst = uint32(m * mstride) + uint32((j & 15) * gstride + (j >> 4))
                            if a_ahead:
                                s_a[dst] = stage(ra[m * per_thread + h])
                                if k0 + TILE_K + j < K:
                                    ra[m * per_thread + h] = A[m, k0 + TILE_K + j]
                            else:
                                s_a[dst] = stage(A[m, k0 + j])
            cuda.syncthreads()
            if not live:
                continue
            q = (k0 >> 4) + lane  # this lane's group in the tile
            for t in range(cols):
                w_lo[t] = pw_lo[t]
                w_hi[t] = pw_hi[t]
                scale[t] = _e4m3(p_sc[t])
            for s in range(depth - 1):
                for t in range(cols):
                    pw_lo[s * cols + t] = pw_lo[(s + 1) * cols + t]
                    pw_hi[s * cols + t] = pw_hi[(s + 1) * cols + t]
                    p_sc[s * cols + t] = p_sc[(s + 1) * cols + t]
            qn = q + 32 * depth
            if qn < groups:
                for t in range(cols):
                    r = min(col0 + t, N - 1)
                    x = (depth - 1) * cols + t
                    pw_lo[x] = uint32(Wp[r, 2 * qn])
                    pw_hi[x] = uint32(Wp[r, 2 * qn + 1])
                    p_sc[x] = uint32(S[r, qn])
            if q >= groups:
                continue  # the last tile is short: this lane has no group in it
            for x in range(nacc):
                part[x] = float32(0.0)
            # unsigned indices: numba adds a negative-index fix-up to signed ones
            off = uint64(lane)
            if unroll_words:  # constant shifts: LLVM unrolls the 8 nibbles of a word
                for h in range(2):  # the group's two words: elements 0..7, then 8..15
                    for t in range(cols):
                        if h == 1:
                            w_lo[t] = w_hi[t]
                    for j in range(8):
                        for t in range(cols):
                            ev[t] = _e2m1_low(w_lo[t] >> uint32(4 * j))
                        for m in range(max_m):
                            if m < M:
                                a = fetch(s_a[off + uint64(m * mstride)])
                                for t in range(cols):
                                    part[t * max_m + m] = fma(ev[t], a, part[t * max_m + m])
                        off += uint64(gstride)
            else:  # one rolled loop over the 16 elements: less code for wide tiers
                for i in range(BLOCK):
                    for t in range(cols):
                        if i == 8:
                            w_lo[t] = w_hi[t]
                        ev[t] = _e2m1_low(w_lo[t])
                        w_lo[t] = w_lo[t] >> uint32(4)
                    for m in range(max_m):
                        if m < M:
                            a = fetch(s_a[off + uint64(m * mstride)])
                            for t in range(cols):
                                part[t * max_m + m] = fma(ev[t], a, part[t * max_m + m])
                    off += uint64(gstride)
            for m in range(max_m):
                if m < M:
                    for t in range(cols):
                        x = t * max_m + m
                        acc[x] = fadd_rn(acc[x], fmul_rn(part[x], scale[t]))
        if not live:
            return
        for m in range(max_m):
            if m < M:
                for t in range(cols):
                    v = warp_sum(acc[t * max_m + m])
                    if lane == t and col0 + t < N:
                        C[m, col0 + t] = f32_to_bf16(fmul_rn(v, g))

    return body


def kernel_body(name: str):
    """The plain Python body of kernel ``name`` (for ``cuda.jit`` / ``cuda.compile_ptx``)."""
    return _body_of(spec_of(name))


@functools.cache
def _body_of(spec: KernelSpec):
    return _make_batchm_body(spec.max_m, spec.cols, spec.depth, spec.a_ahead, spec.unroll_words)


def spec_of(name: str) -> KernelSpec:
    """The registry spec of W4A16 kernel ``name``; TypeError/ValueError naming ``kernel``."""
    if not isinstance(name, str):
        raise TypeError(f"kernel: expected a kernel name (str), got {type(name).__name__}")
    if name not in SPECS:
        raise ValueError(f"kernel: expected one of {list(SPECS)}, got {name!r}")
    return SPECS[name]


MAX_M = registry.table("w4a16", "seed")  # live: name -> rows per launch
_BUILD_LOCK = threading.Lock()  # threads asking for one kernel at once build it once


def compiled(name: str, m: int | None = None):
    """The ``cuda.jit`` dispatcher of kernel ``name``, built (compiled) on first use.

    ``m`` (the launch's rows) is accepted for the launcher's one interface
    (``compiled(name, rows)``) and unused: a tier is built once for every M.
    """
    spec = spec_of(name)
    with _BUILD_LOCK:
        return _compiled(spec)


@functools.cache
def _compiled(spec: KernelSpec):  # keyed by the whole spec: a re-registered spec is rebuilt
    return cuda.jit(SIGNATURE)(_body_of(spec))


def buildable_kernels(names: Iterable[str] = KERNEL_NAMES) -> list[str]:
    """The subset of ``names`` that this module defines and that build on the current target.

    The default resolver of :meth:`q2gemv.dispatch.nvfp4_tiers.W4a16BatchmTiers.resolve`: a
    kernel that fails to build is left out (an absent tier), not an error.
    """
    ok = []
    for name in names:
        if name not in SPECS:
            continue
        try:
            compiled(name)
        except Exception:  # noqa: BLE001 - any build failure means "absent"
            continue
        ok.append(name)
    return ok


nvfp4_tiers.set_default_resolver(buildable_kernels)  # which tiers exist = which build here


def ptx_specs() -> list[tuple[str, object, str]]:
    """``(name, body, signature)`` of every kernel here, for PTX compilation tests."""
    return [(name, kernel_body(name), SIGNATURE) for name in SPECS]


# -- launches -------------------------------------------------------------------------------


def launch_args(name: str, d_a, dw: DeviceNvfp4Weight, d_out, m: int) -> tuple[tuple, tuple]:
    """``(grid, kernel arguments)`` of one launch of ``name``, validated.

    The one place that knows this family's kernel argument list (used by the
    launcher, :mod:`q2gemv.cuda.runtime.launcher`, for every seed launch).
    """
    spec = spec_of(name)
    if not isinstance(dw, DeviceNvfp4Weight):
        raise TypeError(f"weight: expected a DeviceNvfp4Weight, got {type(dw).__name__}")
    check_launch_rows(name, d_a, d_out, m, spec.max_m, dw.n, dw.k)
    wp, scales = dw.raw_parts()
    args = (
        d_a,
        wp,
        scales,
        d_out,
        np.float32(dw.global_scale),
        np.int32(dw.n),
        np.int32(dw.k),
        np.int32(m),
    )
    return spec.grid(dw.n), args


def launch_raw(name: str, d_a, dw: DeviceNvfp4Weight, d_out, m: int, stream=0) -> None:
    """One launch of kernel ``name`` on device arrays: A [m, K], C [m, N] (bf16 bits, uint16).

    Refuses ``m`` beyond the kernel's ``max_m`` (the kernel stages and
    accumulates at most that many rows) instead of leaving rows unwritten.
    A thin wrapper below the road (:mod:`q2gemv.host.call`), for benchmarks
    and scripts holding device arrays: ``launch_all([seed_launch(...)])``
    (:mod:`q2gemv.cuda.runtime.launcher`) after checking ``name`` is a W4A16 tier.
    """
    from ..runtime import launcher

    spec_of(name)
    launcher.launch_all([launcher.seed_launch(name, d_a, dw, d_out, m)], stream)


def chunk_plan(name: str, m: int) -> list[tuple[int, int, str]]:
    """``(row0, rows, name)`` launches of kernel ``name`` covering ``m`` rows (<= max_m each)."""
    max_m = spec_of(name).max_m
    return [(r0, min(max_m, m - r0), name) for r0 in range(0, m, max_m)]


def _run_plan(plan, a_bits: np.ndarray, weight, stream) -> np.ndarray:
    """Run the launches ``plan`` over ``a_bits``; the whole plan is checked before any work.

    A plan naming an unknown kernel, or rows a kernel does not serve, or not
    covering every row once (:func:`q2gemv.dispatch.nvfp4_tiers.check_plan`) is refused
    before the weight is uploaded or a chunk launched.
    """
    if not isinstance(weight, (Nvfp4Weight, DeviceNvfp4Weight)):
        raise TypeError(
            f"weight: expected an Nvfp4Weight or DeviceNvfp4Weight, got {type(weight).__name__}"
        )
    from ..runtime.launcher import check_bits, run_host

    check_bits(a_bits, weight.k)

    m = a_bits.shape[0]
    plan = check_plan(plan, m, MAX_M)
    if m == 0:
        return np.empty((m, weight.n), dtype=np.uint16)
    with simulator_lock():
        dw = as_device_weight(weight, stream, "seed")
        return run_host("w4a16", "seed", plan, a_bits, dw, stream)


def w4a16_gemv(
    a: np.ndarray,
    weight,
    *,
    kernel: str | None = None,
    tiers: W4a16BatchmTiers | None = None,
    stream=0,
) -> np.ndarray:
    """``a @ w.T`` on the GPU (or the simulator), bit-equal to the NumPy reference.

    ``a``: bf16 (``ml_dtypes.bfloat16``) [K] or [M, K]; ``weight``: an
    :class:`~q2gemv.formats.nvfp4.Nvfp4Weight` or a :class:`DeviceNvfp4Weight`.
    Returns bf16 [N] or [M, N].

    ``kernel`` forces one kernel of :data:`KERNEL_NAMES` (rows chunked by its
    max_m). Otherwise the launches follow :func:`q2gemv.dispatch.nvfp4_tiers.plan_w4a16`
    over ``tiers`` (default: every tier here treated as present, compiled on
    first use, so the kill switches of :mod:`q2gemv.dispatch.nvfp4_tiers` apply).

    A thin wrapper for a caller's own tier table: :func:`q2gemv.gemv` is the
    road; this runs its plan through the road's host edge
    (:func:`q2gemv.cuda.runtime.launcher.run_host`), the same launches.
    """
    if not isinstance(weight, (Nvfp4Weight, DeviceNvfp4Weight)):
        as_device_weight(weight)  # raises the TypeError naming weight
    bits2, squeeze = as_bf16_rows(a, weight.k)
    m = bits2.shape[0]
    if kernel is not None:
        plan = chunk_plan(kernel, m)
    else:
        if tiers is None:
            tiers = W4a16BatchmTiers.resolve(KERNEL_NAMES)
        plan = plan_w4a16(m, tiers)
    out = _run_plan(plan, bits2, weight, stream)  # checks the whole plan before any launch
    y = bits_to_bf16(out)
    return y[0] if squeeze else y

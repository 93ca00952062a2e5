"""Timing GPU work only: CUDA-graph replays or launches queued behind a spin kernel.

Two timers with one method, :meth:`time_sequence`: given a list of
"calls" (each enqueues one unit of work on the stream handle it is given:
a pre-bound launch, a chunked GEMV, a torch ``F.linear``), return the GPU
seconds per call of each timed repeat.

* :class:`GraphTimer` (default) — captures the whole sequence once into a
  ``torch.cuda.CUDAGraph`` on a torch stream (numba launches enqueue on the
  same raw stream handle), then records a CUDA event pair around each replay. The host
  enqueues one graph launch per repeat, so it can never starve the GPU;
  inside the graph kernels run back to back (no host gaps, no overlap).
* :class:`SleepTimer` — no graphs (torch absent, or capture refused): a
  one-thread spin kernel holds the stream for longer than the host needs to
  enqueue the sequence, the start event is recorded after it, so the timed
  span is the sequence alone. A repeat whose host enqueue outlasted the spin
  is flagged (``starved``).

Both run the sequence once eagerly before timing (module load, cuBLAS
workspace, clocks), then ``warmup`` untimed repeats.

Also here: the streaming-read ceiling kernels (16 bytes per thread through
``ld.global.v4.u32``; a simulator twin reads the same words) and the spin
kernel (``%globaltimer``). Nothing compiles at import.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numba import config, cuda, types, uint32, uint64

from ..cuda.runtime.prebound import PreboundLaunch, stream_handle

SIMULATED: bool = bool(config.ENABLE_CUDASIM)
READ_THREADS = 256
READ_CTAS_PER_SM = 8  # 2048 resident threads per SM on sm_90
READ_UNROLL = 4  # independent 16-byte loads in flight per thread per step
_NEVER = 0x9E3779B9  # the read kernels write only if the xor of everything equals this

Call = Callable[[int], None]


@dataclass(frozen=True)
class Timing:
    """Per-call GPU seconds of each timed repeat, and how they were taken."""

    per_call_s: tuple[float, ...]
    calls: int  # calls per timed span (graph length)
    method: str
    starved: int = 0  # repeats whose host enqueue outlasted the spin (SleepTimer only)

    @property
    def median_s(self) -> float:
        return float(np.median(self.per_call_s)) if self.per_call_s else float("nan")


# -- device helpers ---------------------------------------------------------------


def _ld_v4_xor(typingctx, arr, idx):
    """xor of the 4 uint32 words at ``arr[idx .. idx+3]``, read by one ``ld.global.v4.u32``.

    ``idx`` must be a multiple of 4 (16-byte alignment; numba allocations are
    256-byte aligned).
    """
    sig = types.uint32(arr, idx)

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        arrty, idxty = sig.args
        ary = context.make_array(arrty)(context, builder, value=args[0])
        i = context.cast(builder, args[1], idxty, types.intp)
        ptr = builder.gep(ary.data, [i])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
        asm = ir.InlineAsm(fnty, "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
        r = builder.call(asm, [ptr])
        x = builder.extract_value(r, 0)
        for j in range(1, 4):
            x = builder.xor(x, builder.extract_value(r, j))
        return x

    return sig, codegen


def _globaltimer(typingctx):
    """The GPU's nanosecond ``%globaltimer`` (volatile: read anew every time)."""
    sig = types.uint64()

    def codegen(context, builder, sig, args):
        from llvmlite import ir

        fnty = ir.FunctionType(ir.IntType(64), [])
        asm = ir.InlineAsm(fnty, "mov.u64 $0, %globaltimer;", "=l", side_effect=True)
        return builder.call(asm, [])

    return sig, codegen


def _ld16_xor_sim(arr, idx):
    return arr[idx] ^ arr[idx + 1] ^ arr[idx + 2] ^ arr[idx + 3]


if SIMULATED:  # the simulator cannot lower inline PTX: the same words, four loads
    _ld16_xor = cuda.jit(device=True)(_ld16_xor_sim)
    _globaltimer = None
else:
    from numba.cuda.extending import intrinsic

    _ld16_xor = intrinsic(_ld_v4_xor)
    _globaltimer = intrinsic(_globaltimer)


def _read16_grid_stride(buf, out, n16):
    """Grid-stride read of ``n16`` 16-byte chunks, READ_UNROLL independent loads per step."""
    tid = cuda.grid(1)
    stride = cuda.gridsize(1)
    acc = uint32(0)
    i = tid
    step = stride * READ_UNROLL
    while i + stride * (READ_UNROLL - 1) < n16:
        for u in range(READ_UNROLL):
            acc ^= _ld16_xor(buf, (i + u * stride) * 4)
        i += step
    while i < n16:
        acc ^= _ld16_xor(buf, i * 4)
        i += stride
    if acc == uint32(_NEVER):
        out[tid] = acc


def _read16_one_per_thread(buf, out, n16):
    """One 16-byte load per thread; the grid covers the buffer."""
    i = cuda.grid(1)
    if i < n16:
        v = _ld16_xor(buf, i * 4)
        if v == uint32(_NEVER):
            out[i] = v


def _spin(ns, out):
    t0 = _globaltimer()
    while _globaltimer() - t0 < ns:
        pass
    out[0] = uint64(1)


READ_KERNELS = {
    "numba_read16_gridstride": _read16_grid_stride,
    "numba_read16_one_per_thread": _read16_one_per_thread,
}
_READ_SIGNATURE = "void(uint32[::1], uint32[::1], int64)"


@functools.cache
def read_kernel(name: str):
    return cuda.jit(_READ_SIGNATURE)(READ_KERNELS[name])


@functools.cache
def spin_kernel():
    if SIMULATED:
        raise RuntimeError("the spin kernel needs %globaltimer (no simulator twin)")
    return cuda.jit("void(uint64, uint64[::1])")(_spin)


def read_launches(buf, out, grid_stride_ctas: int) -> dict[str, PreboundLaunch]:
    """Pre-bound launches of every read-ceiling kernel over ``buf`` (uint32, size % 4 == 0).

    ``grid_stride_ctas``: CTAs of the grid-stride kernel (SMs x READ_CTAS_PER_SM
    fills the GPU once).
    """
    n16 = buf.size // 4
    grids = {
        "numba_read16_gridstride": grid_stride_ctas,
        "numba_read16_one_per_thread": -(-n16 // READ_THREADS),
    }
    return {
        name: PreboundLaunch(
            read_kernel(name), grids[name], READ_THREADS, (buf, out, np.int64(n16)), name=name
        )
        for name in READ_KERNELS
    }


def read_ceiling(timer, nbytes: int = 2**30, repeats: int = 5) -> float:
    """Streaming-read ceiling in bytes/s: the fastest :func:`read_launches` kernel over a
    buffer of ``nbytes`` (median of ``repeats`` timings each, ``timer.time_sequence``).

    For the standalone benchmark scripts; ``q2gemv bench`` reports every kernel
    (:func:`q2gemv.bench.runner.measure_ceiling`).
    """
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    buf = cuda.device_array(nbytes // 4, np.uint32)
    sink = cuda.device_array(1, np.uint32)
    reads = read_launches(buf, sink, sms * READ_CTAS_PER_SM)
    return max(
        nbytes / float(np.median(timer.time_sequence([lk], repeats).per_call_s))
        for lk in reads.values()
    )


# -- timers ---------------------------------------------------------------------------


@contextmanager
def _no_frees_during_capture():
    """No cuMemFree (numba's deferred frees run on GC) while a stream is capturing."""
    was = gc.isenabled()
    gc.disable()
    ctx = cuda.current_context()
    mm = getattr(ctx, "memory_manager", ctx)
    deallocs = getattr(mm, "deallocations", None)
    try:
        if deallocs is not None:
            with deallocs.disable():
                yield
        else:
            yield
    finally:
        if was:
            gc.enable()


def flush_deferred_frees() -> None:
    """Run numba's pending frees now (between cases; never during a capture)."""
    if SIMULATED:
        return
    ctx = cuda.current_context()
    for owner in (getattr(ctx, "memory_manager", None), ctx):
        d = getattr(owner, "deallocations", None)
        if d is not None:
            d.clear()


class GraphTimer:
    """CUDA events around replays of a ``torch.cuda.CUDAGraph`` of the whole sequence."""

    method = "cuda-graph replay, torch events"

    def __init__(self):
        import torch

        self.torch = torch
        self.stream = torch.cuda.Stream()
        self.handle = int(self.stream.cuda_stream)

    def run_eager(self, seq: Sequence[Call]) -> None:
        with self.torch.cuda.stream(self.stream):
            for call in seq:
                call(self.handle)
        self.stream.synchronize()

    def capture(self, seq: Sequence[Call]):
        """A ``torch.cuda.CUDAGraph`` of ``seq`` enqueued on this timer's stream (not replayed)."""
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.stream), _no_frees_during_capture():
            g.capture_begin()
            try:
                for call in seq:
                    call(self.handle)
            finally:
                g.capture_end()
        return g

    def time_sequence(self, seq: Sequence[Call], repeats: int, warmup: int = 2) -> Timing:
        torch = self.torch
        self.run_eager(seq)
        g = self.capture(seq)
        with torch.cuda.stream(self.stream):
            for _ in range(warmup):
                g.replay()
            events = [
                (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                for _ in range(repeats)
            ]
            for e0, e1 in events:
                e0.record()
                g.replay()
                e1.record()
        self.stream.synchronize()
        ms = [e0.elapsed_time(e1) for e0, e1 in events]
        del g
        return Timing(tuple(t * 1e-3 / len(seq) for t in ms), len(seq), self.method)


class SleepTimer:
    """numba events around the sequence, queued behind a spin kernel so the host cannot starve it."""

    method = "launches behind a spin kernel, numba events"

    def __init__(self, torch_stream=None, spin_s: float = 0.002):
        self.torch = None
        if torch_stream is not None:
            import torch

            self.torch = torch
        self.torch_stream = torch_stream
        self.nstream = (
            cuda.external_stream(stream_handle(torch_stream)) if torch_stream else cuda.stream()
        )
        self.handle = stream_handle(self.nstream)
        self.spin_s = spin_s
        self._spin_out = cuda.device_array(1, dtype=np.uint64)

    @contextmanager
    def _torch_current(self):
        if self.torch is None:
            yield
        else:
            with self.torch.cuda.stream(self.torch_stream):
                yield

    def run_eager(self, seq: Sequence[Call]) -> None:
        with self._torch_current():
            for call in seq:
                call(self.handle)
        self.nstream.synchronize()

    def time_sequence(self, seq: Sequence[Call], repeats: int, warmup: int = 2) -> Timing:
        self.run_eager(seq)
        spin = spin_kernel()
        per_call, starved = [], 0
        with self._torch_current():
            for r in range(warmup + repeats):
                e0, e1 = cuda.event(timing=True), cuda.event(timing=True)
                spin[1, 1, self.nstream](np.uint64(self.spin_s * 1e9), self._spin_out)
                e0.record(self.nstream)
                t0 = time.perf_counter()
                for call in seq:
                    call(self.handle)
                host = time.perf_counter() - t0
                e1.record(self.nstream)
                e1.synchronize()
                if r < warmup:
                    continue
                if host > self.spin_s:
                    starved += 1
                    self.spin_s = min(0.1, 2 * host)  # the next repeat waits longer
                per_call.append(cuda.event_elapsed_time(e0, e1) * 1e-3 / len(seq))
        return Timing(tuple(per_call), len(seq), self.method, starved)


class EagerOnce:
    """No timing (``--dry-run``, the simulator): run the sequence once and report nothing."""

    method = "dry run (no timing)"

    def __init__(self):
        self.handle = 0

    def run_eager(self, seq: Sequence[Call]) -> None:
        for call in seq:
            call(self.handle)
        cuda.synchronize()

    def time_sequence(self, seq: Sequence[Call], repeats: int, warmup: int = 2) -> Timing:
        self.run_eager(seq)
        return Timing((), len(seq), self.method)


def host_us_per_call(fn: Callable[[], None], calls: int, batches: int, sync: Callable[[], None]):
    """Median and min host microseconds per ``fn()`` over ``batches`` of ``calls`` back-to-back calls.

    Synchronizes before each batch; only the enqueue loop is timed. Keep
    ``calls`` well under the driver's launch-queue depth (about a thousand)
    so the host never blocks on a full queue.
    """
    fn()
    sync()
    per = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    sync()
    return float(np.median(per)), float(min(per))

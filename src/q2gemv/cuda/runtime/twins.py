"""The simulator twins of :mod:`q2gemv.cuda.runtime.dev`'s device helpers (``NUMBA_ENABLE_CUDASIM=1``).

Imported by :mod:`.dev` only when numba runs the CUDA simulator: importing it patches the
simulator (overflow warnings off in its threads, shared arrays allocated under a lock). Each
twin has the device semantics of its :mod:`.intrinsics` counterpart exactly; the table of
both is in :mod:`.dev`'s docstring.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
from numba import cuda
from numba.cuda.simulator import kernel as _simkernel
from numba.cuda.simulator import kernelapi as _kernelapi

_device = cuda.jit(device=True, inline="always")

# A lane waits for its 31 partners in short slices, so that it notices the
# simulator's abort flag (another thread raised) instead of hiding that
# error behind a timeout; the overall limit only catches a lane that never
# reaches the shuffle (a kernel bug), never a slow, loaded machine.
_SHFL_SLICE_S = 0.5
_SHFL_LIMIT_S = 1800.0
_shfl_lock = threading.Lock()


class _WarpBarrier:
    """A reusable 32-lane barrier that gives up only on abort or a lane that never comes."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.arrived = 0
        self.generation = 0

    def wait(self, thread) -> None:
        with self.cond:
            gen = self.generation
            self.arrived += 1
            if self.arrived == 32:
                self.arrived = 0
                self.generation += 1
                self.cond.notify_all()
                return
            deadline = time.monotonic() + _SHFL_LIMIT_S
            while gen == self.generation:
                self.cond.wait(_SHFL_SLICE_S)
                if getattr(thread, "abort", False):
                    raise RuntimeError("abort flag set while waiting in a warp shuffle")
                if time.monotonic() > deadline:
                    raise RuntimeError("warp shuffle: not every lane of the warp arrived")


# numba-cuda 0.30.4's FakeCUDAShared.array keys a launch's shared arrays by the calling
# line and creates one on a miss: get, miss, np.empty, store, with no lock. Every thread
# of the launch's first block calls it at once; two that interleave between the get and
# the store each keep their own array, so one thread's "shared" writes are lost to the
# others and it reads np.empty garbage (the intermittent wrong bits of the W4A16
# simulator tests at a 0.2 ms GIL switch interval). The same allocation, same key
# (file, line of the caller), under a lock; alignment and dynamic shared memory
# (shape 0) go to numba's own code.
_shared_alloc_lock = threading.Lock()
_numba_shared_array = _kernelapi.FakeCUDAShared.array


def _shared_array(self, shape, dtype, alignment=None):
    if alignment is not None or shape == 0:  # numba's own test, as numba makes it
        return _numba_shared_array(self, shape, dtype, alignment)
    if isinstance(dtype, _kernelapi.types.Type):
        dtype = _kernelapi.numpy_support.as_dtype(dtype)
    frame = sys._getframe(1)
    caller = (frame.f_code.co_filename, frame.f_lineno)
    with _shared_alloc_lock:
        res = self._allocations.get(caller)
        if res is None:
            res = np.empty(shape, dtype)
            self._allocations[caller] = res
    return res


_kernelapi.FakeCUDAShared.array = _shared_array

# Device integer arithmetic wraps modulo 2**32 (or 2**64) by definition, and a float
# overflow gives Inf; the kernels rely on both. The simulator runs kernel code on NumPy
# scalars, which warn ("overflow encountered in scalar add") where the device wraps:
# each simulated thread runs with overflow warnings off (np.errstate is per thread).
_numba_thread_run = _simkernel.BlockThread.run


def _thread_run(self):
    with np.errstate(over="ignore"):
        _numba_thread_run(self)


_simkernel.BlockThread.run = _thread_run

# numba-cuda 0.30.4's BlockManager.run polls its block's threads in a loop that never waits:
# the launching thread always wants the GIL, so a simulated thread woken from a wait (our
# warp barrier, syncthreads) often gets it only when CPython forces a switch, after a whole
# switch interval (5 ms). A warp shuffle wakes 31 lanes twice, and a kernel of many
# shuffles then took minutes where it takes seconds (the same seed test: 1.3 s or 214 s
# alone, by luck of the scheduling). The same loop, sleeping _POLL_S a round: the GIL is
# free for the threads that have work, and a round costs the launching thread nothing.
_POLL_S = 1e-4


def _block_run(self, grid_point, *args):
    threads = set()
    livethreads = set()
    blockedthreads = set()
    for block_point in np.ndindex(*self._block_dim):

        def target():
            self._f(*args)

        t = _simkernel.BlockThread(target, self, grid_point, block_point, self._debug)
        t.start()
        threads.add(t)
        livethreads.add(t)
    while livethreads:
        for t in livethreads:
            if t.syncthreads_blocked:
                blockedthreads.add(t)
            elif t.exception:
                for t_other in threads:  # abort the others, as numba does
                    t_other.abort = True
                    t_other.syncthreads_blocked = False
                    t_other.syncthreads_event.set()
                raise t.exception[0].with_traceback(t.exception[1])
        if livethreads == blockedthreads:
            for t in blockedthreads:
                t.syncthreads_blocked = False
                t.syncthreads_event.set()
            blockedthreads = set()
        livethreads = {t for t in livethreads if t.is_alive()}
        time.sleep(_POLL_S)
    for t in threads:  # an exception set after the last poll
        if t.exception:
            raise t.exception[0].with_traceback(t.exception[1])


_simkernel.BlockManager.run = _block_run


def _warp_exchange():
    t = threading.current_thread()
    mgr = t._manager  # the simulator's per-launch BlockManager
    warp = t.thread_id // 32
    with _shfl_lock:
        state = mgr.__dict__.setdefault("_q2gemv_shfl", {})
        if warp not in state:
            state[warp] = ([None] * 32, _WarpBarrier())
        return state[warp], t.thread_id % 32, t


@_device
def u32_as_f32(x):
    return np.uint32(x).view(np.float32)


@_device
def f32_as_u32(x):
    return np.float32(x).view(np.uint32)


@_device
def fma(a, b, c):
    # Python floats are IEEE doubles: the f64 emulation of fpmath.fma_f32.
    with np.errstate(all="ignore"):
        return np.float32(float(a) * float(b) + float(c))


@_device
def fmul_rn(a, b):
    with np.errstate(all="ignore"):
        return np.float32(np.float32(a) * np.float32(b))


@_device
def fadd_rn(a, b):
    with np.errstate(all="ignore"):
        return np.float32(np.float32(a) + np.float32(b))


@_device
def ld_bf16x8(arr, m, c):
    w = [
        np.uint32(arr[m, c + 2 * j]) | (np.uint32(arr[m, c + 2 * j + 1]) << np.uint32(16))
        for j in range(4)
    ]
    return w[0], w[1], w[2], w[3]


@_device
def ld_f32x4(arr, i):
    return arr[i], arr[i + 1], arr[i + 2], arr[i + 3]


@_device
def ld_u32x4(arr, i):
    return (
        np.uint32(arr[i]),
        np.uint32(arr[i + 1]),
        np.uint32(arr[i + 2]),
        np.uint32(arr[i + 3]),
    )


ld_stream_u32x4 = ld_u32x4
ld_vec_u32x4 = ld_u32x4


@_device
def shfl_xor(v, offset):
    (vals, barrier), lane, thread = _warp_exchange()
    vals[lane] = v
    barrier.wait(thread)
    r = vals[lane ^ offset]
    barrier.wait(thread)
    return r


def _bytes4(x) -> list[int]:
    x = int(x) & 0xFFFFFFFF
    return [(x >> (8 * i)) & 0xFF for i in range(4)]


def _warp_mma(own, k, place):
    # Every lane posts its fragments (``own``: A, B, then the 4 of C); each then forms
    # the warp's 16 x k @ k x 8 product from all 32, ``place(am, bm, f, g, t)`` putting
    # one lane's A and B fragments (g = lane / 4, t = lane % 4; PTX ISA fragment
    # layouts), and returns its D: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1) plus C.
    (vals, barrier), lane, thread = _warp_exchange()
    vals[lane] = own
    barrier.wait(thread)
    frags = list(vals)
    barrier.wait(thread)
    am = np.zeros((16, k), np.int64)
    bm = np.zeros((k, 8), np.int64)
    for ln, f in enumerate(frags):
        place(am, bm, f, ln >> 2, ln & 3)
    d = am @ bm
    g, t = lane >> 2, lane & 3
    c = own[-4:]
    out = (
        d[g, 2 * t] + int(c[0]),
        d[g, 2 * t + 1] + int(c[1]),
        d[g + 8, 2 * t] + int(c[2]),
        d[g + 8, 2 * t + 1] + int(c[3]),
    )
    # s32 accumulators wrap modulo 2**32, as the tensor cores do
    return tuple(np.int32(((int(v) + 2**31) & 0xFFFFFFFF) - 2**31) for v in out)


def _place_k32(am, bm, f, g, t):
    # mma.m16n8k32, u8: A regs (g, k 4t..), (g+8, 4t..), (g, 16+4t..), (g+8, 16+4t..);
    # B regs (col g, k 4t..), (col g, k 16+4t..)
    for r, (row, k0) in enumerate(
        ((g, 4 * t), (g + 8, 4 * t), (g, 16 + 4 * t), (g + 8, 16 + 4 * t))
    ):
        am[row, k0 : k0 + 4] = _bytes4(f[r])
    bm[4 * t : 4 * t + 4, g] = _bytes4(f[4])
    bm[16 + 4 * t : 20 + 4 * t, g] = _bytes4(f[5])


def _place_k32_u8s8(am, bm, f, g, t):
    _place_k32(am, bm, f, g, t)
    bm[4 * t : 4 * t + 4, g] = _sbytes4(f[4])
    bm[16 + 4 * t : 20 + 4 * t, g] = _sbytes4(f[5])


def _place_k16_s8u8(am, bm, f, g, t):
    # mma.m16n8k16, s8 x u8: A regs (g, k 4t..4t+3), (g+8, k 4t..); B reg (col g, k 4t..)
    am[g, 4 * t : 4 * t + 4] = _sbytes4(f[0])
    am[g + 8, 4 * t : 4 * t + 4] = _sbytes4(f[1])
    bm[4 * t : 4 * t + 4, g] = _bytes4(f[2])


def _sbytes4(x) -> list[int]:
    return [b - 256 if b > 127 else b for b in _bytes4(x)]


@_device
def mma_k16_s8u8(a0, a1, b0, c0, c1, c2, c3):
    return _warp_mma((a0, a1, b0, c0, c1, c2, c3), 16, _place_k16_s8u8)


@_device
def mma_u8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_mma((a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), 32, _place_k32)


@_device
def mma_u8s8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _warp_mma((a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), 32, _place_k32_u8s8)


@_device
def cp_async16(dst, di, src, si):
    for j in range(16 // dst.dtype.itemsize):  # 16 bytes of elements of one dtype
        dst[di + j] = src[si + j]


@_device
def cp_async4(dst, di, src, si):
    for j in range(4 // dst.dtype.itemsize):
        dst[di + j] = src[si + j]


@_device
def cp_async_commit():
    return None


@_device
def _cp_async_wait_sim():
    return None


cp_async_wait = tuple(_cp_async_wait_sim for _ in range(8))


@_device
def prmt(a, b, c):
    pool = _bytes4(a) + _bytes4(b)
    sel = int(c)
    r = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        byte = pool[nib & 7]
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        r |= byte << (8 * i)
    return np.uint32(r)


@_device
def mul_wide(a, b):
    return np.int64(int(a) * int(b))


@_device
def bitlen64(x):
    return np.int64(int(x).bit_length())


@_device
def grid_dep_wait():
    return None


@_device
def grid_dep_launch():
    return None

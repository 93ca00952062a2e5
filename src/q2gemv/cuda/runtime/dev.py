"""Device helpers shared by every kernel, each with a simulator twin.

Kernels call only these names for bit casts, rounding-explicit arithmetic and warp
reduction, never asking whether they run in the simulator; the choice is made once,
here, from numba's ``ENABLE_CUDASIM`` (set it in the environment before numba is
imported). The simulator has no warp shuffles, its ``libdevice`` functions return
None and its ``cuda.fma`` rounds twice, so each twin has the device semantics exactly:

=================  ==================================  ===========================
helper             device                              simulator twin
=================  ==================================  ===========================
u32_as_f32         libdevice.int_as_float              ndarray view
f32_as_u32         libdevice.float_as_int              ndarray view
fma                cuda.fma (fma.rn.f32, one rounding)  f64 product + sum -> f32
fmul_rn, fadd_rn   libdevice (never contracted)        np.float32 ops
shfl_xor           cuda.shfl_xor_sync, full mask        per-warp exchange + barrier
ld_bf16x8          one ld.global.nc.v4.u32 (16 bytes)   eight uint16 reads
ld_f32x4           one 16-byte vector load              four float32 reads
ld_u32x4           one ld.global.nc.v4.u32 (16 bytes)   four uint32 reads
ld_stream_u32x4    the same, .L1::no_allocate            four uint32 reads
ld_vec_u32x4       one 16-byte vector load (any space:  four uint32 reads
                   a shared array gives ld.shared.v4)
mma_u8             one mma.sync m16n8k32 u8 x u8 ->    the warp's 16x32 @ 32x8
                   s32 (IMMA), warp-collective          product in NumPy
mma_u8s8           the same, u8 x s8 (B signed)         the product in NumPy
cp_async16         cp.async.cg 16 bytes, global ->      a copy of the 16 bytes now (the
                   shared, asynchronous                 wait below is then trivially
cp_async4          cp.async.ca 4 bytes                  met; the same for 4 bytes)
cp_async_commit    cp.async.commit_group                nothing
cp_async_wait[n]   cp.async.wait_group n (this thread's nothing
                   groups but the n newest are done)
mma_k16_s8u8       one mma.sync m16n8k16 s8 x u8 ->    the warp's 16x16 @ 16x8
                   s32 (half the k of the above)       product in NumPy
prmt               prmt.b32 (byte permute, default     the PTX byte-select rule
                   mode: 8-byte pool, sign replicate)
mul_wide           mul.wide.s32 (int32 x int32 ->      the product in Python ints
                   int64, exact)
bitlen64           64 - clz (64-bit)                    int.bit_length
grid_dep_wait      griddepcontrol.wait (sm_90: wait     nothing (the simulator runs
                   for the grids this one depends on)   launches one after another)
grid_dep_launch    griddepcontrol.launch_dependents     nothing
=================  ==================================  ===========================

``grid_dep_wait`` holds a kernel launched with programmatic dependent launch (PDL,
:mod:`q2gemv.cuda.runtime.prebound`) until the launch before it has finished and its
writes are visible; without PDL it returns at once. So a kernel reads what an earlier
launch wrote only after ``grid_dep_wait``, and that is all the twins need.

Two fixes to the simulator itself: its threads run with NumPy's overflow warnings off
(device arithmetic wraps), and its ``cuda.shared.array`` (``FakeCUDAShared.array``),
whose unlocked check-then-set can give two threads separate arrays, is replaced (in the
simulator only) by the same allocation under a lock.

Derived helpers (bf16 conversions, ``warp_sum``) are written once on top of these.
Integer operands are cast to uint32 explicitly: under NumPy 2 the simulator keeps a
uint16 scalar 16 bits wide, so ``h << 16`` would be 0 there.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
from numba import config, cuda, int32, int64, uint16, uint32, uint64

SIMULATED: bool = bool(config.ENABLE_CUDASIM)
FULL_MASK = 0xFFFFFFFF
BF16_NAN = 0x7FC0  # the one NaN pattern every backend writes (formats/bf16.py)

_device = cuda.jit(device=True, inline="always")

if SIMULATED:
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
    from numba.cuda.simulator import kernelapi as _kernelapi

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
    from numba.cuda.simulator import kernel as _simkernel

    _numba_thread_run = _simkernel.BlockThread.run

    def _thread_run(self):
        with np.errstate(over="ignore"):
            _numba_thread_run(self)

    _simkernel.BlockThread.run = _thread_run

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

else:
    from numba import types
    from numba.cuda import libdevice
    from numba.cuda.extending import intrinsic

    @_device
    def u32_as_f32(x):
        return libdevice.int_as_float(int32(x))

    @_device
    def f32_as_u32(x):
        return uint32(libdevice.float_as_int(x))

    @_device
    def fma(a, b, c):
        return cuda.fma(a, b, c)

    @_device
    def fmul_rn(a, b):
        return libdevice.fmul_rn(a, b)

    @_device
    def fadd_rn(a, b):
        return libdevice.fadd_rn(a, b)

    @_device
    def shfl_xor(v, offset):
        return cuda.shfl_xor_sync(FULL_MASK, v, offset)

    def _element_pointer(context, builder, sig, args):
        """Address of ``arr[indices]`` for an intrinsic called as ``(arr, *indices)`` (no wraparound)."""
        from numba.core import cgutils

        arrty = sig.args[0]
        ary = context.make_array(arrty)(context, builder, value=args[0])
        inds = [
            context.cast(builder, v, t, types.intp)
            for v, t in zip(args[1:], sig.args[1:], strict=True)
        ]
        return cgutils.get_item_pointer(context, builder, arrty, ary, inds, wraparound=False)

    def _ld_nc_v4_u32(context, builder, sig, ptr, op="ld.global.nc.v4.u32"):
        """One ``ld.global.nc.v4.u32`` (or ``op``) at ``ptr``, as the tuple of 4 uint32."""
        from llvmlite import ir

        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ptr.type])
        asm = ir.InlineAsm(fnty, op + " {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l")
        r = builder.call(asm, [ptr])
        vals = [builder.extract_value(r, j) for j in range(4)]
        return context.make_tuple(builder, sig.return_type, vals)

    def _ld_bf16x8(typingctx, arr, m, c):
        """``arr[m, c .. c+7]`` (uint16, C-contiguous) as 4 uint32 words by one 16-byte load.

        The caller guarantees 16-byte alignment of that address. ``.nc``: the
        read-only data path; the kernels never write their activations.
        """
        sig = types.UniTuple(types.uint32, 4)(arr, m, c)

        def codegen(context, builder, sig, args):
            return _ld_nc_v4_u32(
                context, builder, sig, _element_pointer(context, builder, sig, args)
            )

        return sig, codegen

    ld_bf16x8 = intrinsic(_ld_bf16x8)

    def _vec4_load(nbtype, irtype):
        """``arr[i .. i+3]`` of ``nbtype`` (1-D, contiguous) by one plain 16-byte vector load.

        The caller guarantees ``i % 4 == 0`` (and a 16-byte aligned array). A
        plain LLVM ``<4 x T>`` load: NVVM infers the address space (a
        shared-memory array becomes one ``ld.shared.v4``), where four
        scalar reads are merged only when LLVM can prove them consecutive.
        """

        def typer(typingctx, arr, i):
            sig = types.UniTuple(nbtype, 4)(arr, i)

            def codegen(context, builder, sig, args):
                from llvmlite import ir

                ptr = _element_pointer(context, builder, sig, args)
                vty = ir.VectorType(irtype(), 4)
                vptr = builder.bitcast(ptr, vty.as_pointer(ptr.type.addrspace))
                v = builder.load(vptr, align=16)
                vals = [
                    builder.extract_element(v, ir.Constant(ir.IntType(32), j)) for j in range(4)
                ]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        return typer

    from llvmlite import ir as _ir

    _ld_f32x4 = _vec4_load(types.float32, _ir.FloatType)
    ld_f32x4 = intrinsic(_ld_f32x4)

    def _ld_u32x4(typingctx, arr, i):
        """``arr[i .. i+3]`` (uint32, 1-D, contiguous) by one ``ld.global.nc.v4.u32``.

        The caller guarantees ``i % 4 == 0`` and a 16-byte aligned array, and
        that nothing writes ``arr`` during the kernel (the read-only path).
        """
        sig = types.UniTuple(types.uint32, 4)(arr, i)

        def codegen(context, builder, sig, args):
            return _ld_nc_v4_u32(
                context, builder, sig, _element_pointer(context, builder, sig, args)
            )

        return sig, codegen

    ld_u32x4 = intrinsic(_ld_u32x4)

    def _ld_stream_u32x4(typingctx, arr, i):
        """``arr[i .. i+3]`` (uint32) by one ``ld.global.nc.L1::no_allocate.v4.u32``.

        As :func:`ld_u32x4`, for data read once (a weight stream): it does not
        take L1 lines from the operands that are re-read (the activations).
        """
        sig = types.UniTuple(types.uint32, 4)(arr, i)

        def codegen(context, builder, sig, args):
            ptr = _element_pointer(context, builder, sig, args)
            return _ld_nc_v4_u32(context, builder, sig, ptr, "ld.global.nc.L1::no_allocate.v4.u32")

        return sig, codegen

    ld_stream_u32x4 = intrinsic(_ld_stream_u32x4)

    _ld_vec_u32x4 = _vec4_load(types.uint32, lambda: _ir.IntType(32))  # ld.shared.v4.u32 too
    ld_vec_u32x4 = intrinsic(_ld_vec_u32x4)

    def _cp_async(size: int, cache: str):
        """``cp.async.<cache>.shared.global`` of ``size`` bytes: ``dst[di ..]`` <- ``src[si ..]``
        (``dst`` a shared array, ``src`` a global one; both addresses ``size``-aligned)."""

        def typer(typingctx, dst, di, src, si):
            def codegen(context, builder, sig, args):
                from types import SimpleNamespace

                from llvmlite import ir

                pd = _element_pointer(
                    context, builder, SimpleNamespace(args=sig.args[:2]), args[:2]
                )
                ps = _element_pointer(
                    context, builder, SimpleNamespace(args=sig.args[2:]), args[2:]
                )
                i32, i64 = ir.IntType(32), ir.IntType(64)
                # The shared address as a 32-bit shared-window offset, by an address-space cast
                # the compiler folds back to the shared array (no per-copy window conversion);
                # the global address as it is (a generic global address is the global one).
                pd = builder.ptrtoint(
                    builder.addrspacecast(pd, ir.PointerType(pd.type.pointee, 3)), i32
                )
                ps = builder.ptrtoint(ps, i64)
                asm = ir.InlineAsm(
                    ir.FunctionType(ir.VoidType(), [i32, i64]),
                    f"cp.async.{cache}.shared.global [$0], [$1], {size};",
                    "r,l,~{memory}",
                    side_effect=True,
                )
                builder.call(asm, [pd, ps])
                return context.get_dummy_value()

            return types.none(dst, di, src, si), codegen

        return intrinsic(typer)

    cp_async16 = _cp_async(16, "cg")
    cp_async4 = _cp_async(4, "ca")

    def _asm_void(text: str):
        def typer(typingctx):
            def codegen(context, builder, sig, llargs):
                from llvmlite import ir

                asm = ir.InlineAsm(
                    ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True
                )
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.none(), codegen

        return intrinsic(typer)

    cp_async_commit = _asm_void("cp.async.commit_group;")
    cp_async_wait = tuple(_asm_void(f"cp.async.wait_group {n};") for n in range(8))

    def _asm_intrinsic(asm_text: str, n_in: int, n_out: int, doc: str):
        """A numba intrinsic: ``n_in`` 32-bit register inputs -> ``n_out`` int32 by inline PTX."""

        def typer(typingctx, *args):
            ret = types.UniTuple(types.int32, n_out) if n_out > 1 else types.int32

            def codegen(context, builder, sig, llargs):
                from llvmlite import ir

                i32 = ir.IntType(32)
                ins = [
                    builder.trunc(context.cast(builder, v, t, types.int64), i32)
                    for v, t in zip(llargs, sig.args, strict=True)
                ]
                outty = ir.LiteralStructType([i32] * n_out) if n_out > 1 else i32
                cons = ",".join(["=r"] * n_out + ["r"] * n_in)
                fnty = ir.FunctionType(outty, [i32] * n_in)
                r = builder.call(ir.InlineAsm(fnty, asm_text, cons), ins)
                if n_out == 1:
                    return r
                vals = [builder.extract_value(r, j) for j in range(n_out)]
                return context.make_tuple(builder, sig.return_type, vals)

            return ret(*args), codegen

        # numba's @intrinsic needs the arity spelled out (no *args)
        if n_in == 3:

            def fixed(typingctx, a, b, c):
                return typer(typingctx, a, b, c)

        elif n_in == 7:

            def fixed(typingctx, a0, a1, b0, c0, c1, c2, c3):
                return typer(typingctx, a0, a1, b0, c0, c1, c2, c3)

        else:

            def fixed(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
                return typer(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

        fixed.__doc__ = doc
        return intrinsic(fixed)

    mma_u8 = _asm_intrinsic(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        10,
        4,
        """``D = A @ B + C`` for one ``mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32``.

        Warp-collective: every lane of the warp must call it with the same
        control flow. ``a*``, ``b*`` are 32-bit registers of 4 unsigned bytes in
        the PTX fragment layout (see the simulator twin), ``c*`` the s32
        accumulators; returns the 4 s32 of D.
        """,
    )
    mma_u8s8 = _asm_intrinsic(
        "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 "
        "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
        10,
        4,
        """As :func:`mma_u8` with a signed B: ``mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32``.""",
    )
    mma_k16_s8u8 = _asm_intrinsic(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 "
        "{$0, $1, $2, $3}, {$4, $5}, {$6}, {$7, $8, $9, $10};",
        7,
        4,
        """``D = A @ B + C`` for one ``mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32``.

        Warp-collective, as :func:`mma_u8`: ``a0``, ``a1`` hold 4 signed bytes of A rows
        g and g + 8 (k ``4t..4t+3``), ``b0`` 4 unsigned bytes of B column g (the same k),
        ``c*`` the s32 accumulators; returns the 4 s32 of D.
        """,
    )
    _prmt = _asm_intrinsic(
        "prmt.b32 $0, $1, $2, $3;",
        3,
        1,
        "``prmt.b32 d, a, b, c``: byte i of d is byte ``c[4i+2:4i]`` of the pool {b, a} "
        "(a = bytes 0-3), or that byte's sign replicated when ``c[4i+3]`` is set.",
    )

    @_device
    def prmt(a, b, c):
        return uint32(_prmt(a, b, c))

    def _mul_wide(typingctx, a, b):
        """``mul.wide.s32``: the exact int64 product of two int32."""
        sig = types.int64(a, b)

        def codegen(context, builder, sig, llargs):
            from llvmlite import ir

            i32 = ir.IntType(32)
            ins = [
                builder.trunc(context.cast(builder, v, t, types.int64), i32)
                for v, t in zip(llargs, sig.args, strict=True)
            ]
            asm = ir.InlineAsm(
                ir.FunctionType(ir.IntType(64), [i32, i32]), "mul.wide.s32 $0, $1, $2;", "=l,r,r"
            )
            return builder.call(asm, ins)

        return sig, codegen

    mul_wide = intrinsic(_mul_wide)

    def _griddepcontrol(op: str):
        """An intrinsic of no arguments emitting ``griddepcontrol.<op>;`` (a memory clobber:
        no load or store moves across it)."""

        def typer(typingctx):
            def codegen(context, builder, sig, llargs):
                from llvmlite import ir

                asm = ir.InlineAsm(
                    ir.FunctionType(ir.VoidType(), []),
                    f"griddepcontrol.{op};",
                    "~{memory}",
                    side_effect=True,
                )
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.none(), codegen

        return intrinsic(typer)

    grid_dep_wait = _griddepcontrol("wait")
    grid_dep_launch = _griddepcontrol("launch_dependents")

    @_device
    def bitlen64(x):
        return int64(64) - int64(cuda.clz(uint64(x)))


@_device
def bf16_to_f32(h):
    """bf16 bits in the low 16 bits of ``h`` -> fp32 (exact).

    For a uint32 holding two bf16 (as :func:`ld_bf16x8` returns them) that is
    the lower-addressed element; :func:`bf16_hi_to_f32` gives the other.
    """
    return u32_as_f32(uint32(h) << uint32(16))


@_device
def bf16_hi_to_f32(w):
    """The bf16 in the high half of a uint32 (the higher-addressed element) -> fp32 (exact)."""
    return u32_as_f32(uint32(w) & uint32(0xFFFF0000))


@_device
def f32_to_bf16(v):
    """fp32 -> bf16 bits, round-to-nearest-even, every NaN -> 0x7FC0."""
    if v != v:
        return uint16(BF16_NAN)
    u = f32_as_u32(v)
    return uint16((u + uint32(0x7FFF) + ((u >> uint32(16)) & uint32(1))) >> uint32(16))


@_device
def warp_sum(v):
    """Butterfly sum over the 32 lanes: xor offsets 16, 8, 4, 2, 1 (fpmath.warp_tree_sum_f32).

    Every lane of the warp must call it; all lanes return the same bits.
    """
    v = fadd_rn(v, shfl_xor(v, 16))
    v = fadd_rn(v, shfl_xor(v, 8))
    v = fadd_rn(v, shfl_xor(v, 4))
    v = fadd_rn(v, shfl_xor(v, 2))
    v = fadd_rn(v, shfl_xor(v, 1))
    return v

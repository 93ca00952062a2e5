"""Device helpers shared by every kernel, each with a simulator twin.

Kernels call only these names for bit casts, rounding-explicit arithmetic and warp
reduction, never asking whether they run in the simulator; the choice is made once,
here, from numba's ``ENABLE_CUDASIM`` (set it in the environment before numba is
imported). The simulator has no warp shuffles, its ``libdevice`` functions return
None and its ``cuda.fma`` rounds twice, so each twin (:mod:`.twins`) has the device semantics of its device version
(:mod:`.intrinsics`) exactly:

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
whose unlocked check-then-set can give two threads separate arrays, is replaced by :mod:`.twins` (in the
simulator only) with the same allocation under a lock.

Derived helpers (bf16 conversions, ``warp_sum``) are written once on top of these.
Integer operands are cast to uint32 explicitly: under NumPy 2 the simulator keeps a
uint16 scalar 16 bits wide, so ``h << 16`` would be 0 there.
"""

from __future__ import annotations

from numba import config, cuda, uint16, uint32

SIMULATED: bool = bool(config.ENABLE_CUDASIM)
BF16_NAN = 0x7FC0  # the one NaN pattern every backend writes (formats/bf16.py)

_device = cuda.jit(device=True, inline="always")

# The one choice: a kernel calls these names and never asks which world it runs in.
if SIMULATED:
    from . import twins as _impl
else:
    from . import intrinsics as _impl

bitlen64 = _impl.bitlen64
cp_async4 = _impl.cp_async4
cp_async16 = _impl.cp_async16
cp_async_commit = _impl.cp_async_commit
cp_async_wait = _impl.cp_async_wait
f32_as_u32 = _impl.f32_as_u32
fadd_rn = _impl.fadd_rn
fma = _impl.fma
fmul_rn = _impl.fmul_rn
grid_dep_launch = _impl.grid_dep_launch
grid_dep_wait = _impl.grid_dep_wait
ld_bf16x8 = _impl.ld_bf16x8
ld_f32x4 = _impl.ld_f32x4
ld_stream_u32x4 = _impl.ld_stream_u32x4
ld_u32x4 = _impl.ld_u32x4
ld_vec_u32x4 = _impl.ld_vec_u32x4
mma_k16_s8u8 = _impl.mma_k16_s8u8
mma_u8 = _impl.mma_u8
mma_u8s8 = _impl.mma_u8s8
mul_wide = _impl.mul_wide
prmt = _impl.prmt
shfl_xor = _impl.shfl_xor
u32_as_f32 = _impl.u32_as_f32


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

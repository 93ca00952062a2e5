"""The device versions of :mod:`q2gemv.cuda.runtime.dev`'s helpers (a real GPU, or PTX).

Imported by :mod:`.dev` when numba targets a GPU (``ENABLE_CUDASIM`` off): libdevice
calls, inline PTX (vector loads, ``mma.sync``, ``cp.async``, ``prmt``, ``griddepcontrol``)
and warp shuffles. Each has a simulator twin in :mod:`.twins`; the table of both is in
:mod:`.dev`'s docstring.
"""

from __future__ import annotations

from llvmlite import ir as _ir
from numba import cuda, int32, int64, types, uint32, uint64
from numba.cuda import libdevice
from numba.cuda.extending import intrinsic

FULL_MASK = 0xFFFFFFFF
_device = cuda.jit(device=True, inline="always")


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
        context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], sig.args[1:], strict=True)
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
        return _ld_nc_v4_u32(context, builder, sig, _element_pointer(context, builder, sig, args))

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
            vals = [builder.extract_element(v, ir.Constant(ir.IntType(32), j)) for j in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    return typer


_ld_f32x4 = _vec4_load(types.float32, _ir.FloatType)
ld_f32x4 = intrinsic(_ld_f32x4)


def _ld_u32x4(typingctx, arr, i):
    """``arr[i .. i+3]`` (uint32, 1-D, contiguous) by one ``ld.global.nc.v4.u32``.

    The caller guarantees ``i % 4 == 0`` and a 16-byte aligned array, and
    that nothing writes ``arr`` during the kernel (the read-only path).
    """
    sig = types.UniTuple(types.uint32, 4)(arr, i)

    def codegen(context, builder, sig, args):
        return _ld_nc_v4_u32(context, builder, sig, _element_pointer(context, builder, sig, args))

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

            pd = _element_pointer(context, builder, SimpleNamespace(args=sig.args[:2]), args[:2])
            ps = _element_pointer(context, builder, SimpleNamespace(args=sig.args[2:]), args[2:])
            i32, i64 = ir.IntType(32), ir.IntType(64)
            # The shared address as a 32-bit shared-window offset, by an address-space cast the
            # compiler folds back to the shared array (no window conversion per copy); the
            # global address as it is (a generic global address is the global one).
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

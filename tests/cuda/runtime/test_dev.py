"""The device helpers in q2gemv.cuda.runtime.dev, run as kernels (simulator twins in CI, GPU on a GPU).

Each helper must have exactly the semantics the references assume.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32, uint16, uint32

from q2gemv.cuda.runtime import dev as _dev
from q2gemv.formats.bf16 import f32_to_bf16_bits
from q2gemv.golden.check import assert_bits_equal
from q2gemv.reference.fpmath import fadd_rn, fma_f32, fmul_rn, warp_tree_sum_f32


@cuda.jit
def _scalar_kernel(x, y, z, bits, out_fma, out_mul, out_add, out_bf16, out_cast, out_widen):
    i = cuda.grid(1)
    if i < x.size:
        out_fma[i] = _dev.fma(x[i], y[i], z[i])
        out_mul[i] = _dev.fmul_rn(x[i], y[i])
        out_add[i] = _dev.fadd_rn(x[i], z[i])
        out_bf16[i] = _dev.f32_to_bf16(z[i])
        out_cast[i] = _dev.f32_as_u32(_dev.u32_as_f32(bits[i]))
        out_widen[i] = _dev.bf16_to_f32(bits[i] & uint32(0xFFFF))


@cuda.jit
def _warp_kernel(v, out):
    i = cuda.grid(1)
    out[i] = _dev.warp_sum(v[i])


def _canon(x: np.ndarray) -> np.ndarray:
    """One NaN pattern: the GPU writes 0x7FFFFFFF for fp32 NaN results, x86 NumPy 0xFFC00000.

    Kernel outputs are bf16 with NaN fixed to 0x7FC0, so only these raw fp32
    helper checks need it.
    """
    x = np.array(x, np.float32)
    x[np.isnan(x)] = np.float32(np.nan)
    return x


def _inputs(n=64):
    rng = np.random.default_rng(3)
    x = rng.integers(-1, 3, n).astype(np.float32)
    y = (rng.standard_normal(n) * 10.0 ** rng.integers(-38, 38, n)).astype(np.float32)
    y = y.astype(ml_dtypes.bfloat16).astype(np.float32)
    y[:4] = [3.3895314e38, -3.3895314e38, np.inf, 1e-45]
    x[:4] = [2, 2, 0, 2]
    z = (rng.standard_normal(n) * 10.0 ** rng.integers(-38, 38, n)).astype(np.float32)
    z[:4] = [-3.3895314e38, 1.0, 1.0, 0.0]
    z[4:8] = np.array([0x7FC00001, 0x3F808000, 0x3F818000, 0x80000000], np.uint32).view(np.float32)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    return x, y, z, bits


def test_scalar_helpers_match_host_semantics():
    x, y, z, bits = _inputs()
    n = x.size
    outs = [np.zeros(n, np.float32) for _ in range(3)] + [
        np.zeros(n, np.uint16),
        np.zeros(n, np.uint32),
        np.zeros(n, np.float32),
    ]
    _scalar_kernel[1, n](x, y, z, bits, *outs)
    out_fma, out_mul, out_add, out_bf16, out_cast, out_widen = outs
    assert np.isnan(out_fma[2])  # 0 * Inf
    assert_bits_equal(_canon(out_fma), _canon(fma_f32(x, y, z)), "fma")
    assert out_fma[0] == np.float32(3.3895314e38)  # 2*max - max: no intermediate overflow
    assert_bits_equal(_canon(out_mul), _canon(fmul_rn(x, y)), "fmul_rn")
    assert_bits_equal(_canon(out_add), _canon(fadd_rn(x, z)), "fadd_rn")
    assert_bits_equal(out_bf16, f32_to_bf16_bits(z), "f32_to_bf16")
    assert out_bf16[4] == 0x7FC0
    assert_bits_equal(out_cast, bits, "bit casts")
    assert_bits_equal(out_widen.view(np.uint32), (bits & 0xFFFF) << 16, "bf16_to_f32")


def test_warp_sum_is_the_butterfly_on_every_lane():
    rng = np.random.default_rng(4)
    v = (rng.standard_normal(64) * 10.0 ** rng.integers(-5, 6, 64)).astype(np.float32)
    out = np.zeros(64, np.float32)
    _warp_kernel[1, 64](v, out)
    for w in range(2):
        want = warp_tree_sum_f32(v[32 * w : 32 * w + 32])
        assert_bits_equal(out[32 * w : 32 * w + 32], np.full(32, want, np.float32), f"warp {w}")


def test_warp_sum_order_is_not_sequential():
    # lanes 0, 16: 2^25 and -2^25 cancel first, so lane 1's 1.0 survives; a
    # sequential sum would give ((2^25 + 1) - 2^25) == 0 after rounding.
    v = np.zeros(32, np.float32)
    v[0], v[1], v[16] = 2.0**25, 1.0, -(2.0**25)
    out = np.zeros(32, np.float32)
    _warp_kernel[1, 32](v, out)
    assert out[0] == 1.0 and float32(out[31]) == 1.0


@pytest.mark.skipif(
    not _dev.SIMULATED, reason="simulator twin behaviour: a device kernel cannot raise"
)
def test_shuffle_twin_surfaces_a_lane_error_instead_of_waiting():
    """A lane that raises before the shuffle aborts its partners at once (not after a timeout)."""
    import time

    @cuda.jit
    def lane_three_raises(v, out):
        i = cuda.grid(1)
        if i == 3:
            raise ValueError("lane 3 failed")
        out[i] = _dev.warp_sum(v[i])

    v = np.ones(32, np.float32)
    out = np.zeros(32, np.float32)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="lane 3 failed"):
        lane_three_raises[1, 32](v, out)
    assert time.monotonic() - t0 < 60


@cuda.jit
def _ld_kernel(a, out_words, out_f32):
    """Lane i reads row i % rows, columns 8*(i // rows) .. +7 as 4 words, and widens them."""
    i = cuda.grid(1)
    rows = a.shape[0]
    if i < out_words.shape[0]:
        m, c = uint32(i % rows), uint32(8 * (i // rows))
        w0, w1, w2, w3 = _dev.ld_bf16x8(a, m, c)
        out_words[i, 0], out_words[i, 1], out_words[i, 2], out_words[i, 3] = w0, w1, w2, w3
        for j, w in enumerate((w0, w1, w2, w3)):
            out_f32[i, 2 * j] = _dev.bf16_to_f32(w)
            out_f32[i, 2 * j + 1] = _dev.bf16_hi_to_f32(w)


def test_ld_bf16x8_and_pair_widening():
    """16-byte activation loads: element 2j in the low half of word j, both halves exact in fp32."""
    rng = np.random.default_rng(5)
    rows, k = 3, 64
    a = rng.integers(0, 2**16, (rows, k), dtype=np.uint64).astype(np.uint16)
    a[0, :4] = [0x7FC0, 0xFF80, 0x8000, 0x0001]  # NaN, -Inf, -0, smallest subnormal
    n = rows * (k // 8)
    words, f32 = np.zeros((n, 4), np.uint32), np.zeros((n, 8), np.float32)
    _ld_kernel[1, n](cuda.to_device(a), w_d := cuda.to_device(words), f_d := cuda.to_device(f32))
    words, f32 = w_d.copy_to_host(), f_d.copy_to_host()
    for i in range(n):
        m, c = i % rows, 8 * (i // rows)
        want = a[m, c : c + 8].astype(np.uint32)
        assert np.array_equal(words[i], want[0::2] | (want[1::2] << 16))
        assert np.array_equal(f32[i].view(np.uint32), want << 16)  # bf16 -> fp32 is a shift


@cuda.jit
def _ld_f32x4_kernel(src, out):
    """Each thread stages 4 floats in shared memory, then reads its neighbour's 4 as one vector."""
    s = cuda.shared.array(256, float32)
    t = cuda.threadIdx.x
    for e in range(4):
        s[4 * t + e] = src[4 * t + e]
    cuda.syncthreads()
    j = uint32(4 * ((t + 1) % 64))
    out[t, 0], out[t, 1], out[t, 2], out[t, 3] = _dev.ld_f32x4(s, j)


def test_ld_f32x4_reads_four_consecutive_shared_floats():
    """The 16-byte shared read returns elements i..i+3 in order, bit for bit (NaN payloads too)."""
    rng = np.random.default_rng(12)
    src = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out = np.zeros((64, 4), np.float32)
    _ld_f32x4_kernel[1, 64](cuda.to_device(src), o_d := cuda.to_device(out))
    out = o_d.copy_to_host()
    want = np.roll(src.reshape(64, 4), -1, axis=0)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))


# -- integer helpers of the exact kernels (mma_u8, bitlen64, ld_u32x4) ------------


@cuda.jit
def _mma_kernel(a, b, c, d1, d2):
    """Each warp: D1 = A @ B + C, then D2 = A @ B + D1 (the helper called twice in a row)."""
    i = cuda.grid(1)
    r0, r1, r2, r3 = _dev.mma_u8(
        a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], c[i, 0], c[i, 1], c[i, 2], c[i, 3]
    )
    d1[i, 0], d1[i, 1], d1[i, 2], d1[i, 3] = r0, r1, r2, r3
    d2[i, 0], d2[i, 1], d2[i, 2], d2[i, 3] = _dev.mma_u8(
        a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], r0, r1, r2, r3
    )


def _pack4(x) -> np.uint32:
    """4 bytes, element 0 in the lowest byte (PTX packs .u8 fragments so)."""
    return np.uint32(sum(int(v) << (8 * j) for j, v in enumerate(x)))


def _mma_fragments(am, bm, cm):
    """Per-lane registers of mma.m16n8k32 .u8, by the PTX ISA's per-element formulas.

    groupID g = lane >> 2, threadID_in_group t = lane % 4. A element i (0..15):
    row g for i in 0..3, 8..11 and g + 8 otherwise; column 4t + (i & 3), + 16
    for i >= 8. B element i (0..7): row 4t + (i & 3), + 16 for i >= 4; column
    g. C/D element i (0..3): row g for i < 2, else g + 8; column 2t + (i & 1).
    """
    a = np.zeros((32, 4), np.uint32)
    b = np.zeros((32, 2), np.uint32)
    c = np.zeros((32, 4), np.int32)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        ael = [am[g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >= 8)] for i in range(16)]
        bel = [bm[4 * t + (i & 3) + 16 * (i >= 4), g] for i in range(8)]
        a[lane] = [_pack4(ael[4 * r : 4 * r + 4]) for r in range(4)]
        b[lane] = [_pack4(bel[:4]), _pack4(bel[4:])]
        c[lane] = [cm[g + 8 * (i >> 1), 2 * t + (i & 1)] for i in range(4)]
    return a, b, c


def test_mma_u8_is_the_ptx_m16n8k32_product():
    """Two warps, each its own 16x32 @ 32x8 u8 product plus C; every lane gets its D fragment."""
    rng = np.random.default_rng(40)
    frags, want1, want2 = [], [], []
    for w in range(2):
        am = rng.integers(0, 256, (16, 32))
        bm = rng.integers(0, 256, (32, 8))
        if w == 1:
            am[:, :] = 255  # the largest products: 32 * 255**2 per element
            bm[:, 0] = 0
        cm = rng.integers(-(2**30), 2**30, (16, 8))
        prod = am @ bm
        frags.append(_mma_fragments(am, bm, cm))
        want1.append(_mma_fragments(am, bm, prod + cm)[2])
        want2.append(_mma_fragments(am, bm, 2 * prod + cm)[2])
    a, b, c = (np.concatenate([f[i] for f in frags]) for i in range(3))
    d1, d2 = np.zeros((64, 4), np.int32), np.zeros((64, 4), np.int32)
    _mma_kernel[1, 64](a, b, c, d1, d2)
    assert_bits_equal(d1, np.concatenate(want1), "mma_u8 D = A @ B + C")
    assert_bits_equal(d2, np.concatenate(want2), "mma_u8 chained")


@cuda.jit
def _bitlen_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = _dev.bitlen64(x[i])


def test_bitlen64_edges_and_random():
    edges = [0, 1, 2, 3, 255, 256, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
    rng = np.random.default_rng(41)
    wide = rng.integers(2**62, 2**63, 21, np.uint64)
    rand = [int(v) >> s for v, s in zip(wide, range(0, 63, 3), strict=True)]  # every width
    rand += [(int(v) << 1) | 1 for v in wide[:8]]  # 64 bits wide
    vals = edges + rand
    x = np.array(vals, np.uint64)
    out = np.zeros(len(vals), np.int64)
    _bitlen_kernel[1, len(vals)](x, out)
    assert out.tolist() == [v.bit_length() for v in vals]
    assert out[: len(edges)].tolist() == [0, 1, 2, 2, 8, 9, 32, 32, 33, 63, 63, 64, 64]


@cuda.jit
def _ld_u32x4_kernel(src, out):
    """Thread t reads the 4 words at 4 * ((7t + 3) % 64): scattered 16-byte loads."""
    t = cuda.threadIdx.x
    j = 4 * ((7 * t + 3) % 64)
    out[t, 0], out[t, 1], out[t, 2], out[t, 3] = _dev.ld_u32x4(src, j)


@cuda.jit
def _ld_stream_u32x4_kernel(src, out):
    """As _ld_u32x4_kernel through ld_stream_u32x4 (the .L1::no_allocate form)."""
    t = cuda.threadIdx.x
    j = 4 * ((7 * t + 3) % 64)
    out[t, 0], out[t, 1], out[t, 2], out[t, 3] = _dev.ld_stream_u32x4(src, j)


@pytest.mark.parametrize("kernel", [_ld_u32x4_kernel, _ld_stream_u32x4_kernel])
def test_ld_u32x4_reads_four_consecutive_words(kernel):
    rng = np.random.default_rng(42)
    src = rng.integers(0, 2**32, 256, dtype=np.uint64).astype(np.uint32)
    src[:4] = [0, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF]
    out = np.zeros((64, 4), np.uint32)
    kernel[1, 64](cuda.to_device(src), o_d := cuda.to_device(out))
    out = o_d.copy_to_host()
    idx = 4 * ((7 * np.arange(64) + 3) % 64)
    want = src.reshape(64, 4)[idx // 4]
    assert out.dtype == np.uint32
    assert np.array_equal(out, want)


@cuda.jit
def _shared_rotate_kernel(base, out):
    s = cuda.shared.array(256, float32)
    t = cuda.threadIdx.x
    s[t] = base + float32(t)
    cuda.syncthreads()
    out[t] = s[(t + 1) % 256]


@pytest.mark.skipif(not _dev.SIMULATED, reason="the CUDA simulator's own shared-array allocation")
def test_every_thread_of_a_block_gets_the_same_simulated_shared_array(monkeypatch):
    """Two threads that both miss in the simulator's shared-array table, forced to interleave
    (the first waits up to 0.2 s for a second miss), still get one array: _dev's locked
    allocation. numba-cuda 0.30.4's own check-then-set gave each its own array (the
    intermittent W4A16 wrong bits at a 0.2 ms switch interval)."""
    import threading

    from numba.cuda.simulator import kernelapi

    class PairedMiss(dict):
        def __init__(self):
            super().__init__()
            self.pair = threading.Barrier(2)

        def get(self, key, default=None):
            res = super().get(key, default)
            if res is None:
                try:
                    self.pair.wait(timeout=0.2)
                except threading.BrokenBarrierError:
                    pass
            return res

    init = kernelapi.FakeCUDAShared.__init__

    def paired_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._allocations = PairedMiss()

    monkeypatch.setattr(kernelapi.FakeCUDAShared, "__init__", paired_init)
    for launch in range(3):
        base = np.float32(1000 * (launch + 1))  # differs per launch: no stale values pass
        out = np.zeros(256, np.float32)
        _shared_rotate_kernel[1, 256](base, out)
        want = base + ((np.arange(256) + 1) % 256).astype(np.float32)
        assert_bits_equal(out.view(np.uint32), want.view(np.uint32))


# -- the k16 IMMA, prmt and mul_wide (w4a16_gemv_exact) ------------------------------


@cuda.jit
def _mma_k16_kernel(a, b, c, d):
    i = cuda.grid(1)
    d[i, 0], d[i, 1], d[i, 2], d[i, 3] = _dev.mma_k16_s8u8(
        a[i, 0], a[i, 1], b[i, 0], c[i, 0], c[i, 1], c[i, 2], c[i, 3]
    )


def test_mma_k16_twin_is_the_ptx_m16n8k16_product():
    """mma_k16_s8u8 (w4a16_gemv_exact): 16x16 int8 @ 16x8 uint8 + C, one warp, extremes included.
    Its fragments are the first half of m16n8k32's (PTX ISA: A regs (g, 4t..) and (g+8, 4t..),
    B reg (4t.., g), C/D as for k32), so they come from ``_mma_fragments`` with k 16..31 zero."""
    rng = np.random.default_rng(42)
    am = rng.integers(-128, 128, (16, 16))
    bm = rng.integers(0, 256, (16, 8))
    am[0, :] = -128
    am[15, :] = 127
    bm[:, 1] = 255
    cm = rng.integers(-(2**30), 2**30, (16, 8))
    a32 = np.zeros((16, 32), np.int64)
    b32 = np.zeros((32, 8), np.int64)
    a32[:, :16], b32[:16] = am & 0xFF, bm
    a, b, c = _mma_fragments(a32, b32, cm)
    d = np.zeros((32, 4), np.int32)
    _mma_k16_kernel[1, 32](a[:, :2].copy(), b[:, :1].copy(), c, d)
    assert_bits_equal(d, _mma_fragments(a32, b32, am @ bm + cm)[2], "mma_k16_s8u8")


@cuda.jit
def _prmt_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = _dev.prmt(x[i, 0], x[i, 1], x[i, 2])


def test_prmt_twin_follows_the_ptx_byte_select_rule():
    """Hand-worked cases of prmt.b32 (default mode): pool {b, a}, a = bytes 0-3; c[4i+3] = sign."""
    cases = [
        # (a, b, c, want)
        (0x03020100, 0x07060504, 0x3210, 0x03020100),  # identity
        (0x03020100, 0x07060504, 0x4567, 0x04050607),  # from b, reversed
        (0x03020100, 0x0C080604, 0x7531, 0x0C060301),  # the E2M1 table: codes 1, 3, 5, 7
        (0x00000080, 0x00000000, 0x0008, 0x808080FF),  # byte 0: the sign of 0x80; others copy it
        (0x0000007F, 0x00000000, 0x0008, 0x7F7F7F00),  # the sign of 0x7F: 0x00
        (0x03020100, 0x0C080604, 0xDEAD0008, 0x00000000),  # only c's low 16 bits count
        (0x11223344, 0x8899AABB, 0xC4F0, 0xFFBBFF44),  # mixed: sign of 0x88, 0xBB, 0x44 (0)
    ]
    x = np.array([[a, b, c] for a, b, c, _ in cases], np.uint32)
    out = np.zeros(len(cases), np.uint32)
    _prmt_kernel[1, 32](x, out)
    assert [hex(v) for v in out] == [hex(w) for *_, w in cases]


@cuda.jit
def _mul_wide_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = _dev.mul_wide(x[i, 0], x[i, 1])


def test_mul_wide_is_exact_at_the_int32_extremes():
    v = [-(2**31), 2**31 - 1, -1, 0, 1, 3, -(2**17) - 5, 245760]
    x = np.array([(p, q) for p in v for q in v], np.int32)
    out = np.zeros(len(x), np.int64)
    _mul_wide_kernel[1, len(x)](x, out)
    assert out.tolist() == [int(p) * int(q) for p, q in x.tolist()]


@cuda.jit
def _grid_dep_kernel(x, out):
    _dev.grid_dep_launch()
    i = cuda.grid(1)
    _dev.grid_dep_wait()
    if i < x.size:
        out[i] = x[i] + 1


def test_grid_dependency_pair_keeps_the_kernel_s_own_semantics():
    """``grid_dep_wait`` / ``grid_dep_launch`` order launches only (PDL): a kernel launched
    without the attribute (numba's dispatcher here) computes as if they were not there. That
    the real builds carry the PTX instructions is tests/cuda/test_ptx.py's check."""
    x = np.arange(40, dtype=np.int32)
    out = np.zeros_like(x)
    _grid_dep_kernel[2, 32](x, out)
    assert out.tolist() == (x + 1).tolist()


@cuda.jit
def _mma_s8_kernel(a, b, c, d):
    i = cuda.grid(1)
    d[i, 0], d[i, 1], d[i, 2], d[i, 3] = _dev.mma_u8s8(
        a[i, 0], a[i, 1], a[i, 2], a[i, 3], b[i, 0], b[i, 1], c[i, 0], c[i, 1], c[i, 2], c[i, 3]
    )


def test_mma_u8s8_is_the_ptx_m16n8k32_product_with_a_signed_b():
    """u8 A x s8 B: B's bytes read as two's complement (-128 .. 127), the extremes included."""
    rng = np.random.default_rng(43)
    am = rng.integers(0, 256, (16, 32))
    bm = rng.integers(-128, 128, (32, 8))
    am[0], bm[:, 0] = 255, -128  # the most negative products
    cm = rng.integers(-(2**30), 2**30, (16, 8))
    a, b, c = _mma_fragments(am, bm & 0xFF, cm)
    want = _mma_fragments(am, bm & 0xFF, am @ bm + cm)[2]
    d = np.zeros((32, 4), np.int32)
    _mma_s8_kernel[1, 32](a, b, c, d)
    assert_bits_equal(d, want, "mma_u8s8 D = A @ B + C")


_cp_async_wait_all = _dev.cp_async_wait[0]  # a kernel calls a global, not a tuple's item


@cuda.jit
def _cp_async_kernel(src32, src16, out32, out16, out4):
    s32 = cuda.shared.array(64, uint32)
    s16 = cuda.shared.array(64, uint16)
    s4 = cuda.shared.array(16, uint32)
    t = cuda.threadIdx.x  # 16 threads
    _dev.cp_async16(s32, 4 * t, src32, 4 * ((t + 5) % 16))
    _dev.cp_async16(s16, 8 * (t % 8), src16, 8 * ((t + 3) % 8))
    _dev.cp_async_commit()
    _dev.cp_async4(s4, (t + 1) % 16, src32, 63 - t)  # a second group, 4 bytes
    _dev.cp_async_commit()
    _cp_async_wait_all()
    cuda.syncthreads()
    w0, w1, w2, w3 = _dev.ld_vec_u32x4(s32, 4 * ((t + 1) % 16))  # a 16-byte shared read
    out32[t, 0], out32[t, 1], out32[t, 2], out32[t, 3] = w0, w1, w2, w3
    for j in range(4):
        out16[t, j] = s16[4 * t + j]
    out4[t] = s4[t]


def test_cp_async_copies_land_after_the_wait_and_ld_vec_reads_them():
    """cp_async16/4 into shared arrays of uint32 and uint16 (16 and 4 bytes whatever the
    element size), visible after cp_async_wait[0] and a barrier; ld_vec_u32x4 on shared.
    (No two copies write one address: PTX orders no cp.async against another.)"""
    rng = np.random.default_rng(44)
    src32 = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    src16 = rng.integers(0, 2**16, 64).astype(np.uint16)
    out32 = np.zeros((16, 4), np.uint32)
    out16 = np.zeros((16, 4), np.uint16)
    out4 = np.zeros(16, np.uint32)
    _cp_async_kernel[1, 16](src32, src16, out32, out16, out4)
    s32 = np.zeros(64, np.uint32)
    s16 = np.zeros(64, np.uint16)
    for t in range(16):
        s32[4 * t : 4 * t + 4] = src32[4 * ((t + 5) % 16) : 4 * ((t + 5) % 16) + 4]
        s16[8 * (t % 8) : 8 * (t % 8) + 8] = src16[8 * ((t + 3) % 8) : 8 * ((t + 3) % 8) + 8]
    assert np.array_equal(out32, s32.reshape(16, 4)[[(t + 1) % 16 for t in range(16)]])
    assert np.array_equal(out16, s16[:64].reshape(16, 4))
    assert np.array_equal(out4, [src32[63 - (t - 1) % 16] for t in range(16)])


@cuda.jit
def _wrap_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = uint32(x[i] + uint32(0x80000000)) + uint32(0x80000000)  # wraps twice


def test_wrapping_integer_arithmetic_warns_nothing():
    """Device integers wrap modulo 2**32; the simulator's NumPy scalars must not warn where
    the device wraps (issue 33: six RuntimeWarnings flooded the quickstart)."""
    import warnings

    x = np.array([0, 1, 0xFFFFFFFF, 0x80000000], np.uint32)
    out = np.zeros_like(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _wrap_kernel[1, 4](x, out)
    assert np.array_equal(out, x)
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []


def test_every_helper_has_a_device_version_and_a_twin():
    """dev re-exports one set of names; both worlds define each of them (and as device code)."""
    import re

    from q2gemv.cuda.runtime import dev, intrinsics, twins

    names = re.findall(r"^(\w+) = _impl\.\1$", open(dev.__file__).read(), re.M)
    assert len(names) >= 20 and "mma_u8s8" in names and "cp_async16" in names
    for name in names:
        assert hasattr(intrinsics, name), f"intrinsics lacks {name}"
        assert hasattr(twins, name), f"twins lacks {name}"
        assert getattr(dev, name) is getattr(twins if dev.SIMULATED else intrinsics, name)

"""Bad calls of every public entry point: refused with ValueError/TypeError, before any launch.

One table, one row per bad call: ``(id, call, exception, message regex)``.
The regex pins the argument's name and the expectation (``"a: expected
dtype bfloat16"``), so a refusal that names the wrong argument fails too.
The ``no_launch`` fixture replaces both kernel caches with a function that
raises AssertionError: a bad call that reaches a kernel fails its row instead
of being refused late (or not at all).

Non-contiguous arrays are either handled (computed exactly as their
contiguous copies) or refused; both outcomes are pinned below the table.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest

import q2gemv
from q2gemv import Nvfp4Weight, Q2Weight, quantize_q2_0
from q2gemv import reference as ref
from q2gemv.cuda.nvfp4 import seed as w4cuda
from q2gemv.cuda.q2_0 import seed as q2cuda
from q2gemv.dispatch.nvfp4_tiers import W4a16BatchmTiers, plan_w4a16, select_tier
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import assert_bits_equal
from q2gemv.host import call as road
from q2gemv.io import load_nvfp4_weights, load_q2_weights, read_gguf, save_q2_weights

N, K, M = 7, 128, 2


def _ctx() -> SimpleNamespace:
    rng = np.random.default_rng(1234)
    codes = rng.integers(0, 4, (N, K), dtype=np.uint8)
    scales = (rng.standard_normal((N, K // 64)) * 0.1).astype(np.float16)
    w = Q2Weight.from_codes(codes, scales, group=64)
    w4 = Nvfp4Weight.from_codes(
        rng.integers(0, 16, (N, K), dtype=np.uint8),
        rng.integers(0x20, 0x40, (N, K // 16), dtype=np.uint8),
        1.0,
    )
    a = rng.standard_normal((M, K)).astype(BF16)
    return SimpleNamespace(
        w=w,
        w4=w4,
        codes=codes,
        scales=scales,
        a=a,
        a1=a[0].copy(),
        raw=np.array(w.raw),
        packed=np.array(w4.packed),
        s4=np.array(w4.scales),
    )


C = _ctx()


def _aliased():
    """``a`` [M, K] and ``out`` [M, N] views of one bf16 buffer."""
    buf = np.zeros(M * K, BF16)
    return buf.reshape(M, K), buf[: M * N].reshape(M, N)


def _dev_q2():
    from numba import cuda

    return cuda, q2cuda.DeviceQ2Weight.upload(C.w, keep_gguf=True)


def _dev_w4():
    from numba import cuda

    return cuda, w4cuda.DeviceNvfp4Weight.upload(C.w4, keep_packed=True)


def _q2_raw(name, m, a_shape=None, out_shape=None, a_dt=np.uint16, out_dt=np.uint16):
    cuda, dw = _dev_q2()
    d_a = cuda.to_device(np.zeros(a_shape or (int(m), K), a_dt))
    d_out = cuda.device_array(out_shape or (int(m), N), out_dt)
    q2cuda.launch_raw(name, d_a, dw, d_out, m)


def _w4_raw(name, m, a_shape=None, out_shape=None, a_dt=np.uint16, out_dt=np.uint16):
    cuda, dw = _dev_w4()
    d_a = cuda.to_device(np.zeros(a_shape or (int(m), K), a_dt))
    d_out = cuda.device_array(out_shape or (int(m), N), out_dt)
    w4cuda.launch_raw(name, d_a, dw, d_out, m)


def _readonly_out():
    out = np.zeros((M, N), BF16)
    out.flags.writeable = False
    return out


def _gguf_bytes(tmp) -> bytes:
    p = tmp / "ok.gguf"
    save_q2_weights(p, {"blk.0.w": C.w})
    return p.read_bytes()


def _truncated_gguf(tmp, keep):
    data = _gguf_bytes(tmp)
    p = tmp / "cut.gguf"
    p.write_bytes(data[: keep(len(data))])
    return p


def _bad_magic(tmp):
    p = tmp / "magic.gguf"
    p.write_bytes(b"GGUX" + _gguf_bytes(tmp)[4:])
    return p


def _truncated_safetensors(tmp, cut):
    stn = pytest.importorskip("safetensors.numpy")
    p = tmp / "w.safetensors"
    stn.save_file(
        {
            "l.weight": np.array(C.w4.packed),
            "l.weight_scale": np.array(C.w4.scales),
            "l.weight_scale_2": np.array([1.0], np.float32),
        },
        str(p),
    )
    data = p.read_bytes()
    p.write_bytes(data[:cut] if cut else struct.pack("<Q", 1 << 40) + data[8:])
    return p


F16, F32, U16, I32 = np.float16, np.float32, np.uint16, np.int32

# (id, call(tmp_path), exception, regex naming the argument and what it expected)
# fmt: off
CASES = [
    # -- q2gemv.gemv: activations ---------------------------------------------------------
    ("gemv/a-float16-seed", lambda t: q2gemv.gemv(C.a.astype(F16), C.w, numerics="seed"), ValueError, r"a: the seed contract .* is bf16-only"),
    ("gemv/a-float16-seed-kernel", lambda t: q2gemv.gemv(C.a.astype(F16), C.w, kernel="q2_0_gemv_vec"), ValueError, r"a: the seed contract .* is bf16-only"),
    ("gemv/w4-a-float16-seed", lambda t: q2gemv.gemv(C.a.astype(F16), C.w4, numerics="seed"), ValueError, r"a: the seed contract .* is bf16-only"),
    ("gemv/a-float32", lambda t: q2gemv.gemv(C.a.astype(F32), C.w), TypeError, r"a: expected dtype bfloat16"),
    ("gemv/a-int-codes", lambda t: q2gemv.gemv(C.a.view(U16), C.w), TypeError, r"a: expected dtype bfloat16"),
    ("gemv/a-list", lambda t: q2gemv.gemv([1.0] * K, C.w), TypeError, r"a: expected a numpy"),
    ("gemv/a-rank0", lambda t: q2gemv.gemv(C.a[0, 0], C.w), TypeError, r"a: expected a numpy"),
    ("gemv/a-rank0-array", lambda t: q2gemv.gemv(np.zeros((), BF16), C.w), ValueError, r"a: expected shape \[K\] or \[M, K\]"),
    ("gemv/a-rank3", lambda t: q2gemv.gemv(C.a[None], C.w), ValueError, r"a: expected shape \[K\] or \[M, K\]"),
    ("gemv/a-K-mismatch", lambda t: q2gemv.gemv(C.a[:, :64], C.w), ValueError, r"a: expected K=128"),
    ("gemv/a-K-mismatch-1d", lambda t: q2gemv.gemv(C.a1[:127], C.w), ValueError, r"a: expected K=128"),
    ("gemv/w4-a-float32", lambda t: q2gemv.gemv(C.a.astype(F32), C.w4), TypeError, r"a: expected dtype bfloat16"),
    ("gemv/w4-a-K-mismatch", lambda t: q2gemv.gemv(C.a[:, :112], C.w4), ValueError, r"a: expected K=128"),
    # -- q2gemv.gemv: out ------------------------------------------------------------------
    ("gemv/out-float32", lambda t: q2gemv.gemv(C.a, C.w, out=np.zeros((M, N), F32)), TypeError, r"out: expected a bfloat16"),
    ("gemv/out-uint16", lambda t: q2gemv.gemv(C.a, C.w, out=np.zeros((M, N), U16)), TypeError, r"out: expected a bfloat16"),
    ("gemv/out-list", lambda t: q2gemv.gemv(C.a, C.w, out=[0.0] * N), TypeError, r"out: expected a bfloat16"),
    ("gemv/out-float16-for-bf16-a", lambda t: q2gemv.gemv(C.a, C.w, out=np.zeros((M, N), F16)), TypeError, r"out: expected a bfloat16"),
    ("gemv/out-bf16-for-float16-a", lambda t: q2gemv.gemv(C.a.astype(F16), C.w, out=np.zeros((M, N), BF16)), TypeError, r"out: expected a float16 numpy array \(the dtype of a\)"),
    ("gemv/out-N-mismatch", lambda t: q2gemv.gemv(C.a, C.w, out=np.zeros((M, N + 1), BF16)), ValueError, r"out: expected shape \(2, 7\)"),
    ("gemv/out-M-mismatch", lambda t: q2gemv.gemv(C.a, C.w, out=np.zeros((M + 1, N), BF16)), ValueError, r"out: expected shape \(2, 7\)"),
    ("gemv/out-rank-1d-a", lambda t: q2gemv.gemv(C.a1, C.w, out=np.zeros((1, N), BF16)), ValueError, r"out: expected shape \(7,\)"),
    ("gemv/out-transposed", lambda t: q2gemv.gemv(C.a, C.w, out=np.zeros((N, M), BF16)), ValueError, r"out: expected shape"),
    ("gemv/out-readonly", lambda t: q2gemv.gemv(C.a, C.w, out=_readonly_out()), ValueError, r"out: expected a writeable"),
    ("gemv/out-aliases-a", lambda t: _gemv_aliased(C.w), ValueError, r"out: must not alias"),
    ("gemv/w4-out-aliases-a", lambda t: _gemv_aliased(C.w4), ValueError, r"out: must not alias"),
    ("gemv/w4-out-float16", lambda t: q2gemv.gemv(C.a, C.w4, out=np.zeros((M, N), F16)), TypeError, r"out: expected a bfloat16"),
    # -- q2gemv.gemv: weight, kernel, backend --------------------------------------------
    ("gemv/weight-ndarray", lambda t: q2gemv.gemv(C.a, C.raw), TypeError, r"weight: expected a Q2Weight, Nvfp4Weight"),
    ("gemv/weight-none", lambda t: q2gemv.gemv(C.a, None), TypeError, r"weight: expected"),
    ("gemv/kernel-unknown", lambda t: q2gemv.gemv(C.a, C.w, kernel="q2_0_gemv_fast"), ValueError, r"kernel: expected one of"),
    ("gemv/kernel-other-family", lambda t: q2gemv.gemv(C.a, C.w, kernel="w4a16_gemv_batch4"), ValueError, r"kernel: expected one of"),
    ("gemv/w4-kernel-q2", lambda t: q2gemv.gemv(C.a, C.w4, kernel="q2_0_gemv_vec"), ValueError, r"kernel: expected one of"),
    ("gemv/w4-tier-too-narrow", lambda t: q2gemv.gemv(np.zeros((5, K), BF16), C.w4, kernel="w4a16_gemv_batch4"), ValueError, r"kernel: w4a16_gemv_batch4 serves at most 4 rows, got M=5"),
    ("gemv/backend-unknown", lambda t: q2gemv.gemv(C.a, C.w, backend="cpu"), ValueError, r"backend: expected one of"),
    ("gemv/backend-ref-device-weight", lambda t: q2gemv.gemv(C.a, _dev_q2()[1], backend="reference"), TypeError, r"weight: the reference backend needs a host weight"),
    # -- plan / explain -------------------------------------------------------------------
    ("plan/m-negative", lambda t: q2gemv.plan(C.w, -1), ValueError, r"m: expected an int >= 0"),
    ("plan/m-float", lambda t: q2gemv.plan(C.w, 1.0), ValueError, r"m: expected an int >= 0"),
    ("plan/m-bool", lambda t: q2gemv.plan(C.w4, True), ValueError, r"m: expected an int >= 0"),
    ("explain/weight", lambda t: q2gemv.explain("w", 1), TypeError, r"weight: expected"),
    # -- Q2_0 kernel entry points (q2gemv.cuda.q2_0) -----------------------------------
    ("q2.launch_raw/batchm-M9", lambda t: _q2_raw("q2_0_gemv_vec_batchm", 9), ValueError, r"m: kernel q2_0_gemv_vec_batchm serves 1\.\.8 rows per launch, got 9"),
    ("q2.launch_raw/rt2-M9", lambda t: _q2_raw("q2_0_gemv_vec_batchm_rt2", 9), ValueError, r"m: kernel q2_0_gemv_vec_batchm_rt2 serves 1\.\.8"),
    ("q2.launch_raw/vec-M2", lambda t: _q2_raw("q2_0_gemv_vec", 2), ValueError, r"m: kernel q2_0_gemv_vec serves 1\.\.1"),
    ("q2.launch_raw/M0", lambda t: _q2_raw("q2_0_gemv", 0), ValueError, r"m: kernel q2_0_gemv serves 1\.\.1"),
    ("q2.launch_raw/M-float", lambda t: _q2_raw("q2_0_gemv_vec_batchm", 2.0), TypeError, r"m: expected an int"),
    ("q2.launch_raw/kernel-unknown", lambda t: _q2_raw("q2_0_gemv_vec_batch16", 1), ValueError, r"kernel: expected one of"),
    ("q2.launch_raw/a-shape", lambda t: _q2_raw("q2_0_gemv_vec_batchm", 2, a_shape=(2, 64)), ValueError, r"a: expected shape \(2, 128\)"),
    ("q2.launch_raw/a-rows", lambda t: _q2_raw("q2_0_gemv_vec_batchm", 2, a_shape=(3, K)), ValueError, r"a: expected shape \(2, 128\)"),
    ("q2.launch_raw/out-shape", lambda t: _q2_raw("q2_0_gemv_vec_batchm", 2, out_shape=(2, 8)), ValueError, r"out: expected shape \(2, 7\)"),
    ("q2.launch_raw/a-float32", lambda t: _q2_raw("q2_0_gemv_vec_batchm", 2, a_dt=F32), TypeError, r"a: expected uint16"),
    ("q2.launch_raw/out-float32", lambda t: _q2_raw("q2_0_gemv_vec", 1, out_dt=F32), TypeError, r"out: expected uint16"),
    ("q2.launch_raw/weight-host", lambda t: q2cuda.launch_raw("q2_0_gemv_vec", None, C.w, None, 1), TypeError, r"weight: expected a DeviceQ2Weight"),
    ("run_kernel/q2-kernel-unknown", lambda t: road.run_kernel("q2_0_gemv_vec8", C.a.view(U16), C.w), ValueError, r"kernel: expected one of"),
    ("run_kernel/q2-a-bf16-not-bits", lambda t: road.run_kernel("q2_0_gemv_vec", C.a.astype(F32), C.w), TypeError, r"a_bits: expected uint16"),
    ("run_kernel/q2-a-rank1", lambda t: road.run_kernel("q2_0_gemv_vec", C.a1.view(U16), C.w), ValueError, r"a_bits: expected shape \[M, K\]"),
    ("run_kernel/q2-a-K-mismatch", lambda t: road.run_kernel("q2_0_gemv_vec", C.a.view(U16)[:, :64], C.w), ValueError, r"a_bits: expected shape \[M, K\] = \[M, 128\]"),
    ("run_kernel/q2-weight", lambda t: road.run_kernel("q2_0_gemv_vec", C.a.view(U16), C.w4), TypeError, r"weight: expected a Q2Weight or DeviceQ2Weight"),
    ("q2.upload/weight", lambda t: q2cuda.DeviceQ2Weight.upload(C.w4), TypeError, r"weight: expected a Q2Weight"),
    # -- W4A16 kernel entry points (q2gemv.cuda.nvfp4) ---------------------------------
    ("w4.launch_raw/batch8-M9", lambda t: _w4_raw("w4a16_gemv_batch8", 9), ValueError, r"m: kernel w4a16_gemv_batch8 serves 1\.\.8 rows per launch, got 9"),
    ("w4.launch_raw/batch4-M5", lambda t: _w4_raw("w4a16_gemv_batch4", 5), ValueError, r"m: kernel w4a16_gemv_batch4 serves 1\.\.4"),
    ("w4.launch_raw/rt2-M9", lambda t: _w4_raw("w4a16_gemv_batch8_rt2", 9), ValueError, r"m: kernel w4a16_gemv_batch8_rt2 serves 1\.\.8"),
    ("w4.launch_raw/batch32-M33", lambda t: _w4_raw("w4a16_gemv_batch32", 33), ValueError, r"m: kernel w4a16_gemv_batch32 serves 1\.\.32"),
    ("w4.launch_raw/M0", lambda t: _w4_raw("w4a16_gemv_batch4", 0), ValueError, r"m: kernel w4a16_gemv_batch4 serves 1\.\.4"),
    ("w4.launch_raw/M-float", lambda t: _w4_raw("w4a16_gemv_batch4", 2.0), TypeError, r"m: expected an int"),
    ("w4.launch_raw/kernel-unknown", lambda t: _w4_raw("w4a16_gemv_batch9", 1), ValueError, r"kernel"),
    ("w4.launch_raw/a-shape", lambda t: _w4_raw("w4a16_gemv_batch4", 2, a_shape=(2, 112)), ValueError, r"a: expected shape \(2, 128\)"),
    ("w4.launch_raw/out-shape", lambda t: _w4_raw("w4a16_gemv_batch4", 2, out_shape=(2, 6)), ValueError, r"out: expected shape \(2, 7\)"),
    ("w4.launch_raw/a-float32", lambda t: _w4_raw("w4a16_gemv_batch4", 2, a_dt=F32), TypeError, r"a: expected uint16"),
    ("w4.launch_raw/out-int32", lambda t: _w4_raw("w4a16_gemv_batch4", 2, out_dt=I32), TypeError, r"out: expected uint16"),
    ("w4.launch_raw/weight-host", lambda t: w4cuda.launch_raw("w4a16_gemv_batch4", None, C.w4, None, 1), TypeError, r"weight: expected a DeviceNvfp4Weight"),
    ("run_kernel/w4-kernel-unknown", lambda t: road.run_kernel("w4a16_gemv_batch3", C.a.view(U16), C.w4), ValueError, r"kernel"),
    ("run_kernel/w4-a-float32", lambda t: road.run_kernel("w4a16_gemv_batch4", C.a.astype(F32), C.w4), TypeError, r"a_bits: expected uint16"),
    ("run_kernel/w4-a-rank1", lambda t: road.run_kernel("w4a16_gemv_batch4", C.a1.view(U16), C.w4), ValueError, r"a_bits: expected shape \[M, K\]"),
    ("run_kernel/w4-a-K-mismatch", lambda t: road.run_kernel("w4a16_gemv_batch4", C.a.view(U16)[:, :16], C.w4), ValueError, r"a_bits: expected shape \[M, K\] = \[M, 128\]"),
    ("run_kernel/w4-weight", lambda t: road.run_kernel("w4a16_gemv_batch4", C.a.view(U16), C.w), TypeError, r"weight: expected an Nvfp4Weight"),
    ("w4.w4a16_gemv/a-float16", lambda t: w4cuda.w4a16_gemv(C.a.astype(F16), C.w4), TypeError, r"a: expected dtype bfloat16"),
    ("w4.w4a16_gemv/a-rank3", lambda t: w4cuda.w4a16_gemv(C.a[None], C.w4), ValueError, r"a: expected shape"),
    ("w4.w4a16_gemv/K-mismatch", lambda t: w4cuda.w4a16_gemv(C.a[:, :16], C.w4), ValueError, r"a: expected K=128"),
    ("w4.w4a16_gemv/tiers", lambda t: w4cuda.w4a16_gemv(C.a, C.w4, tiers=[True] * 5), TypeError, r"tiers: expected a W4a16BatchmTiers"),
    ("w4.upload/weight", lambda t: w4cuda.DeviceNvfp4Weight.upload(C.w), TypeError, r"weight: expected an Nvfp4Weight"),
    # -- Q2Weight and its constructors -----------------------------------------------------
    ("Q2Weight/raw-float", lambda t: Q2Weight(C.raw.astype(F32), N, K, 64), TypeError, r"raw: expected dtype uint8"),
    ("Q2Weight/raw-list", lambda t: Q2Weight(list(C.raw), N, K, 64), TypeError, r"raw: expected a numpy uint8"),
    ("Q2Weight/raw-2d", lambda t: Q2Weight(C.raw.reshape(N, -1), N, K, 64), ValueError, r"raw: expected a 1-D byte array"),
    ("Q2Weight/raw-truncated", lambda t: Q2Weight(C.raw[:-1], N, K, 64), ValueError, r"raw: expected exactly 252 bytes"),
    ("Q2Weight/raw-too-long", lambda t: Q2Weight(np.zeros(C.raw.size + 18, np.uint8), N, K, 64), ValueError, r"raw: expected exactly 252 bytes"),
    ("Q2Weight/raw-empty", lambda t: Q2Weight(np.zeros(0, np.uint8), N, K, 64), ValueError, r"raw: expected exactly 252 bytes"),
    ("Q2Weight/raw-noncontiguous", lambda t: Q2Weight(np.zeros(2 * C.raw.size, np.uint8)[::2], N, K, 64), ValueError, r"raw: expected a contiguous"),
    ("Q2Weight/group-32", lambda t: Q2Weight(C.raw, N, K, 32), ValueError, r"group: expected 64 or 128"),
    ("Q2Weight/group-256", lambda t: Q2Weight(C.raw, N, K, 256), ValueError, r"group: expected 64 or 128"),
    ("Q2Weight/group-float", lambda t: Q2Weight(C.raw, N, K, 64.0), ValueError, r"group: expected 64 or 128"),
    ("Q2Weight/group-bool", lambda t: Q2Weight(C.raw, N, K, True), ValueError, r"group: expected 64 or 128"),
    ("Q2Weight/n-zero", lambda t: Q2Weight(C.raw, 0, K, 64), ValueError, r"n: expected >= 1"),
    ("Q2Weight/n-negative", lambda t: Q2Weight(C.raw, -7, K, 64), ValueError, r"n: expected >= 1"),
    ("Q2Weight/k-zero", lambda t: Q2Weight(C.raw, N, 0, 64), ValueError, r"k: expected >= 1"),
    ("Q2Weight/k-not-group", lambda t: Q2Weight(C.raw, N, 96, 64), ValueError, r"k: expected a multiple of group=64"),
    ("Q2Weight/k-not-group128", lambda t: Q2Weight(C.raw, N, 192, 128), ValueError, r"k: expected a multiple of group=128"),
    ("Q2Weight/n-float", lambda t: Q2Weight(C.raw, 7.0, K, 64), TypeError, r"n: expected an int"),
    ("Q2Weight.from_bytes/truncated", lambda t: Q2Weight.from_bytes(C.raw.tobytes()[:-2], N, K, 64), ValueError, r"raw: expected exactly 252 bytes"),
    ("Q2Weight.from_bytes/group-mismatch", lambda t: Q2Weight.from_bytes(C.raw.tobytes(), N, K, 128), ValueError, r"raw: expected exactly 238 bytes"),
    ("Q2Weight.from_codes/codes-int32", lambda t: Q2Weight.from_codes(C.codes.astype(I32), C.scales, 64), TypeError, r"codes: expected a uint8"),
    ("Q2Weight.from_codes/codes-1d", lambda t: Q2Weight.from_codes(C.codes[0], C.scales, 64), ValueError, r"codes: expected shape \[n, k\]"),
    ("Q2Weight.from_codes/code-4", lambda t: Q2Weight.from_codes(C.codes | 4, C.scales, 64), ValueError, r"codes: expected values 0\.\.3"),
    ("Q2Weight.from_codes/scales-float64", lambda t: Q2Weight.from_codes(C.codes, C.scales.astype(np.float64), 64), TypeError, r"scales: expected float16 or float32"),
    ("Q2Weight.from_codes/scales-shape", lambda t: Q2Weight.from_codes(C.codes, C.scales[:, :1], 64), ValueError, r"scales: expected shape \(7, 2\)"),
    ("Q2Weight.from_codes/k-not-group", lambda t: Q2Weight.from_codes(C.codes[:, :96], C.scales, 64), ValueError, r"k: expected a multiple of group=64"),
    ("Q2Weight.from_codes/group-16", lambda t: Q2Weight.from_codes(C.codes, C.scales, 16), ValueError, r"group: expected 64 or 128"),
    ("Q2Weight.from_codes/n-zero", lambda t: Q2Weight.from_codes(C.codes[:0], C.scales[:0], 64), ValueError, r"n: expected >= 1"),
    ("quantize_q2_0/int", lambda t: quantize_q2_0(C.codes, 64), TypeError, r"w: expected a float array"),
    ("quantize_q2_0/rank1", lambda t: quantize_q2_0(np.zeros(K, F32), 64), ValueError, r"w: expected shape \[n, k\]"),
    ("quantize_q2_0/k-not-group", lambda t: quantize_q2_0(np.zeros((2, 80), F32), 64), ValueError, r"k: expected a multiple of group=64"),
    ("quantize_q2_0/group-96", lambda t: quantize_q2_0(np.zeros((2, 192), F32), 96), ValueError, r"group: expected 64 or 128"),
    ("quantize_q2_0/method", lambda t: quantize_q2_0(np.zeros((2, 128), F32), 64, method="rtn"), ValueError, r"method: expected 'ggml' or 'absmean'"),
    # -- Nvfp4Weight and its constructors --------------------------------------------------
    ("Nvfp4Weight/packed-int16", lambda t: Nvfp4Weight(C.packed.astype(np.int16), C.s4, 1.0), TypeError, r"packed: expected dtype uint8"),
    ("Nvfp4Weight/packed-1d", lambda t: Nvfp4Weight(C.packed.reshape(-1), C.s4, 1.0), ValueError, r"packed: expected a 2-D array"),
    ("Nvfp4Weight/packed-n0", lambda t: Nvfp4Weight(C.packed[:0], C.s4[:0], 1.0), ValueError, r"packed: expected at least one row"),
    ("Nvfp4Weight/k-not-16", lambda t: Nvfp4Weight(C.packed[:, :12], C.s4[:, :1], 1.0), ValueError, r"packed: expected shape \[n, k/2\] with k a multiple of 16"),
    ("Nvfp4Weight/k-zero", lambda t: Nvfp4Weight(C.packed[:, :0], C.s4[:, :0], 1.0), ValueError, r"packed: expected shape \[n, k/2\] with k a multiple of 16"),
    ("Nvfp4Weight/scales-shape", lambda t: Nvfp4Weight(C.packed, C.s4[:, :7], 1.0), ValueError, r"scales: expected shape \(7, 8\)"),
    ("Nvfp4Weight/scales-rows", lambda t: Nvfp4Weight(C.packed, C.s4[:6], 1.0), ValueError, r"scales: expected shape \(7, 8\)"),
    ("Nvfp4Weight/scales-float32", lambda t: Nvfp4Weight(C.packed, C.s4.astype(F32), 1.0), TypeError, r"scales: expected dtype uint8"),
    ("Nvfp4Weight/global-str", lambda t: Nvfp4Weight(C.packed, C.s4, "1.0"), TypeError, r"global_scale: expected a real number"),
    ("Nvfp4Weight/global-bool", lambda t: Nvfp4Weight(C.packed, C.s4, True), TypeError, r"global_scale: expected a real number"),
    ("Nvfp4Weight/global-size2", lambda t: Nvfp4Weight(C.packed, C.s4, np.ones(2, F32)), ValueError, r"global_scale: expected a scalar or size-1"),
    ("Nvfp4Weight.from_codes/code-16", lambda t: Nvfp4Weight.from_codes(np.full((N, K), 16, np.uint8), C.s4, 1.0), ValueError, r"codes: expected values 0\.\.15"),
    ("Nvfp4Weight.from_codes/odd-k", lambda t: Nvfp4Weight.from_codes(np.zeros((N, 17), np.uint8), C.s4, 1.0), ValueError, r"codes: expected an even k"),
    ("Nvfp4Weight.from_codes/int32", lambda t: Nvfp4Weight.from_codes(np.zeros((N, K), I32), C.s4, 1.0), TypeError, r"codes: expected dtype uint8"),
    ("Nvfp4Weight.from_float/int", lambda t: Nvfp4Weight.from_float(np.zeros((N, K), I32)), TypeError, r"w: expected a float array"),
    ("Nvfp4Weight.from_float/rank1", lambda t: Nvfp4Weight.from_float(np.zeros(K, F32)), ValueError, r"w: expected shape \[n, k\]"),
    ("Nvfp4Weight.from_float/k-24", lambda t: Nvfp4Weight.from_float(np.zeros((N, 24), F32)), ValueError, r"w:"),
    ("Nvfp4Weight.from_float/nan", lambda t: Nvfp4Weight.from_float(np.full((N, K), np.nan, F32)), ValueError, r"w: expected finite weights"),
    # -- loaders ---------------------------------------------------------------------------
    ("load_q2_weights/truncated-data", lambda t: load_q2_weights(_truncated_gguf(t, lambda n: n - 64)), ValueError, r"cut\.gguf"),
    ("load_q2_weights/truncated-header", lambda t: load_q2_weights(_truncated_gguf(t, lambda n: 20)), ValueError, r"cut\.gguf"),
    ("load_q2_weights/empty-file", lambda t: load_q2_weights(_truncated_gguf(t, lambda n: 0)), ValueError, r"cut\.gguf"),
    ("load_q2_weights/bad-magic", lambda t: load_q2_weights(_bad_magic(t)), ValueError, r"bad magic"),
    ("load_q2_weights/ambiguous-group-96", lambda t: load_q2_weights(t / "x.gguf", ambiguous_group=96), ValueError, r"ambiguous_group: expected 64, 128 or None"),
    ("read_gguf/truncated", lambda t: read_gguf(_truncated_gguf(t, lambda n: 30)), ValueError, r"cut\.gguf"),
    ("load_nvfp4_weights/truncated", lambda t: load_nvfp4_weights(_truncated_safetensors(t, -10)), ValueError, r"w\.safetensors"),
    ("load_nvfp4_weights/header-len", lambda t: load_nvfp4_weights(_truncated_safetensors(t, 0)), ValueError, r"w\.safetensors"),
    ("load_nvfp4_weights/4-bytes", lambda t: load_nvfp4_weights(_truncated_safetensors(t, 4)), ValueError, r"truncated"),
    # -- select_tier and the tier table --------------------------------------------------
    ("select_tier/m-negative", lambda t: select_tier(-1, [True] * 5, True), ValueError, r"m: expected >= 0"),
    ("select_tier/m-float", lambda t: select_tier(2.0, [True] * 5, True), TypeError, r"m: expected an int"),
    ("select_tier/m-bool", lambda t: select_tier(True, [True] * 5, True), TypeError, r"m: expected an int"),
    ("select_tier/m-str", lambda t: select_tier("4", [True] * 5, True), TypeError, r"m: expected an int"),
    ("select_tier/present-4", lambda t: select_tier(1, [True] * 4, True), ValueError, r"present: expected 5 flags"),
    ("select_tier/present-6", lambda t: select_tier(1, [True] * 6, True), ValueError, r"present: expected 5 flags"),
    ("select_tier/present-empty", lambda t: select_tier(0, [], True), ValueError, r"present: expected 5 flags"),
    ("plan_w4a16/tiers", lambda t: plan_w4a16(3, (True,) * 5), TypeError, r"tiers: expected a W4a16BatchmTiers"),
    ("plan_w4a16/m-negative", lambda t: plan_w4a16(-3, W4a16BatchmTiers()), ValueError, r"m: expected >= 0"),
    ("W4a16BatchmTiers/len", lambda t: W4a16BatchmTiers(("w4a16_gemv_batch4",)), ValueError, r"kernels: expected 5 entries"),
    ("W4a16BatchmTiers/entry", lambda t: W4a16BatchmTiers((4, None, None, None, None)), TypeError, r"kernels: expected str or None"),
    ("W4a16BatchmTiers.resolve/str", lambda t: W4a16BatchmTiers.resolve("w4a16_gemv_batch4"), TypeError, r"available: expected an iterable"),
    # -- issue 16 (more in tests/test_api.py, tests/formats/, tests/cuda/) -----------------
    ("gemv/kernel-list", lambda t: q2gemv.gemv(C.a, C.w, kernel=["q2_0_gemv"]), TypeError, r"kernel: expected a kernel name \(str\) or None, got list"),
    ("gemv/w4-kernel-list", lambda t: q2gemv.gemv(C.a, C.w4, kernel=["w4a16_gemv_batch4"]), TypeError, r"kernel: expected a kernel name"),
    ("gemv/stream-str", lambda t: q2gemv.gemv(C.a, C.w, backend="cuda", stream="x"), TypeError, r"stream: expected None, an int cudaStream_t handle or a numba stream"),
    ("gemv/w4-stream-negative", lambda t: q2gemv.gemv(C.a, C.w4, backend="cuda", stream=-2), ValueError, r"stream: expected a cudaStream_t handle >= 0"),
    ("gemv/out-overlaps-weight", lambda t: _gemv_out_over_weight(), ValueError, r"out: must not overlap the weight's bytes \(weight\.raw\)"),
    ("select_tier/present-None", lambda t: select_tier(1, None, True), TypeError, r"present: expected a sequence of 5 bools"),
    ("select_tier/exact_m-str", lambda t: select_tier(1, [True] * 5, "no"), TypeError, r"exact_m: expected a bool"),
    ("W4a16BatchmTiers/unknown-kernel", lambda t: W4a16BatchmTiers(("w4a16_gemv_batch4x", None, None, None, None)), ValueError, r"kernels: width 4 expected None or a W4A16 kernel"),
    ("W4a16BatchmTiers/too-narrow", lambda t: W4a16BatchmTiers((None, None, None, None, "w4a16_gemv_batch7")), ValueError, r"kernels: width 8 expected"),
    ("w4.w4a16_gemv/kernel-list", lambda t: w4cuda.w4a16_gemv(C.a, C.w4, kernel=["w4a16_gemv_batch4"]), TypeError, r"kernel: expected a kernel name"),
    ("Nvfp4Weight/global-2**2000", lambda t: Nvfp4Weight(C.packed, C.s4, 2**2000), ValueError, r"global_scale: expected a value representable in fp32"),
    ("Nvfp4Weight/global-2**200", lambda t: Nvfp4Weight(C.packed, C.s4, 2**200), ValueError, r"global_scale: expected a value representable in fp32"),
    ("q2.DeviceQ2Weight/rows", lambda t: q2cuda.DeviceQ2Weight(_dev_q2()[1].b16, _dev_q2()[1].bh, 2 * N, K, 64), ValueError, r"b16: expected 252 halves"),
    ("q2.DeviceQ2Weight/group", lambda t: _dev_q2_regroup(128), ValueError, r"b16: expected 119 halves .* group=128"),
    ("w4.DeviceNvfp4Weight/rows", lambda t: w4cuda.DeviceNvfp4Weight(_dev_w4()[1].wp, _dev_w4()[1].scales, 1.0, 2 * N, K), ValueError, r"wp: expected shape \(14, 16\)"),
]
# fmt: on


def _gemv_out_over_weight():
    """An out over a weight's bytes (the weight built past the ownership rule)."""
    buf = np.zeros(C.raw.size, np.uint8)
    w = Q2Weight(C.raw, N, K, 64)
    object.__setattr__(w, "raw", buf)
    return q2gemv.gemv(C.a, w, out=buf[: M * N * 2].view(BF16).reshape(M, N))


def _dev_q2_regroup(group):
    dw = _dev_q2()[1]
    return q2cuda.DeviceQ2Weight(dw.b16, dw.bh, N, K, group)


def _gemv_aliased(w):
    a, out = _aliased()
    return q2gemv.gemv(a, w, out=out)


def test_table_size():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 100


@pytest.mark.parametrize(("case", "call", "exc", "match"), CASES, ids=[c[0] for c in CASES])
def test_bad_call_is_refused(no_launch, tmp_path, case, call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call(tmp_path)
    # ValueError/TypeError only (loader errors subclass ValueError); never a bare crash
    assert isinstance(info.value, (ValueError, TypeError)), case


# -- non-contiguous arrays: handled exactly ---------------------------------------------------


def _strided_cases():
    rng = np.random.default_rng(77)
    big = rng.standard_normal((2 * M, 2 * K)).astype(BF16)
    return {
        "every-other-column": big[:M, ::2],
        "every-other-row": big[::2, :K],
        "reversed-rows": big[:M, :K][::-1],
        "fortran-order": np.asfortranarray(big[:M, :K]),
        "1d-strided": big[0, ::2],
    }


@pytest.mark.parametrize("layout", list(_strided_cases()))
@pytest.mark.parametrize("family", ["q2_0", "w4a16"])
def test_non_contiguous_activations_are_handled(layout, family):
    a = _strided_cases()[layout]
    w = C.w if family == "q2_0" else C.w4
    want = q2gemv.gemv(np.ascontiguousarray(a), w, backend="reference")
    got_ref = q2gemv.gemv(a, w, backend="reference")
    assert_bits_equal(got_ref.view(np.uint16), want.view(np.uint16))
    if layout in ("every-other-column", "1d-strided"):  # one simulator run per family
        got = q2gemv.gemv(a, w, backend="cuda")
        assert_bits_equal(got.view(np.uint16), want.view(np.uint16))


def test_non_contiguous_out_is_written_exactly():
    buf = np.zeros((M, 2 * N), BF16)
    out = buf[:, ::2]
    res = q2gemv.gemv(C.a, C.w, backend="reference", out=out)
    assert res is out
    want = ref.q2_0_gemv_vec_batchm(C.a, C.w)
    assert_bits_equal(out.view(np.uint16).copy(), want.view(np.uint16))
    assert not buf[:, 1::2].view(np.uint16).any()  # the gaps are untouched


def test_non_contiguous_weight_parts():
    # Q2Weight refuses a strided raw buffer (it is the GGUF bytes, unchanged) ...
    with pytest.raises(ValueError, match="raw: expected a contiguous"):
        Q2Weight(np.repeat(C.raw, 2)[::2], N, K, 64)
    # ... Nvfp4Weight copies strided parts into contiguous read-only arrays
    w = Nvfp4Weight(np.asfortranarray(C.packed), np.asfortranarray(C.s4), 1.0)
    assert w.packed.flags.c_contiguous and not w.packed.flags.writeable
    assert_bits_equal(
        ref.w4a16_gemv(C.a, w).view(np.uint16), ref.w4a16_gemv(C.a, C.w4).view(np.uint16)
    )

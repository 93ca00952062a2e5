"""``q2gemv.gemv``: the user-facing entry that validates, picks a kernel and a backend."""

from __future__ import annotations

import sys

import numpy as np

from . import launch
from .backends import BACKENDS, default_backend
from .formats.bf16 import BF16, as_bf16_bits, bits_to_bf16
from .formats.q2_0 import Q2Weight

Q2_KERNELS = (
    "q2_0_gemv",
    "q2_0_gemv_vec",
    "q2_0_gemv_vec_batchm",
    "q2_0_gemv_vec_rt4",
    "q2_0_gemv_vec_batchm_rt2",
)


def _weight_nk(weight) -> tuple[int, int]:
    try:
        return int(weight.n), int(weight.k)
    except AttributeError:
        raise TypeError(
            f"weight: expected a Q2Weight or Nvfp4Weight, got {type(weight).__name__}"
        ) from None


def _is_device_weight(weight) -> bool:
    """Without importing numba: a device weight can only exist once q2gemv.cuda is loaded."""
    mod = sys.modules.get("q2gemv.cuda.q2_0")
    return mod is not None and isinstance(weight, mod.DeviceQ2Weight)


def default_q2_kernel(m: int) -> str:
    """M=1 -> the candidate-B kernel; otherwise the batched kernel (chunked by 8)."""
    return "q2_0_gemv_vec" if m == 1 else "q2_0_gemv_vec_batchm"


def check_activations(a, k: int) -> tuple[np.ndarray, bool]:
    """bf16 [K] or [M, K] -> (uint16 bits [M, K], was_1d). Raises naming ``a``."""
    bits = as_bf16_bits(a, "a")
    if bits.ndim not in (1, 2):
        raise ValueError(f"a: expected shape [K] or [M, K], got {bits.shape}")
    was_1d = bits.ndim == 1
    bits2 = bits.reshape(1, -1) if was_1d else bits
    if bits2.shape[1] != k:
        raise ValueError(f"a: expected K={k} columns (the weight's k), got {bits2.shape[1]}")
    return bits2, was_1d


def check_out(out, a, shape: tuple[int, ...]) -> None:
    if not isinstance(out, np.ndarray) or out.dtype != BF16:
        got = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        raise TypeError(f"out: expected a bfloat16 numpy array, got {got}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out: expected a writeable array")
    if np.shares_memory(out, a):
        raise ValueError("out: must not alias the activations a")


def gemv(
    a: np.ndarray,
    weight,
    *,
    kernel: str | None = None,
    backend: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``y = a @ dequantize(weight).T`` in bf16, bit-exact across backends.

    Args:
        a: ``ml_dtypes.bfloat16`` activations, [K] or [M, K] (any M >= 0).
        weight: a :class:`~q2gemv.Q2Weight` (or a device-resident
            :class:`~q2gemv.cuda.DeviceQ2Weight` for ``backend="cuda"``).
        kernel: force one kernel: ``"q2_0_gemv"``, ``"q2_0_gemv_vec"``
            (each M=1 kernel runs one launch per activation row) or
            ``"q2_0_gemv_vec_batchm"`` (chunks of at most 8 rows). Default:
            ``q2_0_gemv_vec`` for M=1, the batched kernel otherwise.
        backend: ``"reference"`` (NumPy) or ``"cuda"`` (the numba kernels on
            the GPU, or the CUDA simulator when ``NUMBA_ENABLE_CUDASIM=1``).
            Default: ``"cuda"`` where available, else ``"reference"``.
        out: optional bfloat16 array of the result's shape to write into.

    Returns:
        bfloat16 [M, N] (or [N] for 1-D ``a``).

    Raises:
        TypeError / ValueError naming the argument, before anything runs.
    """
    n, k = _weight_nk(weight)
    bits, was_1d = check_activations(a, k)
    m = bits.shape[0]
    shape = (n,) if was_1d else (m, n)
    if out is not None:
        check_out(out, a, shape)
    if backend is None:
        backend = "cuda" if _is_device_weight(weight) else default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if kernel is None:
        kernel = default_q2_kernel(m)
    if kernel not in Q2_KERNELS:
        raise ValueError(f"kernel: expected one of {Q2_KERNELS}, got {kernel!r}")
    if backend == "reference" and not isinstance(weight, Q2Weight):
        raise TypeError("weight: the reference backend needs a host Q2Weight")

    if m == 0:
        y = np.empty((0, n), np.uint16)
    elif backend == "reference":
        from . import reference

        y = getattr(reference, kernel)(bits_to_bf16(bits), weight).view(np.uint16)
    else:
        from .cuda import q2_0 as q2cuda

        y = q2cuda.run(kernel, bits, weight)
    result = bits_to_bf16(y.reshape(shape))
    if out is not None:
        out[...] = result
        return out
    return result


__all__ = ["gemv", "default_q2_kernel", "launch"]

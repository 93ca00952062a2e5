"""Device-resident activations and outputs: numba device arrays, CuPy arrays, torch tensors.

:func:`q2gemv.gemv` takes activations that already live on the GPU through here (the road,
:mod:`q2gemv.host.call`, builds the call with :func:`device_bits` and :func:`output`),
so nothing is copied to the host:

* numba device arrays (real or simulated) and any object with
  ``__cuda_array_interface__`` (CuPy, ...) must hold **bf16 bit patterns as
  uint16** ([K] or [M, K], C-contiguous): neither numba nor CuPy has a bf16
  dtype. The result is a numba device array of uint16 bits (wrap it with
  ``cupy.asarray`` for CuPy).
* torch CUDA tensors must be ``torch.bfloat16`` or ``torch.float16`` (the exact
  contract only: the seed's kernels are bf16-only); they are reinterpreted as
  16-bit integers (no copy) and the result is a tensor of the same dtype on
  the same device. Without ``stream=``, launches go on torch's current stream
  (through ``cuda.external_stream``) so they order with the surrounding torch
  work and can be captured in a torch CUDA graph.

``out=`` may be a device array / tensor of the result's shape and kind;
``stream=`` a numba stream or a raw ``cudaStream_t`` handle (int). torch is
never imported here unless a torch tensor was passed.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...host.arrays import is_torch


def as_bits(x, name: str):
    """``(numba uint16 device array, kind)`` for a device array / tensor ``x``; no copy.

    Raises TypeError/ValueError naming ``name`` for a wrong dtype, a host
    tensor, or a non-contiguous array.
    """
    if is_torch(x):
        return _torch_bits(x, name), "torch"
    return _array_bits(x, name)


def device_bits(x, name: str, kind: str):
    """:func:`as_bits`'s array for ``x`` of a known ``kind`` (``"torch"``, ``"numba"`` or
    ``"cai"``: :func:`q2gemv.host.arrays.device_activations`), which is not asked again."""
    return _torch_bits(x, name) if kind == "torch" else _array_bits(x, name)[0]


def _torch_bits(x, name: str):
    import torch

    if not x.is_cuda:
        raise TypeError(f"{name}: expected a CUDA tensor, got one on {x.device}")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"{name}: expected torch.bfloat16 or torch.float16, got {x.dtype}")
    if not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")
    return cuda.as_cuda_array(x.view(torch.int16)).view(np.uint16)


def _array_bits(x, name: str):
    if getattr(x, "__cuda_ndarray__", False):
        d, kind = x, "numba"
    elif hasattr(x, "__cuda_array_interface__"):
        d, kind = cuda.as_cuda_array(x), "cai"
    else:
        raise TypeError(f"{name}: expected a device array or CUDA tensor, got {type(x).__name__}")
    if np.dtype(d.dtype) != np.uint16:
        raise TypeError(f"{name}: expected uint16 bf16 bit patterns on the device, got {d.dtype}")
    if not d.is_c_contiguous():
        raise ValueError(f"{name}: expected a C-contiguous device array")
    return d, kind


def as_device_buffer(x, name: str):
    """``x`` as a numba device array over the same memory (no copy), for ``from_buffers``.

    Takes a numba device array as it is, or anything with
    ``__cuda_array_interface__`` (a CUDA torch tensor, a CuPy array), which
    stays alive as long as the view. Raises TypeError naming ``name`` for
    host arrays (and, under the CUDA simulator, which has no foreign device
    memory, for anything but its own device arrays).
    """
    if getattr(x, "__cuda_ndarray__", False):
        return x
    if hasattr(x, "__cuda_array_interface__") and hasattr(cuda, "as_cuda_array"):
        return cuda.as_cuda_array(x)
    raise TypeError(
        f"{name}: expected a device array (a numba device array, or a CUDA torch tensor / CuPy "
        f"array: anything with __cuda_array_interface__), got {type(x).__name__}"
    )


def visible_to_all_streams(stream) -> None:
    """Wait for ``stream`` (0: the whole device), so that what it wrote is visible to every
    stream: a device weight's one-time conversions (its layout, its rebuilt storage bytes)
    are made once, and later calls may come on streams that do not wait for ``stream``.
    Not allowed inside a CUDA graph capture (warm up first)."""
    if stream:
        stream.synchronize()
    else:
        cuda.synchronize()


def check_device_array(x, name: str, dtype, shape: tuple[int, ...]) -> None:
    """``x`` must be a C-contiguous numba device array of ``dtype`` and ``shape``.

    Raises TypeError/ValueError naming ``name``: a kernel handed a smaller
    buffer than (n, k) imply would read out of bounds.
    """
    if not getattr(x, "__cuda_ndarray__", False):
        raise TypeError(f"{name}: expected a numba device array, got {type(x).__name__}")
    if np.dtype(x.dtype) != np.dtype(dtype):
        raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if not x.is_c_contiguous():
        raise ValueError(f"{name}: expected a C-contiguous device array")


def output(kind, a, d_a, dw, parts, out_shape, out, st):
    """``(result to return, its uint16 device view)``: a new array, or ``out`` checked.

    ``out`` must be the kind of ``a`` (``kind``, from :func:`as_bits`), of
    ``out_shape``, and share no memory with ``d_a`` or the device weight's
    arrays named ``parts`` (its family's ``FamilySpec.device_arrays``).
    """
    if out is None:
        if kind == "torch":
            import torch

            result = torch.empty(out_shape, dtype=a.dtype, device=a.device)
            d_out, _ = as_bits(result, "out")
        else:
            result = d_out = cuda.device_array(out_shape, dtype=np.uint16, stream=st)
        return result, d_out
    d_out, out_kind = as_bits(out, "out")
    if (out_kind == "torch") != (kind == "torch"):
        raise TypeError("out: expected the same kind of device array as a")
    if kind == "torch" and out.dtype != a.dtype:
        raise TypeError(f"out: expected {a.dtype} (the dtype of a), got {out.dtype}")
    if tuple(d_out.shape) != tuple(out_shape):
        raise ValueError(f"out: expected shape {tuple(out_shape)}, got {tuple(d_out.shape)}")
    if _same_memory(d_out, d_a):
        raise ValueError("out: must not alias the activations a")
    for name in parts:
        part = getattr(dw, name)  # None: not made (a weight's raw bytes or layout)
        if part is not None and _same_memory(d_out, part):
            raise ValueError(f"out: must not overlap the weight's device buffer ({name})")
    return out, d_out


def _same_memory(x, y) -> bool:
    try:
        px = x.device_ctypes_pointer.value
        py = y.device_ctypes_pointer.value
    except AttributeError:  # the simulator's arrays are NumPy underneath
        return np.shares_memory(np.asarray(x._ary), np.asarray(y._ary))
    nx = x.size * np.dtype(x.dtype).itemsize
    ny = y.size * np.dtype(y.dtype).itemsize
    return px < py + ny and py < px + nx

"""Device arrays and streams as callers pass them: the one place they are recognised and normalised.

:func:`q2gemv.gemv`, :func:`q2gemv.prepare` and the device-array interop
(:mod:`q2gemv.cuda.runtime.interop`) all ask here: is this a device array
(:func:`is_device_array`, :func:`is_torch`; a call's activations once:
:func:`device_activations`), is this a stream argument we
take (:func:`check_stream`), which numba stream do the launches go on
(:func:`numba_stream`), and what identifies a call for the launch cache
(:func:`call_key`). Importing this module imports neither numba nor torch:
a torch tensor can only exist once torch is loaded, and numba is imported
only when a stream is made.
"""

from __future__ import annotations

import sys

import numpy as np

from ..dispatch import registry
from ..formats.act import BF16, FP16, ActFormat
from .backends import simulator_active


def is_torch(x) -> bool:
    """True when ``x`` is a torch tensor (host or CUDA); never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_device_array(x) -> bool:
    """True when ``x`` is a numba device array, a ``__cuda_array_interface__`` object or a CUDA tensor."""
    if getattr(x, "__cuda_ndarray__", False) or hasattr(x, "__cuda_array_interface__"):
        return True
    return is_torch(x) and x.is_cuda


def device_activations(a, stream) -> tuple[str, object, ActFormat] | None:
    """``(kind, numba stream, format)`` of activations ``a`` on the GPU, None for anything else.

    The one look at a call's activations: ``kind`` is ``"torch"`` (a CUDA
    tensor), ``"numba"`` (a numba device array) or ``"cai"`` (another
    ``__cuda_array_interface__`` object: CuPy), as
    :func:`q2gemv.cuda.runtime.interop.device_bits` takes it; the stream is
    :func:`numba_stream` of the (checked) ``stream`` argument for ``a``; the format is
    fp16 for a ``torch.float16`` tensor, else bf16 (uint16 bits are bf16; the dtype itself
    is checked with the bits, by :func:`~q2gemv.cuda.runtime.interop.device_bits`).
    """
    cuda_ndarray = getattr(a, "__cuda_ndarray__", False)
    if cuda_ndarray or hasattr(a, "__cuda_array_interface__"):
        kind = "torch" if is_torch(a) else "numba" if cuda_ndarray else "cai"
    elif is_torch(a) and a.is_cuda:
        kind = "torch"
    else:
        return None
    fp16 = kind == "torch" and a.dtype == sys.modules["torch"].float16
    return kind, numba_stream(stream, a), FP16 if fp16 else BF16


def check_stream(stream) -> None:
    """None, a raw ``cudaStream_t`` handle (int >= 0; 0 = default stream) or a numba stream."""
    if stream is None:
        return
    if isinstance(stream, (bool, np.bool_)):
        raise TypeError(
            "stream: expected None, an int cudaStream_t handle or a numba stream, got bool"
        )
    if isinstance(stream, (int, np.integer)):
        if stream < 0:
            raise ValueError(f"stream: expected a cudaStream_t handle >= 0, got {int(stream)}")
        if stream and simulator_active():
            raise ValueError(
                "stream: the CUDA simulator has no external streams: expected 0 or a numba "
                f"stream (cuda.stream()), got the raw handle {int(stream)}"
            )
        return
    if not (callable(getattr(stream, "synchronize", None)) and hasattr(stream, "auto_synchronize")):
        raise TypeError(
            "stream: expected None, an int cudaStream_t handle or a numba stream "
            f"(numba.cuda.stream(); for a torch stream pass its .cuda_stream), "
            f"got {type(stream).__name__}"
        )


def numba_stream(stream, like=None):
    """The numba stream launches go on for a (checked) ``stream`` argument.

    None: torch's current stream of ``like``'s device when ``like`` is a
    torch tensor, else 0 (the default stream); an int: 0, or numba's
    external stream of that raw handle; a numba stream as it is.
    """
    if stream is None or isinstance(stream, (bool, np.bool_)):
        if stream is None and is_torch(like):
            import torch
            from numba import cuda

            return cuda.external_stream(torch.cuda.current_stream(like.device).cuda_stream)
        return 0
    if isinstance(stream, (int, np.integer)):
        from numba import cuda

        return cuda.external_stream(int(stream)) if stream else 0
    return stream


_TORCH_RAW_STREAM: list = []  # torch._C._cuda_getCurrentRawStream (or a fallback), found once


def _torch_stream(torch, device: int) -> int:
    if not _TORCH_RAW_STREAM:
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _TORCH_RAW_STREAM.append(raw or (lambda d: torch.cuda.current_stream(d).cuda_stream))
    return _TORCH_RAW_STREAM[0](device)


def _buffer_key(x, tensor_type) -> tuple | None:
    """What identifies device buffer ``x`` for the launch cache: address, shape, dtype, strides."""
    if tensor_type is not None and isinstance(x, tensor_type):  # a CUDA address names its device
        return (x.data_ptr(), x.shape, x.dtype, x.stride(), x.is_cuda)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:  # numba (GPU) and CuPy arrays
        return (cai["data"][0], cai["shape"], cai["typestr"], cai.get("strides"), type(x))
    if getattr(x, "__cuda_ndarray__", False):  # the simulator's: no address; kept alive, so
        return (id(x), type(x))  # its identity cannot be reused while cached
    return None


def call_key(a, out, stream, kernel, numerics) -> tuple | None:
    """The launch-cache key of a call on device ``a`` and ``out`` (None: not cacheable).

    Everything the first call's validation depended on, besides the weight
    (the cache lives on the immutable device weight): both buffers' device
    address (unique across devices), shape, dtype, strides, the stream's raw
    handle (torch's current stream for torch ``a`` without ``stream=``; the
    simulator's streams by identity), ``kernel``, ``numerics`` and the launch
    policies' generation (:func:`q2gemv.dispatch.registry.policy_generation`: e.g.
    :func:`~q2gemv.dispatch.nvfp4_tiers.reload_env` re-plans). A call whose key
    differs in any of them is validated and bound afresh: a cached launch is
    never used on other buffers.
    """
    if not (kernel is None or type(kernel) is str) or not (
        numerics is None or type(numerics) is str
    ):
        return None  # gemv refuses it (or it is unhashable): no key can match it
    tensor_type = getattr(sys.modules.get("torch"), "Tensor", None)
    ka = _buffer_key(a, tensor_type)
    ko = _buffer_key(out, tensor_type)
    if ka is None or ko is None:
        return None
    if stream is None:
        torch_a = tensor_type is not None and isinstance(a, tensor_type)
        st = _torch_stream(sys.modules["torch"], a.get_device()) if torch_a else 0
    elif type(stream) is int:
        st = stream
    elif hasattr(stream, "auto_synchronize"):  # a numba stream (check_stream's test)
        try:
            st = int(int(stream))  # its handle (an IntEnum for the default stream)
        except TypeError:
            st = ("simulator", id(stream))  # no handle there: by identity (kept alive)
    else:
        return None  # anything else is refused by gemv's checks
    return (ka, ko, st, kernel, numerics, registry.policy_generation())


__all__ = [
    "is_torch",
    "is_device_array",
    "device_activations",
    "check_stream",
    "numba_stream",
    "call_key",
]

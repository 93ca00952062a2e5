"""What the torch.library ops under q2gemv's layers share (needs torch): the argument
checks, the device-weight cache over torch buffers, the run of one op on CPU or CUDA
(:func:`_linear`), the gradient formula (:func:`_grad_x`) and ``q2gemv::add_bias``. Each
format's op (``q2gemv::q2_linear``, ``q2gemv::nvfp4_linear``), its fake impl and autograd
live in its layer module (:mod:`q2gemv.nn.q2_0`, :mod:`q2gemv.nn.nvfp4`). The contract is
stated in :mod:`q2gemv.torch`.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..formats.act import BF16 as BF16_ACT
from ..formats.act import FP16

# -- argument checks (shared by the modules, the real and the fake op) ---------------------


X_DTYPES = (torch.bfloat16, torch.float16)  # activations in, results out: the same dtype


def _check_x(x: torch.Tensor, k: int) -> None:
    """``x`` must be a bfloat16 or float16 tensor [..., k]; TypeError/ValueError naming ``x``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in X_DTYPES:
        raise TypeError(f"x: expected torch.bfloat16 or torch.float16 activations, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(
            f"x: expected shape [..., K] with K={k} (the layer's in_features), got {tuple(x.shape)}"
        )


def _check_buffer(t: torch.Tensor, name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if t.dtype != torch.uint8:
        raise TypeError(f"{name}: expected a torch.uint8 buffer, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(t.shape)}")
    if t.device != x.device:
        raise ValueError(
            f"{name}: the weight is on {t.device} but x is on {x.device} (move the module "
            "with .to(x.device))"
        )


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` as a contiguous [M, k] tensor, 16-byte aligned (some kernels load 16 bytes)."""
    x2 = x.detach().reshape(-1, k)
    if not x2.is_contiguous() or x2.data_ptr() % 16:
        x2 = x2.clone(memory_format=torch.contiguous_format)
    return x2


def _act(dtype: torch.dtype):
    return FP16 if dtype == torch.float16 else BF16_ACT


def _host_bf16(x2: torch.Tensor) -> np.ndarray:
    """A CPU bf16 / fp16 tensor as the NumPy array of its dtype (no copy)."""
    return x2.detach().view(torch.int16).numpy().view(_act(x2.dtype).dtype)


def _from_host_bf16(y: np.ndarray, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(dtype)


# -- device weights over torch buffers ---------------------------------------------------


class _CudaBuffer:
    """A ``__cuda_array_interface__`` copied from a tensor, without a reference to the tensor.

    The cached device weights are built over these, so the cache never keeps
    a module's buffers alive; an entry whose tensor is gone is harmless (its
    key is the address and size, and a live tensor there is what it reads).
    """

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t: torch.Tensor) -> None:
        self.__cuda_array_interface__ = dict(t.__cuda_array_interface__)


_DEVICE_WEIGHTS: dict[tuple, object] = {}
_DEVICE_WEIGHTS_LOCK = threading.RLock()  # _forget may run from a GC inside a locked region
_DEVICE_WEIGHTS_MAX = 4096  # cleared past this many (entries of freed buffers are dropped)
# Keys whose buffers a layer has handed out since the entry was made or checked: one of
# them may have been written in a way torch does not count (see _QuantizedLinear).
_HANDED_OUT: set[tuple] = set()


def clear_device_weight_cache() -> None:
    """Forget every cached device weight (each frees its execution layout's memory)."""
    with _DEVICE_WEIGHTS_LOCK:
        _DEVICE_WEIGHTS.clear()
        _HANDED_OUT.clear()


def _current(
    key: tuple,
    tensors: tuple,
    build: Callable[[], object],
    unchanged: Callable[[object], bool],
) -> object:
    """The cached device weight of ``key`` while it is current, else a new one from ``build``.

    A device weight's execution layout is a copy of its buffers (``from_buffers``
    repacks them), so a cached one is reused only while every tensor of ``tensors``
    is the same storage (a freed buffer's address can come back holding another
    weight) at the same version (``load_state_dict`` and other in-place writes bump
    it). After a layer handed a buffer out (:func:`_handed_out`), a write torch does not
    count may have happened: the first use after compares the buffers' bytes with the
    layout's (``unchanged(dw)``, once) and keeps the weight when they are equal (a
    captured CUDA graph may read its layout), else builds a new one. An entry goes when
    its first tensor's storage is freed (:func:`_forget`).
    """
    state = tuple((t.untyped_storage(), t._version) for t in tensors)
    entry = _DEVICE_WEIGHTS.get(key)
    if (
        entry is not None
        and all(r() is st for r, (st, _) in zip(entry[0], state, strict=True))
        and entry[1] == tuple(v for _, v in state)
    ):
        if key not in _HANDED_OUT:
            return entry[2]
        if unchanged(entry[2]):
            with _DEVICE_WEIGHTS_LOCK:
                _HANDED_OUT.discard(key)
            return entry[2]
    dw = build()
    refs = tuple(
        weakref.ref(st, functools.partial(_forget, key)) if i == 0 else weakref.ref(st)
        for i, (st, _) in enumerate(state)
    )
    with _DEVICE_WEIGHTS_LOCK:
        if len(_DEVICE_WEIGHTS) >= _DEVICE_WEIGHTS_MAX:
            _DEVICE_WEIGHTS.clear()
            _HANDED_OUT.clear()
        _DEVICE_WEIGHTS[key] = (refs, tuple(v for _, v in state), dw)
        _HANDED_OUT.discard(key)
    return dw


def _handed_out(t: torch.Tensor) -> None:
    """Mark the cached device weights made from ``t``'s storage for a check at their next use."""
    st = t.untyped_storage()
    with _DEVICE_WEIGHTS_LOCK:
        _HANDED_OUT.update(k for k, e in _DEVICE_WEIGHTS.items() if any(r() is st for r in e[0]))


def _forget(key: tuple, ref: weakref.ref) -> None:
    """Drop an entry (and its device layout) when its first buffer's storage is freed."""
    with _DEVICE_WEIGHTS_LOCK:
        entry = _DEVICE_WEIGHTS.get(key)
        if entry is not None and entry[0][0] is ref:
            del _DEVICE_WEIGHTS[key]
            _HANDED_OUT.discard(key)


def _run_cuda(x2: torch.Tensor, device_weight: Callable[[], object], numerics: str | None):
    """The GEMV of device activations [M, K] on torch's current stream, into a new tensor.

    ``device_weight()`` returns the (cached) device weight; it is called in numba's
    context of ``x2``'s device.
    """
    from .. import api

    index = x2.device.index or 0
    if index == 0 or torch.cuda.device_count() == 1:
        return _gemv_cuda(api, x2, device_weight(), numerics)
    from numba import cuda

    with cuda.gpus[index]:  # numba's context must be the tensor's device
        return _gemv_cuda(api, x2, device_weight(), numerics)


def _gemv_cuda(api, x2: torch.Tensor, dw, numerics: str | None) -> torch.Tensor:
    out = torch.empty((x2.shape[0], dw.n), dtype=x2.dtype, device=x2.device)
    if x2.shape[0]:
        # stream=None: for torch tensors q2gemv.host.arrays.numba_stream launches on
        # torch.cuda.current_stream(x2.device), so the launches order with the
        # surrounding torch work and are captured by torch.cuda.graph.
        api.gemv(x2, dw, out=out, numerics=numerics)
    return out


# -- the custom ops ----------------------------------------------------------------------


def _linear(x, n: int, k: int, device_weight, host_weight, numerics) -> torch.Tensor:
    """Both ops' run, ``x`` checked: CUDA ``x`` through the device weight
    (``device_weight()``, cached), CPU ``x`` through the reference backend on the host
    weight (``host_weight()``); ``[..., k] -> [..., n]``."""
    lead = tuple(x.shape[:-1])
    x2 = _rows(x, k)
    if x.device.type == "cuda":
        y = _run_cuda(x2, device_weight, numerics)
    elif x.device.type == "cpu":
        from .. import api

        w = host_weight()
        y = api.gemv(_host_bf16(x2), w, backend="reference", numerics=numerics)
        y = _from_host_bf16(y, x2.dtype)
    else:
        raise ValueError(f"x: expected a CPU or CUDA tensor, got one on {x.device}")
    return y.reshape(*lead, n)


# -- autograd: the gradient with respect to x ----------------------------------------------
# The ops are opaque to autograd; their formula, registered with torch.library (so
# torch.compile traces it), is the transposed GEMV on the dequantized weight:
# dx = fp32(dy) @ dequantize(W) in fp32 (torch's matmul: a float result, not q2gemv's
# bit-exact contract), rounded to x's dtype. The weight buffers are uint8: no gradient.


def _grad_x(grad: torch.Tensor, w: torch.Tensor, x_dtype: torch.dtype) -> torch.Tensor:
    return (grad.to(torch.float32) @ w).to(x_dtype)


def _eager_direct(x: torch.Tensor) -> bool:
    """Call an op's implementation directly, without torch's dispatcher: eager CUDA calls only.

    A ``torch.library`` op defined in Python pays tens of microseconds of dispatch
    per call, as much as a decode GEMV takes on the GPU. The modules skip it for
    CUDA tensors when nothing traces or intercepts the call (not compiling, no
    ``TorchDispatchMode`` active) and no gradient is asked for (autograd needs the op's
    registered formula); ``torch.compile``, fake tensors, CPU tensors, ``x`` requiring a
    gradient and every other case go through the registered op. Both run the same function.
    """
    return (
        x.is_cuda
        and not (x.requires_grad and torch.is_grad_enabled())
        and not torch.compiler.is_compiling()
        and _get_current_dispatch_mode() is None
    )


def _add_bias_impl(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``y + bias`` in y's dtype (bf16 or fp16, one rounding): the bias add of both layers, as
    an opaque op."""
    return y + bias.to(y.dtype)


# An op of its own so that torch.compile keeps the bf16 rounding of y + bias: as a plain
# add, inductor fuses it with a following GELU/SiLU and skips that rounding (127 of 256
# outputs then differ from eager; issue 24).
add_bias = torch.library.custom_op(
    "q2gemv::add_bias", mutates_args=(), schema="(Tensor y, Tensor bias) -> Tensor"
)(_add_bias_impl)


@add_bias.register_fake
def _add_bias_fake(y, bias):
    return torch.empty_like(y)


def _add_bias_setup(ctx, inputs, output) -> None:
    ctx.bias_dtype = inputs[1].dtype


def _add_bias_backward(ctx, grad):
    dbias = None
    if ctx.needs_input_grad[1]:
        dbias = grad.reshape(-1, grad.shape[-1]).sum(0).to(ctx.bias_dtype)
    return grad, dbias


add_bias.register_autograd(_add_bias_backward, setup_context=_add_bias_setup)


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is None:
        return y
    op = _add_bias_impl if _eager_direct(y) else torch.ops.q2gemv.add_bias
    return op(y, bias)

"""The torch.library ops under q2gemv's layers (needs torch): ``q2gemv::q2_linear``,
``q2gemv::nvfp4_linear``, ``q2gemv::add_bias``, their fake impls and autograd, and the
device-weight cache over torch buffers. The contract is stated in :mod:`q2gemv.torch`.
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
from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK
from ..formats.nvfp4 import E2M1_VALUES, E4M3_VALUES, Nvfp4Weight, check_global_scale
from ..formats.q2_0 import SCALE_BYTES, Q2Weight, row_bytes

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


def _q2_device_weight(raw: torch.Tensor, n: int, k: int, group: int):
    """The device weight over ``raw`` (GGUF bytes), current (:func:`_current`)."""
    key = ("q2_0", raw.device.index, raw.data_ptr(), raw.numel(), n, k, group)

    def build():
        from ..cuda.q2_0 import DeviceQ2Weight

        return DeviceQ2Weight.from_buffers(_CudaBuffer(raw), n, k, group)

    return _current(key, (raw,), build, lambda dw: _q2_unchanged(dw, raw))


def _q2_unchanged(dw, raw: torch.Tensor) -> bool:
    """Are ``raw``'s bytes those ``dw``'s layout was made from? (its inverse, on the device)"""
    from ..cuda.q2_0 import layout

    b16 = layout.unpack(dw.codes, dw.scales, dw.n, dw.k, dw.group)
    return torch.equal(torch.as_tensor(b16, device=raw.device).view(torch.uint8), raw.reshape(-1))


def _nvfp4_unchanged(dw, packed: torch.Tensor, scales: torch.Tensor) -> bool:
    """Are ``packed`` and ``scales`` what ``dw``'s layout was made from? (on the device)"""
    from ..cuda.nvfp4 import layout

    wp, sc = layout.unpack(dw.codes, dw.xscales, dw.n, dw.k)
    wp = torch.as_tensor(wp, device=packed.device).view(torch.uint8)
    return torch.equal(wp, packed) and torch.equal(
        torch.as_tensor(sc, device=scales.device), scales
    )


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


def _nvfp4_device_weight(packed: torch.Tensor, scales: torch.Tensor, global_scale: float):
    key = (
        "w4a16",
        packed.device.index,
        packed.data_ptr(),
        tuple(packed.shape),
        scales.data_ptr(),
        float(global_scale),
    )

    def build():
        from ..cuda.nvfp4 import DeviceNvfp4Weight

        return DeviceNvfp4Weight.from_buffers(
            _CudaBuffer(packed), _CudaBuffer(scales), global_scale
        )

    return _current(key, (packed, scales), build, lambda dw: _nvfp4_unchanged(dw, packed, scales))


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


def _q2_linear_impl(
    x: torch.Tensor, raw: torch.Tensor, n: int, k: int, group: int, numerics: str | None = None
) -> torch.Tensor:
    """``x @ dequantize(Q2_0 weight).T`` in x's dtype: the op behind :class:`Q2Linear` (no bias).

    Args:
        x: ``torch.bfloat16`` or ``torch.float16`` activations [..., k] (fp16: the exact
            contract only), on the CPU or a CUDA device.
        raw: the weight's GGUF ``block_q2_0`` bytes, ``torch.uint8`` [n, row_bytes(k, group)],
            on x's device.
        n: output features. k: input features (a multiple of group).
        group: codes per block, 64 or 128.
        numerics: ``"exact"``, ``"seed"`` or None (the library default), as for
            :func:`q2gemv.gemv`.

    Returns a new tensor [..., n] of x's dtype: CPU through the reference
    backend, CUDA through the kernels on torch's current stream; the same bits.
    """
    _check_x(x, k)
    _check_buffer(raw, "raw", x, (n, row_bytes(k, group)))
    return _linear(
        x,
        n,
        k,
        lambda: _q2_device_weight(raw, n, k, group),
        lambda: Q2Weight.from_bytes(raw.detach().reshape(-1).numpy(), n, k, group),
        numerics,
    )


# Schemas spelled out (no inference from annotations, which torch 2.4 cannot read under
# ``from __future__ import annotations``).
q2_linear = torch.library.custom_op(
    "q2gemv::q2_linear",
    mutates_args=(),
    schema="(Tensor x, Tensor raw, int n, int k, int group, str? numerics=None) -> Tensor",
)(_q2_linear_impl)


@q2_linear.register_fake
def _q2_linear_fake(x, raw, n, k, group, numerics=None):
    _check_x(x, k)
    return x.new_empty((*x.shape[:-1], n))


def _nvfp4_linear_impl(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_scale: float,
    numerics: str | None = None,
) -> torch.Tensor:
    """``x @ dequantize(NVFP4 weight).T`` in x's dtype: the op behind :class:`Nvfp4Linear`.

    Args:
        x: ``torch.bfloat16`` or ``torch.float16`` activations [..., k] (fp16: the exact
            contract only), on the CPU or a CUDA device.
        packed: E2M1 codes, ``torch.uint8`` [n, k // 2] (even k in the low nibble).
        scales: E4M3 block-scale bits, ``torch.uint8`` [n, k // 16].
        global_scale: the per-tensor multiplier (an fp32 value); a finite value fp32
            cannot hold (``1e39``, ``1e-46``) is refused as :class:`~q2gemv.Nvfp4Weight`
            refuses it (:func:`q2gemv.formats.nvfp4.check_global_scale`).
        numerics: ``"seed"``, ``"exact"`` or None (the
            library default), as for :func:`q2gemv.gemv`.

    Returns a new tensor [..., n] of x's dtype (CPU: reference backend;
    CUDA: the W4A16 kernels on torch's current stream; the same bits).
    """
    if packed.dim() != 2:
        raise ValueError(f"packed: expected shape [n, k/2], got {tuple(packed.shape)}")
    n, k = int(packed.shape[0]), 2 * int(packed.shape[1])
    _check_x(x, k)
    _check_buffer(packed, "packed", x, (n, k // 2))
    _check_buffer(scales, "scales", x, (n, k // 16))
    global_scale = check_global_scale(global_scale)  # Nvfp4Weight's rules, before any work
    return _linear(
        x,
        n,
        k,
        lambda: _nvfp4_device_weight(packed, scales, global_scale),
        lambda: Nvfp4Weight.from_parts(
            packed.detach().numpy(), scales.detach().numpy(), np.float32(global_scale)
        ),
        numerics,
    )


nvfp4_linear = torch.library.custom_op(
    "q2gemv::nvfp4_linear",
    mutates_args=(),
    schema="(Tensor x, Tensor packed, Tensor scales, float global_scale, str? numerics=None)"
    " -> Tensor",
)(_nvfp4_linear_impl)


@nvfp4_linear.register_fake
def _nvfp4_linear_fake(x, packed, scales, global_scale, numerics=None):
    _check_x(x, 2 * packed.shape[1])
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


# -- autograd: the gradient with respect to x ----------------------------------------------
# The ops are opaque to autograd; their formula, registered with torch.library (so
# torch.compile traces it), is the transposed GEMV on the dequantized weight:
# dx = fp32(dy) @ dequantize(W) in fp32 (torch's matmul: a float result, not q2gemv's
# bit-exact contract), rounded to x's dtype. The weight buffers are uint8: no gradient.


def _q2_dequantize(raw: torch.Tensor, n: int, k: int, group: int) -> torch.Tensor:
    """float32 [n, k] of GGUF ``block_q2_0`` bytes, on raw's device: :meth:`Q2Weight.dequantize`.

    ``(code - 1) * fp32(d)`` per the layout of :mod:`q2gemv.formats.q2_0` (d: the block's
    first two bytes, little-endian fp16; code j: bits ``2 * (j % 4)`` of ``qs[j // 4]``).
    """
    blocks = raw.reshape(n, k // group, -1)
    d = blocks[..., :SCALE_BYTES].contiguous().view(torch.float16).to(torch.float32)
    shifts = torch.arange(0, 8, 2, dtype=torch.uint8, device=raw.device)
    codes = (blocks[..., SCALE_BYTES:].unsqueeze(-1) >> shifts) & 3  # [n, nb, group/4, 4]
    values = codes.reshape(n, k // group, group).to(torch.float32) - 1
    return (values * d).reshape(n, k)


def _nvfp4_dequantize(
    packed: torch.Tensor, scales: torch.Tensor, global_scale: float
) -> torch.Tensor:
    """float32 [n, k] of an NVFP4 weight, on its device: :meth:`Nvfp4Weight.dequantize`.

    ``fp32(fp32(e2m1 * e4m3) * g)``, the tables of :mod:`q2gemv.formats.nvfp4` (even k in
    a byte's low nibble).
    """
    n, k = packed.shape[0], 2 * packed.shape[1]
    e2m1 = torch.tensor(E2M1_VALUES.tolist(), dtype=torch.float32, device=packed.device)
    e4m3 = torch.tensor(E4M3_VALUES.tolist(), dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(
        n, k // NVFP4_BLOCK, NVFP4_BLOCK
    )
    ws = e2m1[codes.long()] * e4m3[scales.long()].unsqueeze(-1)
    return (ws * global_scale).reshape(n, k)


def _grad_x(grad: torch.Tensor, w: torch.Tensor, x_dtype: torch.dtype) -> torch.Tensor:
    return (grad.to(torch.float32) @ w).to(x_dtype)


def _q2_linear_setup(ctx, inputs, output) -> None:
    x, raw, n, k, group, _ = inputs
    ctx.save_for_backward(raw)
    ctx.shape, ctx.x_dtype = (n, k, group), x.dtype


def _q2_linear_backward(ctx, grad):
    (raw,) = ctx.saved_tensors
    dx = _grad_x(grad, _q2_dequantize(raw, *ctx.shape), ctx.x_dtype)
    return dx, None, None, None, None, None


q2_linear.register_autograd(_q2_linear_backward, setup_context=_q2_linear_setup)


def _nvfp4_linear_setup(ctx, inputs, output) -> None:
    x, packed, scales, global_scale, _ = inputs
    ctx.save_for_backward(packed, scales)
    ctx.global_scale, ctx.x_dtype = global_scale, x.dtype


def _nvfp4_linear_backward(ctx, grad):
    packed, scales = ctx.saved_tensors
    w = _nvfp4_dequantize(packed, scales, ctx.global_scale)
    return _grad_x(grad, w, ctx.x_dtype), None, None, None, None


nvfp4_linear.register_autograd(_nvfp4_linear_backward, setup_context=_nvfp4_linear_setup)


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

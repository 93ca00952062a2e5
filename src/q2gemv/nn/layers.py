"""torch integration: ``Q2Linear`` / ``Nvfp4Linear`` modules over q2gemv's GEMV (needs torch).

``import q2gemv`` never imports torch; ``import q2gemv.torch`` does (``pip
install "q2gemv[torch]"``). Two ``torch.nn.Module`` classes replace a
``torch.nn.Linear`` in inference:

* :class:`Q2Linear` holds a GGUF ``block_q2_0`` weight (:class:`~q2gemv.Q2Weight`);
* :class:`Nvfp4Linear` an NVFP4 W4A16 weight (:class:`~q2gemv.Nvfp4Weight`).

``forward(x)`` takes ``torch.bfloat16`` activations of shape ``[..., K]`` and
returns ``torch.bfloat16`` ``[..., N]``: ``y = x @ dequantize(W).T`` with the
bits of :func:`q2gemv.gemv` (the library's default numerics contract unless
``numerics=`` is given), then ``y = y + bias`` as one bf16 torch add when the
module has a bias (the bias is stored in bf16).

The packed weight lives in registered buffers (``raw`` for Q2_0, ``packed``
and ``scales`` for NVFP4; uint8), so ``.to("cuda")`` / ``.cuda()`` moves it
and ``state_dict()`` / ``load_state_dict()`` round-trip it; ``n``, ``k``,
``group``, ``global_scale`` and ``numerics`` are plain attributes, saved as the
module's extra state: a uint8 tensor of JSON, so a state dict is tensors only
(``safetensors``, ``save_pretrained``; docs/models_save_load.md). ``load_state_dict``
checks the buffers and the settings together before it writes a byte.
``Q2Linear.empty`` / ``Nvfp4Linear.empty`` make a layer from its shape alone (on the
meta device under ``with torch.device("meta"):``), to be filled by loading.

The GEMV is a ``torch.library`` custom op (``torch.ops.q2gemv.q2_linear``,
``torch.ops.q2gemv.nvfp4_linear``) with a fake (meta) implementation, so
modules using it trace under ``torch.compile`` (the op stays opaque: one
call per layer in the graph) and can be captured in a CUDA graph:

* CPU tensors run q2gemv's NumPy reference backend (``backend="reference"``),
  bit-identical to the GPU kernels;
* CUDA tensors run the numba kernels on torch's current stream over a device
  weight made from the buffers (``DeviceQ2Weight.from_buffers`` /
  ``DeviceNvfp4Weight.from_buffers``: no host copy; a snapshot repacked into the
  kernels' execution layout), writing into a tensor from torch's caching
  allocator. It is cached per buffer and rebuilt after a write torch records (the
  buffer's version counter or a new storage: in-place ops, ``copy_``,
  ``load_state_dict``, ``.to()``, ``.data = t``), and checked against the buffer's
  bytes once after the layer hands the buffer out (``layer.raw``,
  ``named_buffers()``, ``state_dict()``: a write through ``.data`` is not counted);
  see docs/guarantees.md (:func:`clear_device_weight_cache`).
  An eager CUDA forward calls the op's function without the dispatcher (its
  Python overhead is as long as a decode GEMV); traced and CPU calls use the op.

CUDA graphs: run each layer once on the capturing stream before the capture
(that compiles the kernels and, for the exact contract, allocates its
per-stream workspace: nothing may be allocated with ``cudaMalloc`` while
capturing).

Autograd (both devices alike): ``y`` requires a gradient when ``x`` does, and
``backward`` gives ``x`` the transposed GEMV on the dequantized weight,
``fp32(dy) @ dequantize(W)`` rounded to bf16 (torch's matmul: not part of the
bit-exact contract); the uint8 weight buffers get none. Registered with
``torch.library.register_autograd``, so ``torch.compile`` traces it.

Model level (:mod:`q2gemv.models`, re-exported here): :func:`quantize_model`,
:func:`load_gguf` / :func:`config_from_gguf`, :func:`load_safetensors`,
:func:`save_gguf` / :func:`save_safetensors` (:mod:`q2gemv.models.export`) and
:class:`CapturedDecoder` (the loaders and the decoder need transformers).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import warnings
import weakref
from collections.abc import Callable

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from .api import resolve_numerics
from .formats.bf16 import BF16
from .formats.nvfp4 import BLOCK as NVFP4_BLOCK
from .formats.nvfp4 import E2M1_VALUES, E4M3_VALUES, Nvfp4Weight, check_global_scale
from .formats.q2_0 import SCALE_BYTES, Q2Weight, as_size, check_group, quantize_q2_0, row_bytes
from .nn.swap import find_linears, swap_linears

__all__ = [
    "Q2Linear",
    "Nvfp4Linear",
    "q2_linear",
    "nvfp4_linear",
    "replace_linears",
    "clear_device_weight_cache",
    "quantize_model",
    "QuantizeReport",
    "load_gguf",
    "config_from_gguf",
    "load_safetensors",
    "save_gguf",
    "save_safetensors",
    "CapturedDecoder",
]


# -- argument checks (shared by the modules, the real and the fake op) ---------------------


def _check_x(x: torch.Tensor, k: int) -> None:
    """``x`` must be a bfloat16 tensor [..., k]; TypeError/ValueError naming ``x``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected torch.bfloat16 activations, got {x.dtype}")
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


def _host_bf16(x2: torch.Tensor) -> np.ndarray:
    return x2.detach().view(torch.int16).numpy().view(BF16)


def _from_host_bf16(y: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(torch.bfloat16)


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
        from .cuda.q2_0 import DeviceQ2Weight

        return DeviceQ2Weight.from_buffers(_CudaBuffer(raw), n, k, group)

    return _current(key, (raw,), build, lambda dw: _q2_unchanged(dw, raw))


def _q2_unchanged(dw, raw: torch.Tensor) -> bool:
    """Are ``raw``'s bytes those ``dw``'s layout was made from? (its inverse, on the device)"""
    from .cuda.q2_0 import layout

    b16 = layout.unpack(dw.codes, dw.scales, dw.n, dw.k, dw.group)
    return torch.equal(torch.as_tensor(b16, device=raw.device).view(torch.uint8), raw.reshape(-1))


def _nvfp4_unchanged(dw, packed: torch.Tensor, scales: torch.Tensor) -> bool:
    """Are ``packed`` and ``scales`` what ``dw``'s layout was made from? (on the device)"""
    from .cuda.nvfp4 import layout

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
        from .cuda.nvfp4 import DeviceNvfp4Weight

        return DeviceNvfp4Weight.from_buffers(
            _CudaBuffer(packed), _CudaBuffer(scales), global_scale
        )

    return _current(key, (packed, scales), build, lambda dw: _nvfp4_unchanged(dw, packed, scales))


def _run_cuda(x2: torch.Tensor, device_weight: Callable[[], object], numerics: str | None):
    """The GEMV of device activations [M, K] on torch's current stream, into a new tensor.

    ``device_weight()`` returns the (cached) device weight; it is called in numba's
    context of ``x2``'s device.
    """
    from . import api

    index = x2.device.index or 0
    if index == 0 or torch.cuda.device_count() == 1:
        return _gemv_cuda(api, x2, device_weight(), numerics)
    from numba import cuda

    with cuda.gpus[index]:  # numba's context must be the tensor's device
        return _gemv_cuda(api, x2, device_weight(), numerics)


def _gemv_cuda(api, x2: torch.Tensor, dw, numerics: str | None) -> torch.Tensor:
    out = torch.empty((x2.shape[0], dw.n), dtype=torch.bfloat16, device=x2.device)
    if x2.shape[0]:
        # stream=None: for torch tensors q2gemv.host.arrays.numba_stream launches on
        # torch.cuda.current_stream(x2.device), so the launches order with the
        # surrounding torch work and are captured by torch.cuda.graph.
        api.gemv(x2, dw, out=out, numerics=numerics)
    return out


# -- the custom ops ----------------------------------------------------------------------


def _q2_linear_impl(
    x: torch.Tensor, raw: torch.Tensor, n: int, k: int, group: int, numerics: str | None = None
) -> torch.Tensor:
    """``x @ dequantize(Q2_0 weight).T`` in bf16: the op behind :class:`Q2Linear` (no bias).

    Args:
        x: ``torch.bfloat16`` activations [..., k], on the CPU or a CUDA device.
        raw: the weight's GGUF ``block_q2_0`` bytes, ``torch.uint8`` [n, row_bytes(k, group)],
            on x's device.
        n: output features. k: input features (a multiple of group).
        group: codes per block, 64 or 128.
        numerics: ``"exact"``, ``"seed"`` or None (the library default), as for
            :func:`q2gemv.gemv`.

    Returns a new ``torch.bfloat16`` tensor [..., n]: CPU through the reference
    backend, CUDA through the kernels on torch's current stream; the same bits.
    """
    _check_x(x, k)
    _check_buffer(raw, "raw", x, (n, row_bytes(k, group)))
    lead = tuple(x.shape[:-1])
    x2 = _rows(x, k)
    if x.device.type == "cuda":
        y = _run_cuda(x2, lambda: _q2_device_weight(raw, n, k, group), numerics)
    elif x.device.type == "cpu":
        from . import api

        w = Q2Weight.from_bytes(raw.detach().reshape(-1).numpy(), n, k, group)
        y = _from_host_bf16(api.gemv(_host_bf16(x2), w, backend="reference", numerics=numerics))
    else:
        raise ValueError(f"x: expected a CPU or CUDA tensor, got one on {x.device}")
    return y.reshape(*lead, n)


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
    """``x @ dequantize(NVFP4 weight).T`` in bf16: the op behind :class:`Nvfp4Linear` (no bias).

    Args:
        x: ``torch.bfloat16`` activations [..., k], on the CPU or a CUDA device.
        packed: E2M1 codes, ``torch.uint8`` [n, k // 2] (even k in the low nibble).
        scales: E4M3 block-scale bits, ``torch.uint8`` [n, k // 16].
        global_scale: the per-tensor multiplier (an fp32 value); a finite value fp32
            cannot hold (``1e39``, ``1e-46``) is refused as :class:`~q2gemv.Nvfp4Weight`
            refuses it (:func:`q2gemv.formats.nvfp4.check_global_scale`).
        numerics: ``"seed"``, ``"exact"`` or None (the
            library default), as for :func:`q2gemv.gemv`.

    Returns a new ``torch.bfloat16`` tensor [..., n] (CPU: reference backend;
    CUDA: the W4A16 kernels on torch's current stream; the same bits).
    """
    if packed.dim() != 2:
        raise ValueError(f"packed: expected shape [n, k/2], got {tuple(packed.shape)}")
    n, k = int(packed.shape[0]), 2 * int(packed.shape[1])
    _check_x(x, k)
    _check_buffer(packed, "packed", x, (n, k // 2))
    _check_buffer(scales, "scales", x, (n, k // 16))
    global_scale = check_global_scale(global_scale)  # Nvfp4Weight's rules, before any work
    lead = tuple(x.shape[:-1])
    x2 = _rows(x, k)
    if x.device.type == "cuda":
        y = _run_cuda(x2, lambda: _nvfp4_device_weight(packed, scales, global_scale), numerics)
    elif x.device.type == "cpu":
        from . import api

        w = Nvfp4Weight.from_parts(
            packed.detach().numpy(), scales.detach().numpy(), np.float32(global_scale)
        )
        y = _from_host_bf16(api.gemv(_host_bf16(x2), w, backend="reference", numerics=numerics))
    else:
        raise ValueError(f"x: expected a CPU or CUDA tensor, got one on {x.device}")
    return y.reshape(*lead, n)


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


# -- modules -----------------------------------------------------------------------------


def _bias_buffer(bias, n: int, device) -> torch.Tensor | None:
    if bias is None:
        return None
    if isinstance(bias, np.ndarray):
        bias = torch.from_numpy(np.array(bias, dtype=np.float32))
    if not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias: expected a torch.Tensor or None, got {type(bias).__name__}")
    if not bias.is_floating_point():
        raise TypeError(f"bias: expected a floating-point tensor, got {bias.dtype}")
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias: expected shape ({n},) (out_features), got {tuple(bias.shape)}")
    return bias.detach().to(device=device, dtype=torch.bfloat16).clone()


def _check_numerics(family: str, numerics: str | None) -> str | None:
    resolve_numerics(family, numerics)  # ValueError naming numerics
    return numerics


def _add_bias_impl(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``y + bias`` in bf16 (one rounding): the bias add of both layers, as an opaque op."""
    return y + bias.to(torch.bfloat16)


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


def _linear_weight_f32(linear: torch.nn.Linear) -> np.ndarray:
    """The float weight of ``linear`` as fp32 on the host; a meta-device weight has no values.

    Both ``from_linear`` read it; a meta weight (``torch.device("meta")``, a model built
    with ``init_empty_weights``) would fail inside torch with "Cannot copy out of meta tensor".
    """
    if not isinstance(linear, torch.nn.Linear):
        raise TypeError(f"linear: expected a torch.nn.Linear, got {type(linear).__name__}")
    if linear.weight.is_meta:
        raise ValueError(
            "linear: its weight is on the meta device (no values to quantize); load the "
            "float weights first (e.g. to_empty() then load_state_dict())"
        )
    return linear.weight.detach().to(device="cpu", dtype=torch.float32).numpy()


# -- layer state: tensors only -------------------------------------------------------------
# A layer's settings (format, n, k, group or global scale, numerics) are saved as its
# ``_extra_state``: a 1-D torch.uint8 tensor holding UTF-8 JSON (bitsandbytes keeps its
# quant state the same way), so state_dict(), safetensors and save_pretrained see tensors only.

STATE_VERSION = 1  # the "version" of the JSON a layer writes; 1 adds numerics to the settings


def _state_tensor(state: dict) -> torch.Tensor:
    """``state`` as a layer's ``_extra_state``: a 1-D ``torch.uint8`` tensor of its UTF-8 JSON."""
    return torch.frombuffer(
        bytearray(json.dumps(state, sort_keys=True).encode()), dtype=torch.uint8
    )


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    return f"a {type(value).__name__}"


def _state_from(extra) -> tuple[dict, bool]:
    """A loaded ``_extra_state`` as ``(settings, legacy)``.

    The tensor form (:func:`_state_tensor`), or ``legacy``: the dict that layers saved
    before their state was tensors only (``{"format", "n", "k", "group"}`` for Q2_0,
    ``{"format", "n", "k", "global_scale"}`` for NVFP4; no numerics).
    """
    if isinstance(extra, dict):
        return dict(extra), True
    if (
        isinstance(extra, torch.Tensor)
        and extra.dtype == torch.uint8
        and extra.dim() == 1
        and not extra.is_meta
    ):
        try:
            state = json.loads(bytes(extra.detach().cpu().numpy()).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            state = None
        if isinstance(state, dict):
            return state, False
    raise ValueError(
        "state: expected a q2gemv layer state (a 1-D torch.uint8 tensor of UTF-8 JSON, or the "
        f"dict of older checkpoints), got {_describe(extra)}"
    )


def _check_version(state: dict, keys: set[str]) -> None:
    """A tensor-form state must be this version with exactly ``keys`` (+ "version")."""
    if state.get("version") != STATE_VERSION:
        raise ValueError(
            f"state: version {state.get('version')!r} is not one this q2gemv reads "
            f"({STATE_VERSION}); it was written by another q2gemv"
        )
    got = set(state) - {"version"}
    if got != keys:
        raise ValueError(
            f"state: expected the keys {sorted(keys)}, got {sorted(got)} (missing "
            f"{sorted(keys - got)}, unknown {sorted(got - keys)})"
        )


def _check_sizes(n, k, multiple: int, what: str) -> tuple[int, int]:
    n, k = as_size(n, "n"), as_size(k, "k")
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    if k < 1 or k % multiple:
        raise ValueError(f"k: expected a positive multiple of {what}={multiple}, got {k}")
    return n, k


def _empty_bias(n: int, bias: bool, device) -> torch.Tensor | None:
    if not isinstance(bias, bool):
        raise TypeError(f"bias: expected a bool, got {type(bias).__name__}")
    return torch.empty(n, dtype=torch.bfloat16, device=device) if bias else None


class _WeightBuffers(dict):
    """A quantized layer's ``_buffers``: handing its tensors out in bulk is noted.

    ``named_buffers()``, ``buffers()`` and ``state_dict()`` (of the layer or of any module
    above it) iterate ``_buffers.items()`` / ``.values()``; a tensor handed out there may
    be written in ways torch does not count (``b.data.copy_(new)``), so the device layout
    made from it is checked against the bytes at its next use (:func:`_current`). Item
    lookup (``_buffers["raw"]``, the layer's own reads) is not noted.
    """

    def items(self):
        _forget_all(self.values())
        return super().items()

    def values(self):
        vals = super().values()
        _forget_all(vals)
        return vals


def _forget_all(tensors) -> None:
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype == torch.uint8:
            _handed_out(t)


class _QuantizedLinear(torch.nn.Module):
    """What both quantized layers share: ``torch.nn.Linear``'s feature names over ``k``, ``n``,
    and a state of tensors only.

    ``state_dict()`` holds the weight buffers (``_WEIGHT_BUFFERS``), ``bias`` when there is
    one, and ``_extra_state``: the layer's settings as a 1-D ``torch.uint8`` tensor of UTF-8
    JSON (:meth:`get_extra_state`). ``load_state_dict()`` checks the weight buffers and the
    settings together before any byte is written: they come together or not at all, the
    settings must describe this layer (format, n, k, group), the buffers must be
    ``torch.uint8`` of this layer's shapes (a bias: floating point, [n]); anything else is
    a ``ValueError`` and the layer is unchanged. Then the buffers are copied and the settings taken (numerics, and the
    NVFP4 global scale).
    """

    n: int
    k: int
    _WEIGHT_BUFFERS: tuple[str, ...] = ()
    _unloaded = False  # True for an ``empty()`` layer until a state is loaded into it

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "_buffers", _WeightBuffers())

    def __getattr__(self, name: str):
        # A weight buffer handed out through the attribute (layer.raw, get_buffer) may be
        # written in ways torch does not count (layer.raw.data.copy_(new): .data has a
        # version counter of its own): its device layout is checked against the bytes at
        # the next CUDA forward (_current). The layer's own code reads self._buffers.
        value = super().__getattr__(name)
        if name in type(self)._WEIGHT_BUFFERS and isinstance(value, torch.Tensor):
            _handed_out(value)
        return value

    @property
    def in_features(self) -> int:
        """Input features ``k`` (``torch.nn.Linear``'s name)."""
        return self.k

    @property
    def out_features(self) -> int:
        """Output features ``n`` (``torch.nn.Linear``'s name)."""
        return self.n

    def _state(self) -> dict:
        raise NotImplementedError

    def _checked_state(self, extra) -> dict:
        """The attributes a loaded ``extra`` state sets, after every check (ValueError)."""
        raise NotImplementedError

    def get_extra_state(self) -> torch.Tensor:
        """The layer's settings as a 1-D ``torch.uint8`` tensor of UTF-8 JSON (on the CPU).

        ``{"format", "version": 1, "n", "k", "numerics", ...}`` plus ``"group"`` (Q2_0) or
        ``"global_scale"`` (NVFP4); ``json.loads(bytes(t.numpy()))`` reads it back.
        """
        return _state_tensor(self._state())

    def set_extra_state(self, state) -> None:
        """Take a loaded ``state`` (the tensor of :meth:`get_extra_state`, or the dict older
        checkpoints hold); ValueError if it does not describe this layer."""
        for name, value in self._checked_state(state).items():
            setattr(self, name, value)
        self._unloaded = False

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # torch copies the buffers before it calls set_extra_state: check everything
        # first, so a refused state leaves the layer as it was.
        self._check_loaded(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _check_loaded(self, state_dict, prefix: str) -> None:
        names = (*self._WEIGHT_BUFFERS, "_extra_state")
        present = [name for name in names if prefix + name in state_dict]
        if not present:
            return  # nothing of the weight (strict loading reports the missing keys)
        if len(present) != len(names):
            missing = [prefix + name for name in names if name not in present]
            raise ValueError(
                f"state_dict: {missing} missing beside {[prefix + name for name in present]} "
                f"(a {type(self).__name__}'s bytes and the state saying how to read them load "
                "together)"
            )
        self._checked_state(state_dict[prefix + "_extra_state"])
        for name in self._WEIGHT_BUFFERS:
            value, have = state_dict[prefix + name], getattr(self, name)
            if (
                not isinstance(value, torch.Tensor)
                or value.dtype != torch.uint8
                or value.shape != have.shape
            ):
                raise ValueError(
                    f"state_dict: {prefix}{name}: expected a torch.uint8 tensor of shape "
                    f"{tuple(have.shape)}, got {_describe(value)}"
                )
        bias = state_dict.get(prefix + "bias")
        if self.bias is not None and bias is not None:
            if (
                not isinstance(bias, torch.Tensor)
                or not bias.is_floating_point()
                or bias.shape != self.bias.shape
            ):
                raise ValueError(
                    f"state_dict: {prefix}bias: expected a floating-point tensor of shape "
                    f"{tuple(self.bias.shape)}, got {_describe(bias)}"
                )


class Q2Linear(_QuantizedLinear):
    """A ``torch.nn.Linear`` replacement over a GGUF ``block_q2_0`` weight (frozen weight).

    Args:
        weight: the :class:`~q2gemv.Q2Weight` [n, k]; its bytes are copied into
            the ``raw`` buffer (``torch.uint8`` [n, row_bytes(k, group)], on the CPU:
            move the module with ``.to(device)``).
        bias: optional floating-point tensor [n], stored in bf16 (buffer ``bias``).
        numerics: ``"exact"``, ``"seed"`` or None (the library default: exact
            for Q2_0), passed to :func:`q2gemv.gemv`.

    Attributes: ``n``/``out_features``, ``k``/``in_features``, ``group``, ``numerics``.
    ``forward(x)``: ``torch.bfloat16`` [..., k] -> ``torch.bfloat16`` [..., n], through
    ``torch.ops.q2gemv.q2_linear``, then ``+ bias`` (one bf16 add).
    """

    raw: torch.Tensor
    bias: torch.Tensor | None
    _WEIGHT_BUFFERS = ("raw",)

    def __init__(
        self, weight: Q2Weight, bias: torch.Tensor | None = None, *, numerics: str | None = None
    ) -> None:
        super().__init__()
        if not isinstance(weight, Q2Weight):
            raise TypeError(f"weight: expected a Q2Weight, got {type(weight).__name__}")
        self.n, self.k, self.group = weight.n, weight.k, weight.group
        self.numerics = _check_numerics("q2_0", numerics)
        raw = np.array(weight.raw).reshape(weight.n, row_bytes(weight.k, weight.group))
        self.register_buffer("raw", torch.from_numpy(raw))
        self.register_buffer("bias", _bias_buffer(bias, self.n, "cpu"))

    @classmethod
    def empty(
        cls,
        n: int,
        k: int,
        group: int = 128,
        *,
        bias: bool = False,
        numerics: str | None = None,
        device: torch.device | str | None = None,
    ) -> Q2Linear:
        """A layer [n, k] whose bytes are not set yet: filled by ``load_state_dict``.

        Args:
            n: output features. k: input features, a multiple of ``group``.
            group: codes per block, 64 or 128.
            bias: whether the layer has a ``bias`` buffer ([n], bf16).
            numerics: as for the constructor (a loaded state sets it).
            device: where the buffers are made (None: torch's default device, so
                ``with torch.device("meta"):`` makes them on the meta device, no memory).

        The ``raw`` buffer is ``torch.empty`` [n, row_bytes(k, group)] uint8: its bytes
        are undefined until a state dict is loaded (``load_state_dict(..., assign=True)``
        for a meta layer) or the model is loaded by ``from_pretrained``.
        """
        group = check_group(group)
        n, k = _check_sizes(n, k, group, "group")
        layer = cls.__new__(cls)
        _QuantizedLinear.__init__(layer)
        layer.n, layer.k, layer.group = n, k, group
        layer._unloaded = True
        layer.numerics = _check_numerics("q2_0", numerics)
        raw = torch.empty((n, row_bytes(k, group)), dtype=torch.uint8, device=device)
        layer.register_buffer("raw", raw)
        layer.register_buffer("bias", _empty_bias(n, bias, device))
        return layer

    @classmethod
    def from_linear(
        cls,
        linear: torch.nn.Linear,
        group: int = 128,
        *,
        method: str = "ggml",
        numerics: str | None = None,
    ) -> Q2Linear:
        """Quantize a float ``torch.nn.Linear`` with :func:`q2gemv.quantize_q2_0`.

        Args:
            linear: the layer; its weight [out, in] is read as fp32 (``in`` a
                multiple of ``group``), its bias (if any) kept in bf16.
            group: codes per block, 64 or 128.
            method: ``"ggml"`` or ``"absmean"`` (see :func:`q2gemv.quantize_q2_0`).
            numerics: as for the constructor.

        Returns a :class:`Q2Linear` on the linear's device.
        """
        w = _linear_weight_f32(linear)
        mod = cls(quantize_q2_0(w, group=group, method=method), linear.bias, numerics=numerics)
        return mod.to(linear.weight.device)

    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike,
        tensor_name: str,
        bias: torch.Tensor | None = None,
        *,
        ambiguous_group: int | None = None,
        numerics: str | None = None,
    ) -> Q2Linear:
        """One Q2_0 tensor of a GGUF file (:func:`q2gemv.io.load_q2_weights`).

        Args:
            path: the ``.gguf`` file.
            tensor_name: the tensor (``"blk.0.ffn_down.weight"``); KeyError listing
                the file's Q2_0 tensors when absent.
            bias: optional bias [n] (GGUF Q2_0 files keep biases as separate tensors).
            ambiguous_group: for a foreign type-42 tensor whose size fits both groups
                (see the loader).
            numerics: as for the constructor.
        """
        from .io import load_q2_weights

        weights = load_q2_weights(path, ambiguous_group=ambiguous_group)
        if tensor_name not in weights:
            raise KeyError(
                f"tensor_name: no Q2_0 tensor {tensor_name!r} in {os.fspath(path)} "
                f"(Q2_0 tensors: {', '.join(weights) or 'none'})"
            )
        return cls(weights[tensor_name], bias, numerics=numerics)

    def quantized_weight(self) -> Q2Weight:
        """The module's weight as a host :class:`~q2gemv.Q2Weight` (a copy of ``raw``)."""
        raw = self._buffers["raw"].detach().to("cpu").reshape(-1).numpy()
        return Q2Weight.from_bytes(raw, self.n, self.k, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` bf16 [..., k] -> bf16 [..., n] (``x @ W.T`` with q2gemv's bits, then ``+ bias``)."""
        _check_x(x, self.k)
        op = _q2_linear_impl if _eager_direct(x) else torch.ops.q2gemv.q2_linear
        raw = self._buffers["raw"]  # not self.raw: see _QuantizedLinear.__getattr__
        y = op(x, raw, self.n, self.k, self.group, self.numerics)
        return _add_bias(y, self.bias)

    def _state(self) -> dict:
        return {
            "format": "q2_0",
            "version": STATE_VERSION,
            "n": self.n,
            "k": self.k,
            "group": self.group,
            "numerics": self.numerics,
        }

    def _checked_state(self, extra) -> dict:
        state, legacy = _state_from(extra)
        want = {"format": "q2_0", "n": self.n, "k": self.k, "group": self.group}
        got = {key: state.get(key) for key in want}
        if got != want:
            raise ValueError(f"state: expected a Q2Linear state with {want}, got {got}")
        if legacy:
            return {}
        _check_version(state, {*want, "numerics"})
        return {"numerics": _check_numerics("q2_0", state["numerics"])}

    def extra_repr(self) -> str:
        return (
            f"in_features={self.k}, out_features={self.n}, group={self.group}, "
            f"bias={self.bias is not None}, numerics={self.numerics!r}"
        )


class Nvfp4Linear(_QuantizedLinear):
    """A ``torch.nn.Linear`` replacement over an NVFP4 W4A16 weight (frozen weight).

    Args:
        weight: the :class:`~q2gemv.Nvfp4Weight` [n, k]; ``packed`` and ``scales``
            are copied into the buffers of the same names (``torch.uint8``, on
            the CPU: move the module with ``.to(device)``); ``global_scale`` is
            kept as an attribute (an fp32 value).
        bias: optional floating-point tensor [n], stored in bf16 (buffer ``bias``).
        numerics: ``"seed"``, ``"exact"`` or None (the library
            default), passed to :func:`q2gemv.gemv`.

    ``forward(x)``: ``torch.bfloat16`` [..., k] -> ``torch.bfloat16`` [..., n], through
    ``torch.ops.q2gemv.nvfp4_linear``, then ``+ bias`` (one bf16 add).
    """

    packed: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None
    _WEIGHT_BUFFERS = ("packed", "scales")

    def __init__(
        self, weight: Nvfp4Weight, bias: torch.Tensor | None = None, *, numerics: str | None = None
    ) -> None:
        super().__init__()
        if not isinstance(weight, Nvfp4Weight):
            raise TypeError(f"weight: expected an Nvfp4Weight, got {type(weight).__name__}")
        self.n, self.k = weight.n, weight.k
        self.global_scale = float(weight.global_scale)
        self.numerics = _check_numerics("w4a16", numerics)
        self.register_buffer("packed", torch.from_numpy(np.array(weight.packed)))
        self.register_buffer("scales", torch.from_numpy(np.array(weight.scales)))
        self.register_buffer("bias", _bias_buffer(bias, self.n, "cpu"))

    @classmethod
    def empty(
        cls,
        n: int,
        k: int,
        *,
        bias: bool = False,
        numerics: str | None = None,
        device: torch.device | str | None = None,
    ) -> Nvfp4Linear:
        """A layer [n, k] whose codes, scales and global scale are not set yet: filled by loading.

        Args:
            n: output features. k: input features, a multiple of 16.
            bias: whether the layer has a ``bias`` buffer ([n], bf16).
            numerics: as for the constructor (a loaded state sets it).
            device: where the buffers are made (None: torch's default device, so
                ``with torch.device("meta"):`` makes them on the meta device, no memory).

        ``packed`` [n, k/2] and ``scales`` [n, k/16] are ``torch.empty`` uint8 and the
        global scale is 1.0 until a state dict is loaded (``load_state_dict(...,
        assign=True)`` for a meta layer) or the model is loaded by ``from_pretrained``.
        """
        n, k = _check_sizes(n, k, NVFP4_BLOCK, "the NVFP4 block")
        layer = cls.__new__(cls)
        _QuantizedLinear.__init__(layer)
        layer.n, layer.k = n, k
        layer.global_scale = 1.0
        layer._unloaded = True
        layer.numerics = _check_numerics("w4a16", numerics)
        layer.register_buffer("packed", torch.empty((n, k // 2), dtype=torch.uint8, device=device))
        scales = torch.empty((n, k // NVFP4_BLOCK), dtype=torch.uint8, device=device)
        layer.register_buffer("scales", scales)
        layer.register_buffer("bias", _empty_bias(n, bias, device))
        return layer

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, numerics: str | None = None) -> Nvfp4Linear:
        """Quantize a float ``torch.nn.Linear`` with :meth:`Nvfp4Weight.from_float` (ModelOpt recipe).

        Args:
            linear: the layer; its weight [out, in] is read as fp32 (``in`` a
                multiple of 16, finite), its bias (if any) kept in bf16.
            numerics: as for the constructor.

        Returns an :class:`Nvfp4Linear` on the linear's device.
        """
        w = _linear_weight_f32(linear)
        mod = cls(Nvfp4Weight.from_float(w), linear.bias, numerics=numerics)
        return mod.to(linear.weight.device)

    @classmethod
    def from_safetensors(
        cls,
        path: str | os.PathLike,
        layer_prefix: str,
        bias: torch.Tensor | None = None,
        *,
        numerics: str | None = None,
    ) -> Nvfp4Linear:
        """One NVFP4 layer of a safetensors checkpoint (:func:`q2gemv.io.load_nvfp4_weights`).

        Args:
            path: a ``.safetensors`` file or a directory of shards.
            layer_prefix: the layer (``"model.layers.0.mlp.down_proj"``); ModelOpt
                and compressed-tensors layouts are both recognised. KeyError listing
                the checkpoint's NVFP4 layers when absent.
            bias: optional bias [n].
            numerics: as for the constructor.
        """
        from .io import load_nvfp4_weights

        layers = load_nvfp4_weights(path)
        if layer_prefix not in layers:
            raise KeyError(
                f"layer_prefix: no NVFP4 layer {layer_prefix!r} in {os.fspath(path)} "
                f"(NVFP4 layers: {', '.join(layers) or 'none'})"
            )
        return cls(layers[layer_prefix], bias, numerics=numerics)

    def quantized_weight(self) -> Nvfp4Weight:
        """The module's weight as a host :class:`~q2gemv.Nvfp4Weight` (copies of the buffers)."""
        return Nvfp4Weight.from_parts(
            self._buffers["packed"].detach().to("cpu").numpy(),
            self._buffers["scales"].detach().to("cpu").numpy(),
            np.float32(self.global_scale),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` bf16 [..., k] -> bf16 [..., n] (``x @ W.T`` with q2gemv's bits, then ``+ bias``)."""
        _check_x(x, self.k)
        op = _nvfp4_linear_impl if _eager_direct(x) else torch.ops.q2gemv.nvfp4_linear
        b = self._buffers  # not self.packed: see _QuantizedLinear.__getattr__
        y = op(x, b["packed"], b["scales"], self.global_scale, self.numerics)
        return _add_bias(y, self.bias)

    def _state(self) -> dict:
        return {
            "format": "nvfp4",
            "version": STATE_VERSION,
            "n": self.n,
            "k": self.k,
            "global_scale": self.global_scale,
            "numerics": self.numerics,
        }

    def _checked_state(self, extra) -> dict:
        state, legacy = _state_from(extra)
        shape = {"format": "nvfp4", "n": self.n, "k": self.k}
        got = {key: state.get(key) for key in shape}
        if got != shape or not isinstance(state.get("global_scale"), float):
            raise ValueError(
                f"state: expected an Nvfp4Linear state with {shape} and a float global_scale, "
                f"got {state!r}"
            )
        global_scale = check_global_scale(state["global_scale"])
        if legacy:
            return {"global_scale": global_scale}
        _check_version(state, {*shape, "global_scale", "numerics"})
        return {
            "global_scale": global_scale,
            "numerics": _check_numerics("w4a16", state["numerics"]),
        }

    def extra_repr(self) -> str:
        return (
            f"in_features={self.k}, out_features={self.n}, global_scale={self.global_scale!r}, "
            f"bias={self.bias is not None}, numerics={self.numerics!r}"
        )


def replace_linears(
    module: torch.nn.Module,
    make: Callable[[torch.nn.Linear], torch.nn.Module] = Q2Linear.from_linear,
    *,
    where: Callable[[str, torch.nn.Linear], bool] | None = None,
) -> dict[str, torch.nn.Module]:
    """Replace ``module``'s ``torch.nn.Linear`` submodules in place by ``make(linear)``.

    Args:
        module: any torch module; its Linear children (at any depth) are swapped.
        make: builds the replacement from a Linear (default :meth:`Q2Linear.from_linear`,
            group 128); e.g. ``Nvfp4Linear.from_linear`` or
            ``lambda lin: Q2Linear.from_linear(lin, group=64)``.
        where: optional ``where(qualified_name, linear) -> bool``; only Linears it
            accepts are replaced (default: all).

    Every replacement is built before any is set, so a failure (e.g. ``in_features``
    not a multiple of the group) raises, naming the layer, with the model unchanged.
    A Linear shared by several parents is replaced everywhere by one new module.
    Linears whose parent reads their ``.weight`` directly (``torch.nn.MultiheadAttention``'s
    ``out_proj``, ``torch.nn.TransformerEncoderLayer``'s ``linear1``/``linear2``) are left
    as they are, with a ``UserWarning`` naming them (see :mod:`q2gemv.nn.swap`).

    Returns ``{qualified name: new module}`` of what was replaced (``module`` itself
    is never replaced, even when it is a Linear: build that one directly).
    """

    def skip(name: str, linear: torch.nn.Linear) -> str | None:
        return None if where is None or where(name, linear) else "where"

    targets, skipped = find_linears(module, skip)
    kept = {name: why for name, why in skipped.items() if why != "where"}
    if kept:
        warnings.warn(
            "replace_linears left these Linears as they are: "
            + "; ".join(f"{name} ({why})" for name, why in kept.items()),
            stacklevel=2,
        )
    return swap_linears(targets, make)


# -- model level (q2gemv.models), re-exported here ------------------------------------------
# Imported last: those modules build on the layers above (they import this module).
from .models.decode import CapturedDecoder  # noqa: E402
from .models.export import save_gguf, save_safetensors  # noqa: E402
from .models.gguf import config_from_gguf, load_gguf  # noqa: E402
from .models.hf_hook import register_when_transformers_loads  # noqa: E402
from .models.quantize import QuantizeReport, quantize_model  # noqa: E402
from .models.safetensors import load_safetensors  # noqa: E402

# from_pretrained of a saved q2gemv model: register the "q2gemv" quantizer with
# transformers when transformers loads its quantizers (this import stays free of it).
register_when_transformers_loads()

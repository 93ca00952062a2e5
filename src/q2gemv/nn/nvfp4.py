"""``Nvfp4Linear`` (needs torch): a ``torch.nn.Linear`` over an NVFP4 W4A16 weight, its op
``q2gemv::nvfp4_linear`` (fake impl, autograd, the device weight over its buffers), and
what the model level knows of the NVFP4 format (its block, its global scale when fusing).
The shared layer machinery is :mod:`q2gemv.nn.layers`; the contract is stated in
:mod:`q2gemv.torch`.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import torch

from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK
from ..formats.nvfp4 import E2M1_VALUES, E4M3_VALUES, Nvfp4Weight, check_global_scale
from .layers import (
    _bias_buffer,
    _check_numerics,
    _check_sizes,
    _check_version,
    _named,
    _QuantizedLinear,
    _state_from,
)
from .ops import (
    _add_bias,
    _check_buffer,
    _check_x,
    _CudaBuffer,
    _current,
    _eager_direct,
    _grad_x,
    _linear,
)

# -- the op: q2gemv::nvfp4_linear ------------------------------------------------------


def _nvfp4_unchanged(dw, packed: torch.Tensor, scales: torch.Tensor) -> bool:
    """Are ``packed`` and ``scales`` what ``dw``'s layout was made from? (on the device)"""
    from ..cuda.nvfp4 import layout

    wp, sc = layout.unpack(dw.codes, dw.xscales, dw.n, dw.k)
    wp = torch.as_tensor(wp, device=packed.device).view(torch.uint8)
    return torch.equal(wp, packed) and torch.equal(
        torch.as_tensor(sc, device=scales.device), scales
    )


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


def _nvfp4_linear_setup(ctx, inputs, output) -> None:
    x, packed, scales, global_scale, _ = inputs
    ctx.save_for_backward(packed, scales)
    ctx.global_scale, ctx.x_dtype = global_scale, x.dtype


def _nvfp4_linear_backward(ctx, grad):
    packed, scales = ctx.saved_tensors
    w = _nvfp4_dequantize(packed, scales, ctx.global_scale)
    return _grad_x(grad, w, ctx.x_dtype), None, None, None, None


nvfp4_linear.register_autograd(_nvfp4_linear_backward, setup_context=_nvfp4_linear_setup)


class Nvfp4Linear(_QuantizedLinear):
    """A ``torch.nn.Linear`` replacement over an NVFP4 W4A16 weight (frozen weight).

    Args:
        weight: the :class:`~q2gemv.Nvfp4Weight` [n, k]; ``packed`` and ``scales``
            are copied into the buffers of the same names (``torch.uint8``, on
            the CPU: move the module with ``.to(device)``); ``global_scale`` is
            kept as an attribute (an fp32 value).
        bias: optional floating-point tensor [n], stored in bf16, or fp16 if it is fp16
            (buffer ``bias``).
        numerics: ``"seed"``, ``"exact"`` or None (the library
            default), passed to :func:`q2gemv.gemv`.

    ``forward(x)``: ``torch.bfloat16`` or ``torch.float16`` [..., k] -> the same dtype
    [..., n], through ``torch.ops.q2gemv.nvfp4_linear``, then ``+ bias`` (one add in x's
    dtype).
    """

    packed: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None
    _WEIGHT_BUFFERS = ("packed", "scales")
    _FORMAT = "nvfp4"

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
        shapes = {"packed": (n, k // 2), "scales": (n, k // NVFP4_BLOCK)}
        return cls._empty(n, k, "w4a16", numerics, shapes, bias, device, global_scale=1.0)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, numerics: str | None = None) -> Nvfp4Linear:
        """Quantize a float ``torch.nn.Linear`` with :meth:`Nvfp4Weight.from_float` (ModelOpt recipe).

        Args:
            linear: the layer; its weight [out, in] is read as fp32 (``in`` a
                multiple of 16, finite), its bias (if any) kept in bf16 (fp16 if it is fp16).
            numerics: as for the constructor.

        Returns an :class:`Nvfp4Linear` on the linear's device.
        """
        return cls._quantized(linear, Nvfp4Weight.from_float, numerics)

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
        from ..io import load_nvfp4_weights

        layers = load_nvfp4_weights(path)
        weight = _named(layers, layer_prefix, "layer_prefix", "NVFP4 layer", path)
        return cls(weight, bias, numerics=numerics)

    def quantized_weight(self) -> Nvfp4Weight:
        """The module's weight as a host :class:`~q2gemv.Nvfp4Weight` (copies of the buffers)."""
        return Nvfp4Weight.from_parts(
            self._buffers["packed"].detach().to("cpu").numpy(),
            self._buffers["scales"].detach().to("cpu").numpy(),
            np.float32(self.global_scale),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` bf16/fp16 [..., k] -> x's dtype [..., n] (``x @ W.T`` with q2gemv's bits, then
        ``+ bias``)."""
        _check_x(x, self.k)
        op = _nvfp4_linear_impl if _eager_direct(x) else torch.ops.q2gemv.nvfp4_linear
        b = self._buffers  # not self.packed: see _QuantizedLinear.__getattr__
        y = op(x, b["packed"], b["scales"], self.global_scale, self.numerics)
        return _add_bias(y, self.bias)

    def _settings(self) -> dict:
        return {"global_scale": self.global_scale}

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

    @classmethod
    def k_multiple(cls, group) -> int:
        return NVFP4_BLOCK

    @classmethod
    def _fuse_refusal(cls, members) -> str | None:
        if any(m._unloaded for m in members):
            return "global scales not known yet (an empty NVFP4 layer)"
        scales = {struct.pack("<f", m.global_scale) for m in members}
        if len(scales) != 1:
            shown = ", ".join(repr(m.global_scale) for m in members)
            return f"NVFP4 global scales differ ({shown}): one scale per fused weight"
        return None

    def _empty_rows(self, n: int) -> Nvfp4Linear:
        layer = Nvfp4Linear.empty(
            n, self.k, bias=self.bias is not None, numerics=self.numerics, device="meta"
        )
        layer.global_scale = self.global_scale
        return layer

    def extra_repr(self) -> str:
        return (
            f"in_features={self.k}, out_features={self.n}, global_scale={self.global_scale!r}, "
            f"bias={self.bias is not None}, numerics={self.numerics!r}"
        )


# Its public home is q2gemv.torch (it re-exports it): pickles and reprs name it there,
# as they did before the layers moved into q2gemv.nn.
Nvfp4Linear.__module__ = "q2gemv.torch"

__all__ = ["Nvfp4Linear"]

"""``Nvfp4Linear`` (needs torch): a ``torch.nn.Linear`` over an NVFP4 W4A16 weight, and what
the model level knows of the NVFP4 format (its block, its global scale when fusing).
The shared layer machinery is :mod:`q2gemv.nn.layers`; the contract is stated in
:mod:`q2gemv.torch`.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import torch

from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK
from ..formats.nvfp4 import Nvfp4Weight, check_global_scale
from .layers import (
    _bias_buffer,
    _check_numerics,
    _check_sizes,
    _check_version,
    _named,
    _QuantizedLinear,
    _state_from,
)
from .ops import _add_bias, _check_x, _eager_direct, _nvfp4_linear_impl


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

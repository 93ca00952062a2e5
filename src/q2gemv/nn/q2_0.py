"""``Q2Linear`` (needs torch): a ``torch.nn.Linear`` over a GGUF ``block_q2_0`` weight, its
op ``q2gemv::q2_linear`` (fake impl, autograd, the device weight over its buffer), and
what the model level knows of the Q2_0 format (its group, its empty and fused forms).
The shared layer machinery is :mod:`q2gemv.nn.layers`; the contract is stated in
:mod:`q2gemv.torch`.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..formats.q2_0 import GROUPS, SCALE_BYTES, Q2Weight, check_group, quantize_q2_0, row_bytes
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

# -- the op: q2gemv::q2_linear ---------------------------------------------------------


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


def _q2_linear_setup(ctx, inputs, output) -> None:
    x, raw, n, k, group, _ = inputs
    ctx.save_for_backward(raw)
    ctx.shape, ctx.x_dtype = (n, k, group), x.dtype


def _q2_linear_backward(ctx, grad):
    (raw,) = ctx.saved_tensors
    dx = _grad_x(grad, _q2_dequantize(raw, *ctx.shape), ctx.x_dtype)
    return dx, None, None, None, None, None


q2_linear.register_autograd(_q2_linear_backward, setup_context=_q2_linear_setup)


class Q2Linear(_QuantizedLinear):
    """A ``torch.nn.Linear`` replacement over a GGUF ``block_q2_0`` weight (frozen weight).

    Args:
        weight: the :class:`~q2gemv.Q2Weight` [n, k]; its bytes are copied into
            the ``raw`` buffer (``torch.uint8`` [n, row_bytes(k, group)], on the CPU:
            move the module with ``.to(device)``).
        bias: optional floating-point tensor [n], stored in bf16, or fp16 if it is fp16
            (buffer ``bias``).
        numerics: ``"exact"``, ``"seed"`` or None (the library default: exact
            for Q2_0), passed to :func:`q2gemv.gemv`.

    Attributes: ``n``/``out_features``, ``k``/``in_features``, ``group``, ``numerics``.
    ``forward(x)``: ``torch.bfloat16`` or ``torch.float16`` [..., k] -> the same dtype
    [..., n], through ``torch.ops.q2gemv.q2_linear``, then ``+ bias`` (one add in x's dtype).
    """

    raw: torch.Tensor
    bias: torch.Tensor | None
    _WEIGHT_BUFFERS = ("raw",)
    _FORMAT = "q2_0"
    GROUPS = GROUPS

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
        shapes = {"raw": (n, row_bytes(k, group))}
        return cls._empty(n, k, "q2_0", numerics, shapes, bias, device, group=group)

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
                multiple of ``group``), its bias (if any) kept in bf16 (fp16 if it is fp16).
            group: codes per block, 64 or 128.
            method: ``"ggml"`` or ``"absmean"`` (see :func:`q2gemv.quantize_q2_0`).
            numerics: as for the constructor.

        Returns a :class:`Q2Linear` on the linear's device.
        """
        return cls._quantized(
            linear, lambda w: quantize_q2_0(w, group=group, method=method), numerics
        )

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
        from ..io import load_q2_weights

        weights = load_q2_weights(path, ambiguous_group=ambiguous_group)
        weight = _named(weights, tensor_name, "tensor_name", "Q2_0 tensor", path)
        return cls(weight, bias, numerics=numerics)

    def quantized_weight(self) -> Q2Weight:
        """The module's weight as a host :class:`~q2gemv.Q2Weight` (a copy of ``raw``)."""
        raw = self._buffers["raw"].detach().to("cpu").reshape(-1).numpy()
        return Q2Weight.from_bytes(raw, self.n, self.k, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` bf16/fp16 [..., k] -> x's dtype [..., n] (``x @ W.T`` with q2gemv's bits, then
        ``+ bias``)."""
        _check_x(x, self.k)
        op = _q2_linear_impl if _eager_direct(x) else torch.ops.q2gemv.q2_linear
        raw = self._buffers["raw"]  # not self.raw: see _QuantizedLinear.__getattr__
        y = op(x, raw, self.n, self.k, self.group, self.numerics)
        return _add_bias(y, self.bias)

    def _settings(self) -> dict:
        return {"group": self.group}

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

    @classmethod
    def k_multiple(cls, group) -> int:
        return group

    def _empty_rows(self, n: int) -> Q2Linear:
        return Q2Linear.empty(
            n, self.k, self.group, bias=self.bias is not None, numerics=self.numerics,
            device="meta",
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"in_features={self.k}, out_features={self.n}, group={self.group}, "
            f"bias={self.bias is not None}, numerics={self.numerics!r}"
        )


# Its public home is q2gemv.torch (it re-exports it): pickles and reprs name it there,
# as they did before the layers moved into q2gemv.nn.
Q2Linear.__module__ = "q2gemv.torch"

__all__ = ["Q2Linear"]

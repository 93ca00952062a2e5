"""``Q2Linear`` (needs torch): a ``torch.nn.Linear`` over a GGUF ``block_q2_0`` weight, and
what the model level knows of the Q2_0 format (its group, its empty and fused forms).
The shared layer machinery is :mod:`q2gemv.nn.layers`; the contract is stated in
:mod:`q2gemv.torch`.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..formats.q2_0 import GROUPS, Q2Weight, check_group, quantize_q2_0, row_bytes
from .layers import (
    _bias_buffer,
    _check_numerics,
    _check_sizes,
    _check_version,
    _named,
    _QuantizedLinear,
    _state_from,
)
from .ops import _add_bias, _check_x, _eager_direct, _q2_linear_impl


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

"""``Q2Linear`` / ``Nvfp4Linear`` (needs torch): the modules over :mod:`q2gemv.nn.ops`,
their state (tensors only) and :func:`replace_linears`. The contract is stated in
:mod:`q2gemv.torch`.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable

import numpy as np
import torch

from ..api import resolve_numerics
from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK
from ..formats.nvfp4 import Nvfp4Weight, check_global_scale
from ..formats.q2_0 import Q2Weight, as_size, check_group, quantize_q2_0, row_bytes
from .ops import (
    _add_bias,
    _check_x,
    _eager_direct,
    _handed_out,
    _nvfp4_linear_impl,
    _q2_linear_impl,
)
from .swap import find_linears, swap_linears

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
    # an fp16 bias (of an fp16 model) stays fp16; any other float is kept in bf16
    dtype = torch.float16 if bias.dtype == torch.float16 else torch.bfloat16
    return bias.detach().to(device=device, dtype=dtype).clone()


def _check_numerics(family: str, numerics: str | None) -> str | None:
    resolve_numerics(family, numerics)  # ValueError naming numerics
    return numerics


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


def _named(found: dict, name: str, param: str, what: str, path):
    """``found[name]``, or a KeyError naming ``param`` and listing what ``path`` holds."""
    if name not in found:
        raise KeyError(
            f"{param}: no {what} {name!r} in {os.fspath(path)} "
            f"({what}s: {', '.join(found) or 'none'})"
        )
    return found[name]


def keep_bias_dtype(layer: torch.nn.Module, linear: torch.nn.Linear) -> torch.nn.Module:
    """``layer`` (an empty one made for ``linear``) with an fp16 bias buffer when ``linear``'s
    bias is fp16 (an fp16 model: loading then keeps its biases fp16, as :func:`_bias_buffer`
    does); otherwise as it is. Returns ``layer``."""
    if layer.bias is not None and linear.bias is not None and linear.bias.dtype == torch.float16:
        layer.bias = torch.empty_like(layer.bias, dtype=torch.float16)
    return layer


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

    _FORMAT = ""  # the state's "format"

    def _settings(self) -> dict:
        """The state's format-specific settings (``group``, or ``global_scale``)."""
        raise NotImplementedError

    def _state(self) -> dict:
        return {
            "format": self._FORMAT,
            "version": STATE_VERSION,
            "n": self.n,
            "k": self.k,
            "numerics": self.numerics,
            **self._settings(),
        }

    def _checked_state(self, extra) -> dict:
        """The attributes a loaded ``extra`` state sets, after every check (ValueError)."""
        raise NotImplementedError

    @classmethod
    def _quantized(cls, linear: torch.nn.Linear, quantize: Callable, numerics):
        """Both ``from_linear``: ``quantize(fp32 weight)``, the linear's bias, on its device."""
        w = _linear_weight_f32(linear)
        mod = cls(quantize(w), linear.bias, numerics=numerics)
        return mod.to(linear.weight.device)

    @classmethod
    def _empty(cls, n, k, family, numerics, shapes: dict, bias, device, **settings):
        """An ``empty()`` layer: ``torch.empty`` uint8 weight buffers of ``shapes`` (in
        ``_WEIGHT_BUFFERS`` order), ``settings`` set as attributes, not loaded yet."""
        layer = cls.__new__(cls)
        _QuantizedLinear.__init__(layer)
        layer.n, layer.k = n, k
        for name, value in settings.items():
            setattr(layer, name, value)
        layer._unloaded = True
        layer.numerics = _check_numerics(family, numerics)
        for name in cls._WEIGHT_BUFFERS:
            layer.register_buffer(name, torch.empty(shapes[name], dtype=torch.uint8, device=device))
        layer.register_buffer("bias", _empty_bias(n, bias, device))
        return layer

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
        make: builds the replacement from a Linear (default :meth:`Q2Linear.from_linear`).
        where: optional ``where(qualified_name, linear) -> bool``; only Linears it
            accepts are replaced (default: all).

    All replacements are built before any is set (a failure names the layer; ``module``
    unchanged); Linears whose parent reads ``.weight`` stay, with a ``UserWarning``
    (docs/torch.md, :mod:`q2gemv.nn.swap`).

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


# Their public home is q2gemv.torch (it re-exports them): pickles and reprs name them there,
# as they did before the layers moved into q2gemv.nn.
Q2Linear.__module__ = Nvfp4Linear.__module__ = "q2gemv.torch"

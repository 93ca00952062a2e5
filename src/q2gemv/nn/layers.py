"""What every quantized torch layer shares (needs torch): :class:`QuantizedLinear` over
:mod:`q2gemv.nn.ops`, its state (tensors only), the format's layer looked up in the
registry (:func:`layer_class`) and :func:`replace_linears`. The contract is stated in
:mod:`q2gemv.torch`.

Each format's layer is a module of its own (``q2gemv.nn.<format>``), named by its
:attr:`~q2gemv.dispatch.registry.FamilySpec.layer`; it subclasses
:class:`QuantizedLinear` and fills in what the model level asks of a format
(``_FORMAT``, ``GROUPS``, :meth:`~QuantizedLinear.k_multiple`,
:meth:`~QuantizedLinear._fuse_refusal`, :meth:`~QuantizedLinear._empty_rows`). Its
class stays importable from here (``from q2gemv.nn.layers import Q2Linear``).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable

import numpy as np
import torch

from ..api import resolve_numerics
from ..dispatch import registry
from ..formats._sizes import as_size
from .ops import _handed_out
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


def empty_for(
    cls: type[QuantizedLinear], linear: torch.nn.Linear, numerics: str | None, **settings
) -> QuantizedLinear:
    """An empty layer of class ``cls`` in place of ``linear`` (its shape, bias and device;
    ``settings``: the format's, e.g. ``group``), filled later by loading. Its bias buffer is
    fp16 when ``linear``'s bias is (an fp16 model: loading then keeps its biases fp16, as
    :func:`_bias_buffer` does)."""
    layer = cls.empty(
        linear.out_features,
        linear.in_features,
        **settings,
        bias=linear.bias is not None,
        numerics=numerics,
        device=linear.weight.device,
    )
    if layer.bias is not None and linear.bias.dtype == torch.float16:
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

    # -- what the model level asks of a format (q2gemv.models) --

    GROUPS: tuple[int, ...] = ()  # the groups a grouped format takes (FamilySpec.grouped)

    @classmethod
    def k_multiple(cls, group) -> int:
        """What ``k`` must be a multiple of, for ``group`` (a grouped format's; else ignored)."""
        raise NotImplementedError

    @classmethod
    def _fuse_refusal(cls, members) -> str | None:
        """Why ``members`` (layers of this format, alike in k, numerics, group and bias)
        cannot be one fused layer, or None (:func:`q2gemv.models.fuse.why_not_fusable`)."""
        return None

    def _empty_rows(self, n: int) -> QuantizedLinear:
        """An empty layer (on meta) of ``n`` rows with this one's format, k, settings,
        numerics and bias; its buffers are then set by the caller."""
        raise NotImplementedError

    def _config_kind(self) -> tuple[str, int | None, str | None]:
        """``(format, group or None, numerics)``: what a ``quantization_config`` records."""
        return (self._FORMAT, getattr(self, "group", None), self.numerics)

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


QuantizedLinear = _QuantizedLinear  # the models' name for "any q2gemv layer"


def layer_classes() -> dict[str, type[QuantizedLinear]]:
    """``{format: layer class}`` of every registered family with a torch layer, in the
    registry's order (imports their ``q2gemv.nn.<format>`` modules)."""
    return {f.layer_format: registry.resolve(f.layer) for f in registry.families() if f.layer}


def layer_class(fmt: str) -> type[QuantizedLinear]:
    """The layer class of format ``fmt`` (a :func:`layer_classes` key); KeyError otherwise."""
    return layer_classes()[fmt]


def __getattr__(name: str):
    # The formats' layer classes, importable from here as before they had modules of their own.
    for cls in layer_classes().values():
        if cls.__name__ == name:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def replace_linears(
    module: torch.nn.Module,
    make: Callable[[torch.nn.Linear], torch.nn.Module] | None = None,
    *,
    where: Callable[[str, torch.nn.Linear], bool] | None = None,
) -> dict[str, torch.nn.Module]:
    """Replace ``module``'s ``torch.nn.Linear`` submodules in place by ``make(linear)``.

    Args:
        module: any torch module; its Linear children (at any depth) are swapped.
        make: builds the replacement from a Linear (None: the default format's
            ``from_linear``, :meth:`Q2Linear.from_linear`).
        where: optional ``where(qualified_name, linear) -> bool``; only Linears it
            accepts are replaced (default: all).

    All replacements are built before any is set (a failure names the layer; ``module``
    unchanged); Linears whose parent reads ``.weight`` stay, with a ``UserWarning``
    (docs/torch.md, :mod:`q2gemv.nn.swap`).

    Returns ``{qualified name: new module}`` of what was replaced (``module`` itself
    is never replaced, even when it is a Linear: build that one directly).
    """

    if make is None:
        make = layer_class(registry.DEFAULT_LAYER_FORMAT).from_linear

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

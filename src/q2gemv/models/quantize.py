"""``quantize_model``: swap every quantizable ``torch.nn.Linear`` of a model for a q2gemv layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..api import resolve_numerics
from ..dispatch import registry
from ..nn.layers import empty_for, layer_class
from ..nn.swap import LinearTarget, find_linears, swap_linears
from ..tools.progress import Progress, wants_progress
from . import fuse as fusion
from .saved import record_quantization_config

# fmt= : the formats with a torch layer (registry.FamilySpec.layer_format)
FORMATS = registry.layer_formats()


@dataclass
class QuantizeReport:
    """What :func:`quantize_model` did.

    Attributes:
        fmt: ``"q2_0"`` or ``"nvfp4"``.
        group: the Q2_0 group (None for NVFP4).
        replaced: qualified name -> the q2gemv layer computing it (every name of a shared
            Linear; for a fused member such as ``q_proj``, the fused layer ``qkv_proj``).
        skipped: qualified name -> why it was left a ``torch.nn.Linear``.
        fused: fused layer name -> its members' qualified names, in row order.
        not_fused: first member's qualified name -> why its group stayed separate
            layers (e.g. NVFP4 global scales that differ).
    """

    fmt: str
    group: int | None
    replaced: dict[str, torch.nn.Module] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    fused: dict[str, list[str]] = field(default_factory=dict)
    not_fused: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [
            f"quantize_model({self.fmt}"
            + (f", group={self.group}" if self.group else "")
            + f"): {len(self.replaced)} Linear layers replaced, {len(self.skipped)} skipped, "
            + f"{len(self.fused)} fused layers"
        ]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        lines += [f"  not fused (group of {name}): {why}" for name, why in self.not_fused.items()]
        return "\n".join(lines)


# The activation dtypes the q2gemv layers take (q2gemv.nn.ops._check_x); the one check below.
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16)


def check_model_dtype(targets: list[LinearTarget]) -> None:
    """Refuse Linears whose weight dtype the q2gemv layers cannot serve as activations.

    A model's activations have its weights' dtype; a q2gemv layer takes only
    :data:`ACTIVATION_DTYPES` (bf16 and fp16 models keep their dtype: the layers return
    it), so an fp32 model would quantize and then fail at its first forward. ValueError naming the dtype and the first such layer. A meta
    weight has no values yet (the dtype of what is loaded into the model decides).
    """
    for t in targets:
        dtype = t.linear.weight.dtype
        if not t.linear.weight.is_meta and dtype not in ACTIVATION_DTYPES:
            accepted = ", ".join(str(d) for d in ACTIVATION_DTYPES)
            raise ValueError(
                f"model: layer {t.name!r} is {dtype}, but q2gemv layers take {accepted} "
                "activations only: cast the model to bfloat16 or float16 first "
                "(model.to(torch.bfloat16))"
            )


def _matches(name: str, patterns: tuple[str, ...]) -> str | None:
    for p in patterns:
        if name == p or name.endswith("." + p):
            return p
    return None


def _matches_any(pattern: str, names: list[str]) -> str | None:
    return next((n for n in names if _matches(n, (pattern,))), None)


def quantize_model(
    model: torch.nn.Module,
    fmt: str = registry.DEFAULT_LAYER_FORMAT,
    *,
    group: int = 128,
    skip: tuple[str, ...] | list[str] | None = None,
    numerics: str | None = None,
    progress: bool | None = None,
    fuse: bool = True,
) -> QuantizeReport:
    """Quantize ``model``'s ``torch.nn.Linear`` layers in place to q2gemv layers.

    Args:
        model: a transformers decoder (Llama, Qwen2/3, Mistral, Gemma...) or any ``nn.Module``.
        fmt: ``"q2_0"`` (:meth:`Q2Linear.from_linear`) or ``"nvfp4"`` (``Nvfp4Linear``).
        group: the Q2_0 group, 64 or 128 (ignored for NVFP4).
        skip: names left in floating point (name or ``"." + name`` suffix; None: lm_head).
        numerics: the layers' numerics contract (None: the library default).
        progress: one progress step per layer on stderr (None: on a terminal for large models).
        fuse: fuse q/k/v and gate/up into one layer each (False: one layer per Linear).

    Returns a :class:`QuantizeReport` (``print(report)`` lists the skipped layers).
    Raises ValueError for an unknown ``fmt``/``group``, a ``skip`` entry matching no Linear,
    a non-bf16 model, or a layer that cannot be quantized (named; ``model`` unchanged).
    Details: docs/models.md#quantize_model-in-detail.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt: expected one of {FORMATS}, got {fmt!r}")
    family, layer = registry.by_layer_format(fmt).name, layer_class(fmt)
    grouped = registry.family(family).grouped  # Q2_0: a group per weight; NVFP4: blocks of 16
    if grouped and (isinstance(group, bool) or group not in layer.GROUPS):
        raise ValueError(f"group: expected one of {layer.GROUPS}, got {group!r}")
    checked = skip is not None
    if skip is None:
        skip = ("lm_head",)
    if isinstance(skip, str) or not all(isinstance(s, str) for s in skip):
        raise TypeError(f"skip: expected a tuple of layer names, got {skip!r}")
    skip = tuple(skip)
    multiple = layer.k_multiple(group)
    resolve_numerics(family, numerics)  # ValueError naming numerics
    wants_progress(progress, 0, False)  # TypeError naming progress
    group_arg = {"group": group} if grouped else {}

    def reason(name: str, linear: torch.nn.Linear) -> str | None:
        hit = _matches(name, skip)
        if hit is not None:
            return f"in skip ({hit!r})"
        if linear.in_features % multiple:
            return f"in_features={linear.in_features} is not a multiple of {multiple}"
        return None

    def make(lin: torch.nn.Linear) -> torch.nn.Module:
        if lin.weight.is_meta:  # an empty model: an empty layer, filled by loading
            return empty_for(layer, lin, numerics, **group_arg)
        return layer.from_linear(lin, **group_arg, numerics=numerics)

    targets, skipped = find_linears(model, reason)
    if checked:
        linear_names = [
            name
            for name, mod in model.named_modules(remove_duplicate=False)
            if name and isinstance(mod, torch.nn.Linear)
        ]
        for pattern in skip:
            if _matches_any(pattern, linear_names) is None:
                raise ValueError(
                    f"skip: {pattern!r} matches no torch.nn.Linear of the model (an entry is "
                    "a Linear's qualified name or its last dotted parts, e.g. 'lm_head' or "
                    "'mlp.down_proj')"
                )
    check_model_dtype(targets)
    names = {id(t.linear): t.name for t in targets}
    with Progress("quantize_model", len(targets), progress) as bar:

        def make_one(lin: torch.nn.Linear) -> torch.nn.Module:
            new = make(lin)
            bar.step(names[id(lin)])
            return new

        replaced = swap_linears(targets, make_one)
    fused, not_fused = fusion.fuse_model(model) if fuse else ({}, {})
    for name, members in fused.items():
        layer = model.get_submodule(name)
        replaced.update((m, layer) for m in members if m in replaced)
    record_quantization_config(model)
    return QuantizeReport(
        fmt, group if grouped else None, replaced, skipped, dict(fused), dict(not_fused)
    )

"""What a saved q2gemv model says about itself: its ``quantization_config`` and empty layers.

:func:`quantization_config` is the dict ``save_pretrained`` writes into ``config.json``;
:func:`replace_with_empty_layers` rebuilds the layers it describes on the meta device.
The fields and the loading road: docs/models_save_load.md#what-is-saved.
This module does not import transformers.
"""

from __future__ import annotations

import warnings

import torch

from ..api import resolve_numerics
from ..dispatch import registry
from ..nn.layers import QuantizedLinear, empty_for, layer_class, layer_classes
from ..nn.swap import find_linears, swap_linears
from . import fuse as fusion

QUANT_METHOD = "q2gemv"
CONFIG_VERSION = 1
CONFIG_KEYS = (
    "quant_method",
    "version",
    "format",
    "group",
    "numerics",
    "modules_to_not_convert",
    "fused_projections",
)


def quantization_config(model: torch.nn.Module) -> dict:
    """The ``quantization_config`` dict describing ``model``'s q2gemv layers (docs/models_save_load.md).

    Raises ``ValueError`` when ``model`` has no q2gemv layer, or layers of more than one
    (format, group, numerics): one config describes one kind.
    """
    kinds: dict[tuple, str] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, QuantizedLinear):
            kinds.setdefault(mod._config_kind(), name)
    if not kinds:
        names = ", ".join(cls.__name__ for cls in layer_classes().values())
        raise ValueError(f"model: it has no q2gemv layer ({names})")
    if len(kinds) > 1:
        described = "; ".join(
            f"{name}: format={f!r}, group={g}, numerics={nu!r}"
            for (f, g, nu), name in kinds.items()
        )
        raise ValueError(
            f"model: its q2gemv layers are of {len(kinds)} kinds ({described}); one "
            "quantization_config describes one format, group and numerics"
        )
    fmt, group, numerics = next(iter(kinds))
    left: dict[str, None] = {}
    for name, mod in model.named_modules(remove_duplicate=False):
        if name and isinstance(mod, torch.nn.Linear):
            left[name] = None
    return _config(fmt, group, numerics, list(left), fusion.fused_projections(model))


def record_quantization_config(model: torch.nn.Module) -> None:
    """Set ``model.config.quantization_config`` (a dict) on a transformers-style model.

    Nothing for a model without a ``config`` or without q2gemv layers; a model whose
    layers no single config describes gets a ``UserWarning`` and no q2gemv config (its
    ``save_pretrained`` output then cannot be loaded by ``from_pretrained``). A quantized
    output head of a model with tied embeddings is no longer tied: the config's
    ``tie_word_embeddings`` is set to False.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, QuantizedLinear) and getattr(config, "tie_word_embeddings", False):
        # the quantized head no longer shares the embedding's weight: a reload must not tie it
        config.tie_word_embeddings = False
    try:
        config.quantization_config = quantization_config(model)
    except ValueError as err:
        old = getattr(config, "quantization_config", None)
        method = (
            old.get("quant_method") if isinstance(old, dict) else getattr(old, "quant_method", None)
        )
        if method == QUANT_METHOD:  # a config of ours that no longer describes the model
            del config.quantization_config
        if "no q2gemv layer" not in str(err):
            warnings.warn(f"quantization_config not recorded in model.config: {err}", stacklevel=3)


def check_config(config: dict) -> dict:
    """A ``quantization_config`` dict checked and completed (ValueError naming the key)."""
    if not isinstance(config, dict):
        raise TypeError(f"quantization_config: expected a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"quantization_config: unknown keys {unknown} (this q2gemv knows {list(CONFIG_KEYS)})"
        )
    c = dict(config)
    if c.get("quant_method", QUANT_METHOD) != QUANT_METHOD:
        raise ValueError(
            f"quantization_config: quant_method {c['quant_method']!r} is not {QUANT_METHOD!r}"
        )
    if c.get("version", CONFIG_VERSION) != CONFIG_VERSION:
        raise ValueError(
            f"quantization_config: version {c['version']!r} is not one this q2gemv reads "
            f"({CONFIG_VERSION}); it was written by another q2gemv"
        )
    fmt = c.get("format", registry.DEFAULT_LAYER_FORMAT)
    if fmt not in registry.layer_formats():
        raise ValueError(
            f"quantization_config: format expected one of {registry.layer_formats()}, got {fmt!r}"
        )
    family = registry.by_layer_format(fmt).name
    grouped = registry.family(family).grouped
    group = c.get("group", 128 if grouped else None)
    if grouped:
        groups = layer_class(fmt).GROUPS
        if isinstance(group, bool) or group not in groups:
            raise ValueError(f"quantization_config: group expected one of {groups}, got {group!r}")
    elif group is not None:
        raise ValueError(f"quantization_config: group expected null for {fmt}, got {group!r}")
    numerics = c.get("numerics")
    resolve_numerics(family, numerics)
    skip = c.get("modules_to_not_convert") or []
    if not isinstance(skip, (list, tuple)) or not all(isinstance(s, str) for s in skip):
        raise ValueError(
            f"quantization_config: modules_to_not_convert expected a list of names, got {skip!r}"
        )
    fused = c.get("fused_projections") or []
    if not isinstance(fused, (list, tuple)):
        raise ValueError(
            f"quantization_config: fused_projections expected a list of lists of names, got "
            f"{fused!r}"
        )
    for entry in fused:
        fusion.check_fused_entry(entry)
    return _config(fmt, group, numerics, list(skip), [list(e) for e in fused])


def _config(fmt: str, group, numerics, skip: list, fused: list) -> dict:
    """The ``quantization_config`` dict: every key of :data:`CONFIG_KEYS`, this version's."""
    return {
        "quant_method": QUANT_METHOD,
        "version": CONFIG_VERSION,
        "format": fmt,
        "group": group,
        "numerics": numerics,
        "modules_to_not_convert": skip,
        "fused_projections": fused,
    }


def replace_with_empty_layers(model: torch.nn.Module, config: dict) -> dict[str, torch.nn.Module]:
    """Replace every Linear not in ``modules_to_not_convert`` by an empty q2gemv layer.

    The layers are made by ``Q2Linear.empty`` / ``Nvfp4Linear.empty`` on each Linear's
    device (the meta device while transformers builds a model), with its shape and bias,
    the config's group and numerics: no float weight is read. A Linear whose
    ``in_features`` the format cannot take must be in ``modules_to_not_convert``
    (ValueError naming it otherwise). Returns ``{qualified name: new layer}``.
    """
    c = check_config(config)
    layer = layer_class(c["format"])
    grouped = registry.by_layer_format(c["format"]).grouped
    multiple = layer.k_multiple(c["group"])
    keep = set(c["modules_to_not_convert"])

    def reason(name: str, linear: torch.nn.Linear) -> str | None:
        return "in modules_to_not_convert" if name in keep else None

    def make(lin: torch.nn.Linear) -> torch.nn.Module:
        if lin.in_features % multiple:
            raise ValueError(
                f"in_features={lin.in_features} is not a multiple of {multiple}, and the "
                "quantization_config does not list the layer in modules_to_not_convert"
            )
        group_arg = {"group": c["group"]} if grouped else {}
        return empty_for(layer, lin, c["numerics"], **group_arg)

    targets, _ = find_linears(model, reason)
    done = swap_linears(targets, make)
    for entry in c["fused_projections"]:
        parent_name, name, members = fusion.check_fused_entry(entry)
        try:
            parent = model.get_submodule(parent_name)
        except AttributeError:
            parent = None
        layers = [getattr(parent, m, None) for m in members]
        if not all(isinstance(m, QuantizedLinear) for m in layers):
            raise ValueError(
                f"quantization_config: fused_projections entry {entry!r} does not name "
                "q2gemv layers of this model"
            )
        fused = fusion.fuse_group(parent, name, members)
        done.update((f"{parent_name}.{m}" if parent_name else m, fused) for m in members)
    return done


def unloaded_layers(model: torch.nn.Module) -> list[str]:
    """Names of the q2gemv layers made empty whose state no load has set yet."""
    return [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, QuantizedLinear) and getattr(mod, "_unloaded", False)
    ]

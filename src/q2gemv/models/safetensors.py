"""Fill a model from an NVFP4 safetensors checkpoint (ModelOpt or compressed-tensors layout).

NVFP4 layers become :class:`~q2gemv.torch.Nvfp4Linear`; other float tensors are copied
by name; every error is a :class:`~q2gemv.io.SafetensorsError` naming the file and the
tensor. What is ignored, refused and how tied weights are checked:
docs/models.md#load_safetensors-in-detail.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from ..io.safetensors.reader import SafetensorsCheckpoint, SafetensorsError
from ..nn.layers import Nvfp4Linear
from ..tools.progress import track, wants_progress
from . import fuse as fusion
from .meta import finish_meta_model
from .saved import record_quantization_config

PLAIN_DTYPES = ("F32", "F16", "BF16")  # what a plain (not NVFP4) tensor may be stored as
IGNORED_SUFFIXES = ("input_scale", "input_global_scale")  # W4A4 state of an NVFP4 layer
KV_CACHE_SUFFIXES = ("k_scale", "v_scale")  # FP8 KV-cache state: ignored with a warning


def _tensor(ckpt: SafetensorsCheckpoint, name: str, shape: tuple[int, ...], what: str):
    """Tensor ``name`` as a new torch tensor (its own memory), dtype and shape checked."""
    e = ckpt.entries[name]
    if e.dtype not in PLAIN_DTYPES:
        raise ckpt.error(
            name,
            f"dtype {e.dtype} is not supported outside an NVFP4 layer "
            f"({', '.join(PLAIN_DTYPES)} are)",
        )
    if tuple(e.shape) != tuple(shape):
        raise ckpt.error(name, f"shape {list(e.shape)}, expected {list(shape)} ({what})")
    a = np.array(ckpt.array(name))  # a copy: the model's tensor owns its memory
    if e.dtype == "BF16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _same_bits(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    a, b = a.to(dtype).contiguous(), b.to(dtype).contiguous()
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _aliases(model: torch.nn.Module) -> dict[str, str]:
    """Tied parameter names -> the name ``named_parameters()`` keeps for the same tensor."""
    kept = {id(p): n for n, p in model.named_parameters()}
    return {
        n: kept[id(p)]
        for n, p in model.named_parameters(remove_duplicate=False)
        if kept[id(p)] != n
    }


def load_safetensors(
    path: str | os.PathLike,
    model: torch.nn.Module,
    *,
    numerics: str | None = None,
    progress: bool | None = None,
    fuse: bool = True,
) -> torch.nn.Module:
    """Load an NVFP4 checkpoint into ``model`` in place: NVFP4 linears as ``Nvfp4Linear``.

    Args:
        path: a ``.safetensors`` file or a directory of shards.
        model: the float model of the checkpoint's architecture (may be on the meta device).
        numerics: the ``Nvfp4Linear`` layers' numerics contract (None: library default).
        progress: one step per NVFP4 layer on stderr (None: on a terminal for large models).
        fuse: q/k/v and gate/up as one layer each where their global scales are bit-equal.

    Returns ``model`` (eval mode). Details: docs/models.md#load_safetensors-in-detail.

    Raises:
        SafetensorsError: a malformed file or NVFP4 layer (:func:`q2gemv.io.load_nvfp4_weights`),
            a tensor with no place in ``model``, a shape or dtype that does not fit, a stored
            tied weight that differs, or a missing parameter; naming the file and the tensor.
        FileNotFoundError: ``path`` does not exist / holds no shards.
        TypeError: ``model`` is not a ``torch.nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    wants_progress(progress, 0, False)  # TypeError naming progress
    root = Path(os.fspath(path))
    with SafetensorsCheckpoint(root) as ckpt:  # FileNotFoundError / SafetensorsError first
        new_layers, values = _plan(ckpt, model, numerics, progress)
    params = dict(model.named_parameters())
    state = {**params, **dict(model.named_buffers())}
    with torch.no_grad():
        for name, value in values.items():
            old = state[name]
            value = value.to(old.dtype)
            if old.is_meta:  # a model built on the meta device: take the tensor as it is
                module_name, _, attr = name.rpartition(".")
                module = model.get_submodule(module_name) if module_name else model
                new = torch.nn.Parameter(value, requires_grad=False) if name in params else value
                setattr(module, attr, new)
            else:
                old.copy_(value)
    for prefix, layer in new_layers.items():
        parent_name, _, attr = prefix.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        device = params[f"{prefix}.weight"].device
        setattr(parent, attr, layer.to("cpu" if device.type == "meta" else device))
    finish_meta_model(model, str(root))
    fusion.fuse_loaded(model, str(root), fuse)
    record_quantization_config(model)  # so save_pretrained writes a loadable model
    return model.eval()


def _plan(ckpt: SafetensorsCheckpoint, model: torch.nn.Module, numerics: str | None, progress):
    """Every layer and value the load will set, all checked: (new layers, plain values)."""
    params = dict(model.named_parameters())
    state = {**params, **dict(model.named_buffers())}
    aliases = _aliases(model)
    layers = ckpt.nvfp4_layers()
    weights = ckpt.nvfp4_weights()
    new_layers: dict[str, Nvfp4Linear] = {}
    claimed: set[str] = set()
    for prefix, weight in track(weights.items(), "load_safetensors", progress, lambda kv: kv[0]):
        _, names = layers[prefix]
        claimed.update(names)
        claimed.update(f"{prefix}.{s}" for s in IGNORED_SUFFIXES if f"{prefix}.{s}" in ckpt)
        new_layers[prefix] = _layer(ckpt, model, prefix, names[0], weight, aliases, numerics)
        if f"{prefix}.bias" in ckpt:
            claimed.add(f"{prefix}.bias")
    values: dict[str, torch.Tensor] = {}
    tied: dict[str, tuple[str, torch.Tensor]] = {}
    kv_cache: list[str] = []
    for name in ckpt.entries:
        if name in claimed:
            continue
        target = aliases.get(name, name)
        if target not in state and name.rpartition(".")[2] in KV_CACHE_SUFFIXES:
            kv_cache.append(name)
            continue
        if target not in state:
            owner = name.rpartition(".")[0]
            if owner in layers:
                why = (
                    f"not a tensor of the NVFP4 layer {owner!r} (its tensors: "
                    f"{', '.join(repr(n.rpartition('.')[2]) for n in layers[owner][1])}, "
                    f"'bias', {', '.join(map(repr, IGNORED_SUFFIXES))})"
                )
            else:
                why = "the model has no parameter or buffer of this name"
            raise ckpt.error(name, why)
        value = _tensor(ckpt, name, tuple(state[target].shape), f"the model's {target}")
        if target != name:
            tied[name] = (target, value)
        else:
            values[name] = value
    for name, (target, value) in tied.items():
        if target not in values:  # only the tied name is stored: it fills the parameter
            values[target] = value
        elif not _same_bits(value, values[target], state[target].dtype):
            raise ckpt.error(
                name,
                f"the model ties it to {target!r} (tie_word_embeddings=True), but the "
                f"checkpoint's {name!r} differs from its {target!r}; build the model with "
                "tie_word_embeddings=False to load both",
            )
    covered = set(values) | {f"{p}.weight" for p in new_layers} | {f"{p}.bias" for p in new_layers}
    missing = [n for n in params if n not in covered]
    if missing:
        raise SafetensorsError(
            ckpt.path, f"no tensor for {len(missing)} model parameter(s): {missing[:8]}"
        )
    if kv_cache:
        warnings.warn(
            f"{ckpt.path}: {len(kv_cache)} FP8 KV-cache scale(s) ignored (the KV cache stays "
            f"in the model's dtype): {kv_cache[:8]}",
            UserWarning,
            stacklevel=3,
        )
    return new_layers, values


def _layer(ckpt, model, prefix, first, weight, aliases, numerics) -> Nvfp4Linear:
    """The Nvfp4Linear of one NVFP4 layer, checked against the model's Linear there."""
    file = ckpt.file(first)
    try:
        linear = model.get_submodule(prefix)
    except AttributeError:
        linear = None
    if not isinstance(linear, torch.nn.Linear):
        raise SafetensorsError(
            file,
            f"NVFP4 layer {prefix!r}: the model has no torch.nn.Linear there "
            f"({type(linear).__name__ if linear is not None else 'nothing'})",
        )
    if (linear.out_features, linear.in_features) != (weight.n, weight.k):
        raise SafetensorsError(
            file,
            f"NVFP4 layer {prefix!r} is [{weight.n}, {weight.k}] but the model's Linear "
            f"is [{linear.out_features}, {linear.in_features}]",
        )
    if f"{prefix}.weight" in aliases:
        raise ckpt.error(
            first,
            f"NVFP4 layer {prefix!r}: the model ties its weight to "
            f"{aliases[prefix + '.weight']!r}, which an Nvfp4Linear cannot share",
        )
    bias_name = f"{prefix}.bias"
    bias = linear.bias
    if bias_name in ckpt:
        if bias is None:
            raise ckpt.error(bias_name, f"the model's Linear {prefix!r} has no bias (bias=False)")
        bias = _tensor(ckpt, bias_name, (weight.n,), f"the Linear's out_features {weight.n}")
    elif bias is not None and bias.is_meta:
        raise SafetensorsError(
            file,
            f"NVFP4 layer {prefix!r}: the model's bias is on the meta device and the "
            "checkpoint has no bias for it",
            tensor=bias_name,
        )
    try:
        return Nvfp4Linear(weight, bias, numerics=numerics)
    except (TypeError, ValueError) as err:
        raise ckpt.error(first, f"NVFP4 layer {prefix!r}: {err}") from err

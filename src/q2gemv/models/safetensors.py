"""Fill a model from an NVFP4 safetensors checkpoint (ModelOpt or compressed-tensors layout).

Every NVFP4 layer that :func:`q2gemv.io.load_nvfp4_weights` finds (prefix ``<p>``)
becomes an :class:`~q2gemv.torch.Nvfp4Linear` at ``model.get_submodule(<p>)`` (which
must be a ``torch.nn.Linear`` of the same shape; its bias, or ``<p>.bias`` from the
checkpoint, is kept in bf16). Every other tensor of the checkpoint is copied into the
model parameter or buffer of the same name (F32, F16 and BF16 only, converted to its
dtype). Activation-side NVFP4 tensors (``<p>.input_scale``, ``<p>.input_global_scale``:
W4A4 state) are ignored. Everything is read and checked before the model is changed.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .._progress import track, wants_progress
from ..io.safetensors import SafetensorsError, load_nvfp4_weights
from ..torch import Nvfp4Linear
from .meta import finish_meta_model
from .saved import record_quantization_config

PLAIN_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
IGNORED_SUFFIXES = ("input_scale", "input_global_scale")


def _tensors(path: Path) -> dict[str, tuple[str, object]]:
    """name -> (file, safe_open handle) over every shard."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    where: dict[str, tuple[str, object]] = {}
    for file in files:
        handle = safe_open(str(file), framework="pt")
        for name in handle.keys():
            where[name] = (str(file), handle)
    return where


def load_safetensors(
    path: str | os.PathLike,
    model: torch.nn.Module,
    *,
    numerics: str | None = None,
    progress: bool | None = None,
) -> torch.nn.Module:
    """Load an NVFP4 checkpoint into ``model`` in place: NVFP4 linears as ``Nvfp4Linear``.

    Args:
        path: a ``.safetensors`` file or a directory of shards.
        model: the float model of the checkpoint's architecture (e.g. a transformers
            ``LlamaForCausalLM`` built from its config); its parameter names are the
            checkpoint's names. It may be built on the meta device (``with
            torch.device("meta"):``, no random initialization): its tensors are then
            taken from the checkpoint and the layers land on the CPU.
        numerics: the ``Nvfp4Linear`` layers' numerics contract (None: library default).
        progress: one progress step per NVFP4 layer, on stderr (None: shown on a terminal
            for large models, through tqdm when installed; see :func:`quantize_model`).

    Returns ``model`` (eval mode). Every parameter of ``model`` (tied ones once) must
    come from the checkpoint.

    Raises:
        SafetensorsError: a malformed NVFP4 layer (see :func:`q2gemv.io.load_nvfp4_weights`),
            a tensor with no parameter or module of that name, a shape or dtype that does
            not fit, or a model parameter the checkpoint lacks (naming the tensor).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    wants_progress(progress, 0, False)  # TypeError naming progress
    root = Path(os.fspath(path))
    layers = load_nvfp4_weights(root)  # FileNotFoundError / SafetensorsError first
    where = _tensors(root)
    params = dict(model.named_parameters())
    state = {**params, **dict(model.named_buffers())}
    new_layers: dict[str, Nvfp4Linear] = {}
    taken: set[str] = set()
    for prefix, weight in track(layers.items(), "load_safetensors", progress, lambda kv: kv[0]):
        file = where[
            f"{prefix}.weight_packed" if f"{prefix}.weight_packed" in where else f"{prefix}.weight"
        ][0]
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
        bias = linear.bias
        if bias is not None and bias.is_meta and f"{prefix}.bias" not in where:
            raise SafetensorsError(
                file,
                f"NVFP4 layer {prefix!r}: the model's bias is on the meta device and the "
                "checkpoint has no bias for it",
                tensor=f"{prefix}.bias",
            )
        if f"{prefix}.bias" in where:
            bias = where[f"{prefix}.bias"][1].get_tensor(f"{prefix}.bias")
            taken.add(f"{prefix}.bias")
        new_layers[prefix] = Nvfp4Linear(weight, bias, numerics=numerics)
        taken.update(
            n for n in where if n.startswith(prefix + ".") and n.count(".") == prefix.count(".") + 1
        )
    values: dict[str, torch.Tensor] = {}
    for name, (file, handle) in where.items():
        if name in taken:
            continue
        if name.rpartition(".")[2] in IGNORED_SUFFIXES:
            continue
        if name not in state:
            raise SafetensorsError(
                file, "the model has no parameter or buffer of this name", tensor=name
            )
        value = handle.get_tensor(name)
        if value.dtype not in PLAIN_DTYPES:
            raise SafetensorsError(
                file,
                f"dtype {value.dtype} is not supported outside an NVFP4 layer (F32, F16, BF16 are)",
                tensor=name,
            )
        if tuple(value.shape) != tuple(state[name].shape):
            raise SafetensorsError(
                file,
                f"shape {list(value.shape)} does not match the model's {list(state[name].shape)}",
                tensor=name,
            )
        values[name] = value
    covered = set(values) | {f"{p}.weight" for p in new_layers} | {f"{p}.bias" for p in new_layers}
    missing = [n for n in params if n not in covered]
    if missing:
        raise SafetensorsError(
            str(root), f"no tensor for {len(missing)} model parameter(s): {missing[:8]}"
        )
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
    record_quantization_config(model)  # so save_pretrained writes a loadable model
    return model.eval()

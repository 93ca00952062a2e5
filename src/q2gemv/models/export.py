"""Write a quantized model as the ecosystem reads it: GGUF for llama.cpp, safetensors for vLLM.

* :func:`save_gguf`: a Llama or Qwen2 model whose linears are :class:`~q2gemv.torch.Q2Linear`
  -> one GGUF file with llama.cpp's names, metadata and Q/K row order (the inverse of
  :func:`q2gemv.torch.load_gguf`, which reads it back bit for bit);
* :func:`save_safetensors`: a model whose linears are :class:`~q2gemv.torch.Nvfp4Linear`
  -> a checkpoint folder (``model.safetensors`` + ``config.json``) in the
  compressed-tensors (default) or ModelOpt NVFP4 layout, read back bit for bit by
  :func:`q2gemv.torch.load_safetensors`.

A fused layer (``qkv_proj``, ``gate_up_proj``: :mod:`q2gemv.models.fuse`) is written as
its members, each with its own rows and name (:func:`layers_of`), as llama.cpp and
compressed-tensors / ModelOpt expect them. The layers' quantized state is read through :func:`q2_weight_of`, :func:`nvfp4_weight_of`,
:func:`bias_of` and :func:`dims_of` only (the one place that knows how a layer keeps it). The file
writers are :mod:`q2gemv.io.gguf.writer` and :mod:`q2gemv.io.safetensors.writer`; both
write through :func:`q2gemv.tools.atomic.atomic_write`. Recipes: ``docs/export.md``.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import __version__
from ..formats.nvfp4 import BLOCK, Nvfp4Weight, divisor_from_global_scale
from ..formats.q2_0 import Q2Weight
from ..io.gguf.reader import GGUF_ARRAY, GGUF_FLOAT32, GGUF_STRING, GGUF_UINT32, read_gguf
from ..io.gguf.writer import (
    GGUF_BF16,
    GGUF_F16,
    GGUF_F32,
    GgufTensorOut,
    default_q2_type_id,
    write_gguf,
)
from ..io.safetensors.writer import SafetensorsOut, write_safetensors
from ..nn.layers import Nvfp4Linear, Q2Linear
from ..tools import atomic as _atomic
from ..tools.progress import wants_progress
from . import fuse as fusion

# llama.cpp's tensor names, one table for reading and writing (models/gguf.py reads them).
from .gguf import _BLOCK_NAMES, _GLOBAL_NAMES

# -- the layers' state (the only place that reads it) ----------------------------------------


def q2_weight_of(layer: Q2Linear) -> Q2Weight:
    """A :class:`Q2Linear`'s weight as a host :class:`~q2gemv.Q2Weight` (its ``block_q2_0`` bytes)."""
    return layer.quantized_weight()


def nvfp4_weight_of(layer: Nvfp4Linear) -> Nvfp4Weight:
    """An :class:`Nvfp4Linear`'s weight as a host :class:`~q2gemv.Nvfp4Weight`
    (packed codes, E4M3 scale bytes, the fp32 multiplier ``global_scale``)."""
    return layer.quantized_weight()


def bias_of(layer: torch.nn.Module) -> torch.Tensor | None:
    """A quantized layer's bias (bf16 [n]) or None."""
    return layer.bias


def layers_of(model: torch.nn.Module):
    """``(module name, module)`` of ``model`` with every fused layer replaced by its members
    (qualified name, its rows as a layer: views, no copy) at the fused layer's place."""
    parts = fusion.fused_parts(model)
    for name, mod in model.named_modules():
        if name in parts:
            yield from parts[name]
        else:
            yield name, mod


def dims_of(layer: torch.nn.Module) -> tuple[int, int, int | None]:
    """A quantized layer's ``(n, k, group)`` (group None for NVFP4), without copying its state."""
    return layer.n, layer.k, getattr(layer, "group", None)


# -- GGUF ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GgufArch:
    """How llama.cpp's converter writes one transformers model type.

    Attributes:
        arch: ``general.architecture`` and the metadata key prefix.
        permute_qk: the converter reorders ``q_proj``/``k_proj`` rows to interleaved
            pairs (llama.cpp's "norm" rope, Llama); False where llama.cpp's rope takes
            transformers' halves as they are ("neox" rope, Qwen2).
        biases: the projections whose bias the architecture carries (tensors
            ``blk.N.attn_q.bias``...); a bias elsewhere is refused.
    """

    arch: str
    permute_qk: bool
    biases: tuple[str, ...] = ()


GGUF_ARCHS = {
    "llama": GgufArch("llama", permute_qk=True),
    "qwen2": GgufArch("qwen2", permute_qk=False, biases=("q_proj", "k_proj", "v_proj")),
}

_HF_GLOBAL = {hf: g for g, hf in _GLOBAL_NAMES.items()}
_HF_BLOCK = {hf: g for g, hf in _BLOCK_NAMES.items()}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp's tensor name for a transformers Llama/Qwen2 parameter name, None if unknown.

    ``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``; a projection's
    ``.bias`` maps as its ``.weight`` does (``blk.3.attn_q.bias``).
    """
    if hf_name in _HF_GLOBAL:
        return _HF_GLOBAL[hf_name]
    m = _HF_LAYER.fullmatch(hf_name)
    if not m:
        return None
    rest, suffix = m.group(2), ""
    if rest.endswith("_proj.bias"):
        rest, suffix = rest.removesuffix(".bias") + ".weight", ".bias"
    short = _HF_BLOCK.get(rest)
    if short is None:
        return None
    return f"blk.{int(m.group(1))}.{short.removesuffix('.weight') + suffix if suffix else short}"


def gguf_rows_from_hf(n_rows: int, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order: ``gguf = hf[gguf_rows_from_hf(n, heads)]``.

    The converter's ``LlamaModel.permute``: row ``h*d + 2*j + t`` of the file (head ``h``,
    pair ``j``, member ``t``; ``d`` the head dim) is row ``h*d + t*(d/2) + j`` of
    transformers' layout. The inverse of :func:`q2gemv.models.gguf.hf_rows_from_gguf`.
    """
    if heads <= 0 or n_rows % (2 * heads):
        raise ValueError(f"n_rows: expected a multiple of 2 * heads = {2 * heads}, got {n_rows}")
    return np.arange(n_rows).reshape(heads, 2, n_rows // heads // 2).swapaxes(1, 2).reshape(-1)


def _rope_theta(config) -> float:
    rope = dict(getattr(config, "rope_parameters", None) or {})
    kind = rope.get("rope_type", "default")
    if kind != "default":
        raise ValueError(
            f"model: rope_type {kind!r} (rope scaling) is not written: llama.cpp keeps it in a "
            "rope_freqs tensor that load_gguf refuses; only the default rope is supported"
        )
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _gguf_arch(model: torch.nn.Module) -> tuple[GgufArch, object]:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in GGUF_ARCHS:
        raise ValueError(
            f"model: save_gguf writes {', '.join(GGUF_ARCHS)} models (transformers model_type), "
            f"got {model_type!r}"
        )
    if getattr(config, "use_sliding_window", False):
        raise ValueError(
            "model: sliding-window attention is not written (llama.cpp's qwen2 has none)"
        )
    return GGUF_ARCHS[model_type], config


def _gguf_metadata(config, spec: GgufArch, name: str | None) -> list:
    a = spec.arch
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    u32 = [
        ("general.quantization_version", 2),  # ggml's GGML_QNT_VERSION, as llama.cpp writes it
        (f"{a}.vocab_size", config.vocab_size),
        (f"{a}.context_length", config.max_position_embeddings),
        (f"{a}.embedding_length", hidden),
        (f"{a}.block_count", config.num_hidden_layers),
        (f"{a}.feed_forward_length", config.intermediate_size),
        (f"{a}.attention.head_count", heads),
        (f"{a}.attention.head_count_kv", getattr(config, "num_key_value_heads", None) or heads),
        (f"{a}.rope.dimension_count", head_dim),
    ]
    if head_dim != hidden // heads:
        u32 += [(f"{a}.attention.key_length", head_dim), (f"{a}.attention.value_length", head_dim)]
    for attr, key in (
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ):
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            u32.append((key, value))
    out = []
    if name:
        out.append(("general.name", str(name), GGUF_STRING, None))
    out += [(key, int(value), GGUF_UINT32, None) for key, value in u32]
    out += [
        (f"{a}.rope.freq_base", _rope_theta(config), GGUF_FLOAT32, None),
        (f"{a}.attention.layer_norm_rms_epsilon", float(config.rms_norm_eps), GGUF_FLOAT32, None),
    ]
    return out


def _tokenizer_metadata(path: str | os.PathLike) -> list:
    """Every ``tokenizer.*`` key of a GGUF file with its stored type (arrays as lists)."""
    gf = read_gguf(path)
    out = []
    for key, value in gf.metadata.items():
        if not key.startswith("tokenizer."):
            continue
        types = gf.metadata_types[key]
        if types[0] == GGUF_ARRAY:
            if types[1] == GGUF_ARRAY or not len(value):
                continue  # nested or empty arrays: GGUFWriter cannot write them back
            items = value.tolist() if isinstance(value, np.ndarray) else list(value)
            out.append((key, items, GGUF_ARRAY, types[1]))
        else:
            out.append((key, value, types[0], None))
    if not out:
        raise ValueError(f"tokenizer_from: {os.fspath(path)} has no tokenizer.* metadata")
    return out


def _float_out(name: str, t: torch.Tensor, rows: np.ndarray | None) -> GgufTensorOut:
    """A float parameter: 1-D ones (norms, biases) F32 as llama.cpp's converter writes
    them; 2-D ones in their own dtype (bf16 BF16, fp16 F16, fp32 F32), bits unchanged."""
    if t.is_meta:
        raise ValueError(f"model: {name} is on the meta device (nothing to write)")
    t = t.detach()
    if t.ndim == 1:
        type_id, host = GGUF_F32, torch.float32
    elif t.ndim == 2 and t.dtype in (torch.bfloat16, torch.float16, torch.float32):
        type_id = {torch.bfloat16: GGUF_BF16, torch.float16: GGUF_F16}.get(t.dtype, GGUF_F32)
        host = t.dtype
    else:
        raise ValueError(f"model: {name} is a {t.dtype} tensor of shape {list(t.shape)}")

    def data(t=t, host=host, rows=rows) -> np.ndarray:
        x = t.to(device="cpu", dtype=host)
        if rows is not None:
            x = x[torch.from_numpy(rows)]
        x = x.contiguous()
        return x.view(torch.int16).numpy() if host == torch.bfloat16 else x.numpy()

    return GgufTensorOut(name, tuple(t.shape), type_id, data)


def _q2_out(name: str, layer: Q2Linear, rows: np.ndarray | None) -> GgufTensorOut:
    n, k, group = dims_of(layer)

    def data(layer=layer, rows=rows) -> np.ndarray:
        w = q2_weight_of(layer)
        raw = np.asarray(w.raw).reshape(w.n, -1)  # whole rows move: a row is its blocks
        return raw if rows is None else raw[rows]

    return GgufTensorOut(name, (n, k), default_q2_type_id(group), data, group)


def _row_order(config, spec: GgufArch, hf: str, n_rows: int) -> np.ndarray | None:
    if not spec.permute_qk:
        return None
    if ".self_attn.q_proj." in hf:
        return gguf_rows_from_hf(n_rows, int(config.num_attention_heads))
    if ".self_attn.k_proj." in hf:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return gguf_rows_from_hf(n_rows, int(heads))
    return None


def _gguf_tensors(model: torch.nn.Module, config, spec: GgufArch) -> list[GgufTensorOut]:
    out: list[GgufTensorOut] = []
    seen: set[int] = set()  # a tied lm_head shares the embedding: written once

    def target(hf: str) -> str:
        g = gguf_name(hf)
        if g is None:
            raise ValueError(f"model: no llama.cpp tensor name for {hf!r}")
        if g.endswith(".bias") and not any(f".{p}." in hf for p in spec.biases):
            raise ValueError(
                f"model: {hf} is a bias llama.cpp's {spec.arch} does not hold "
                f"(it has biases on {', '.join(spec.biases) or 'no projection'})"
            )
        return g

    for mod_name, mod in layers_of(model):
        prefix = f"{mod_name}." if mod_name else ""
        if isinstance(mod, Nvfp4Linear):
            raise ValueError(
                f"model: {mod_name} is an Nvfp4Linear; save_gguf writes Q2_0 layers "
                "(save an NVFP4 model with save_safetensors)"
            )
        if isinstance(mod, Q2Linear):
            hf = f"{prefix}weight"
            n_rows = dims_of(mod)[0]
            out.append(_q2_out(target(hf), mod, _row_order(config, spec, hf, n_rows)))
            bias = bias_of(mod)
            if bias is not None:
                hb = f"{prefix}bias"
                out.append(_float_out(target(hb), bias, _row_order(config, spec, hb, n_rows)))
            continue
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            hf = f"{prefix}{pname}"
            rows = _row_order(config, spec, hf, p.shape[0]) if p.ndim >= 1 else None
            out.append(_float_out(target(hf), p, rows))
    return out


def save_gguf(
    model: torch.nn.Module,
    path: str | os.PathLike,
    *,
    name: str | None = None,
    tokenizer_from: str | os.PathLike | None = None,
    progress: bool | None = None,
) -> None:
    """Write a quantized transformers Llama or Qwen2 model as a llama.cpp GGUF file.

    Args:
        model: a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` of ``Q2Linear`` and float linears.
        path: the ``.gguf`` file to create or replace, atomically.
        name: optional ``general.name``.
        tokenizer_from: optional GGUF file of the same model whose ``tokenizer.*`` keys are copied.
        progress: one step per tensor written (None: on a terminal for large models).

    What is written, and the tokenizer: docs/export.md#q2_0---gguf.

    Raises:
        ValueError: another model type, rope scaling, sliding-window attention, an
            ``Nvfp4Linear``, a parameter with no llama.cpp name, a bias the architecture
            does not hold, a tensor on the meta device, or a ``tokenizer_from`` file
            without ``tokenizer.*`` keys (``GgufError`` when it is not a GGUF file).
        ImportError: the ``gguf`` package is not installed (``pip install gguf``).
    """
    wants_progress(progress, 0, False)  # TypeError naming progress, before any work
    spec, config = _gguf_arch(model)
    metadata = _gguf_metadata(config, spec, name)
    if tokenizer_from is not None:
        copied = _tokenizer_metadata(tokenizer_from)
        keys = {m[0] for m in copied}
        metadata = [m for m in metadata if m[0] not in keys] + copied
    tensors = _gguf_tensors(model, config, spec)
    write_gguf(path, spec.arch, metadata, tensors, progress=progress)


# -- safetensors (NVFP4) ---------------------------------------------------------------------

LAYOUTS = ("compressed-tensors", "modelopt")
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
WEIGHTS_NAME = "model.safetensors"


def compressed_tensors_config(ignore: list[str]) -> dict:
    """``quantization_config`` of a compressed-tensors NVFP4 W4A16 checkpoint (llm-compressor's
    ``NVFP4A16`` scheme): FP4 weights in groups of 16 with one global scale, no activation
    quantization, ``ignore`` the Linear modules left in floating point."""
    weights = {
        "num_bits": 4,
        "type": "float",
        "strategy": "tensor_group",
        "group_size": BLOCK,
        "symmetric": True,
        "dynamic": False,
        "actorder": None,
        "block_structure": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": "nvfp4-pack-quantized",
                "weights": weights,
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
    }


def modelopt_config(ignore: list[str]) -> dict:
    """``quantization_config`` of a ModelOpt NVFP4 checkpoint (the flat form of its
    ``hf_quant_config.json``): weights NVFP4 in groups of 16, ``exclude_modules`` the
    Linear modules left in floating point."""
    return {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": BLOCK,
        "kv_cache_quant_algo": None,
        "exclude_modules": ignore,
    }


def _divisors(layers: dict[str, Nvfp4Linear], inexact: str) -> dict[str, float]:
    """prefix -> the compressed-tensors divisor of each layer's global scale."""
    out: dict[str, float] = {}
    missing: list[str] = []
    for prefix, layer in layers.items():
        g = nvfp4_weight_of(layer).global_scale
        d = divisor_from_global_scale(g)
        if d is None:
            missing.append(f"{prefix} (global_scale {float(g)!r})")
            with np.errstate(all="ignore"):
                d = float(np.float32(1.0) / np.float32(g))
        out[prefix] = d
    if missing and inexact == "raise":
        raise ValueError(
            f"model: {len(missing)} NVFP4 layer(s) have a global scale that is the fp32 "
            f"reciprocal of no fp32 divisor, so the compressed-tensors layout cannot hold it "
            f"bit-exactly: {'; '.join(missing[:8])}. layout='modelopt' stores the multiplier "
            "itself (exact); inexact='nearest' writes fp32(1 / global_scale), which loads back "
            "as a multiplier one fp32 ulp away"
        )
    if missing:
        warnings.warn(
            f"save_safetensors: {len(missing)} layer(s) load back with a global scale one fp32 "
            f"ulp from the model's (compressed-tensors stores a divisor): {'; '.join(missing[:8])}",
            stacklevel=3,
        )
    return out


def _float_st(name: str, t: torch.Tensor) -> SafetensorsOut:
    if t.is_meta:
        raise ValueError(f"model: {name} is on the meta device (nothing to write)")
    if t.dtype not in _ST_DTYPES:
        raise ValueError(f"model: {name} is {t.dtype}; F32, F16 and BF16 tensors are written")
    t = t.detach()

    def data(t=t) -> np.ndarray:
        x = t.to("cpu").contiguous()
        return x.view(torch.int16).numpy() if x.dtype == torch.bfloat16 else x.numpy()

    return SafetensorsOut(name, _ST_DTYPES[t.dtype], tuple(t.shape), data)


def _nvfp4_st(prefix: str, layer: Nvfp4Linear, layout: str, divisor: float | None) -> list:
    n, k, _ = dims_of(layer)
    suffixes = {
        "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale"),
        "modelopt": ("weight", "weight_scale", "weight_scale_2"),
    }[layout]
    if layout == "compressed-tensors":
        scale = np.float32(divisor)
    else:
        scale = np.float32(nvfp4_weight_of(layer).global_scale)
    gshape = (1,) if layout == "compressed-tensors" else ()  # as each ecosystem writes it

    def packed(layer=layer) -> np.ndarray:
        return np.asarray(nvfp4_weight_of(layer).packed)

    def scales(layer=layer) -> np.ndarray:
        return np.asarray(nvfp4_weight_of(layer).scales)

    out = [
        SafetensorsOut(f"{prefix}.{suffixes[0]}", "U8", (n, k // 2), packed),
        SafetensorsOut(f"{prefix}.{suffixes[1]}", "F8_E4M3", (n, k // BLOCK), scales),
        SafetensorsOut(f"{prefix}.{suffixes[2]}", "F32", gshape, lambda s=scale: np.array(s)),
    ]
    bias = bias_of(layer)
    if bias is not None:
        out.append(_float_st(f"{prefix}.bias", bias))
    return out


def save_safetensors(
    model: torch.nn.Module,
    path: str | os.PathLike,
    *,
    layout: str = "compressed-tensors",
    inexact: str = "raise",
    progress: bool | None = None,
) -> None:
    """Write a model with :class:`~q2gemv.torch.Nvfp4Linear` layers as an NVFP4 checkpoint folder.

    Args:
        model: a module whose quantized linears are ``Nvfp4Linear`` (others keep their dtype).
        path: the folder (created when missing) for ``model.safetensors`` (+ ``config.json``).
        layout: ``"compressed-tensors"`` (scale divisor) or ``"modelopt"`` (multiplier).
        inexact: ``"raise"`` or ``"nearest"`` for a multiplier with no fp32 divisor.
        progress: one step per tensor written (see :mod:`q2gemv.tools.progress`).

    The tensors, the config and the divisor: docs/export.md (NVFP4 -> safetensors).

    Raises:
        ValueError: a :class:`~q2gemv.torch.Q2Linear` (use :func:`save_gguf`), a tensor
            on the meta device or of another dtype, a bad ``layout``/``inexact``, or
            (``inexact="raise"``) a global scale the compressed-tensors layout cannot hold.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    if inexact not in ("raise", "nearest"):
        raise ValueError(f"inexact: expected 'raise' or 'nearest', got {inexact!r}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    wants_progress(progress, 0, False)  # TypeError naming progress
    layers: dict[str, Nvfp4Linear] = {}
    floats: list[tuple[str, torch.Tensor]] = []
    ignore: list[str] = []
    seen: set[int] = set()
    for mod_name, mod in layers_of(model):
        if isinstance(mod, Q2Linear):
            raise ValueError(
                f"model: {mod_name} is a Q2Linear; save_safetensors writes NVFP4 layers "
                "(save a Q2_0 model with save_gguf)"
            )
        if isinstance(mod, Nvfp4Linear):
            layers[mod_name] = mod
            continue
        if isinstance(mod, torch.nn.Linear):
            ignore.append(mod_name)
        prefix = f"{mod_name}." if mod_name else ""
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                floats.append((f"{prefix}{pname}", p))
    divisors = _divisors(layers, inexact) if layout == "compressed-tensors" else {}
    tensors: list[SafetensorsOut] = []
    for prefix, layer in layers.items():
        tensors += _nvfp4_st(prefix, layer, layout, divisors.get(prefix))
    tensors += [_float_st(name, p) for name, p in floats]
    config = getattr(model, "config", None)
    text = None
    if config is not None and hasattr(config, "to_json_string"):
        cfg = json.loads(config.to_json_string(use_diff=False))
        cfg["architectures"] = [type(model).__name__]  # as save_pretrained records it
        make = compressed_tensors_config if layout == "compressed-tensors" else modelopt_config
        cfg["quantization_config"] = make(ignore)
        text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    folder = Path(os.fspath(path))
    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(
        folder / WEIGHTS_NAME, tensors, {"producer": f"q2gemv {__version__}"}, progress=progress
    )
    if text is not None:
        _atomic.write_text(folder / "config.json", text)

"""A transformers Llama decoder from a llama.cpp GGUF file with Q2_0 / PQ2_0 linear layers.

``config_from_gguf(path)`` reads the ``llama.*`` / ``qwen2.*`` metadata into a config;
``load_gguf(path, model=None)`` fills a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``.
Tensor names, the Q/K row order, what is supported and what is refused:
docs/models.md#load_gguf-in-detail.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import numpy as np
import torch

from ..formats.q2_0 import Q2Weight
from ..io.gguf import reader as _io
from ..io.gguf.reader import GgufError, GgufFile, GgufTensorInfo, load_q2_weights, read_gguf
from ..nn.layers import Q2Linear
from ..tools.progress import track, wants_progress
from . import fuse as fusion
from .meta import finish_meta_model
from .saved import record_quantization_config

ARCHITECTURES = ("llama", "qwen2")
# general.architecture -> (transformers config class, model class, Q/K rows permuted)
_ARCH_CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", True),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", False),
}

# GGUF float tensor type id -> (little-endian numpy dtype, torch dtype it is viewed as)
FLOAT_TYPES: dict[int, tuple[str, torch.dtype]] = {
    0: ("<f4", torch.float32),  # F32
    1: ("<f2", torch.float16),  # F16
    30: ("<i2", torch.bfloat16),  # BF16 (read as int16 bits, viewed as bfloat16)
}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",  # qwen2
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# A layer index in canonical spelling only: ASCII decimal, no leading zero, no sign. With
# \d and int() alone, "blk.00.", "blk.0000." and non-ASCII digits ("blk.\u0660.") were all
# layer 0, and the last tensor of a slot silently replaced the others.
_BLOCK = re.compile(r"blk\.(0|[1-9][0-9]*)\.(.+)", re.ASCII | re.DOTALL)
_ANY_BLOCK = re.compile(r"blk\.([^.]*)\.(.+)", re.DOTALL)

MAX_SIZE = 2**31 - 1  # the largest count or size a metadata key may give (a C int)
MAX_TOKEN_ID = 2**32 - 1  # llama.cpp reads token ids as uint32
_INT_TYPES = frozenset(
    (_io.GGUF_UINT8, _io.GGUF_INT8, _io.GGUF_UINT16, _io.GGUF_INT16)
    + (_io.GGUF_UINT32, _io.GGUF_INT32, _io.GGUF_UINT64, _io.GGUF_INT64)
)
_NUMBER_TYPES = _INT_TYPES | {_io.GGUF_FLOAT32, _io.GGUF_FLOAT64}


def hf_name(gguf_name: str) -> str | None:
    """The transformers parameter name of a llama.cpp Llama tensor name, None if unknown.

    Layer indices are taken in canonical spelling only (``blk.0.``, not ``blk.00.``).
    """
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{int(m.group(1))}.{_BLOCK_NAMES[m.group(2)]}"
    return None


def _layer_tensors(gf: GgufFile) -> dict[int, dict[str, GgufTensorInfo]]:
    """layer index -> {short name: tensor} of the ``blk.{i}.`` tensors; refuses other spellings.

    A name ``blk.<x>.<rest>`` whose ``<x>`` is not canonical ASCII decimal is refused,
    naming the tensor that has the canonical name too when ``int(x)`` has one.
    """
    names = {t.name for t in gf.tensors}
    layers: dict[int, dict[str, GgufTensorInfo]] = {}
    for t in gf.tensors:
        m = _BLOCK.fullmatch(t.name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = t
            continue
        loose = _ANY_BLOCK.fullmatch(t.name)
        if loose is None:
            continue
        index, rest = loose.groups()
        try:
            same = f"blk.{int(index)}.{rest}"
        except ValueError:
            same = None
        hint = f" (layer {int(index)} is spelled {same!r})" if same else ""
        twin = f"; the file also has {same!r}: two tensors for one weight" if same in names else ""
        raise GgufError(
            gf.path,
            f"layer index {_io.escape_text(index)!r} is not canonical: ASCII decimal digits "
            f"without a leading zero{hint}{twin}",
            tensor=t.name,
        )
    return layers


def hf_rows_from_gguf(n_rows: int, heads: int) -> np.ndarray:
    """Row gather undoing llama.cpp's Q/K permutation: ``hf = gguf[hf_rows_from_gguf(n, heads)]``.

    Row ``h*d + t*(d/2) + j`` of transformers' layout (head ``h``, half ``t``, index
    ``j``; ``d`` the head dim) is row ``h*d + 2*j + t`` of the GGUF file.
    """
    if heads <= 0 or n_rows % (2 * heads):
        raise ValueError(f"n_rows: expected a multiple of 2 * heads = {2 * heads}, got {n_rows}")
    return np.arange(n_rows).reshape(heads, n_rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def _value(gf: GgufFile, key: str) -> str:
    """A metadata value for an error message: its GGUF type, and the value when short."""
    types = gf.metadata_types[key]
    if types[0] == _io.GGUF_ARRAY:
        return f"an array of {_io.value_type_name(types[1])}"
    text = repr(gf.metadata[key])
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"a {_io.value_type_name(types[0])} ({text})"


def _int(gf: GgufFile, key: str, default: Any = None, *, required=False, lo=1, hi=MAX_SIZE):
    """The integer value of ``key`` (any GGUF integer type) in ``lo..hi``; ``default`` if absent."""
    if key not in gf.metadata:
        if required:
            raise GgufError(gf.path, f"metadata key {key!r} is missing (needed for the config)")
        return default
    if gf.metadata_types[key][0] not in _INT_TYPES:
        raise GgufError(gf.path, f"metadata {key} is {_value(gf, key)}: expected an integer")
    value = int(gf.metadata[key])
    if not lo <= value <= hi:
        raise GgufError(gf.path, f"metadata {key} = {value}: expected an integer from {lo} to {hi}")
    return value


def _positive(gf: GgufFile, key: str, default: float) -> float:
    """The number value of ``key`` (a GGUF float or integer), finite and > 0; ``default`` if absent."""
    if key not in gf.metadata:
        return default
    if gf.metadata_types[key][0] not in _NUMBER_TYPES:
        raise GgufError(gf.path, f"metadata {key} is {_value(gf, key)}: expected a number")
    value = float(gf.metadata[key])
    if not (math.isfinite(value) and value > 0):
        raise GgufError(gf.path, f"metadata {key} = {value!r}: expected a finite number > 0")
    return value


def _architecture(gf: GgufFile) -> str:
    key = "general.architecture"
    if key not in gf.metadata:
        raise GgufError(gf.path, f"metadata key {key!r} is missing (needed for the config)")
    arch = gf.metadata[key]
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        shown = repr(arch) if isinstance(arch, str) else _value(gf, key)
        raise GgufError(
            gf.path,
            f"general.architecture is {shown}; load_gguf supports {', '.join(ARCHITECTURES)}",
        )
    return arch


def _check_rows(gf: GgufFile, t: GgufTensorInfo | None, dim: int, want: int, why: str) -> None:
    if t is not None and len(t.ne) == 2 and t.ne[dim] != want:
        what = "rows" if dim == 1 else "columns"
        raise GgufError(gf.path, f"{why} give {want} {what}, but tensor {t.name!r} has {t.ne[dim]}")


def check_metadata(gf: GgufFile, *, layers_required: bool = True) -> dict[str, Any]:
    """The ``LlamaConfig`` arguments of a llama.cpp file, every value checked (no model built).

    Types (integers for counts, sizes and token ids; numbers for the epsilon and rope
    base), ranges, and agreement with the tensors present: ``embedding_length`` and
    ``vocab_size`` with ``token_embd.weight``; ``block_count`` with the layer indices
    (each of ``0 .. block_count - 1`` named, none beyond; with ``layers_required=False``
    a file that names no layer at all passes, its missing tensors being reported by the
    loader); head counts, head dim and ``feed_forward_length`` with each layer's tensors.
    Layer indices must be spelled canonically (see :func:`hf_name`).

    Raises:
        GgufError: naming the key (and the tensor it disagrees with).
    """
    arch = _architecture(gf)
    names = {t.name: t for t in gf.tensors}
    layers = _layer_tensors(gf)
    if "token_embd.weight" not in names:
        raise GgufError(gf.path, "no token_embd.weight tensor (the vocabulary size comes from it)")
    embd = names["token_embd.weight"]
    key = f"{arch}.embedding_length"
    hidden = _int(gf, key, required=True)
    if embd.k != hidden:
        raise GgufError(
            gf.path, f"metadata {key} = {hidden}, but token_embd.weight has rows of {embd.k}"
        )
    key = f"{arch}.vocab_size"
    vocab = _int(gf, key, embd.n)
    if vocab != embd.n:
        raise GgufError(
            gf.path, f"metadata {key} = {vocab}, but token_embd.weight has {embd.n} rows"
        )
    heads_key, kv_key = f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"
    heads = _int(gf, heads_key, required=True)
    kv = _int(gf, kv_key, heads)
    if heads % kv:
        raise GgufError(
            gf.path, f"metadata {kv_key} = {kv}: expected a divisor of {heads_key} = {heads}"
        )
    dim_key = f"{arch}.attention.key_length"
    if dim_key in gf.metadata:
        head_dim = _int(gf, dim_key)
        dim_why = f"{dim_key} = {head_dim}"
    elif hidden % heads:
        raise GgufError(
            gf.path,
            f"metadata {heads_key} = {heads} does not divide {arch}.embedding_length = "
            f"{hidden}, and {dim_key} (the head dim) is absent",
        )
    else:
        head_dim = hidden // heads
        dim_why = f"the head dim {head_dim} (embedding_length / head_count)"
    if head_dim % 2:
        raise GgufError(
            gf.path, f"{dim_why}: expected an even head dim (rotary embeddings rotate pairs)"
        )
    v_key = f"{arch}.attention.value_length"
    if _int(gf, v_key, head_dim) != head_dim:
        raise GgufError(gf.path, f"metadata {v_key} = {gf.metadata[v_key]} differs from {dim_why}")
    ffn_key = f"{arch}.feed_forward_length"
    ffn = _int(gf, ffn_key, required=True)
    count_key = f"{arch}.block_count"
    count = _int(gf, count_key, required=True)
    beyond = sorted(i for i in layers if i >= count)
    if beyond:
        raise GgufError(
            gf.path,
            f"metadata {count_key} = {count}, but tensors name layer {beyond[0]} "
            f"({next(iter(layers[beyond[0]].values())).name!r})",
        )
    if len(layers) != count and (layers or layers_required):
        first = min(set(range(len(layers) + 1)) - set(layers))
        raise GgufError(
            gf.path,
            f"metadata {count_key} = {count}, but the tensors name {len(layers)} layer(s): "
            f"layer {first} has no tensor",
        )
    q_why = f"metadata {heads_key} = {heads} heads of {dim_why}"
    kv_why = f"metadata {kv_key} = {kv} heads of {dim_why}"
    for block in layers.values():
        _check_rows(gf, block.get("attn_q.weight"), 1, heads * head_dim, q_why)
        _check_rows(gf, block.get("attn_k.weight"), 1, kv * head_dim, kv_why)
        _check_rows(gf, block.get("attn_v.weight"), 1, kv * head_dim, kv_why)
        _check_rows(gf, block.get("attn_output.weight"), 0, heads * head_dim, q_why)
        for short, dim in (("ffn_gate.weight", 1), ("ffn_up.weight", 1), ("ffn_down.weight", 0)):
            _check_rows(gf, block.get(short), dim, ffn, f"metadata {ffn_key} = {ffn}")
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=count,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=_int(gf, f"{arch}.context_length", 4096),
        rms_norm_eps=_positive(gf, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=_positive(gf, f"{arch}.rope.freq_base", 10000.0),
        tie_word_embeddings="output.weight" not in names,
    )
    for key, arg in (
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ):
        if key in gf.metadata:
            kwargs[arg] = _int(gf, key, lo=0, hi=MAX_TOKEN_ID)
    return kwargs


def _config(gf: GgufFile):
    import transformers

    kwargs = check_metadata(gf)
    return getattr(transformers, _ARCH_CLASSES[_architecture(gf)][0])(**kwargs)


def _check_model_heads(gf: GgufFile, file_config: dict[str, Any], model) -> None:
    """Refuse a model whose head counts or head dim are not the file's (Q/K un-permutation)."""
    config = model.config
    arch = _architecture(gf)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and heads and getattr(config, "hidden_size", None):
        head_dim = config.hidden_size // heads
    keys = {
        "num_attention_heads": f"{arch}.attention.head_count",
        "num_key_value_heads": f"{arch}.attention.head_count_kv",
        "head_dim": f"{arch}.attention.key_length",
    }
    diff = []
    for attr, got in (
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv),
        ("head_dim", head_dim),
    ):
        want = file_config[attr]
        if got != want:
            key = keys[attr] if keys[attr] in gf.metadata else f"{keys[attr]} (absent: derived)"
            diff.append(f"{attr} {got} (the file's {key} = {want})")
    if diff:
        raise GgufError(
            gf.path,
            "the model's config differs from the file's: " + ", ".join(diff) + " (the head "
            "counts split Q/K/V into heads and, for llama files, decide how the Q/K rows are "
            "un-permuted)",
        )


def config_from_gguf(path: str | os.PathLike):
    """A ``transformers.LlamaConfig`` from a llama.cpp GGUF file's ``llama.*`` metadata.

    Read: ``embedding_length``, ``feed_forward_length``, ``block_count``,
    ``attention.head_count`` (required); ``attention.head_count_kv``,
    ``attention.key_length``, ``context_length``, ``attention.layer_norm_rms_epsilon``,
    ``rope.freq_base``, ``vocab_size`` (else ``token_embd.weight``'s rows) and the
    tokenizer's bos/eos/padding ids when present. ``tie_word_embeddings`` is True
    when the file has no ``output.weight``.

    Every value is checked first (:func:`check_metadata`): types, ranges and agreement
    with the tensors present.

    Raises:
        GgufError: not a ``llama`` file, a required key or tensor missing, a value of the
            wrong type or out of range, or one that disagrees with the tensors.
    """
    return _config(read_gguf(path))


def _float_tensor(gf: GgufFile, t: GgufTensorInfo) -> torch.Tensor:
    np_dtype, torch_dtype = FLOAT_TYPES[t.type_id]
    shape = tuple(reversed(t.ne))
    count = int(np.prod(shape, dtype=np.int64))
    a = np.fromfile(gf.path, dtype=np_dtype, count=count, offset=t.offset).reshape(shape)
    return torch.from_numpy(a).view(torch_dtype)


def _permute_heads(config, hf: str) -> int | None:
    if hf.endswith("self_attn.q_proj.weight"):
        return config.num_attention_heads
    if hf.endswith("self_attn.k_proj.weight"):
        return config.num_key_value_heads
    return None


def _plan(gf: GgufFile, q2: dict[str, Q2Weight], model, numerics: str | None, progress=None):
    """Everything load_gguf will set, checked against ``model``: (params, q2 layers)."""
    config = model.config
    params = dict(model.named_parameters())  # tied lm_head.weight is left out (a duplicate)
    tied = getattr(config, "tie_word_embeddings", False)
    permuted = _ARCH_CLASSES[_architecture(gf)][2]
    by_name = {t.name: t for t in gf.tensors}
    new_params: dict[str, torch.Tensor] = {}
    new_layers: dict[str, Q2Linear] = {}
    for t in track(gf.tensors, "load_gguf", progress, name=lambda t: t.name):
        hf = hf_name(t.name)
        if hf is None:
            raise GgufError(
                gf.path,
                "no module of a transformers Llama model takes this tensor "
                "(rope_freqs.weight: Llama 3.1 rope scaling is not supported)",
                tensor=t.name,
            )
        if hf == "lm_head.weight" and tied:
            raise GgufError(
                gf.path,
                "the model ties lm_head to the embeddings but the file has its own output.weight",
                tensor=t.name,
            )
        if hf not in params:
            raise GgufError(gf.path, f"the model has no parameter {hf!r}", tensor=t.name)
        want = tuple(params[hf].shape)
        got = tuple(reversed(t.ne))
        if got != want:
            raise GgufError(
                gf.path, f"shape {list(got)} does not match {hf} {list(want)}", tensor=t.name
            )
        heads = _permute_heads(config, hf) if permuted else None
        if t.is_q2:
            module = hf.removesuffix(".weight")
            linear = model.get_submodule(module)
            if not isinstance(linear, (torch.nn.Linear, Q2Linear)):
                raise GgufError(
                    gf.path,
                    f"{module} is a {type(linear).__name__}, not a Linear",
                    tensor=t.name,
                )
            w = q2[t.name]
            if heads is not None:
                rows = np.asarray(w.raw).reshape(w.n, -1)[hf_rows_from_gguf(w.n, heads)]
                w = Q2Weight.from_bytes(rows.reshape(-1), w.n, w.k, w.group)
            bias = getattr(linear, "bias", None)
            file_bias = by_name.get(t.name.removesuffix(".weight") + ".bias")  # qwen2
            if file_bias is not None and file_bias.type_id in FLOAT_TYPES:
                bias = _float_tensor(gf, file_bias)
            elif bias is not None and bias.is_meta:
                raise GgufError(
                    gf.path,
                    f"{module} has a bias, which a llama.cpp Llama file does not hold",
                    tensor=t.name,
                )
            new_layers[module] = Q2Linear(w, bias, numerics=numerics)
        elif t.type_id in FLOAT_TYPES:
            value = _float_tensor(gf, t)
            if heads is not None:
                value = value[torch.from_numpy(hf_rows_from_gguf(value.shape[0], heads))]
            new_params[hf] = value
        else:
            raise GgufError(
                gf.path,
                f"tensor type {t.type_name} is not supported (Q2_0, PQ2_0, F32, F16, BF16 are)",
                tensor=t.name,
            )
    loaded = set(new_params) | {f"{m}.weight" for m in new_layers}
    missing = [name for name in params if name not in loaded and not name.endswith(".bias")]
    if missing:
        raise GgufError(
            gf.path, f"the file has no tensor for {len(missing)} parameter(s): {missing[:8]}"
        )
    return new_params, new_layers


def load_gguf(
    path: str | os.PathLike,
    model: torch.nn.Module | None = None,
    *,
    numerics: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    ambiguous_group: int | None = None,
    progress: bool | None = None,
    fuse: bool = True,
) -> torch.nn.Module:
    """A transformers Llama model with the GGUF file's weights; Q2_0 linears as ``Q2Linear``.

    Args:
        path: the ``.gguf`` file (``general.architecture`` ``"llama"`` or ``"qwen2"``).
        model: a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` to fill in place; None builds one.
        numerics: the ``Q2Linear`` layers' numerics contract (None: library default).
        dtype: parameter dtype of a model built here.
        ambiguous_group: as for :func:`q2gemv.io.load_q2_weights`.
        progress: one progress step per tensor on stderr (None: on a terminal for large models).
        fuse: q/k/v and gate/up of each layer as one fused layer each (False: one per tensor).

    Returns the model in eval mode on the CPU, ``model`` unchanged on any error
    (docs/models.md#load_gguf-in-detail).

    Raises:
        GgufError: an unsupported type or architecture, bad metadata (:func:`check_metadata`),
            a non-canonical layer index, head counts not the file's, a tensor without a
            module, a shape mismatch, or a missing parameter (naming the tensor).
        TypeError: ``model`` is neither None nor a transformers model.
    """
    wants_progress(progress, 0, False)  # TypeError naming progress
    path = os.fspath(path)
    built = model is None
    if not built and (not isinstance(model, torch.nn.Module) or not hasattr(model, "config")):
        raise TypeError(f"model: expected a transformers model or None, got {type(model).__name__}")
    gf = read_gguf(path)
    file_config = check_metadata(gf, layers_required=built)  # before anything is built
    if not built:
        _check_model_heads(gf, file_config, model)
    q2 = load_q2_weights(path, ambiguous_group=ambiguous_group)
    if built:
        import transformers

        config = getattr(transformers, _ARCH_CLASSES[_architecture(gf)][0])(**file_config)
        config.dtype = dtype
        model_class = getattr(transformers, _ARCH_CLASSES[_architecture(gf)][1])
        with torch.device("meta"):
            model = model_class(config).to(dtype)
    new_params, new_layers = _plan(gf, q2, model, numerics, progress)
    for name, value in new_params.items():
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        old = getattr(module, attr)
        value = value.to(dtype=old.dtype)
        if built:
            setattr(module, attr, torch.nn.Parameter(value.clone(), requires_grad=False))
        else:
            with torch.no_grad():
                old.copy_(value)
    for name, layer in new_layers.items():
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name), attr, layer.to(_device_of(model)))
    if built:
        finish_meta_model(model, path)
    fusion.fuse_loaded(model, path, fuse)
    record_quantization_config(model)  # so save_pretrained writes a loadable model
    return model.eval()


def _device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        if not p.is_meta:
            return p.device
    return torch.device("cpu")

"""A transformers Llama decoder from a llama.cpp GGUF file with Q2_0 / PQ2_0 linear layers.

``config_from_gguf(path)`` reads the ``llama.*`` metadata into a
``transformers.LlamaConfig`` (``qwen2.*``: a ``Qwen2Config``); ``load_gguf(path,
model=None)`` fills a ``LlamaForCausalLM`` (``Qwen2ForCausalLM``; built from that
config when ``model`` is None):

* Q2_0 (type 42) and PQ2_0 (type 142) tensors become :class:`~q2gemv.torch.Q2Linear`
  layers over the file's bytes (no dequantization; the bytes are copied once into
  the layer's ``raw`` buffer);
* F32, F16 and BF16 tensors (norms, embeddings, float linears) are copied into the
  model's parameters, converted to the parameter's dtype;
* any other tensor type, any tensor name without a module, any shape that disagrees
  with the model, and any model parameter the file lacks raise :class:`GgufError`
  naming the tensor, before the model is changed.

llama.cpp tensor names (``convert_hf_to_gguf.py``, ``LlamaModel``) -> transformers::

    token_embd.weight            model.embed_tokens.weight
    output_norm.weight           model.norm.weight
    output.weight                lm_head.weight          (absent: tied embeddings)
    blk.{i}.attn_norm.weight     model.layers.{i}.input_layernorm.weight
    blk.{i}.ffn_norm.weight      model.layers.{i}.post_attention_layernorm.weight
    blk.{i}.attn_{q,k,v}.weight  model.layers.{i}.self_attn.{q,k,v}_proj
    blk.{i}.attn_output.weight   model.layers.{i}.self_attn.o_proj
    blk.{i}.ffn_{gate,up,down}.weight  model.layers.{i}.mlp.{gate,up,down}_proj

Q/K rows: llama.cpp's converter reorders the rows of ``q_proj`` (with the number of
heads) and ``k_proj`` (with the number of KV heads) from the halves layout of
transformers' rotary embedding to interleaved pairs::

    gguf = hf.reshape(heads, 2, head_dim // 2, k).swapaxes(1, 2).reshape(n, k)

The order of whole rows changes, nothing inside a row, so it is undone on the packed
tensor by a row gather (:func:`hf_rows_from_gguf`): the bytes of a row (its Q2_0
blocks) move together, for quantized and float tensors alike.

Supported: ``general.architecture == "llama"`` (which llama.cpp also uses for
Mistral) and ``"qwen2"`` (a ``Qwen2ForCausalLM``: ``blk.{i}.attn_{q,k,v}.bias`` are
its projections' biases, and its Q/K rows are stored in transformers' order, since
llama.cpp's converter does not permute them for the "neox" rope it runs Qwen2 with).
``rope_freqs.weight`` (Llama 3.1 rope scaling, not described by the metadata) is
refused.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import torch

from .._progress import track, wants_progress
from ..formats.q2_0 import Q2Weight
from ..io.gguf import GgufError, GgufFile, GgufTensorInfo, load_q2_weights, read_gguf
from ..torch import Q2Linear
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
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


def hf_name(gguf_name: str) -> str | None:
    """The transformers parameter name of a llama.cpp Llama tensor name, None if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{int(m.group(1))}.{_BLOCK_NAMES[m.group(2)]}"
    return None


def hf_rows_from_gguf(n_rows: int, heads: int) -> np.ndarray:
    """Row gather undoing llama.cpp's Q/K permutation: ``hf = gguf[hf_rows_from_gguf(n, heads)]``.

    Row ``h*d + t*(d/2) + j`` of transformers' layout (head ``h``, half ``t``, index
    ``j``; ``d`` the head dim) is row ``h*d + 2*j + t`` of the GGUF file.
    """
    if heads <= 0 or n_rows % (2 * heads):
        raise ValueError(f"n_rows: expected a multiple of 2 * heads = {2 * heads}, got {n_rows}")
    return np.arange(n_rows).reshape(heads, n_rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def _meta(gf: GgufFile, key: str, default: Any = None, *, required: bool = False) -> Any:
    if key in gf.metadata:
        return gf.metadata[key]
    if required:
        raise GgufError(gf.path, f"metadata key {key!r} is missing (needed for the config)")
    return default


def _architecture(gf: GgufFile) -> str:
    arch = _meta(gf, "general.architecture", required=True)
    if arch not in ARCHITECTURES:
        raise GgufError(
            gf.path,
            f"general.architecture is {arch!r}; load_gguf supports {', '.join(ARCHITECTURES)}",
        )
    return arch


def _config(gf: GgufFile):
    import transformers

    arch = _architecture(gf)
    names = {t.name: t for t in gf.tensors}
    if "token_embd.weight" not in names:
        raise GgufError(gf.path, "no token_embd.weight tensor (the vocabulary size comes from it)")
    hidden = int(_meta(gf, f"{arch}.embedding_length", required=True))
    heads = int(_meta(gf, f"{arch}.attention.head_count", required=True))
    kwargs = dict(
        vocab_size=int(_meta(gf, f"{arch}.vocab_size", names["token_embd.weight"].n)),
        hidden_size=hidden,
        intermediate_size=int(_meta(gf, f"{arch}.feed_forward_length", required=True)),
        num_hidden_layers=int(_meta(gf, f"{arch}.block_count", required=True)),
        num_attention_heads=heads,
        num_key_value_heads=int(_meta(gf, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_meta(gf, f"{arch}.attention.key_length", hidden // heads)),
        max_position_embeddings=int(_meta(gf, f"{arch}.context_length", 4096)),
        rms_norm_eps=float(_meta(gf, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_meta(gf, f"{arch}.rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in names,
    )
    for key, arg in (
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ):
        if key in gf.metadata:
            kwargs[arg] = int(gf.metadata[key])
    return getattr(transformers, _ARCH_CLASSES[arch][0])(**kwargs)


def config_from_gguf(path: str | os.PathLike):
    """A ``transformers.LlamaConfig`` from a llama.cpp GGUF file's ``llama.*`` metadata.

    Read: ``embedding_length``, ``feed_forward_length``, ``block_count``,
    ``attention.head_count`` (required); ``attention.head_count_kv``,
    ``attention.key_length``, ``context_length``, ``attention.layer_norm_rms_epsilon``,
    ``rope.freq_base``, ``vocab_size`` (else ``token_embd.weight``'s rows) and the
    tokenizer's bos/eos/padding ids when present. ``tie_word_embeddings`` is True
    when the file has no ``output.weight``.

    Raises:
        GgufError: not a ``llama`` file, or a required key or tensor missing.
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
) -> torch.nn.Module:
    """A transformers Llama model with the GGUF file's weights; Q2_0 linears as ``Q2Linear``.

    Args:
        path: the ``.gguf`` file (``general.architecture`` ``"llama"`` or ``"qwen2"``).
        model: a ``LlamaForCausalLM`` (``Qwen2ForCausalLM``) to fill in place (its
            shapes must match the file); None builds one from :func:`config_from_gguf`
            (without random initialization) in ``dtype``.
        numerics: the ``Q2Linear`` layers' numerics contract (None: library default).
        dtype: parameter dtype of a model built here (float tensors are converted to
            each parameter's dtype either way).
        ambiguous_group: as for :func:`q2gemv.io.load_q2_weights`.
        progress: one progress step per tensor, on stderr (None: shown on a terminal for
            large models, through tqdm when installed; see :func:`quantize_model`).

    Everything is read and checked before ``model`` is changed (see the module
    docstring for the names, the Q/K rows and what is refused). The model is
    returned in eval mode on the CPU (move it with ``.to("cuda")``).

    Raises:
        GgufError: an unsupported type or architecture, a tensor without a module, a
            shape mismatch, or a parameter the file lacks (naming the tensor).
    """
    wants_progress(progress, 0, False)  # TypeError naming progress
    path = os.fspath(path)
    gf = read_gguf(path)
    _architecture(gf)
    q2 = load_q2_weights(path, ambiguous_group=ambiguous_group)
    built = model is None
    if built:
        import transformers

        config = _config(gf)
        config.dtype = dtype
        model_class = getattr(transformers, _ARCH_CLASSES[_architecture(gf)][1])
        with torch.device("meta"):
            model = model_class(config).to(dtype)
    elif not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"model: expected a transformers model or None, got {type(model).__name__}")
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
    record_quantization_config(model)  # so save_pretrained writes a loadable model
    return model.eval()


def _device_of(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        if not p.is_meta:
            return p.device
    return torch.device("cpu")

"""Tiny Llama and Qwen2 models made in code, and a llama.cpp-style GGUF file of a Llama
(for tests/models/)."""

from __future__ import annotations

import numpy as np
import torch

import q2gemv
from q2gemv import quantize_q2_0

HEADS, KV_HEADS = 4, 2
# The sizes both tiny models share (vocab 192: prompts() draws token ids below it).
TINY_SIZES = dict(
    vocab_size=192,
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=64,
)


def tiny_config(layers: int = 2, tie: bool = False):
    from transformers import LlamaConfig

    return LlamaConfig(
        **TINY_SIZES,
        num_hidden_layers=layers,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
    )


def tiny_llama(seed: int = 0, layers: int = 2, tie: bool = False):
    """A LlamaForCausalLM with random bf16 weights (norm weights random too, so they matter).

    The rotary embedding's buffers stay fp32, as ``from_pretrained(dtype=torch.bfloat16)``
    and ``load_gguf`` make them (``.to(torch.bfloat16)`` would round them).
    """
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    torch.manual_seed(seed)
    config = tiny_config(layers, tie)
    return _randomized(LlamaForCausalLM(config), LlamaRotaryEmbedding(config=config))


def _randomized(model, rotary_emb, biases: bool = False):
    """``model`` in bf16 (eval) with an fp32 ``rotary_emb``, its norm weights (and, with
    ``biases``, its biases) drawn at random in parameter order."""
    model = model.to(torch.bfloat16).eval()
    model.model.rotary_emb = rotary_emb
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.25 * torch.randn_like(p, dtype=torch.float32))
            elif biases and name.endswith(".bias"):
                p.copy_(0.5 * torch.randn_like(p, dtype=torch.float32))
    return model


def llama_cpp_permute(n_rows: int, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's ``LlamaModel.permute`` on row indices: gguf = hf[idx]."""
    return np.arange(n_rows).reshape(heads, 2, n_rows // heads // 2).swapaxes(1, 2).reshape(-1)


_BLOCK = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy()


def write_llama_gguf(model, path, group: int = 128, type_id: int = 142) -> None:
    """Write ``model`` as llama.cpp would, with the ``gguf`` package: linears Q2_0, Q/K permuted.

    Embeddings and lm_head BF16, attention norms F16, the other norms F32.
    """
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    bf16 = gguf.GGMLQuantizationType.BF16
    w.add_tensor("token_embd.weight", _bf16_bits(model.model.embed_tokens.weight), raw_dtype=bf16)
    w.add_tensor("output_norm.weight", model.model.norm.weight.float().detach().numpy())
    if not cfg.tie_word_embeddings:
        w.add_tensor("output.weight", _bf16_bits(model.lm_head.weight), raw_dtype=bf16)
    for i, layer in enumerate(model.model.layers):
        w.add_tensor(
            f"blk.{i}.attn_norm.weight",
            layer.input_layernorm.weight.detach().to(torch.float16).numpy(),
        )
        w.add_tensor(
            f"blk.{i}.ffn_norm.weight",
            layer.post_attention_layernorm.weight.float().detach().numpy(),
        )
        for module, short in _BLOCK.items():
            weight = layer.get_submodule(module).weight.detach().float().numpy()
            q = quantize_q2_0(weight, group=group)
            rows = np.asarray(q.raw).reshape(q.n, -1)
            if short in ("attn_q", "attn_k"):
                heads = cfg.num_attention_heads if short == "attn_q" else cfg.num_key_value_heads
                rows = rows[llama_cpp_permute(q.n, heads)]
            w.add_tensor(
                f"blk.{i}.{short}.weight",
                np.ascontiguousarray(rows).view(np.int8),
                raw_shape=(q.n, q.k),
                raw_dtype=type_id,
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_qwen2(seed: int = 0, layers: int = 2, tie: bool = True):
    """A Qwen2ForCausalLM with random bf16 weights (q/k/v biases and norms random too)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    torch.manual_seed(seed)
    config = Qwen2Config(
        **TINY_SIZES,
        num_hidden_layers=layers,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
    )
    return _randomized(Qwen2ForCausalLM(config), Qwen2RotaryEmbedding(config=config), biases=True)


def equal_amax_per_group(model, value: float = 0.125) -> None:
    """Give q/k/v and gate/up of every layer one max |w| (one element set to ``value``), so
    ``Nvfp4Weight.from_float`` gives them bit-equal global scales (fusable NVFP4 members)."""
    with torch.no_grad():
        for layer in model.model.layers:
            for parent, names in (
                (layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                (layer.mlp, ("gate_proj", "up_proj")),
            ):
                for name in names:
                    w = getattr(parent, name).weight
                    w.clamp_(-value / 2, value / 2)
                    w[0, 0] = value


def u16(t: torch.Tensor) -> np.ndarray:
    """A bf16 tensor's bits as uint16."""
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape, what
    q2gemv.golden.check.assert_bits_equal(u16(got), u16(want), what)


def prompts(batch: int = 2, length: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, TINY_SIZES["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed)
    )

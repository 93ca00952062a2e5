"""A transformers Llama end to end: quantize with q2gemv, decode with a static cache + CUDA graph.

Builds a small Llama (random weights, from a config in code: no download), swaps its
Linear layers for q2gemv ``Q2Linear`` (group 128) with ``quantize_model``, writes it
as a llama.cpp-style GGUF file and loads it back with ``load_gguf``, then decodes
greedily with ``CapturedDecoder`` (on CUDA: one captured decode step replayed per
token; on the CPU: the same step run eagerly through q2gemv's NumPy reference) and
compares the tokens with ``model.generate``.

    python examples/model_decode.py            # prints the report, the tokens, then "OK"

For a real checkpoint: ``model = q2gemv.torch.load_gguf("model-Q2_0.gguf")`` (a Llama
GGUF with Q2_0/PQ2_0 linears), or ``load_safetensors(dir, model)`` for NVFP4.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from q2gemv import quantize_q2_0
from q2gemv.torch import CapturedDecoder, load_gguf, quantize_model

HEADS, KV_HEADS = 4, 2


def build_model(seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer Llama (hidden 128, MLP 256, vocabulary 192) with random bf16 weights."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=192,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    # .to(bfloat16) also rounds the rotary frequencies; from_pretrained(dtype=torch.bfloat16)
    # and load_gguf keep them fp32: rebuild them so both models agree
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model


def write_gguf(model: LlamaForCausalLM, path: Path) -> None:
    """The model as llama.cpp's converter writes it: Q2_0 (PQ2_0) linears, Q/K rows permuted."""
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
    emb = model.model.embed_tokens.weight.detach().view(torch.int16).numpy()
    w.add_tensor("token_embd.weight", emb, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.add_tensor("output_norm.weight", model.model.norm.weight.detach().float().numpy())
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output"}
    names |= {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for i, layer in enumerate(model.model.layers):
        for norm, short in (
            (layer.input_layernorm, "attn_norm"),
            (layer.post_attention_layernorm, "ffn_norm"),
        ):
            w.add_tensor(f"blk.{i}.{short}.weight", norm.weight.detach().float().numpy())
        for parent in (layer.self_attn, layer.mlp):
            for attr, short in names.items():
                if not hasattr(parent, attr):
                    continue
                q = quantize_q2_0(getattr(parent, attr).weight.detach().float().numpy(), group=128)
                rows = np.asarray(q.raw).reshape(q.n, -1)
                if short in ("attn_q", "attn_k"):  # llama.cpp's LlamaModel.permute, on rows
                    heads = HEADS if short == "attn_q" else KV_HEADS
                    rows = rows[np.arange(q.n).reshape(heads, 2, -1).swapaxes(1, 2).reshape(-1)]
                raw = np.ascontiguousarray(rows).view(np.int8)
                w.add_tensor(f"blk.{i}.{short}.weight", raw, raw_shape=(q.n, q.k), raw_dtype=142)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(device: str | None = None) -> int:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tiny-Q2_0.gguf"
        write_gguf(model, path)
        loaded = load_gguf(path).to(device)  # Q2Linear layers straight from the file
    report = quantize_model(model, "q2_0", group=128)  # the same weights, quantized here
    print(report)
    model = model.to(device)

    ids = torch.randint(0, 192, (2, 8), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        same = torch.equal(
            loaded(ids).logits.view(torch.int16), model(ids).logits.view(torch.int16)
        )
    print(f"load_gguf logits bit-equal to quantize_model's: {same}")

    decoder = CapturedDecoder(model, max_len=32)  # static cache; a CUDA graph on a GPU
    tokens = decoder.generate(ids, max_new_tokens=12)
    want = model.generate(
        ids, max_new_tokens=12, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids)
    )
    print(tokens[:, 8:].tolist())
    print(f"captured={decoder.capture}: tokens equal model.generate's: {torch.equal(tokens, want)}")
    ok = same and (torch.equal(tokens, want) or device != "cpu")
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

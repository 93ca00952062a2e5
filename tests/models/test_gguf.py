"""``load_gguf`` on hostile or inconsistent files (issue 33, items 12, 13, 16).

GGUF files are ``write_llama_gguf``'s, edited while the ``gguf`` package writes them
(metadata values replaced, tensors renamed or written twice). Safetensors files:
tests/models/test_safetensors.py.
"""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from q2gemv.io import GgufError  # noqa: E402
from q2gemv.torch import (  # noqa: E402
    config_from_gguf,
    load_gguf,
)

from ..model_cases import tiny_config, tiny_llama, write_llama_gguf  # noqa: E402

T = gguf.GGUFValueType


def llama_gguf(tmp_path, monkeypatch, *, kv=None, rename=None, copies=None, name="m.gguf"):
    """The GGUF file of ``tiny_llama(layers=1)``, edited as the ``gguf`` package writes it.

    ``kv``: metadata key -> ``(GGUFValueType, value)`` (replaces or adds the key) or None
    (leaves it out); ``rename``: tensor name -> the name written instead; ``copies``:
    tensor name -> a second name under which the same data is written too.
    """
    kv, rename, copies = dict(kv or {}), dict(rename or {}), dict(copies or {})
    left = dict(kv)

    class Writer(gguf.GGUFWriter):
        def add_key_value(self, key, val, vtype, sub_type=None):
            if key in kv:
                left.pop(key, None)
                if kv[key] is None:
                    return
                vtype, val = kv[key]
            super().add_key_value(key, val, vtype, sub_type)

        def add_tensor(self, tname, *args, **kwargs):
            super().add_tensor(rename.get(tname, tname), *args, **kwargs)
            if tname in copies:
                super().add_tensor(copies[tname], *args, **kwargs)

        def write_header_to_file(self, *args, **kwargs):
            for key, value in left.items():  # keys write_llama_gguf does not write
                if value is not None:
                    super().add_key_value(key, value[1], value[0])
            super().write_header_to_file(*args, **kwargs)

    path = tmp_path / name
    with monkeypatch.context() as mp:
        mp.setattr(gguf, "GGUFWriter", Writer)
        write_llama_gguf(tiny_llama(layers=1), path)
    return path


def _loads(path):
    """Every way of reading the file: config only, a model built here, a model given."""
    return {
        "config_from_gguf": lambda: config_from_gguf(path),
        "load_gguf": lambda: load_gguf(path),
        "load_gguf(model)": lambda: load_gguf(path, tiny_llama(layers=1)),
    }


# -- item 12: one spelling per layer index ----------------------------------------------------


@pytest.mark.parametrize("alias", ["00", "0000", "\u0660", "\uff10", "+0", "0_0"])
def test_gguf_alias_layer_names_are_refused(tmp_path, monkeypatch, alias):
    real, fake = "blk.0.attn_q.weight", f"blk.{alias}.attn_q.weight"
    only = llama_gguf(tmp_path, monkeypatch, rename={real: fake}, name="only.gguf")
    for what, load in _loads(only).items():
        with pytest.raises(GgufError, match="canonical") as info:
            load()
        assert info.value.tensor == fake, what
    both = llama_gguf(tmp_path, monkeypatch, copies={real: fake}, name="both.gguf")
    for what, load in _loads(both).items():
        with pytest.raises(GgufError) as info:
            load()
        assert repr(real) in str(info.value) and repr(fake) in str(info.value), what


# -- item 13: the model's head counts are the file's ------------------------------------------


def test_load_gguf_refuses_a_model_with_other_head_counts(tmp_path, monkeypatch):
    from transformers import LlamaForCausalLM

    path = llama_gguf(tmp_path, monkeypatch)  # 4 heads, 2 KV heads, head_dim 32
    cfg = tiny_config(layers=1)
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 8, 4, 16  # same shapes
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(GgufError) as info:
        load_gguf(path, model)
    msg = str(info.value)
    for want in (
        "num_attention_heads 8",
        "llama.attention.head_count = 4",
        "num_key_value_heads 4",
        "llama.attention.head_count_kv = 2",
        "head_dim 16",
    ):
        assert want in msg, msg
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed by a refused load"


# -- item 16: metadata checked (types, ranges, the tensors) before anything is built ----------

BAD_METADATA = [
    ("llama.attention.head_count", (T.UINT32, 0), "head_count = 0: expected"),
    ("llama.attention.head_count", (T.INT32, -4), "head_count = -4: expected"),
    ("llama.attention.head_count", (T.STRING, "abc"), "head_count.*string.*expected an integer"),
    ("llama.attention.head_count", (T.BOOL, True), "head_count.*bool.*expected an integer"),
    ("llama.embedding_length", (T.FLOAT32, 128.9), "embedding_length.*float32.*expected an int"),
    ("llama.embedding_length", (T.UINT32, 64), "embedding_length = 64.*token_embd.weight"),
    ("llama.feed_forward_length", (T.UINT32, 512), "feed_forward_length = 512.*ffn_"),
    ("llama.block_count", (T.UINT32, 10**9), "block_count = 1000000000.*layer"),
    ("llama.block_count", (T.UINT32, 2), "block_count = 2.*layer"),
    ("llama.block_count", (T.UINT64, 2**64 - 1), "block_count = 18446744073709551615"),
    ("llama.block_count", None, "block_count.*missing"),
    ("llama.attention.head_count_kv", (T.UINT32, 3), "head_count_kv = 3"),
    ("llama.attention.key_length", (T.UINT32, 16), "key_length = 16.*attn_q"),
    ("llama.attention.key_length", (T.UINT32, 33), "key_length = 33"),
    ("llama.vocab_size", (T.UINT32, 10**6), "vocab_size = 1000000.*token_embd"),
    ("llama.attention.layer_norm_rms_epsilon", (T.FLOAT32, math.nan), "epsilon = nan"),
    ("llama.attention.layer_norm_rms_epsilon", (T.STRING, "1e-5"), "epsilon.*string"),
    ("llama.rope.freq_base", (T.FLOAT32, -1.0), "freq_base = -1.0"),
    ("llama.rope.freq_base", (T.FLOAT64, math.inf), "freq_base = inf"),
    ("llama.context_length", (T.UINT64, 2**40), "context_length = 1099511627776"),
    ("tokenizer.ggml.eos_token_id", (T.FLOAT32, 2.5), "eos_token_id.*float32"),
]


@pytest.mark.parametrize(
    "key, value, match", BAD_METADATA, ids=[f"{k}={v}" for k, v, _ in BAD_METADATA]
)
def test_gguf_metadata_is_checked_before_a_model_is_built(tmp_path, monkeypatch, key, value, match):
    path = llama_gguf(tmp_path, monkeypatch, kv={key: value})
    for what, load in _loads(path).items():
        with pytest.raises(GgufError, match=match) as info:
            load()
        assert str(path) in str(info.value), what


def test_gguf_metadata_of_other_integer_and_float_types_is_read(tmp_path, monkeypatch):
    kv = {
        "llama.attention.head_count": (T.UINT64, 4),
        "llama.attention.head_count_kv": (T.INT16, 2),
        "llama.block_count": (T.INT32, 1),
        "llama.rope.freq_base": (T.FLOAT64, 10000.0),
        "llama.attention.layer_norm_rms_epsilon": (T.FLOAT64, 1e-5),
    }
    cfg = config_from_gguf(llama_gguf(tmp_path, monkeypatch, kv=kv))
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers) == (4, 2, 1)
    assert cfg.rms_norm_eps == 1e-5 and cfg.rope_parameters["rope_theta"] == 10000.0

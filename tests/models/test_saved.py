"""Saving and loading quantized models (``q2gemv.models.saved``, ``q2gemv.models.hf``).

CPU only, tiny Llama and Qwen2 models (tests/model_cases.py). A model quantized by
``quantize_model`` is saved with ``save_pretrained`` and loaded back by
``AutoModelForCausalLM.from_pretrained`` into an empty (meta) model through the
``"q2gemv"`` quantizer: the logits and the generated tokens are compared bit for bit
with the model before saving. Also the plain torch road (``safetensors`` files,
``quantize_model`` on a meta model, ``load_state_dict(assign=True)``) and the refusals.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from q2gemv.models.meta import finish_meta_model  # noqa: E402
from q2gemv.torch import Nvfp4Linear, Q2Linear, quantize_model  # noqa: E402

from ..model_cases import assert_same_bits, prompts, tiny_llama, tiny_qwen2  # noqa: E402

MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2}
LAYERS = {"q2_0": Q2Linear, "nvfp4": Nvfp4Linear}


def run(model, ids):
    """Logits of ``ids`` and 3 greedy tokens with their logits."""
    with torch.no_grad():
        logits = model(ids).logits
    out = model.generate(
        ids,
        max_new_tokens=3,
        do_sample=False,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
        output_logits=True,
        return_dict_in_generate=True,
    )
    return logits, out.sequences, torch.stack(out.logits)


def no_quantizing(monkeypatch):
    """Loading must not quantize: every road from float weights to a layer raises."""

    def refuse(*args, **kwargs):
        raise AssertionError("a float weight was quantized while loading")

    monkeypatch.setattr(Q2Linear, "from_linear", classmethod(refuse))
    monkeypatch.setattr(Nvfp4Linear, "from_linear", classmethod(refuse))


def fused_names(layers: int = 2) -> list[list[str]]:
    out = []
    for i in range(layers):
        p = f"model.layers.{i}."
        out.append([f"{p}self_attn.{m}" for m in ("q_proj", "k_proj", "v_proj")])
        out.append([f"{p}mlp.{m}" for m in ("gate_proj", "up_proj")])
    return out


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize("fmt", list(LAYERS))
def test_save_pretrained_then_from_pretrained_is_bit_exact(tmp_path, monkeypatch, arch, fmt, fuse):
    from transformers import AutoModelForCausalLM

    from ..model_cases import equal_amax_per_group

    model = MODELS[arch]()
    if fuse and fmt == "nvfp4":
        equal_amax_per_group(model)  # NVFP4 members fuse only with bit-equal global scales
    report = quantize_model(model, fmt, numerics="seed" if fmt == "q2_0" else None, fuse=fuse)
    assert len(report.fused) == (4 if fuse else 0) and not report.not_fused
    ids = prompts()
    want = run(model, ids)
    model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "q2gemv",
        "version": 1,
        "format": fmt,
        "group": 128 if fmt == "q2_0" else None,
        "numerics": "seed" if fmt == "q2_0" else None,
        "modules_to_not_convert": ["lm_head"],
        "fused_projections": fused_names() if fuse else [],
    }

    no_quantizing(monkeypatch)
    loaded, info = AutoModelForCausalLM.from_pretrained(
        tmp_path / "saved", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    layers = {n: m for n, m in loaded.named_modules() if isinstance(m, LAYERS[fmt])}
    assert len(layers) == (8 if fuse else 14) and isinstance(loaded.lm_head, torch.nn.Linear)
    assert (
        loaded.config.quantization_config.fused_projections
        == config["quantization_config"]["fused_projections"]
    )
    for name, layer in layers.items():
        source = model.get_submodule(name)
        assert layer.numerics == source.numerics, name
        if fmt == "nvfp4":
            assert layer.global_scale == source.global_scale, name
    got = run(loaded, ids)
    assert_same_bits(got[0], want[0], f"{arch} {fmt} logits")
    assert torch.equal(got[1], want[1])
    assert_same_bits(got[2], want[2], f"{arch} {fmt} generate logits")

    loaded.save_pretrained(tmp_path / "again")  # a loaded model saves the same tensors
    a = safetensors_torch.load_file(tmp_path / "saved" / "model.safetensors")
    b = safetensors_torch.load_file(tmp_path / "again" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fmt", list(LAYERS))
def test_an_fp16_model_round_trips_bit_exact(tmp_path, fmt):
    """fp16 (Qwen2: biased q/k/v): saved and loaded in fp16, the biases stay fp16 and the
    logits and tokens are those of the model before saving."""
    from transformers import AutoModelForCausalLM
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    model = tiny_qwen2().to(torch.float16)
    model.model.rotary_emb = Qwen2RotaryEmbedding(config=model.config)  # fp32, as loading has it
    quantize_model(model, fmt)
    ids = prompts()
    want = run(model, ids)
    model.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float16)
    biases = [b for n, b in loaded.named_buffers() if n.endswith("proj.bias")]
    assert biases and all(b.dtype == torch.float16 for b in biases)
    got = run(loaded, ids)
    assert got[0].dtype == torch.float16
    assert_same_bits(got[0], want[0], f"fp16 {fmt} logits")
    assert torch.equal(got[1], want[1])


def test_a_quantized_tied_head_is_untied_and_round_trips(tmp_path):
    """Qwen2 ties lm_head to the embeddings; a quantized head has its own bytes."""
    from transformers import AutoModelForCausalLM

    model = tiny_qwen2(layers=1)
    assert model.config.tie_word_embeddings
    quantize_model(model, "q2_0", skip=())
    assert isinstance(model.lm_head, Q2Linear) and not model.config.tie_word_embeddings
    ids = prompts()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(loaded.lm_head, Q2Linear)
    with torch.no_grad():
        assert_same_bits(loaded(ids).logits, model(ids).logits, "quantized tied head")


@pytest.mark.parametrize("source", ["gguf", "modelopt"])
def test_a_model_from_the_loaders_saves_and_reloads(tmp_path, source):
    """load_gguf / load_safetensors record the quantization_config too."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    from q2gemv.torch import load_gguf, load_safetensors

    from ..model_cases import write_llama_gguf
    from .test_models import write_modelopt

    float_model = tiny_llama(layers=1)
    if source == "gguf":
        write_llama_gguf(float_model, tmp_path / "tiny.gguf", group=64, type_id=42)
        model = load_gguf(tmp_path / "tiny.gguf")
    else:
        write_modelopt(float_model, tmp_path / "nvfp4.safetensors")
        with torch.device("meta"):
            model = LlamaForCausalLM(float_model.config).to(torch.bfloat16)
        load_safetensors(tmp_path / "nvfp4.safetensors", model)
    cfg = model.config.quantization_config
    assert (cfg["format"], cfg["group"]) == (("q2_0", 64) if source == "gguf" else ("nvfp4", None))
    model.save_pretrained(tmp_path / "saved")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    ids = prompts()
    with torch.no_grad():
        assert_same_bits(loaded(ids).logits, model(ids).logits, f"{source}, saved and reloaded")


@pytest.mark.parametrize("fuse", [False, True])
def test_plain_torch_road_safetensors_into_a_meta_model(tmp_path, fuse):
    """save_file(state_dict) / quantize_model on a meta model / load_state_dict(assign=True)."""
    from transformers import LlamaForCausalLM

    model = tiny_llama()
    quantize_model(model, "q2_0", group=64, fuse=fuse)
    state = model.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    safetensors_torch.save_file(state, tmp_path / "model.safetensors")

    with torch.device("meta"):
        empty = LlamaForCausalLM(model.config).to(torch.bfloat16)
    report = quantize_model(empty, "q2_0", group=64, fuse=fuse)
    assert len(report.replaced) == 14 and list(report.skipped) == ["lm_head"]
    name = "qkv_proj" if fuse else "q_proj"  # the fused layer holds q, k and v's rows
    q = getattr(empty.model.layers[0].self_attn, name)
    assert isinstance(q, Q2Linear) and q.raw.is_meta and q.group == 64
    assert q.raw.shape == getattr(model.model.layers[0].self_attn, name).raw.shape
    empty.load_state_dict(safetensors_torch.load_file(tmp_path / "model.safetensors"), assign=True)
    finish_meta_model(empty, "test")
    ids = prompts()
    with torch.no_grad():
        assert_same_bits(empty.eval()(ids).logits, model(ids).logits, "meta road logits")


def test_quantization_config_names_the_float_linears_and_refuses_mixed_layers():
    model = tiny_llama()
    quantize_model(model, "nvfp4", skip=("lm_head", "down_proj"))
    cfg = model.config.quantization_config
    assert cfg["modules_to_not_convert"] == [
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.down_proj",
        "lm_head",
    ]
    with pytest.warns(UserWarning, match="quantization_config not recorded.*2 kinds"):
        quantize_model(model, "q2_0", skip=("lm_head",))
    assert getattr(model.config, "quantization_config", None) is None


def _saved(tmp_path, fmt="q2_0"):
    model = tiny_llama(layers=1)
    quantize_model(model, fmt)
    model.save_pretrained(tmp_path)
    return model


@pytest.mark.parametrize(
    "change, match",
    [
        ({"fused_projections": [["q_proj", "v_proj"]]}, "fused_projections entry"),
        ({"fused_projections": "qkv"}, "fused_projections expected a list"),
        ({"version": 2}, "version 2 is not one this q2gemv reads"),
        ({"group": 32}, r"group expected one of \(64, 128\)"),
        ({"colour": "red"}, r"unknown keys \['colour'\]"),
    ],
)
def test_from_pretrained_refuses_a_config_it_cannot_follow(tmp_path, change, match):
    from transformers import AutoModelForCausalLM

    _saved(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"].update(change)
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "key, match",
    [
        (
            "model.layers.0.mlp.down_proj._extra_state",
            r"no q2gemv state for 1 layer.*mlp\.down_proj'",
        ),
        (
            "model.layers.0.mlp.gate_up_proj.raw",
            r"no tensor for 1 q2gemv buffer.*mlp\.gate_up_proj\.raw'",
        ),
    ],
)
def test_from_pretrained_refuses_a_checkpoint_without_a_layer_tensor(tmp_path, key, match):
    """transformers only warns (and leaves the tensor uninitialized): refused after loading."""
    from transformers import AutoModelForCausalLM

    _saved(tmp_path)
    tensors = safetensors_torch.load_file(tmp_path / "model.safetensors")
    del tensors[key]
    safetensors_torch.save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=match):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_quantizing_while_loading_a_float_checkpoint_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM

    from q2gemv.models.hf import Q2gemvConfig

    tiny_llama(layers=1).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="q2gemv does require the model to be pre-quantized"):
        AutoModelForCausalLM.from_pretrained(tmp_path, quantization_config=Q2gemvConfig())


def test_from_pretrained_refuses_a_state_of_another_group(tmp_path):
    """The config says group 128; a layer's state says 64 (a hand-edited checkpoint)."""
    from transformers import AutoModelForCausalLM

    _saved(tmp_path)
    tensors = safetensors_torch.load_file(tmp_path / "model.safetensors")
    key = "model.layers.0.mlp.gate_up_proj._extra_state"  # fused: gate_proj and up_proj
    state = json.loads(bytes(tensors[key].numpy()))
    text = json.dumps({**state, "group": 64}).encode()
    tensors[key] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    safetensors_torch.save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="state: expected a Q2Linear state"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("order", ["q2gemv first", "transformers first"])
def test_import_q2gemv_torch_registers_the_quantizer_in_either_order(order):
    imports = ["import q2gemv.torch", "import transformers.quantizers.auto as auto"]
    if order == "transformers first":
        imports.reverse()
    code = "; ".join(
        [
            *imports,
            "from q2gemv.models.hf import Q2gemvConfig, Q2gemvHfQuantizer",
            "assert auto.AUTO_QUANTIZER_MAPPING['q2gemv'] is Q2gemvHfQuantizer",
            "assert auto.AUTO_QUANTIZATION_CONFIG_MAPPING['q2gemv'] is Q2gemvConfig",
            "import q2gemv.models.hf as hf; hf.register()",  # idempotent
        ]
    )
    subprocess.run([sys.executable, "-W", "error", "-c", code], check=True)

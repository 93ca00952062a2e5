"""``save_gguf`` / ``save_safetensors`` (q2gemv.models.export): write, read back, same bits.

CPU only (reference backend). Every round trip compares logits bit for bit: quantize a
tiny Llama or Qwen2, write it, load it into a fresh model (built on the meta device
from the file's own config), run both. The GGUF layout is also checked against the
tests' llama.cpp-style writer (``model_cases.write_llama_gguf``: the ``gguf`` package
and llama.cpp's own Q/K permutation), byte for byte.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("safetensors")

import q2gemv  # noqa: E402
import q2gemv.torch  # noqa: E402  (before q2gemv.models.export: it imports q2gemv.torch)
from q2gemv.formats.nvfp4 import Nvfp4Weight, divisor_from_global_scale  # noqa: E402
from q2gemv.io import load_q2_weights, read_gguf  # noqa: E402
from q2gemv.models import export  # noqa: E402
from q2gemv.models.gguf import hf_rows_from_gguf  # noqa: E402
from q2gemv.torch import (  # noqa: E402
    Nvfp4Linear,
    Q2Linear,
    config_from_gguf,
    load_gguf,
    load_safetensors,
    quantize_model,
    save_gguf,
    save_safetensors,
)

from ..model_cases import (  # noqa: E402
    llama_cpp_permute,
    tiny_llama,
    tiny_qwen2,
    u16,
    write_llama_gguf,
)


def assert_same_logits(got_model, want_model, seed: int = 3) -> None:
    ids = torch.randint(0, 192, (2, 7), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        got, want = got_model(ids).logits, want_model(ids).logits
    assert got.shape == want.shape
    q2gemv.golden.check.assert_bits_equal(u16(got), u16(want), "logits after the round trip")


def tiny(arch: str, **kw):
    return tiny_llama(**kw) if arch == "llama" else tiny_qwen2(**kw)


# -- GGUF ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("group, type_id, tie", [(128, 142, False), (64, 42, True)])
def test_save_gguf_then_load_gguf_gives_the_same_logits(tmp_path, arch, group, type_id, tie):
    model = tiny(arch, tie=tie)
    quantize_model(model, "q2_0", group=group)
    path = tmp_path / "model.gguf"
    save_gguf(model, path, name="tiny")
    gf = read_gguf(path)
    assert gf.metadata["general.architecture"] == arch
    assert gf.metadata["general.name"] == "tiny"
    q2 = [t for t in gf.tensors if t.is_q2]
    assert len(q2) == 14 and {(t.type_id, t.group) for t in q2} == {(type_id, group)}
    norms = [t for t in gf.tensors if t.name.endswith("norm.weight")]
    assert norms and all(t.type_name == "F32" for t in norms)
    assert ("output.weight" in {t.name for t in gf.tensors}) == (not tie)
    biases = sorted(t.name for t in gf.tensors if t.name.endswith(".bias"))
    assert len(biases) == (6 if arch == "qwen2" else 0)
    cfg = config_from_gguf(path)
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                "tie_word_embeddings", "bos_token_id", "eos_token_id"):  # fmt: skip
        assert getattr(cfg, key) == getattr(model.config, key), key
    assert cfg.model_type == arch
    assert len(model.config.quantization_config["fused_projections"]) == 4  # a fused model
    loaded = load_gguf(path, fuse=False)
    assert type(loaded) is type(model)
    assert sum(isinstance(m, Q2Linear) for m in loaded.modules()) == 14
    assert_same_logits(loaded, model)
    fused = load_gguf(path)  # fused again on loading: q/k/v and gate/up of each layer
    assert sum(isinstance(m, Q2Linear) for m in fused.modules()) == 8
    assert_same_logits(fused, model)


def test_save_gguf_writes_what_llama_cpps_converter_writes(tmp_path):
    """Same Q2 bytes (Q/K rows permuted by llama.cpp's own formula), names, types and metadata
    as the tests' llama.cpp-style writer; embeddings and lm_head BF16 with the same bits."""
    model = tiny_llama()
    ours, theirs = tmp_path / "ours.gguf", tmp_path / "theirs.gguf"
    write_llama_gguf(model, theirs, group=128, type_id=142)
    quantize_model(model, "q2_0", group=128)
    save_gguf(model, ours)
    a, b = read_gguf(ours), read_gguf(theirs)
    assert {t.name: (t.type_name, t.ne) for t in a.tensors if t.is_q2} == {
        t.name: (t.type_name, t.ne) for t in b.tensors if t.is_q2
    }
    qa, qb = load_q2_weights(ours), load_q2_weights(theirs)
    for name in qb:
        assert np.array_equal(np.asarray(qa[name].raw), np.asarray(qb[name].raw)), name
    for name in ("token_embd.weight", "output.weight"):
        ta, tb = a.tensor(name), b.tensor(name)
        assert ta.type_name == tb.type_name == "BF16"
        da = np.fromfile(ours, np.uint8, ta.nbytes, offset=ta.offset)
        db = np.fromfile(theirs, np.uint8, tb.nbytes, offset=tb.offset)
        assert np.array_equal(da, db), name
    for key, value in b.metadata.items():
        if key != "general.alignment":
            assert a.metadata[key] == value and a.metadata_types[key] == b.metadata_types[key], key


@pytest.mark.parametrize("n, heads", [(8, 1), (128, 4), (64, 2), (96, 3)])
def test_gguf_rows_from_hf_is_llama_cpps_permute_and_the_loaders_inverse(n, heads):
    rows = export.gguf_rows_from_hf(n, heads)
    assert np.array_equal(rows, llama_cpp_permute(n, heads))
    assert np.array_equal(rows[hf_rows_from_gguf(n, heads)], np.arange(n))
    with pytest.raises(ValueError, match="multiple of 2 \\* heads"):
        export.gguf_rows_from_hf(n + 1, heads)


def test_gguf_name_maps_every_parameter_of_llama_and_qwen2():
    assert export.gguf_name("model.layers.7.self_attn.q_proj.weight") == "blk.7.attn_q.weight"
    assert export.gguf_name("model.layers.0.self_attn.v_proj.bias") == "blk.0.attn_v.bias"
    assert export.gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert export.gguf_name("lm_head.weight") == "output.weight"
    assert export.gguf_name("model.layers.0.rotary.inv_freq") is None
    for model in (tiny_llama(layers=1), tiny_qwen2(layers=1, tie=False)):
        assert all(export.gguf_name(n) for n, _ in model.named_parameters())


def test_save_gguf_refusals(tmp_path):
    path = tmp_path / "x.gguf"
    nv = tiny_llama(layers=1)
    quantize_model(nv, "nvfp4")
    with pytest.raises(ValueError, match="Nvfp4Linear; save_gguf writes Q2_0"):
        save_gguf(nv, path)
    with pytest.raises(ValueError, match="save_gguf writes llama, qwen2"):
        save_gguf(torch.nn.Linear(4, 4), path)
    scaled = tiny_llama(layers=1)
    scaled.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    with pytest.raises(ValueError, match="rope_type 'linear'"):
        save_gguf(scaled, path)
    from transformers import LlamaForCausalLM

    cfg = tiny_llama(layers=1).config
    cfg.attention_bias = True
    biased = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with pytest.raises(ValueError, match="bias llama.cpp's llama does not hold"):
        save_gguf(biased, path)
    with pytest.raises(TypeError, match="progress"):
        save_gguf(tiny_llama(layers=1), path, progress="yes")
    assert not path.exists() and os.listdir(tmp_path) == []


def test_save_gguf_failing_part_way_leaves_the_old_file(tmp_path, monkeypatch):
    model = tiny_llama(layers=1)
    quantize_model(model, "q2_0")
    path = tmp_path / "model.gguf"
    path.write_bytes(b"old")
    calls = []

    def failing(layer):
        calls.append(layer)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        return layer.quantized_weight()

    monkeypatch.setattr(export, "q2_weight_of", failing)
    with pytest.raises(OSError, match="disk full"):
        save_gguf(model, path)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.gguf"]


def test_save_gguf_without_the_gguf_package(tmp_path, monkeypatch):
    model = tiny_llama(layers=1)
    quantize_model(model, "q2_0")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match="pip install gguf"):
        save_gguf(model, tmp_path / "x.gguf")
    assert os.listdir(tmp_path) == []


# -- NVFP4 safetensors -------------------------------------------------------------------------


def nvfp4_layers(model) -> dict[str, Nvfp4Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, Nvfp4Linear)}


def with_divisible_global_scales(model) -> None:
    """Swap each Nvfp4Linear for one whose multiplier g is fp32(1 / d) for an fp32 d (same codes
    and scales), so the compressed-tensors layout can hold it exactly."""
    for name, layer in nvfp4_layers(model).items():
        w = layer.quantized_weight()
        g = np.float32(1.0) / np.float32(np.float32(1.0) / np.float32(w.global_scale))
        new = Nvfp4Linear(Nvfp4Weight.from_parts(w.packed, w.scales, g), layer.bias)
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)


def load_folder(folder):
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    model_class = getattr(transformers, config.architectures[0])
    with torch.device("meta"):
        model = model_class(config).to(torch.bfloat16)
    return load_safetensors(folder, model)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("layout", ["compressed-tensors", "modelopt"])
def test_save_safetensors_then_load_safetensors_gives_the_same_logits(tmp_path, arch, layout):
    from safetensors import safe_open

    model = tiny(arch, tie=False)
    quantize_model(model, "nvfp4")
    if layout == "compressed-tensors":
        with_divisible_global_scales(model)
    save_safetensors(model, tmp_path / "ckpt", layout=layout)
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == layout and config["model_type"] == arch
    ignore = q["ignore"] if layout == "compressed-tensors" else q["exclude_modules"]
    assert ignore == ["lm_head"]
    if layout == "compressed-tensors":
        assert q["format"] == "nvfp4-pack-quantized"
        w = q["config_groups"]["group_0"]["weights"]
        assert (w["num_bits"], w["type"], w["strategy"], w["group_size"]) == (
            4, "float", "tensor_group", 16)  # fmt: skip
    suffixes = {
        "compressed-tensors": ("weight_packed", "weight_scale", "weight_global_scale", [1]),
        "modelopt": ("weight", "weight_scale", "weight_scale_2", []),
    }[layout]
    layers = nvfp4_layers(model)
    with safe_open(str(tmp_path / "ckpt" / "model.safetensors"), framework="pt") as f:
        for prefix, layer in layers.items():
            packed, scales, gscale = (f.get_tensor(f"{prefix}.{s}") for s in suffixes[:3])
            assert packed.dtype == torch.uint8 and scales.dtype == torch.float8_e4m3fn
            assert list(gscale.shape) == suffixes[3] and gscale.dtype == torch.float32
            g = np.float32(layer.global_scale)
            stored = np.float32(gscale.reshape(-1)[0].item())
            assert (np.float32(1.0) / stored if layout == "compressed-tensors" else stored) == g
            assert (f"{prefix}.bias" in f.keys()) == (layer.bias is not None)
    loaded = load_folder(tmp_path / "ckpt")
    assert len(nvfp4_layers(loaded)) == 14
    assert_same_logits(loaded, model)


@pytest.mark.filterwarnings("ignore:.*kept as separate layers")  # NVFP4 scales per projection
@pytest.mark.parametrize("file", ["gguf", "safetensors"])
def test_an_fp16_model_exports_and_loads_back_in_fp16(tmp_path, file):
    """An fp16 model (Qwen2: biased q/k/v) written by either exporter and loaded into an fp16
    model gives the same fp16 logits, bit for bit."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    model = tiny("qwen2", tie=False).to(torch.float16)
    model.model.rotary_emb = Qwen2RotaryEmbedding(config=model.config)  # fp32, as loading has it
    if file == "gguf":
        quantize_model(model, "q2_0")
        save_gguf(model, tmp_path / "model.gguf")
        loaded = load_gguf(tmp_path / "model.gguf", dtype=torch.float16)
    else:
        quantize_model(model, "nvfp4")
        with_divisible_global_scales(model)
        save_safetensors(model, tmp_path / "ckpt")
        import transformers

        config = transformers.AutoConfig.from_pretrained(tmp_path / "ckpt")
        with torch.device("meta"):
            empty = transformers.Qwen2ForCausalLM(config).to(torch.float16)
        loaded = load_safetensors(tmp_path / "ckpt", empty)
    assert {p.dtype for p in loaded.parameters() if p.is_floating_point()} == {torch.float16}
    ids = torch.randint(0, 192, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = loaded(ids).logits, model(ids).logits
    assert got.dtype == want.dtype == torch.float16
    q2gemv.golden.check.assert_bits_equal(u16(got), u16(want), f"fp16 logits through {file}")


@pytest.mark.parametrize("layout", ["compressed-tensors", "modelopt"])
def test_a_fused_nvfp4_model_is_written_as_its_members_and_fused_again(tmp_path, layout):
    from safetensors import safe_open

    from ..model_cases import equal_amax_per_group

    model = tiny_llama()
    equal_amax_per_group(model)  # one global scale per group: the members fuse
    separate = tiny_llama()
    equal_amax_per_group(separate)
    report = quantize_model(model, "nvfp4")
    quantize_model(separate, "nvfp4", fuse=False)
    assert len(report.fused) == 4 and not report.not_fused
    if layout == "compressed-tensors":  # a multiplier the divisor form holds (in place)
        for layer in nvfp4_layers(model).values():
            layer.global_scale = float(np.float32(1) / (np.float32(1) / np.float32(0.001)))
        for layer in nvfp4_layers(separate).values():
            layer.global_scale = float(np.float32(1) / (np.float32(1) / np.float32(0.001)))
    save_safetensors(model, tmp_path / "fused", layout=layout)
    save_safetensors(separate, tmp_path / "separate", layout=layout)
    with (
        safe_open(str(tmp_path / "fused" / "model.safetensors"), framework="pt") as a,
        safe_open(str(tmp_path / "separate" / "model.safetensors"), framework="pt") as b,
    ):
        assert sorted(a.keys()) == sorted(b.keys())  # per member: q_proj, k_proj, ...
        for key in a.keys():
            x, y = a.get_tensor(key), b.get_tensor(key)
            assert torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
    loaded = load_folder(tmp_path / "fused")
    assert len(nvfp4_layers(loaded)) == 8  # q/k/v and gate/up fused again
    assert_same_logits(loaded, model)
    assert_same_logits(loaded, separate)


def test_save_safetensors_compressed_tensors_global_scales_without_a_divisor(tmp_path):
    model = tiny_llama()
    quantize_model(model, "nvfp4")
    missing = [
        n
        for n, m in nvfp4_layers(model).items()
        if divisor_from_global_scale(m.global_scale) is None
    ]
    assert missing, "the tiny model's quantization has changed: pick a model with such a scale"
    with pytest.raises(ValueError, match=f"{len(missing)} NVFP4 layer.*{missing[0]}"):
        save_safetensors(model, tmp_path / "ckpt")
    assert not (tmp_path / "ckpt" / "model.safetensors").exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_safetensors(model, tmp_path / "ckpt", inexact="nearest")
    assert any("one fp32 ulp" in str(w.message) for w in caught)
    loaded = load_folder(tmp_path / "ckpt")
    for name, layer in nvfp4_layers(model).items():
        g = np.float32(layer.global_scale)
        want = np.float32(1.0) / np.float32(np.float32(1.0) / g)  # nearest divisor, reloaded
        assert np.float32(nvfp4_layers(loaded)[name].global_scale) == want
        assert (want == g) == (name not in missing)


def test_save_safetensors_refusals(tmp_path):
    q2 = tiny_llama(layers=1)
    quantize_model(q2, "q2_0")
    with pytest.raises(ValueError, match="Q2Linear; save_safetensors writes NVFP4"):
        save_safetensors(q2, tmp_path / "a")
    nv = tiny_llama(layers=1)
    with pytest.raises(ValueError, match="layout"):
        save_safetensors(nv, tmp_path / "a", layout="gptq")
    with pytest.raises(ValueError, match="inexact"):
        save_safetensors(nv, tmp_path / "a", inexact="round")
    assert not (tmp_path / "a").exists()


def test_save_safetensors_of_a_plain_module_writes_no_config(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(32, 8, bias=True), torch.nn.LayerNorm(8))
    net[0] = Nvfp4Linear.from_linear(net[0])
    save_safetensors(net, tmp_path / "m", layout="modelopt")
    assert os.listdir(tmp_path / "m") == ["model.safetensors"]
    fresh = torch.nn.Sequential(torch.nn.Linear(32, 8, bias=True), torch.nn.LayerNorm(8))
    load_safetensors(tmp_path / "m", fresh)
    x = torch.randn(3, 32).to(torch.bfloat16)
    with torch.no_grad():
        q2gemv.golden.check.assert_bits_equal(u16(fresh[0](x)), u16(net[0](x)), "layer")
    assert torch.equal(fresh[1].weight, net[1].weight)


def test_save_gguf_copies_the_tokenizer_of_a_gguf_file(tmp_path):
    import gguf

    source = tmp_path / "float.gguf"
    w = gguf.GGUFWriter(str(source), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(192)])
    w.add_token_scores([float(-i) for i in range(192)])
    w.add_token_types([1] * 192)
    w.add_bos_token_id(7)
    w.add_add_bos_token(True)
    w.add_chat_template("{{ messages }}")
    w.add_tensor("token_embd.weight", np.zeros((192, 128), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    model = tiny_llama(layers=1)
    quantize_model(model, "q2_0")
    path = tmp_path / "q2.gguf"
    save_gguf(model, path, tokenizer_from=source)
    got, want = read_gguf(path), read_gguf(source)
    keys = [k for k in want.metadata if k.startswith("tokenizer.")]
    assert len(keys) == 7
    for key in keys:
        assert got.metadata_types[key] == want.metadata_types[key], key
        assert np.array_equal(np.asarray(got.metadata[key]), np.asarray(want.metadata[key])), key
    assert got.metadata["tokenizer.ggml.eos_token_id"] == 2  # from the config, not in the source
    assert load_gguf(path).config.bos_token_id == 7
    bare = tmp_path / "bare.gguf"
    w = gguf.GGUFWriter(str(bare), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="tokenizer_from: .* has no tokenizer"):
        save_gguf(model, tmp_path / "x.gguf", tokenizer_from=bare)
    assert not (tmp_path / "x.gguf").exists()


def test_docs_export_recipes_run(tmp_path, monkeypatch):
    """The python blocks of docs/export.md run as written (in a scratch folder)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "export.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/export.md#block{i}", "exec"), {})
    assert sorted(os.listdir(tmp_path)) == ["tiny-nvfp4", "tiny-q2.gguf"]

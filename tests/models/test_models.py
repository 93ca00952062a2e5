"""``q2gemv.models`` (re-exported by ``q2gemv.torch``): a tiny transformers Llama end to end.

CPU only (the layers run q2gemv's reference backend). Every comparison is of bits or
token ids: ``quantize_model`` against layers computed by ``q2gemv.gemv(...,
backend="reference")`` directly; a llama.cpp-style GGUF file (written with the ``gguf``
package, Q/K rows permuted as llama.cpp's converter does) against ``quantize_model`` on
the same weights; an NVFP4 ModelOpt checkpoint against ``quantize_model(fmt="nvfp4")``;
the captured decoder (run eagerly here) against ``model.generate``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import q2gemv  # noqa: E402
from q2gemv.io import GgufError, SafetensorsError  # noqa: E402
from q2gemv.torch import (  # noqa: E402
    CapturedDecoder,
    Nvfp4Linear,
    Q2Linear,
    config_from_gguf,
    load_gguf,
    load_safetensors,
    quantize_model,
)

from ..model_cases import assert_same_bits, tiny_llama, write_llama_gguf  # noqa: E402

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ReferenceLinear(torch.nn.Module):
    """``x @ W.T`` by ``q2gemv.gemv(backend="reference")`` on a host weight (no q2gemv.torch)."""

    def __init__(self, weight) -> None:
        super().__init__()
        self.weight_q = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.detach().reshape(-1, self.weight_q.k).contiguous().view(torch.int16).numpy()
        np_dtype = np.float16 if x.dtype == torch.float16 else q2gemv.BF16  # bf16 or fp16 models
        y = q2gemv.gemv(a.view(np_dtype), self.weight_q, backend="reference")
        y = torch.from_numpy(np.ascontiguousarray(y).view(np.int16)).view(x.dtype)
        return y.reshape(*x.shape[:-1], self.weight_q.n)


def reference_model(model, fmt: str, group: int = 128):
    """``model`` with every projection replaced by a ReferenceLinear of the same quantized weight."""
    ref = copy.deepcopy(model)
    for layer in ref.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for attr in PROJ:
                lin = getattr(parent, attr, None)
                if lin is None:
                    continue
                w = lin.weight.detach().float().numpy()
                qw = (
                    q2gemv.quantize_q2_0(w, group=group)
                    if fmt == "q2_0"
                    else q2gemv.Nvfp4Weight.from_float(w)
                )
                setattr(parent, attr, ReferenceLinear(qw))
    return ref


def prompts(batch: int, length: int = 6, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 192, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_import_q2gemv_torch_does_not_import_transformers():
    import subprocess
    import sys

    code = (
        "import sys, q2gemv.torch as qt; "
        "assert callable(qt.quantize_model) and callable(qt.load_gguf); "
        "print(sorted(m for m in ('transformers', 'safetensors', 'gguf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- quantize_model ------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["q2_0", "nvfp4"])
def test_quantize_model_generates_like_reference_layers(fmt):
    model = tiny_llama()
    ref = reference_model(model, fmt)
    report = quantize_model(model, fmt)
    layer_type = Q2Linear if fmt == "q2_0" else Nvfp4Linear
    assert len(report.replaced) == 14 and all(
        isinstance(m, layer_type) for m in report.replaced.values()
    )
    assert list(report.skipped) == ["lm_head"] and "skip" in report.skipped["lm_head"]
    assert isinstance(model.lm_head, torch.nn.Linear)
    ids = prompts(2)
    with torch.no_grad():
        assert_same_bits(model(ids).logits, ref(ids).logits, f"{fmt} logits")
    kw = dict(
        max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids)
    )
    got, want = model.generate(ids, **kw), ref.generate(ids, **kw)
    assert torch.equal(got, want) and got.shape == (2, 12)


@pytest.mark.parametrize("fmt", ["q2_0", "nvfp4"])
def test_fp16_model_keeps_its_dtype_and_generates_like_reference_layers(fmt):
    """An fp16 model: quantize_model keeps fp16 (layers take and return fp16), the logits
    equal those of fp16 reference layers bit for bit, and generate gives the same tokens."""
    model = tiny_llama().to(torch.float16)
    ref = reference_model(model, fmt)
    quantize_model(model, fmt)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    ids = prompts(2)
    with torch.no_grad():
        logits = model(ids).logits
        assert logits.dtype == torch.float16
        assert_same_bits(logits, ref(ids).logits, f"{fmt} fp16 logits")
    kw = dict(
        max_new_tokens=4, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids)
    )
    got, want = model.generate(ids, **kw), ref.generate(ids, **kw)
    assert torch.equal(got, want) and got.shape == (2, 10)


def test_quantize_model_skips_and_reports():
    torch.manual_seed(0)
    shared = torch.nn.Linear(128, 128)
    model = torch.nn.ModuleDict(
        {
            "a": torch.nn.Sequential(shared, torch.nn.ReLU()),
            "b": torch.nn.Sequential(shared),
            "small": torch.nn.Linear(64, 32),  # K=64: not a multiple of group 128
            "attn": torch.nn.MultiheadAttention(128, 4),  # reads out_proj.weight itself
            "lm_head": torch.nn.Linear(128, 8),
        }
    ).to(torch.bfloat16)
    report = quantize_model(model, "q2_0", group=128)
    assert set(report.replaced) == {"a.0", "b.0"}
    assert model["a"][0] is model["b"][0] and isinstance(model["a"][0], Q2Linear)
    assert set(report.skipped) == {"small", "attn.out_proj", "lm_head"}
    assert "not a multiple of 128" in report.skipped["small"]
    assert "MultiheadAttention reads out_proj.weight" in report.skipped["attn.out_proj"]
    assert "small" in str(report) and "2 Linear layers replaced" in str(report)
    x = torch.randn(3, 1, 128).to(torch.bfloat16)
    model["attn"](x, x, x)  # still works


def test_quantize_model_group_64_takes_the_small_layer():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32)).to(torch.bfloat16)
    report = quantize_model(model, group=64, skip=())
    assert list(report.replaced) == ["0"] and model[0].group == 64


def test_quantize_model_all_or_nothing():
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.Linear(16, 16))
    model = model.to(
        torch.bfloat16
    )  # q2gemv layers take bf16 or fp16 models only (issue 33 item 15)
    with torch.no_grad():
        model[1].weight[3, 5] = float("inf")
    before = [type(m) for m in model]
    with pytest.raises(ValueError, match="layer '1'"):
        quantize_model(model, "nvfp4", skip=())
    assert [type(m) for m in model] == before


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(fmt="q4"), "fmt: expected"),
        (dict(group=96), "group: expected"),
        (dict(skip="lm_head"), "skip: expected"),
        (dict(numerics="fast"), "numerics"),
    ],
)
def test_quantize_model_refuses_bad_arguments(kwargs, match):
    model = torch.nn.Sequential(torch.nn.Linear(128, 16))
    with pytest.raises((ValueError, TypeError), match=match):
        quantize_model(model, **kwargs)
    assert isinstance(model[0], torch.nn.Linear)


# -- batch invariance -------------------------------------------------------------------------


@pytest.mark.parametrize("fuse", [False, True])
def test_batch_invariance_of_the_q2gemv_layers(fuse):
    model = tiny_llama()
    quantize_model(model, "q2_0", fuse=fuse)
    outputs: dict[str, list[torch.Tensor]] = {}

    def hook(name):
        return lambda mod, args, out: outputs.setdefault(name, []).append(out)

    for name, mod in model.named_modules():
        if isinstance(mod, Q2Linear):
            mod.register_forward_hook(hook(name))
    ids = prompts(3, seed=5)
    with torch.no_grad():
        alone = model(ids[1:2]).logits
        batch = model(ids).logits
    assert len(outputs) == (8 if fuse else 14)  # fused: qkv_proj and gate_up_proj per layer
    for name, (one, three) in outputs.items():
        assert_same_bits(three[1:2], one, name)
    assert_same_bits(batch[1:2], alone, "logits")


# -- GGUF -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("group, type_id, tie", [(128, 142, False), (64, 42, True)])
def test_load_gguf_gives_the_logits_of_quantize_model(tmp_path, group, type_id, tie, fuse):
    model = tiny_llama(tie=tie)
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(model, path, group=group, type_id=type_id)
    cfg = config_from_gguf(path)
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
    ):
        assert getattr(cfg, key) == getattr(model.config, key), key
    loaded = load_gguf(path, fuse=fuse)
    q2 = [m for m in loaded.modules() if isinstance(m, Q2Linear)]
    assert len(q2) == (8 if fuse else 14) and all(m.group == group for m in q2)
    quantize_model(model, "q2_0", group=group, fuse=not fuse)  # fused against separate
    ids = prompts(2, seed=3)
    with torch.no_grad():
        assert_same_bits(loaded(ids).logits, model(ids).logits, "gguf vs quantize_model")


def test_load_gguf_into_a_given_model(tmp_path):
    path = tmp_path / "tiny.gguf"
    source = tiny_llama(seed=0)
    write_llama_gguf(source, path)
    target = tiny_llama(seed=1)  # same shapes, other weights
    assert load_gguf(path, target) is target
    quantize_model(source, "q2_0")
    ids = prompts(1, seed=4)
    with torch.no_grad():
        assert_same_bits(target(ids).logits, source(ids).logits, "loaded into a given model")


def _gguf_with(tmp_path, extra: dict, arch: str = "llama"):
    """A tiny GGUF written by hand-picked tensors (for the refusals)."""
    import gguf

    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("embedding_length", 128)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_uint32(f"{arch}.feed_forward_length", 256)
    w.add_uint32(f"{arch}.attention.head_count", 4)
    w.add_uint32(f"{arch}.attention.head_count_kv", 2)  # tiny_llama's (issue 33 item 13)
    w.add_tensor("token_embd.weight", np.zeros((192, 128), np.float32))
    for name, (array, raw_dtype) in extra.items():
        w.add_tensor(name, array, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_load_gguf_refusals_name_the_tensor(tmp_path):
    import gguf

    model = tiny_llama(layers=1)
    before = copy.deepcopy(model.state_dict())
    cases = {
        "rope_freqs.weight": ({"rope_freqs.weight": (np.ones(16, np.float32), None)}, "rope"),
        "blk.0.attn_v.weight": (
            {
                "blk.0.attn_v.weight": (
                    np.zeros((64, 4 * 18), np.uint8),
                    gguf.GGMLQuantizationType.Q4_0,
                )
            },
            "type Q4_0 is not supported",
        ),
        "blk.0.ffn_norm.weight": (
            {"blk.0.ffn_norm.weight": (np.ones(64, np.float32), None)},
            r"shape \[64\] does not match",
        ),
    }
    for tensor, (extra, match) in cases.items():
        path = _gguf_with(tmp_path, extra)
        with pytest.raises(GgufError, match=match) as info:
            load_gguf(path, model)
        assert info.value.tensor == tensor
    missing = _gguf_with(tmp_path, {})
    with pytest.raises(GgufError, match="no tensor for"):
        load_gguf(missing, model)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed by a refused load"
    with pytest.raises(GgufError, match="general.architecture is 'gpt2'"):
        config_from_gguf(_gguf_with(tmp_path, {}, arch="gpt2"))


# -- NVFP4 safetensors ------------------------------------------------------------------------


def write_modelopt(model, path) -> None:
    """A ModelOpt NVFP4 checkpoint of ``model``: projections NVFP4, the rest bf16."""
    from safetensors.torch import save_file

    tensors = {}
    for name, p in model.state_dict().items():
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and prefix.rpartition(".")[2] in PROJ:
            w = q2gemv.Nvfp4Weight.from_float(p.float().numpy())
            tensors[name] = torch.from_numpy(np.array(w.packed))
            scales = torch.from_numpy(np.array(w.scales))
            tensors[f"{prefix}.weight_scale"] = scales.view(torch.float8_e4m3fn)
            tensors[f"{prefix}.weight_scale_2"] = torch.tensor(float(w.global_scale))
            tensors[f"{prefix}.input_scale"] = torch.tensor(1.0)  # W4A4 state: ignored
        else:
            tensors[name] = p.contiguous()
    save_file(tensors, str(path))


@pytest.mark.parametrize("meta", [False, True])
def test_load_safetensors_gives_the_logits_of_quantize_model(tmp_path, meta):
    from transformers import LlamaForCausalLM

    source = tiny_llama(seed=0)
    path = tmp_path / "nvfp4.safetensors"
    write_modelopt(source, path)
    if meta:  # no random initialization: every tensor comes from the checkpoint
        with torch.device("meta"):
            target = LlamaForCausalLM(source.config).to(torch.bfloat16)
    else:
        target = tiny_llama(seed=1)
    assert load_safetensors(path, target) is target
    assert sum(isinstance(m, Nvfp4Linear) for m in target.modules()) == 14
    quantize_model(source, "nvfp4")
    ids = prompts(2, seed=6)
    with torch.no_grad():
        assert_same_bits(target(ids).logits, source(ids).logits, "safetensors vs quantize_model")


def test_load_safetensors_refusals(tmp_path):
    from safetensors.torch import save_file

    model = tiny_llama(layers=1)
    path = tmp_path / "bad.safetensors"
    write_modelopt(model, path)
    bigger = tiny_llama(layers=2)
    with pytest.raises(SafetensorsError, match="no tensor for"):
        load_safetensors(path, bigger)
    save_file({"extra.weight": torch.zeros(3)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(SafetensorsError, match="'extra.weight'.*no parameter"):
        load_safetensors(tmp_path / "x.safetensors", model)
    assert isinstance(model.model.layers[0].mlp.up_proj, torch.nn.Linear)


# -- the captured decoder (uncaptured on the CPU) -------------------------------------------


def test_captured_decoder_equals_generate():
    model = tiny_llama()
    quantize_model(model, "q2_0")
    ids = prompts(3, length=5, seed=7)
    want = model.generate(
        ids, max_new_tokens=7, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids)
    )
    decoder = CapturedDecoder(model, max_len=16)
    assert not decoder.capture
    assert torch.equal(decoder.generate(ids, 7), want)
    assert torch.equal(decoder.generate(ids, 7), want)  # the cache is reset and reused
    assert torch.equal(decoder.generate(ids[:1], 7), want[:1])  # another batch size


def test_captured_decoder_refusals():
    model = tiny_llama(layers=1)
    with pytest.raises(ValueError, match="max_len"):
        CapturedDecoder(model, max_len=1)
    with pytest.raises(ValueError, match="capture"):
        CapturedDecoder(model, max_len=8, capture=True)
    decoder = CapturedDecoder(model, max_len=8)
    with pytest.raises(ValueError, match="max_new_tokens: expected 1..3"):
        decoder.generate(prompts(1, length=5), 4)
    with pytest.raises(ValueError, match="input_ids"):
        decoder.generate(torch.zeros(5, dtype=torch.long), 1)


def test_captured_decoder_prefill_then_steps():
    model = tiny_llama(layers=1)
    ids = prompts(2, length=4, seed=8)
    want = model.generate(
        ids, max_new_tokens=4, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids)
    )
    decoder = CapturedDecoder(model, max_len=7)
    with pytest.raises(RuntimeError, match="prefill"):
        decoder.step()
    got = [decoder.prefill(ids)] + [decoder.step() for _ in range(2)]
    assert torch.equal(torch.cat([ids, *got], dim=1), want[:, :7])
    with pytest.raises(ValueError, match="max_len=7"):
        decoder.step()


def test_example_model_decode(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "model_decode.py"
    spec = importlib.util.spec_from_file_location("model_decode_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main("cpu") == 0
    out = capsys.readouterr().out
    assert "bit-equal to quantize_model's: True" in out and out.rstrip().endswith("OK")


def test_docs_models_page_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "docs/models.md has no python block"
    scope: dict = {}
    exec(compile(blocks[0], "docs/models.md", "exec"), scope)
    assert tuple(scope["tokens"].shape) == (2, 24)


# -- GPU (skipped without a real CUDA device) -------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["q2_0", "nvfp4"])
def test_cuda_captured_decoder_equals_eager_steps(fmt):
    model = tiny_llama()
    quantize_model(model, fmt)
    model = model.cuda()
    for batch in (1, 3):
        ids = prompts(batch, length=5, seed=9 + batch).cuda()
        captured = CapturedDecoder(model, max_len=20)
        eager = CapturedDecoder(model, max_len=20, capture=False)
        assert captured.capture
        got = captured.generate(ids, 12)
        assert torch.equal(got, eager.generate(ids, 12)), f"batch {batch}"
        # a second generate reuses the cache (reset in place) and the graph made above
        assert torch.equal(captured.generate(ids, 12), got), f"batch {batch}, replayed again"


@pytest.mark.gpu
def test_cuda_model_layers_equal_the_cpu_reference():
    model = tiny_llama()
    quantize_model(model, "q2_0")
    cpu_layers = {n: copy.deepcopy(m) for n, m in model.named_modules() if isinstance(m, Q2Linear)}
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(name):
        def record(mod, args, out) -> None:  # a forward hook that returns a value replaces `out`
            seen.setdefault(name, (args[0].cpu(), out.cpu()))

        return record

    model = model.cuda()
    for name, mod in model.named_modules():
        if name in cpu_layers:
            mod.register_forward_hook(hook(name))
    with torch.no_grad():
        model(prompts(2, seed=10).cuda())
    assert set(seen) == set(cpu_layers)
    for name, (x, y) in seen.items():
        assert_same_bits(y, cpu_layers[name](x), f"{name} on CUDA vs the CPU reference")


# -- issue 33: silent wrong results at the model level ------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), 1e5])
def test_quantize_model_q2_0_refuses_a_non_finite_or_overflowing_scale(bad):
    """One NaN weight gave NaN logits; a weight of 1e5 an Inf fp16 scale (item 11)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.Linear(64, 16))
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        model[1].weight[2, 7] = bad
    with pytest.raises(ValueError, match=r"^layer '1': w: (expected finite|the fp16 scale)"):
        quantize_model(model, "q2_0", group=64, skip=())
    assert all(isinstance(m, torch.nn.Linear) for m in model)


def test_quantize_model_refuses_a_skip_entry_that_matches_nothing():
    """A typo in skip quantized every layer silently (item 15)."""
    model = torch.nn.ModuleDict(
        {"mlp": torch.nn.Sequential(torch.nn.Linear(64, 16)), "lm_head": torch.nn.Linear(64, 8)}
    ).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"^skip: 'lm_haed' matches no torch.nn.Linear"):
        quantize_model(model, group=64, skip=("lm_haed",))
    with pytest.raises(ValueError, match=r"^skip: 'mlp' matches no torch.nn.Linear"):
        quantize_model(model, group=64, skip=["lm_head", "mlp"])  # a parent, not a Linear
    assert isinstance(model["mlp"][0], torch.nn.Linear)
    report = quantize_model(model, group=64, skip=["mlp.0"])
    assert set(report.skipped) == {"mlp.0"} and set(report.replaced) == {"lm_head"}
    # the default skips lm_head where there is one and asks nothing of a model without
    plain = torch.nn.Sequential(torch.nn.Linear(64, 16)).to(torch.bfloat16)
    assert list(quantize_model(plain, group=64).replaced) == ["0"]


@pytest.mark.parametrize("fmt", ["q2_0", "nvfp4"])
def test_quantize_model_refuses_a_model_that_is_not_bf16_or_fp16(fmt):
    """An fp32 model quantized, then failed at its first forward (item 15); an fp16 model is
    served since issue 34 (fp16 activations): it quantizes and keeps its dtype."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 16)).to(torch.float32)
    with pytest.raises(
        ValueError, match=r"^model: layer '0' is torch.float32.*torch.bfloat16, torch.float16"
    ):
        quantize_model(model, fmt, group=64)
    assert isinstance(model[0], torch.nn.Linear)
    half = torch.nn.Sequential(torch.nn.Linear(64, 16)).to(torch.float16)
    assert list(quantize_model(half, fmt, group=64, skip=()).replaced) == ["0"]
    assert half(torch.ones(2, 64, dtype=torch.float16)).dtype == torch.float16


def _tiny_mistral(window: int):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        sliding_window=window,
    )
    torch.manual_seed(0)
    return MistralForCausalLM(config).to(torch.bfloat16).eval()


def test_captured_decoder_refuses_max_len_beyond_a_sliding_window():
    """transformers' static cache keeps only the window: the step crashed inside transformers
    ("The size of tensor a (4) must match the size of tensor b (16)") (item 18)."""
    model = _tiny_mistral(window=4)
    with pytest.raises(ValueError, match=r"^max_len: .*sliding-window.* <= 4, got 16"):
        CapturedDecoder(model, max_len=16)
    ids = prompts(1, length=2, seed=3) % 64
    want = model.generate(
        ids, max_new_tokens=2, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids)
    )
    assert torch.equal(CapturedDecoder(model, max_len=4).generate(ids, 2), want)  # within it


def test_captured_decoder_refuses_an_empty_batch():
    """A [0, P] prompt crashed inside transformers (a reshape of 0 elements) (item 18)."""
    decoder = CapturedDecoder(tiny_llama(layers=1), max_len=8)
    empty = torch.zeros((0, 3), dtype=torch.long)
    with pytest.raises(ValueError, match=r"^input_ids: expected a batch of >= 1 prompts"):
        decoder.generate(empty, 2)
    with pytest.raises(ValueError, match=r"^input_ids: expected a batch of >= 1 prompts"):
        decoder.prefill(empty)

"""Fused projections (``q2gemv.models.fuse``): q/k/v and gate/up as one quantized layer each.

CPU only (reference backend). A fused model's logits and tokens are compared bit for bit
with the same model quantized with ``fuse=False``; the members' slices are checked to run
the fused layer once per input, whatever the order of the calls, and never to return an
output of another input.
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from q2gemv.models.fuse import FusedSlice, fuse_layers, why_not_fusable  # noqa: E402
from q2gemv.torch import Nvfp4Linear, Q2Linear, quantize_model  # noqa: E402

from ..model_cases import (  # noqa: E402
    assert_same_bits,
    equal_amax_per_group,
    prompts,
    tiny_llama,
    tiny_qwen2,
)

MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2}


def pair(arch: str, fmt: str, **kw):
    """The same float model quantized fused and separate: (fused, separate, fused report)."""
    model = MODELS[arch]()
    if fmt == "nvfp4":
        equal_amax_per_group(model)
    separate = copy.deepcopy(model)
    report = quantize_model(model, fmt, **kw)
    quantize_model(separate, fmt, fuse=False, **kw)
    return model, separate, report


@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize(
    "fmt, numerics", [("q2_0", None), ("q2_0", "seed"), ("nvfp4", None), ("nvfp4", "seed")]
)
def test_fused_logits_and_tokens_equal_separate_layers(arch, fmt, numerics):
    model, separate, report = pair(arch, fmt, numerics=numerics)
    assert sorted(report.fused) == [
        f"model.layers.{i}.{m}" for i in (0, 1) for m in ("mlp.gate_up_proj", "self_attn.qkv_proj")
    ]
    attn = model.model.layers[0].self_attn
    assert all(isinstance(getattr(attn, m), FusedSlice) for m in ("q_proj", "k_proj", "v_proj"))
    assert attn.qkv_proj.n == 256 and (attn.qkv_proj.bias is not None) == (arch == "qwen2")
    assert report.replaced["model.layers.0.self_attn.k_proj"] is attn.qkv_proj
    # one copy of the weights: the fused buffers hold the separate ones, row for row
    layer = Q2Linear if fmt == "q2_0" else Nvfp4Linear
    size = {
        m: sum(b.numel() for n, b in m_.named_buffers() if n != "bias")
        for m, m_ in (("fused", model), ("separate", separate))
    }
    assert size["fused"] == size["separate"]
    sep = separate.model.layers[0].self_attn
    for buf in layer._WEIGHT_BUFFERS:
        want = torch.cat([getattr(sep, m)._buffers[buf] for m in ("q_proj", "k_proj", "v_proj")])
        assert torch.equal(attn.qkv_proj._buffers[buf], want)
    ids = prompts()
    with torch.no_grad():
        assert_same_bits(model(ids).logits, separate(ids).logits, f"{arch} {fmt} logits")
    kw = dict(
        max_new_tokens=4, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(ids)
    )
    assert torch.equal(model.generate(ids, **kw), separate.generate(ids, **kw))


def _counting(model):
    """Count the fused layers' forwards."""
    calls: dict[str, int] = {}
    for name, mod in model.named_modules():
        if name.endswith(("qkv_proj", "gate_up_proj")):

            def hook(mod, args, out, name=name):
                calls[name] = calls.get(name, 0) + 1

            mod.register_forward_hook(hook)
    return calls


def test_the_fused_layer_runs_once_per_input_in_any_order():
    model, separate, _ = pair("qwen2", "q2_0")
    attn, sep = model.model.layers[0].self_attn, separate.model.layers[0].self_attn
    calls = _counting(model)
    key = "model.layers.0.self_attn.qkv_proj"
    x = torch.randn(3, 128).to(torch.bfloat16)
    with torch.no_grad():
        for order in (("q_proj", "k_proj", "v_proj"), ("v_proj", "q_proj", "k_proj")):
            before = calls.get(key, 0)
            for m in order:
                assert_same_bits(getattr(attn, m)(x), getattr(sep, m)(x), m)
            assert calls[key] == before + 1, order  # once for the three members
            assert attn.q_proj._shared.entry is None  # every member took it: nothing kept
        # another input in between: recomputed, never the other input's output
        y = torch.randn(3, 128).to(torch.bfloat16)
        q = attn.q_proj(x)
        assert_same_bits(attn.k_proj(y), sep.k_proj(y), "k of another input")
        assert_same_bits(attn.v_proj(x), sep.v_proj(x), "v after another input")
        assert_same_bits(q, sep.q_proj(x), "q")
        # the same member twice with one input: recomputed (its first result may be written)
        z = torch.randn(3, 128).to(torch.bfloat16)
        before = calls[key]
        a = attn.q_proj(z)
        a.mul_(0)
        assert_same_bits(attn.q_proj(z), sep.q_proj(z), "q asked twice")
        assert calls[key] == before + 2
        # x written in place between the members: its version changed, recomputed
        attn.q_proj(x)
        x.add_(1)
        assert_same_bits(attn.k_proj(x), sep.k_proj(x), "k after x changed in place")


def test_autograd_through_the_slices():
    """dx through the fused layer: one transposed matmul for the three members (a float
    result, outside the bit-exact contract), against float64 on the dequantized weights."""
    model, _, _ = pair("llama", "q2_0")
    attn = model.model.layers[0].self_attn
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x.requires_grad_()
    (attn.q_proj(x).float().sum() + 2 * attn.k_proj(x).float().sum()).backward()
    w = torch.from_numpy(attn.qkv_proj.quantized_weight().dequantize()).double()
    dy = torch.tensor([1.0] * 128 + [2.0] * 64 + [0.0] * 64, dtype=torch.float64)
    want = (dy @ w).expand(2, -1)
    # bf16 rounding of dx (2**-9 relative) plus the fp32 sum of 256 products
    bound = 2**-8 * want.abs() + 256 * 2**-23 * (dy.abs() @ w.abs())
    assert ((x.grad.double() - want).abs() <= bound).all()


def test_nvfp4_members_with_other_global_scales_stay_separate():
    model = tiny_llama()  # random weights: each projection has its own global scale
    separate = copy.deepcopy(model)
    report = quantize_model(model, "nvfp4")
    quantize_model(separate, "nvfp4", fuse=False)
    assert not report.fused and len(report.not_fused) == 4
    assert "global scales differ" in report.not_fused["model.layers.0.self_attn.q_proj"]
    assert "not fused" in str(report)
    assert isinstance(model.model.layers[0].self_attn.q_proj, Nvfp4Linear)
    assert model.config.quantization_config["fused_projections"] == []
    ids = prompts()
    with torch.no_grad():
        assert_same_bits(model(ids).logits, separate(ids).logits, "nvfp4 unfused")


def test_why_not_fusable():
    torch.manual_seed(0)
    lin = [torch.nn.Linear(64, 16, bias=b).to(torch.bfloat16) for b in (True, False)]
    a, b = (Q2Linear.from_linear(x, group=64) for x in lin)
    assert "bias" in why_not_fusable([a, b])
    assert "group" in why_not_fusable([a, Q2Linear.from_linear(lin[0], group=64, numerics="seed")])
    assert "one format" in why_not_fusable([a, Nvfp4Linear.from_linear(lin[0])])
    assert why_not_fusable([a, a]) == "a layer serves two members"
    empty = Nvfp4Linear.empty(16, 64, device="meta")
    assert "not known" in why_not_fusable([empty, Nvfp4Linear.empty(16, 64, device="meta")])
    fused = fuse_layers([a, Q2Linear.from_linear(lin[0], group=64)])
    assert (fused.n, fused.k, fused.group) == (32, 64, 64) and fused.bias.shape == (32,)


def test_a_fused_model_copies_and_moves_whole():
    model, _, _ = pair("llama", "q2_0")
    twin = copy.deepcopy(model)
    for m in (model, twin):
        attn = m.model.layers[0].self_attn
        assert attn.k_proj.fused is attn.qkv_proj  # the copy's slices read the copy's layer
    assert twin.model.layers[0].self_attn.qkv_proj is not model.model.layers[0].self_attn.qkv_proj
    ids = prompts()
    with torch.no_grad():
        assert_same_bits(twin(ids).logits, model(ids).logits, "deepcopy")


def test_quantize_model_fuses_an_empty_q2_model_and_not_an_empty_nvfp4_one():
    from transformers import LlamaForCausalLM

    config = tiny_llama(layers=1).config
    for fmt, fused in (("q2_0", 2), ("nvfp4", 0)):
        with torch.device("meta"):
            empty = LlamaForCausalLM(config).to(torch.bfloat16)
        report = quantize_model(empty, fmt)
        assert len(report.fused) == fused
        assert len(report.not_fused) == (2 - fused)


def test_load_safetensors_fuses_equal_global_scales_and_names_the_others(tmp_path):
    from .test_models import write_modelopt

    equal, other = tiny_llama(), tiny_llama()
    equal_amax_per_group(equal)
    write_modelopt(equal, tmp_path / "equal.safetensors")
    write_modelopt(other, tmp_path / "other.safetensors")  # a scale per projection
    from q2gemv.torch import load_safetensors

    fused = load_safetensors(tmp_path / "equal.safetensors", tiny_llama(seed=1))
    assert len(fused.config.quantization_config["fused_projections"]) == 4
    separate = load_safetensors(tmp_path / "equal.safetensors", tiny_llama(seed=1), fuse=False)
    with torch.no_grad():
        ids = prompts()
        assert_same_bits(fused(ids).logits, separate(ids).logits, "loaded fused vs separate")
    with pytest.warns(UserWarning, match=r"4 projection group\(s\) kept as separate.*differ"):
        kept = load_safetensors(tmp_path / "other.safetensors", tiny_llama(seed=1))
    assert kept.config.quantization_config["fused_projections"] == []
    assert isinstance(kept.model.layers[0].mlp.up_proj, Nvfp4Linear)


def test_a_group_with_a_member_left_in_bf16_stays_separate_and_is_reported():
    model = tiny_llama(layers=1)
    report = quantize_model(model, "q2_0", skip=("lm_head", "k_proj"))
    assert list(report.fused) == ["model.layers.0.mlp.gate_up_proj"]
    assert report.not_fused == {"model.layers.0.self_attn.q_proj": "not q2gemv layers: k_proj"}
    assert isinstance(model.model.layers[0].self_attn.q_proj, Q2Linear)

"""The compiled decode path: a transformers model with q2gemv layers under ``torch.compile``.

CPU only. A decode step (one token per sequence, transformers' ``StaticCache``) traces
with no graph break (``torch._dynamo.explain``); ``torch.compile(model.forward,
fullgraph=True)`` gives the eager logits bit for bit, step after step, from one graph
(no recompilation as the position moves), with one q2gemv GEMV per fused layer; and
transformers' own ``generate`` with a compiled forward gives the eager tokens. The
backend here is ``aot_eager`` (the graph dynamo and AOTAutograd make, run op by op):
inductor's CPU code for the bf16 norms and rotary rounds differently from eager for a
plain bf16 model too, and takes ~40 s to build; the GPU run uses inductor with
``mode="reduce-overhead"`` (docs/models.md).
"""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import q2gemv  # noqa: E402
from q2gemv.torch import quantize_model  # noqa: E402

from ..model_cases import equal_amax_per_group, tiny_llama, tiny_qwen2, u16  # noqa: E402

GEMV_OPS = ("q2gemv.q2_linear", "q2gemv.nvfp4_linear")


def quantized(arch: str, fmt: str, fuse: bool, dtype=None):
    model = tiny_llama() if arch == "llama" else tiny_qwen2()
    if dtype is not None:
        model = model.to(dtype)
    if fmt == "nvfp4":
        equal_amax_per_group(model)
    report = quantize_model(model, fmt, fuse=fuse)
    assert len(report.fused) == (4 if fuse else 0)
    return model


def prefilled(model, batch: int = 2, prompt: int = 5, max_len: int = 16):
    """A static cache holding a prompt, and the first decode step's inputs."""
    from transformers import StaticCache

    device = next(model.parameters()).device
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    ids = torch.randint(0, 192, (batch, prompt), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(
            input_ids=ids.to(device),
            cache=cache,
            use_cache=True,
            cache_position=torch.arange(prompt, device=device),
        )
    return cache, out.logits[:, -1:].argmax(-1), prompt


def step_kwargs(tokens, pos: int, cache) -> dict:
    p = torch.tensor([pos], device=tokens.device)
    return dict(
        input_ids=tokens,
        cache=cache,
        use_cache=True,
        cache_position=p,
        position_ids=p.view(1, 1).expand(tokens.shape[0], 1),
    )


@pytest.mark.parametrize(
    "arch, fmt, fuse, dtype",
    [
        ("llama", "q2_0", True, None),
        ("qwen2", "nvfp4", True, None),
        ("llama", "q2_0", False, None),
        ("qwen2", "q2_0", True, "float16"),  # an fp16 model: the same single graph
    ],
)
def test_a_decode_step_traces_without_a_graph_break(arch, fmt, fuse, dtype):
    model = quantized(arch, fmt, fuse, dtype and getattr(torch, dtype))
    cache, tokens, pos = prefilled(model)
    with torch.no_grad():
        explained = torch._dynamo.explain(model.forward)(**step_kwargs(tokens, pos, cache))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    # the fused layers' slot is empty after the traced forward: nothing kept between calls
    attn = model.model.layers[0].self_attn
    if fuse:
        assert attn.q_proj._shared.entry is None


@pytest.mark.parametrize("fuse, dtype", [(True, None), (False, None), (True, "float16")])
def test_compiled_forward_equals_eager_step_after_step(fuse, dtype):
    from torch._dynamo.backends.registry import lookup_backend

    torch._dynamo.reset()
    model = quantized("qwen2", "q2_0", fuse, dtype and getattr(torch, dtype))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, example_inputs)

    compiled = torch.compile(model.forward, backend=backend, fullgraph=True)
    cache, tokens, pos = prefilled(model)
    eager_cache = copy.deepcopy(cache)
    eager_tokens = tokens
    with torch.no_grad():
        for step in range(3):
            got = compiled(**step_kwargs(tokens, pos + step, cache)).logits
            want = model(**step_kwargs(eager_tokens, pos + step, eager_cache)).logits
            q2gemv.golden.check.assert_bits_equal(u16(got), u16(want), f"step {step}")
            tokens, eager_tokens = got.argmax(-1), want.argmax(-1)
    assert len(graphs) == 1  # one graph for every position: no recompilation per step
    gemvs = [n for n in graphs[0].graph.nodes if str(n.target).startswith(GEMV_OPS)]
    layers = model.config.num_hidden_layers
    assert len(gemvs) == (4 if fuse else 7) * layers  # fused: one GEMV for q/k/v, one for gate/up


def test_transformers_generate_with_a_compiled_forward_gives_the_eager_tokens():
    from transformers import CompileConfig

    torch._dynamo.reset()
    model = quantized("llama", "q2_0", True)
    ids = torch.randint(0, 192, (2, 5), generator=torch.Generator().manual_seed(4))
    kw = dict(
        max_new_tokens=5,
        do_sample=False,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
        cache_implementation="static",
    )
    want = model.generate(ids, disable_compile=True, **kw)
    config = CompileConfig(backend="aot_eager", fullgraph=True, mode=None)
    config._compile_all_devices = True  # transformers compiles on accelerators only by default
    from torch._dynamo.utils import counters

    counters.clear()
    got = model.generate(ids, compile_config=config, **kw)
    assert torch.equal(got, want)
    assert counters["stats"]["unique_graphs"] == 1


# -- GPU (skipped without a real CUDA device) -------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["q2_0", "nvfp4"])
def test_cuda_compiled_decode_with_cuda_graphs_equals_eager(fmt):
    """``backend="cudagraphs"``: the graph dynamo and AOTAutograd make, replayed through
    CUDA graph trees (what ``mode="reduce-overhead"`` does, without inductor's own kernels,
    so the bits are eager's). Logits step after step, and generate's tokens."""
    from transformers import CompileConfig

    torch._dynamo.reset()
    model = quantized("qwen2", fmt, True).cuda()
    compiled = torch.compile(model.forward, backend="cudagraphs", fullgraph=True)
    cache, tokens, pos = prefilled(model)
    eager_cache, eager_tokens = copy.deepcopy(cache), tokens
    with torch.no_grad():
        for step in range(4):
            p = pos + step
            torch.compiler.cudagraph_mark_step_begin()
            got = compiled(**step_kwargs(tokens, p, cache)).logits.clone()
            want = model(**step_kwargs(eager_tokens, p, eager_cache)).logits
            q2gemv.golden.check.assert_bits_equal(u16(got.cpu()), u16(want.cpu()), f"step {step}")
            tokens, eager_tokens = got.argmax(-1), want.argmax(-1)
    ids = torch.randint(0, 192, (2, 5), generator=torch.Generator().manual_seed(4)).cuda()
    kw = dict(
        max_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
        cache_implementation="static",
    )
    want = model.generate(ids, disable_compile=True, **kw)
    config = CompileConfig(backend="cudagraphs", fullgraph=True, mode=None)
    assert torch.equal(model.generate(ids, compile_config=config, **kw), want)

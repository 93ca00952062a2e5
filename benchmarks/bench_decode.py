"""Decode speed of a Llama-3-8B-shaped model: compiled bf16 vs q2gemv vs peers, one harness.

    export PYTHONPATH=$PWD/src:$PWD/.peers/gemlite-0.6.0.post2   # gemlite: optional
    python3 benchmarks/bench_decode.py                      # H200 -> benchmarks/results/<date>_decode/
    python3 benchmarks/bench_decode.py --layers 4 --batches 1,8 --variants bf16,q2_0
    python3 benchmarks/bench_decode.py --smoke --out /tmp/d  # CPU, seconds: catches breakage only

Model: ``transformers.LlamaForCausalLM`` with Llama-3-8B's shapes (hidden 4096, MLP 14336,
32 heads, 8 KV heads, head dim 128, vocabulary 128256; ``--layers`` decoder layers, 32 by
default), random bf16 weights made on the device. Embeddings, norms and the LM head stay
bf16 in every variant; only the decoder layers change:

* ``bf16``: the layers as built (cuBLAS through ``F.linear``);
* ``q2_0`` / ``nvfp4``: ``q2gemv.torch.quantize_model(layer, fmt, group=--group, fuse=True)``
  on one decoder layer (q/k/v fused into ``qkv_proj``, gate/up into ``gate_up_proj``; the
  members' max |w| made equal first so NVFP4 fuses too), copied into every layer
  (quantizing 7 billion weights with the NumPy quantizers would take minutes; decode speed
  does not depend on the values; every layer has its own copy of the bytes);
* ``gemlite_a16w2`` / ``gemlite_a16w4``: gemlite's ``A16Wn`` layers (2 / 4-bit codes, group
  128, bf16) in place of each of the 7 projections (``import gemlite`` must work);
* ``tinygemm_int4``: torch's int4 GEMM (``torch.ops.aten._weight_int4pack_mm`` on weights
  packed by ``_convert_weight_to_int4pack``, group 128) wrapped as a module per projection.

Peers get random codes (scale 0.02); they are not fused (7 GEMMs a layer, as transformers'
Llama calls them; ``calls_per_layer``).

The decode step (one token per sequence) is a module whose static KV cache
(``transformers.StaticCache``, ``--max-len`` positions; its tensors registered as the
module's buffers and marked static), input tokens and position are buffers; the causal
mask is made inside the step from the position. ``torch.compile(step,
mode="reduce-overhead")`` compiles it and replays it as CUDA graphs (inputs passed as
arguments would keep CUDA graphs off: everything the step reads or writes is a buffer).
If compiling fails, or inductor skips its CUDA graphs, the step is captured eagerly in a
``torch.cuda.CUDAGraph`` instead and the row says so (``mode``, ``note``). A short prompt
(``--prompt`` tokens) fills the cache first; attention spans all ``--max-len`` positions
(static cache, masked), so its cost does not grow as the timed steps advance.

Timing: after ``--warmup`` steps, ``--repeats`` times ``--steps`` steps between CUDA
events (the position reset in place before each repeat); ``ms_per_step`` is the median
repeat's time per step, ``tokens_per_s`` = batch / that, ``speedup`` = compiled bf16's
``ms_per_step`` at the same batch over this one's.

Also, per variant: ``gemv_share`` (batches 1 and 8; ``--no-profile`` skips it):
``torch.profiler`` over 5 replayed steps, the variant's projection-GEMV kernels' time over
all kernels' (bf16: every dense-GEMM kernel, the LM head's included; ``lm_share``: the
dense-GEMM kernels of a quantized variant, i.e. its bf16 LM head). ``layer_gemv_us``: one
decoder layer's projection calls at M=1 (q2gemv: qkv, o, gate_up, down; bf16 and peers:
the 7 projections) timed alone in one CUDA graph that runs them for every layer of the
model in turn (cold weights, as in a decode step), per layer. ``bits``: for q2gemv (and
bf16, for comparison) the compiled step's bf16 logits against the eager step's from the
same state, ``torch.equal`` (batch 1); a q2gemv difference makes the exit status 1.

Writes ``decode.csv`` (one row per variant and batch), ``decode.png`` (speed-up over
compiled bf16 against batch, one line per variant) and ``run.json`` into ``--out`` and
prints the table last. The CSV is rewritten after every row (a run cut short keeps them).

``--smoke``: the CPU, a tiny model (hidden 256, 2 layers), batches 1 and 2, eager steps
(no compile, no CUDA graphs, no profile, no layer timing), the CUDA-only peers recorded as
not run; wall-clock times that mean nothing. For tests.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

VARIANTS = ("bf16", "q2_0", "nvfp4", "gemlite_a16w2", "gemlite_a16w4", "tinygemm_int4")
Q2GEMV = ("q2_0", "nvfp4")
PROFILE_BATCHES = (1, 8)
PROJECTIONS = (
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
    ("mlp", "down_proj"),
)
FUSED_CALLS = (
    ("self_attn", "qkv_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_up_proj"),
    ("mlp", "down_proj"),
)
LLAMA3_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
SMOKE = dict(
    LLAMA3_8B,
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)
# kernel names counted as a variant's projection GEMVs (torch.profiler keys)
DENSE = re.compile(r"gemv|gemm|xmma|cutlass|nvjet|cublas", re.I)
GEMV_KERNELS = {
    "bf16": DENSE,
    "q2_0": re.compile(r"cudapy|q2gemv"),  # numba's mangled names: _ZN6cudapy + module path
    "nvfp4": re.compile(r"cudapy|q2gemv"),
    "gemlite_a16w2": re.compile(r"A16fWn|gemlite", re.I),
    "gemlite_a16w4": re.compile(r"A16fWn|gemlite", re.I),
    "tinygemm_int4": re.compile(r"tinygemm|int4", re.I),
}
COLUMNS = (
    "variant",
    "batch",
    "status",
    "mode",
    "ms_per_step",
    "tokens_per_s",
    "speedup",
    "gemv_share",
    "lm_share",
    "layer_gemv_us",
    "calls_per_layer",
    "bits",
    "compile_s",
    "note",
    "layers",
    "max_len",
    "steps",
    "repeats",
    "device",
    "torch",
    "transformers",
    "smoke",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/<date>_decode/"
    )
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 32; smoke 2)")
    p.add_argument("--batches", default=None, help="comma-separated (default 1,4,8,16,32)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {VARIANTS}")
    p.add_argument("--group", type=int, default=128, choices=(64, 128), help="Q2_0 group")
    p.add_argument("--numerics", default=None, help="q2gemv numerics contract (default)")
    p.add_argument("--prompt", type=int, default=8, help="prompt tokens filling the cache first")
    p.add_argument("--max-len", type=int, default=512, help="static cache positions")
    p.add_argument("--warmup", type=int, default=3, help="steps before timing")
    p.add_argument("--steps", type=int, default=None, help="steps per timed repeat (default 32)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats (default 5)")
    p.add_argument("--no-compile", action="store_true", help="eager CUDA graphs for every variant")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler shares")
    p.add_argument("--no-layer-gemv", action="store_true", help="skip the per-layer GEMV timing")
    p.add_argument("--smoke", "--dry-run", action="store_true", help="tiny CPU run (tests)")
    args = p.parse_args(argv)
    args.variants = tuple(v for v in args.variants.split(",") if v)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad or not args.variants:
        p.error(f"--variants: expected a comma-separated subset of {VARIANTS}, got {bad}")
    if "bf16" not in args.variants:
        args.variants = ("bf16", *args.variants)  # the baseline of every speed-up
    smoke = args.smoke
    args.layers = args.layers if args.layers is not None else (2 if smoke else 32)
    args.steps = args.steps if args.steps is not None else (2 if smoke else 32)
    args.repeats = args.repeats if args.repeats is not None else (1 if smoke else 5)
    if smoke:
        args.max_len = min(args.max_len, 32)
        args.prompt = min(args.prompt, 4)
        args.warmup = min(args.warmup, 1)
    try:
        args.batches = tuple(
            int(b) for b in (args.batches or ("1,2" if smoke else "1,4,8,16,32")).split(",")
        )
    except ValueError:
        p.error(f"--batches: expected comma-separated integers, got {args.batches!r}")
    for name, value, low in (
        ("--layers", args.layers, 1),
        ("--prompt", args.prompt, 1),
        ("--steps", args.steps, 1),
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 1),
        *(("--batches", b, 1) for b in args.batches),
    ):
        if value < low:
            p.error(f"{name}: expected an integer >= {low}, got {value}")
    need = args.prompt + args.warmup + args.steps + 2
    if args.max_len < need:
        p.error(
            f"--max-len: prompt + warmup + steps + 2 = {need} positions needed, got {args.max_len}"
        )
    args.out = args.out or dated("decode")
    return args


# -- the model and its variants ---------------------------------------------------------------


def build_model(args, device):
    """The bf16 LlamaForCausalLM with random weights made on ``device``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **{**(SMOKE if args.smoke else LLAMA3_8B), "num_hidden_layers": args.layers}
    )
    previous = torch.get_default_dtype()
    torch.manual_seed(0)
    try:
        torch.set_default_dtype(torch.bfloat16)
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def equal_amax(layer, value: float = 0.125) -> None:
    """q/k/v and gate/up get one max |w| (NVFP4 fuses members with bit-equal global scales)."""
    import torch

    with torch.no_grad():
        for parent, names in (
            ("self_attn", ("q_proj", "k_proj", "v_proj")),
            ("mlp", ("gate_proj", "up_proj")),
        ):
            for name in names:
                w = getattr(getattr(layer, parent), name).weight
                w.clamp_(-value / 2, value / 2)
                w[0, 0] = value


def placed(layer, index: int):
    """``layer`` as decoder layer ``index`` (attention's ``layer_idx`` picks the cache layer)."""
    layer.self_attn.layer_idx = index
    return layer


def q2gemv_layers(base, fmt: str, args) -> tuple[list, str]:
    """Every layer a copy of layer 0 quantized by ``quantize_model`` (fused), and its report."""
    from q2gemv.torch import quantize_model

    template = copy.deepcopy(base[0])
    equal_amax(template)
    report = quantize_model(template, fmt, group=args.group, numerics=args.numerics, progress=False)
    fused = len(report.fused) if hasattr(report, "fused") else "?"
    return [
        placed(copy.deepcopy(template), i) for i in range(len(base))
    ], f"fused groups a layer: {fused}"


def _tinygemm_class():
    import torch

    class _Tinygemm(torch.nn.Module):
        """``y = x @ W.T`` with W int4, group 128, through ``aten._weight_int4pack_mm``."""

        def __init__(self, n: int, k: int, device) -> None:
            super().__init__()
            w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack(w, 8))
            sz = torch.zeros(k // 128, n, 2, dtype=torch.bfloat16, device=device)
            sz[..., 0] = 0.02
            self.register_buffer("scales_zeros", sz)
            self.out_features = n

        def forward(self, x):
            shape = x.shape
            y = torch.ops.aten._weight_int4pack_mm(
                x.reshape(-1, shape[-1]), self.packed, 128, self.scales_zeros
            )
            return y.reshape(*shape[:-1], self.out_features)

    return _Tinygemm


def peer_layer(variant: str, linear, device):
    import torch

    n, k = linear.out_features, linear.in_features
    if variant == "tinygemm_int4":
        return _tinygemm_class()(n, k, device)
    from gemlite.helper import A16Wn  # ImportError: recorded by the caller

    bits = int(variant.removeprefix("gemlite_a16w"))
    codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device=device)
    scales = torch.full((n, k // 128), 0.02, dtype=torch.bfloat16, device=device)
    zeros = torch.full((n, k // 128), (2**bits - 1) / 2, dtype=torch.bfloat16, device=device)
    return A16Wn(device=str(device)).from_weights(
        codes, scales, zeros, W_nbits=bits, group_size=128
    )


def peer_layers(base, variant: str, device) -> list:
    import torch

    if device.type != "cuda":
        raise RuntimeError("not run: needs CUDA")
    out = []
    for i, layer in enumerate(base):
        new = copy.copy(layer)  # shallow: the submodule dicts are replaced below
        new._modules = dict(layer._modules)
        for parent in ("self_attn", "mlp"):
            owner = copy.copy(getattr(layer, parent))
            owner._modules = dict(owner._modules)
            new._modules[parent] = owner
        for parent, attr in PROJECTIONS:
            owner = new._modules[parent]
            owner._modules[attr] = peer_layer(variant, getattr(owner, attr), device)
        out.append(placed(new, i))
        torch.cuda.synchronize()
    return out


def variant_layers(base, variant: str, args, device) -> tuple[list, str]:
    if variant == "bf16":
        return list(base), ""
    if variant in Q2GEMV:
        return q2gemv_layers(base, variant, args)
    return peer_layers(base, variant, device), ""


# -- the decode step ---------------------------------------------------------------------------


def _decode_step_class():
    import torch

    from q2gemv.models.decode import cache_keyword, decode_step

    class DecodeStep(torch.nn.Module):
        """One greedy decode step on buffers: tokens <- argmax(logits), position += 1."""

        def __init__(self, model, batch: int, max_len: int) -> None:
            super().__init__()
            from transformers import StaticCache

            self.model = model
            self.cache = StaticCache(config=model.config, max_cache_len=max_len)
            device = next(model.parameters()).device
            self.dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
            self.register_buffer("tokens", torch.zeros(batch, 1, dtype=torch.long, device=device))
            self.register_buffer("pos", torch.zeros(1, dtype=torch.long, device=device))
            self.register_buffer("key_pos", torch.arange(max_len, device=device))
            self.cache_kw = cache_keyword(model)

        @torch.no_grad()
        def prefill(self, prompt: int, seed: int = 0) -> None:
            """A random prompt into the cache (its tensors made here, then registered as buffers)."""
            batch = self.tokens.shape[0]
            gen = torch.Generator().manual_seed(seed)
            ids = torch.randint(0, self.model.config.vocab_size, (batch, prompt), generator=gen)
            out = self.model(
                input_ids=ids.to(self.pos.device), **{self.cache_kw: self.cache}, use_cache=True
            )
            self.tokens.copy_(out.logits[:, -1:].argmax(-1))
            self.pos.fill_(prompt)
            self.prompt = prompt
            self.start_tokens = self.tokens.clone()
            for i, layer in enumerate(self.cache.layers):
                for name, value in vars(layer).items():
                    if isinstance(value, torch.Tensor):
                        self.register_buffer(f"cache_{i}_{name}", value, persistent=False)
                        torch._dynamo.mark_static_address(value)

        @torch.no_grad()
        def rewind(self) -> None:
            """Back to the position after the prompt, in place (static addresses kept)."""
            self.pos.fill_(self.prompt)
            self.tokens.copy_(self.start_tokens)
            for layer in self.cache.layers:
                length = getattr(layer, "cumulative_length", None)
                if isinstance(length, torch.Tensor):
                    length.fill_(self.prompt)

        def forward(self) -> torch.Tensor:
            return decode_step(
                self.model, self.tokens, self.pos, self.key_pos, self.cache, self.cache_kw,
                self.dtype,
            )  # fmt: skip

    return DecodeStep


def _skips() -> int:
    """Inductor's count of CUDA-graph skips so far (0 where torch does not count them)."""
    try:
        from torch._dynamo.utils import counters

        return sum(counters["inductor"].get(k, 0) for k in ("cudagraph_skips",))
    except Exception:
        return 0


def eager_graph(step):
    """``step`` captured eagerly in one ``torch.cuda.CUDAGraph``: a callable replaying it."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        step()  # compiles the q2gemv kernels, allocates their workspace: not while capturing
        step.rewind()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            logits = step()
    torch.cuda.current_stream().wait_stream(s)
    step.rewind()

    def replay():
        g.replay()
        return logits

    return replay


def make_runner(step, args, device) -> tuple:
    """``(run, mode, note, compile_s)``: ``run()`` does one decode step and returns the logits."""
    import torch

    if device.type != "cuda":
        return (lambda: step()), "eager", "", 0.0
    if args.no_compile:
        return eager_graph(step), "eager_graph", "--no-compile", 0.0
    t0 = time.perf_counter()
    skips = _skips()
    try:
        compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)

        def run():
            torch.compiler.cudagraph_mark_step_begin()
            return compiled()

        with torch.no_grad():
            for _ in range(3):  # compile, warm up, record the CUDA graph
                run()
        torch.cuda.synchronize()
        step.rewind()
        if _skips() > skips:
            raise RuntimeError("inductor skipped its CUDA graphs (TORCH_LOGS=perf_hints says why)")
        return run, "compiled", "", time.perf_counter() - t0
    except Exception as err:
        note = f"torch.compile failed, eager CUDA graph instead: {type(err).__name__}: {err}"[:300]
        torch._dynamo.reset()
        step.rewind()
        return eager_graph(step), "eager_graph", note, time.perf_counter() - t0


def time_steps(run, step, args, device) -> float:
    """Median over repeats of the ms per decode step (CUDA events; wall clock on the CPU)."""
    import torch

    per_step = []
    with torch.no_grad():
        for _ in range(args.warmup):
            run()
        for _ in range(args.repeats):
            step.rewind()
            if device.type == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                for _ in range(args.steps):
                    run()
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end)
            else:
                t = time.perf_counter()
                for _ in range(args.steps):
                    run()
                ms = (time.perf_counter() - t) * 1e3
            per_step.append(ms / args.steps)
    step.rewind()
    return statistics.median(per_step)


def bits_check(run, step) -> str:
    """The runner's logits against the eager step's, from the same state (batch's first step)."""
    import torch

    with torch.no_grad():
        step.rewind()
        want = step().clone()
        step.rewind()
        got = run().clone()
        step.rewind()
    return "equal" if torch.equal(got, want) else "DIFFERENT"


def _device_us(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def gemv_shares(run, variant: str, steps: int = 5) -> tuple[float, float]:
    """(variant's GEMV kernels, dense-GEMM kernels) over all kernel time of ``steps`` steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    kernels = [
        e for e in prof.key_averages() if str(getattr(e, "device_type", "")).endswith("CUDA")
    ]
    kernels = [e for e in kernels if _device_us(e) > 0]
    total = sum(_device_us(e) for e in kernels)
    if not total:
        return float("nan"), float("nan")
    ours = sum(_device_us(e) for e in kernels if GEMV_KERNELS[variant].search(e.key))
    # (q2gemv's kernel names hold "q2gemv", which DENSE matches: a variant's own are not dense)
    mine = GEMV_KERNELS[variant]
    dense = sum(
        _device_us(e)
        for e in kernels
        if DENSE.search(e.key) and (variant == "bf16" or not mine.search(e.key))
    )
    return ours / total, dense / total


def layer_gemv_us(layers, variant: str, hidden: int, inter: int, device) -> tuple[float, int]:
    """One layer's projection calls at M=1, per layer, from a graph over all the model's layers."""
    import torch

    calls = FUSED_CALLS if variant in Q2GEMV else PROJECTIONS
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device=device)
    xi = torch.randn(1, inter, dtype=torch.bfloat16, device=device)
    fns = []
    for layer in layers:
        for parent, attr in calls:
            mod = getattr(getattr(layer, parent), attr)
            fns.append((mod, xi if attr == "down_proj" else x))

    def body():
        for mod, a in fns:
            mod(a)

    return graph_us(capture_graph(body), len(layers)), len(calls)


def capture_graph(body):
    """``body()`` run once on a side stream (kernels compiled, workspaces made), then captured
    in a ``torch.cuda.CUDAGraph`` there (no gradients); the graph, not replayed."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        body()
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            body()
    torch.cuda.current_stream().wait_stream(s)
    return g


def graph_us(g, per: int, replays: int = 7, warmup: int = 0) -> float:
    """Median microseconds of one replay of graph ``g`` (CUDA events) divided by ``per``."""
    import torch

    for _ in range(warmup):
        g.replay()
    times = []
    for _ in range(replays):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / per)
    return statistics.median(times)


# -- output ------------------------------------------------------------------------------------


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else v


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: _fmt(v) for k, v in row.items()})


def plot(path: Path, rows: list[dict]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        pts = [
            (r["batch"], r["speedup"])
            for r in rows
            if r["variant"] == variant
            and r["status"] == "ok"
            and r.get("speedup") == r.get("speedup")
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=variant)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speed-up over compiled bf16 (ms per step)")
    ax.set_title("Llama-3-8B-shaped decode step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def table(rows: list[dict]) -> str:
    head = f"{'variant':<15}{'batch':>6}{'mode':>13}{'ms/step':>9}{'tok/s':>9}{'x bf16':>8}"
    head += f"{'gemv%':>7}{'layer us':>10}  bits / status"
    lines = [head]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['variant']:<15}{r['batch']:>6}  {r['status']}")
            continue
        share = r.get("gemv_share", "")
        share = f"{share:.0%}" if isinstance(share, float) and share == share else "-"
        layer = r.get("layer_gemv_us", "")
        layer = f"{layer:.1f}" if isinstance(layer, float) else "-"
        lines.append(
            f"{r['variant']:<15}{r['batch']:>6}{r['mode']:>13}{r['ms_per_step']:>9.3f}"
            f"{r['tokens_per_s']:>9.1f}{r.get('speedup', float('nan')):>8.2f}{share:>7}{layer:>10}"
            f"  {r.get('bits', '') or 'ok'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    if args.smoke:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench_decode: no CUDA device (--smoke runs on the CPU)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", torch.cuda.current_device())
        try:  # eager's bf16 roundings in inductor's kernels (norms, rotary): bit checks need them
            torch._inductor.config.emulate_precision_casts = True
        except Exception:
            pass
    args.out.mkdir(parents=True, exist_ok=True)
    base_row = dict(
        layers=args.layers,
        max_len=args.max_len,
        steps=args.steps,
        repeats=args.repeats,
        device="cpu" if args.smoke else torch.cuda.get_device_name(device),
        torch=torch.__version__,
        transformers=transformers.__version__,
        smoke=int(args.smoke),
    )
    (args.out / "run.json").write_text(
        json.dumps(
            {**base_row, "argv": sys.argv, "args": {k: str(v) for k, v in vars(args).items()}},
            indent=1,
        )
    )
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    model = build_model(args, device)
    base = list(model.model.layers)
    cfg = model.config
    DecodeStep = _decode_step_class()
    rows: list[dict] = []
    bf16_ms: dict[int, float] = {}
    failed_bits = []
    say(f"model built: {args.layers} layers on {base_row['device']}")
    for variant in args.variants:
        try:
            layers, vnote = variant_layers(base, variant, args, device)
        except Exception as err:  # a peer that does not run here: a row per batch, not a crash
            why = (
                f"{err}"
                if str(err).startswith("not run")
                else f"unavailable: {type(err).__name__}: {err}"
            )
            for batch in args.batches:
                rows.append({**base_row, "variant": variant, "batch": batch, "status": why[:300]})
            say(f"{variant}: {why[:200]}")
            write_csv(args.out / "decode.csv", rows)
            continue
        model.model.layers = torch.nn.ModuleList(layers)
        say(f"{variant}: layers ready {vnote}")
        layer_us, calls = "", ""
        if device.type == "cuda" and not args.no_layer_gemv:
            try:
                layer_us, calls = layer_gemv_us(
                    layers, variant, cfg.hidden_size, cfg.intermediate_size, device
                )
            except Exception as err:
                vnote = f"{vnote}; layer GEMV timing failed: {type(err).__name__}: {err}"[:300]
        for batch in args.batches:
            row = {**base_row, "variant": variant, "batch": batch, "status": "ok"}
            row.update(layer_gemv_us=layer_us, calls_per_layer=calls, note=vnote)
            try:
                step = DecodeStep(model, batch, args.max_len)
                step.prefill(args.prompt)
                run, mode, note, compile_s = make_runner(step, args, device)
                row.update(mode=mode, compile_s=compile_s)
                row["note"] = "; ".join(n for n in (vnote, note) if n)
                if (
                    batch == args.batches[0]
                    and mode == "compiled"
                    and variant in Q2GEMV + ("bf16",)
                ):
                    row["bits"] = bits_check(run, step)
                    if row["bits"] != "equal" and variant in Q2GEMV:
                        failed_bits.append(variant)
                        say(
                            f"!!! {variant}: compiled logits differ from eager ones (batch {batch})"
                        )
                ms = time_steps(run, step, args, device)
                row.update(ms_per_step=ms, tokens_per_s=batch / ms * 1e3)
                if variant == "bf16":
                    bf16_ms[batch] = ms
                row["speedup"] = bf16_ms[batch] / ms if batch in bf16_ms else float("nan")
                if device.type == "cuda" and not args.no_profile and batch in PROFILE_BATCHES:
                    row["gemv_share"], row["lm_share"] = gemv_shares(run, variant)
                    if variant == "bf16":
                        row["lm_share"] = ""
            except Exception as err:
                row["status"] = f"failed: {type(err).__name__}: {err}"[:300]
            finally:
                step = run = None
                if device.type == "cuda":
                    torch._dynamo.reset()
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            rows.append(row)
            write_csv(args.out / "decode.csv", rows)
            if row["status"] == "ok":
                say(
                    f"{variant} batch {batch}: {row['mode']} {row['ms_per_step']:.3f} ms/step, "
                    f"{row['speedup']:.2f}x bf16 (compile {row['compile_s']:.0f}s)"
                    + (f" bits {row['bits']}" if row.get("bits") else "")
                )
            else:
                say(f"{variant} batch {batch}: {row['status']}")
        model.model.layers = torch.nn.ModuleList(base)
        del layers
    plotted = plot(args.out / "decode.png", rows)
    say(f"wrote {args.out / 'decode.csv'}" + (" and decode.png" if plotted else ""))
    if failed_bits:
        print(f"BITS: compiled != eager logits for {sorted(set(failed_bits))}", file=sys.stderr)
    print(table(rows))
    ok = all(r["status"] == "ok" or r["variant"] not in ("bf16",) + Q2GEMV for r in rows)
    return 0 if ok and not failed_bits else 1


if __name__ == "__main__":
    sys.exit(main())

"""One decoder layer's projection calls at Llama-3-8B shapes, kernel by kernel, in a CUDA graph.

    python3 benchmarks/experimental/profile_layer.py q2_0,nvfp4,bf16 1,8,16

The four calls of a fused layer (q/k/v 6144x4096, o 4096x4096, gate/up 28672x4096, down
4096x14336) as q2gemv layers (``Q2Linear`` / ``Nvfp4Linear`` from one random ``nn.Linear``,
default numerics) or bf16 ``nn.Linear``, :data:`COPIES` copies of the layer in one CUDA graph
(cold weights: more than L2; captured and timed by ``bench_decode.py``'s helpers). Prints
per format and M the graph's time per layer and, from ``torch.profiler``, each kernel's
device time per layer: GEMV against prepare, the split that ``bench_decode.py``'s
``layer_gemv_us`` does not show. GPU only.
"""

from __future__ import annotations

import collections
import copy
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: bench_decode.py
from bench_decode import capture_graph, graph_us  # noqa: E402

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
COPIES = 8


def layer(fmt: str, device):
    import torch

    from q2gemv.nn.layers import Nvfp4Linear, Q2Linear

    mods = []
    for _, n, k in SHAPES:
        lin = torch.nn.Linear(k, n, bias=False)
        torch.nn.init.uniform_(lin.weight, -0.05, 0.05)
        if fmt == "bf16":
            mods.append(lin.to(torch.bfloat16).to(device))
        else:
            mods.append((Q2Linear if fmt == "q2_0" else Nvfp4Linear).from_linear(lin).to(device))
    return mods


def profile(fmt: str, m: int, layers, device) -> None:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    xs = {k: torch.randn(m, k, dtype=torch.bfloat16, device=device) for k in (4096, 14336)}

    def body():
        for mods in layers:
            for mod, (_, _, k) in zip(mods, SHAPES, strict=True):
                mod(xs[k])

    g = capture_graph(body)
    layer_us = graph_us(g, len(layers), replays=15, warmup=5)
    replays = 3
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    kernels = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels[e.name[:60]].append(e.device_time)
    print(f"== {fmt} M={m}: {layer_us:.1f} us per layer (graph, {len(layers)} layers)")
    total = 0.0
    for name, v in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
        per_layer = sum(v) / replays / len(layers)
        total += per_layer
        print(
            f"   {per_layer:7.2f} us/layer  calls/layer {len(v) / replays / len(layers):4.1f}"
            f"  mean {statistics.mean(v):6.2f} us  {name}"
        )
    print(f"   sum of kernels {total:.1f} us/layer")


def main(argv: list[str]) -> int:
    import torch

    fmts = argv[0].split(",") if argv else ["q2_0", "nvfp4", "bf16"]
    ms = [int(v) for v in argv[1].split(",")] if len(argv) > 1 else [1, 8]
    device = torch.device("cuda")
    for fmt in fmts:
        one = layer(fmt, device)
        layers = [one] + [copy.deepcopy(one) for _ in range(COPIES - 1)]
        for m in ms:
            profile(fmt, m, layers, device)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Toy decode loop in torch: L Linear layers at M=1, bf16 torch vs the same model on q2gemv layers.

    export PYTHONPATH=$PWD/src
    python3 benchmarks/bench_torch_decode.py --out DIR               # H200: 4 x 5120x5120
    python3 benchmarks/bench_torch_decode.py --out DIR --formats q2_0,nvfp4 --compile
    python3 benchmarks/bench_torch_decode.py --out DIR --dry-run     # CPU smoke run, tiny shape

The model is ``torch.nn.Sequential`` of ``--layers`` bias-free ``nn.Linear(n, n)``
in bf16, weights N(0, 1/n) (so activations keep their scale). One token is one
forward pass of a [1, n] activation through every layer (layer i reads layer
i-1's output); each token starts from the same input, so eager and graph
replay do identical work. The q2gemv models are that model with every Linear
swapped by ``q2gemv.torch.replace_linears`` (``Q2Linear.from_linear``, group
``--group``; ``Nvfp4Linear.from_linear``), under the library's default numerics
contract unless ``--numerics`` is given.

Modes, per model:

* ``eager``: ``model(x)`` per token (Python, the op's dispatch and the
  kernel launches every token);
* ``graph``: the forward captured once in a ``torch.cuda.CUDAGraph`` (after a
  warm-up on the capture stream, which compiles the kernels and allocates the
  exact contract's workspace), then one ``replay()`` per token;
* ``compile`` and ``compile_graphs`` (``--compile``): ``torch.compile(model)``
  (inductor) and ``torch.compile(model, mode="reduce-overhead")`` (inductor's
  CUDA graphs).

Timing: CUDA events around ``--tokens`` tokens, ``--repeats`` times; the CSV
has the median and the minimum per token. ``speedup`` is the bf16 model's
median in the same mode over this one's. Bits: each q2gemv model's eager
output is compared with a chain of ``q2gemv.gemv(..., backend="reference")``
calls (``bits_vs_reference``), and its graph replay's output with its eager
output (``graph_bits_vs_eager``); both must be ``equal``.

For the claim "with CUDA graphs, faster by the kernel ratio", compare the
graph-mode speedup with the single-kernel ratio bf16 / q2 at the same shape
and M=1, e.g. ``bf16_us / exact_us`` in ``benchmarks/results/2026-12-01_exact/h200_exact.csv``
(5120x5120, group 128: 16.16 / 13.46 = 1.20 with cold weights; note that the
4 q2 layers, 4 x 7.0 MB, fit the H200's L2, the bf16 ones, 4 x 52 MB, do not).

``--dry-run`` runs on the CPU (no GPU needed): n=128, 2 layers, 2 tokens, eager
only (the CPU path is q2gemv's NumPy reference), wall-clock timing marked as
such; it checks the bits and writes the CSV with ``dry_run=1``.

Writes ``DIR/<prefix>_torch_decode.csv`` (prefix ``h200`` on an H200, else the
device name, ``cpu_dry_run`` for ``--dry-run``) and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import csv
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

COLUMNS = (
    "device",
    "torch",
    "model",
    "mode",
    "n",
    "layers",
    "tokens",
    "repeats",
    "numerics",
    "us_per_token_median",
    "us_per_token_min",
    "speedup",
    "bits_vs_reference",
    "graph_bits_vs_eager",
    "dry_run",
)


def build_bf16_model(n: int, layers: int, device: str, seed: int = 0):
    """``layers`` bias-free bf16 ``nn.Linear(n, n)``, weights N(0, 1/n), on ``device``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(n, n, bias=False) for _ in range(layers)])
    with torch.no_grad():
        for lin in model:
            lin.weight.copy_(torch.randn(n, n, generator=g) / n**0.5)
    return model.to(device=device, dtype=torch.bfloat16).eval()


def swapped(model, fmt: str, group: int, numerics: str | None):
    """A copy of ``model`` with every Linear replaced by a q2gemv layer of format ``fmt``."""
    from q2gemv.torch import Nvfp4Linear, Q2Linear, replace_linears

    m = copy.deepcopy(model)
    if fmt == "q2_0":
        replace_linears(m, lambda lin: Q2Linear.from_linear(lin, group=group, numerics=numerics))
    else:
        replace_linears(m, lambda lin: Nvfp4Linear.from_linear(lin, numerics=numerics))
    return m


def reference_chain(model, x) -> np.ndarray:
    """The model's output computed layer by layer by q2gemv's NumPy reference (uint16 bits)."""
    import q2gemv

    a = bits(x).view(q2gemv.BF16)
    for layer in model:
        a = q2gemv.gemv(a, layer.quantized_weight(), backend="reference", numerics=layer.numerics)
    return a.view(np.uint16)


def bits(t) -> np.ndarray:
    import torch

    return t.detach().cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def time_cuda(step, tokens: int, repeats: int) -> list[float]:
    """Per-token microseconds of ``tokens`` calls of ``step``, ``repeats`` times (CUDA events)."""
    import torch

    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(tokens):
            step()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / tokens)
    return out


def time_wall(step, tokens: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(tokens):
            step()
        out.append((time.perf_counter() - t0) * 1e6 / tokens)
    return out


def graph_of(model, x, warmup: int):
    """``(graph, static output)``: ``model(x)`` captured after ``warmup`` calls on the capture stream."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.inference_mode():
        for _ in range(warmup):  # compiles kernels, allocates per-stream workspaces
            model(x)
        s.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            y = model(x)
    torch.cuda.current_stream().wait_stream(s)
    return g, y


def device_prefix(dry_run: bool) -> tuple[str, str]:
    import torch

    if dry_run:
        return "cpu", "cpu_dry_run"
    name = torch.cuda.get_device_name()
    prefix = "h200" if "H200" in name else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
    return name, prefix


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/<date>_torch_decode/"
    )
    p.add_argument("--n", type=int, default=5120, help="features in and out of every layer")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=200, help="tokens per timed repeat")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--group", type=int, default=128, choices=(64, 128))
    p.add_argument("--formats", default="q2_0", help="comma-separated: q2_0, nvfp4")
    p.add_argument("--numerics", choices=("exact", "seed"), default=None)
    p.add_argument("--compile", action="store_true", help="add the torch.compile mode")
    p.add_argument("--dry-run", action="store_true", help="CPU smoke run at a tiny shape")
    args = p.parse_args(argv)
    args.out = args.out or dated("torch_decode")
    formats = [f for f in args.formats.split(",") if f]
    if bad := [f for f in formats if f not in ("q2_0", "nvfp4")]:
        p.error(f"--formats: unknown {bad} (expected q2_0, nvfp4)")
    import torch

    if args.dry_run:
        args.n, args.layers, args.tokens, args.repeats, args.warmup = 128, 2, 2, 1, 1
        device, timer, modes = "cpu", time_wall, ["eager"]
    else:
        if not torch.cuda.is_available():
            print("bench_torch_decode: no CUDA device (use --dry-run on a CPU)", file=sys.stderr)
            return 2
        device, timer, modes = "cuda", time_cuda, ["eager", "graph"]
        if args.compile:
            modes += ["compile", "compile_graphs"]
    dev_name, prefix = device_prefix(args.dry_run)

    base = build_bf16_model(args.n, args.layers, device)
    models = {"bf16": base} | {f: swapped(base, f, args.group, args.numerics) for f in formats}
    x = (torch.randn(1, args.n, generator=torch.Generator().manual_seed(1))).to(
        device=device, dtype=torch.bfloat16
    )

    rows, medians = [], {}
    for name, model in models.items():
        with torch.inference_mode():
            y_eager = model(x)
        ref_ok = graph_ok = ""
        if name != "bf16":
            ref_ok = "equal" if np.array_equal(bits(y_eager), reference_chain(model, x)) else "DIFF"
        for mode in modes:
            if mode == "graph":
                g, y_graph = graph_of(model, x, args.warmup)
                step = g.replay
                g.replay()
                torch.cuda.synchronize()
                if name != "bf16":
                    graph_ok = "equal" if np.array_equal(bits(y_graph), bits(y_eager)) else "DIFF"
            else:
                fn = model
                if mode.startswith("compile"):
                    torch._dynamo.reset()  # a fresh cache per model and mode
                if mode == "compile":
                    fn = torch.compile(model)
                elif mode == "compile_graphs":
                    fn = torch.compile(model, mode="reduce-overhead")

                def step(fn=fn):
                    with torch.inference_mode():
                        fn(x)

                for _ in range(args.warmup):
                    step()
            times = timer(step, args.tokens, args.repeats)
            med = statistics.median(times)
            medians[name, mode] = med
            rows.append(
                {
                    "device": dev_name,
                    "torch": torch.__version__,
                    "model": name,
                    "mode": mode,
                    "n": args.n,
                    "layers": args.layers,
                    "tokens": args.tokens,
                    "repeats": args.repeats,
                    "numerics": "" if name == "bf16" else (args.numerics or "default"),
                    "us_per_token_median": f"{med:.2f}",
                    "us_per_token_min": f"{min(times):.2f}",
                    "speedup": "",
                    "bits_vs_reference": ref_ok,
                    "graph_bits_vs_eager": graph_ok if mode == "graph" else "",
                    "dry_run": int(args.dry_run),
                }
            )
    for row in rows:
        row["speedup"] = f"{medians['bf16', row['mode']] / float(row['us_per_token_median']):.2f}"

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{prefix}_torch_decode.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    clock = "wall clock, CPU reference path" if args.dry_run else "CUDA events"
    print(f"{dev_name}: {args.layers} x Linear({args.n}, {args.n}), M=1, {clock}")
    print(f"{'model':6} {'mode':8} {'us/token':>10} {'min':>10} {'vs bf16':>8}  bits")
    for r in rows:
        checks = " ".join(
            f"{k}={r[k]}" for k in ("bits_vs_reference", "graph_bits_vs_eager") if r[k]
        )
        print(
            f"{r['model']:6} {r['mode']:8} {r['us_per_token_median']:>10} "
            f"{r['us_per_token_min']:>10} {r['speedup']:>8}  {checks}"
        )
    print(f"wrote {path}")
    bad = [r for r in rows if "DIFF" in (r["bits_vs_reference"], r["graph_bits_vs_eager"])]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

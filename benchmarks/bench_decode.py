"""Decode tokens/s of a Llama-3-8B-shaped transformers model: bf16 vs q2gemv Q2_0 and NVFP4.

    export PYTHONPATH=$PWD/src
    python3 benchmarks/bench_decode.py --out DIR                  # H200: 32 layers, ~3-4 min
    python3 benchmarks/bench_decode.py --out DIR --layers 8       # quicker, same shapes
    python3 benchmarks/bench_decode.py --out DIR --dry-run        # CPU smoke run, tiny model

Model: ``transformers.LlamaForCausalLM`` with Llama-3-8B's shapes (hidden 4096, MLP
14336, 32 heads, 8 KV heads, head dim 128, vocabulary 128256, ``--layers`` decoder
layers, 32 by default), built on the device with random bf16 weights (no download).
The formats, run one after the other on the same model (embeddings, norms and the LM
head stay bf16 throughout; only the 7 projections of every layer change):

* ``bf16``: the model as built (torch's dense bf16 GEMMs);
* ``q2_0``: every projection a :class:`q2gemv.torch.Q2Linear` (group ``--group``);
* ``nvfp4``: every projection a :class:`q2gemv.torch.Nvfp4Linear`;
* ``gemlite_a16w2`` / ``gemlite_a16w4``: gemlite's ``A16Wn`` layers (2 and 4 bits,
  group ``--group``), when ``import gemlite`` works (else a row with the reason);
* ``q2_0_w8`` / ``nvfp4_w8`` (only when named in ``--formats``): the same layers as
  ``q2_0`` / ``nvfp4`` with the exact kernels' CTAs forced to 8 warps instead of the
  launcher's choice (``warps_for``; the same bits): the check behind that choice.

The quantized weights are random codes made on the device (Q2_0 scale 0.02, NVFP4
block scale 1.0 and global scale 0.02/3, gemlite scale 0.02): decode speed does not
depend on the values, and quantizing 7 billion weights with the NumPy quantizers
would take minutes. Bits are the tests' business (tests/test_models.py); here the
column ``graph_vs_eager`` checks that the captured decoder gives the eager decoder's
tokens (batch 1, 8 tokens) on the real model.

Decode: :class:`q2gemv.torch.CapturedDecoder` (static KV cache of ``--prompt +
--new`` positions, the decode step captured in one CUDA graph per batch size), greedy,
prompts of ``--prompt`` random tokens, ``--new`` new tokens, batch sizes ``--batches``.
After one warm-up ``generate`` (which captures), ``--repeats`` times each: CUDA events
around ``prefill`` alone and, after it, around ``new - 1`` decode steps;
``ms_per_token`` = their time / (new - 1) (one decode step of the whole batch; an
earlier version took (generate - prefill) / (new - 1), which the prefill's varying
host time made meaningless for the eager q2gemv layers), ``tokens_per_s`` = batch /
that; ``speedup`` = the bf16 ``ms_per_token`` over this one at the same batch size.
Medians of the repeats.

Profile (``--no-profile`` skips it): for each format at batch 1, ``torch.profiler``
over 7 eager decode steps; the share of GPU kernel time spent in the quantized layers'
kernels (numba's kernel names: ``_ZN6cudapy`` + the module path ``q2gemv...``; gemlite's
Triton kernels: ``*A16fWn*``) and the ten longest kernels per format. The rest is the
non-GEMV cost of a step (attention, norms, rotary, the bf16 LM head, the bias ops).

Writes ``DIR/<prefix>_decode.csv``, ``DIR/<prefix>_decode_profile.csv`` and, with
matplotlib, ``DIR/<prefix>_decode.png`` (prefix ``h200`` on an H200, else the device
name, ``cpu_dry_run`` for ``--dry-run``), then prints the table and the issue's targets
(Q2_0 >= 2.5x bf16 at batch 1 and >= 2x at batch 8, NVFP4 >= 1.8x at batch 1) last.

``--dry-run`` runs on the CPU: hidden 256, 2 layers, vocabulary 512, batch 1, prompt 4,
3 new tokens, 1 repeat, eager (the q2gemv layers use the NumPy reference backend),
wall-clock timing; for tests, not for numbers.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

FORMATS = ("bf16", "q2_0", "nvfp4", "gemlite_a16w2", "gemlite_a16w4")
CTA_VARIANTS = ("q2_0_w8", "nvfp4_w8")  # run only when named: 8-warp CTAs forced
PROJECTIONS = (
    ("self_attn", "q_proj"),
    ("self_attn", "k_proj"),
    ("self_attn", "v_proj"),
    ("self_attn", "o_proj"),
    ("mlp", "gate_proj"),
    ("mlp", "up_proj"),
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
DRY = dict(
    LLAMA3_8B,
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)
Q2_SCALE = 0.02  # Q2_0 block scale d: weights (code - 1) * d in {-d, 0, d, 2d}
NVFP4_SCALE_BITS = 0x38  # E4M3 1.0
NVFP4_GLOBAL = 0.02 / 3
TARGETS = (("q2_0", 1, 2.5), ("q2_0", 8, 2.0), ("nvfp4", 1, 1.8))
COLUMNS = (
    "device",
    "torch",
    "transformers",
    "format",
    "layers",
    "batch",
    "prompt",
    "new",
    "repeats",
    "prefill_ms",
    "ms_per_token",
    "tokens_per_s",
    "speedup",
    "graph_vs_eager",
    "status",
    "dry_run",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for the CSV and plot")
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default 32)")
    p.add_argument("--batches", default=None, help="comma-separated (default 1,4,8,16)")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (default 128)")
    p.add_argument("--new", type=int, default=None, help="new tokens (default 128)")
    p.add_argument(
        "--formats", default=",".join(FORMATS), help=f"subset of {FORMATS + CTA_VARIANTS}"
    )
    p.add_argument("--group", type=int, default=128, choices=(64, 128), help="Q2_0 group")
    p.add_argument("--numerics", default=None, help="q2gemv numerics contract (default)")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per point (default 2)")
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler part")
    p.add_argument("--dry-run", action="store_true", help="tiny CPU run (tests)")
    args = p.parse_args(argv)
    formats = tuple(f for f in args.formats.split(",") if f)
    bad = [f for f in formats if f not in FORMATS + CTA_VARIANTS]
    if bad or not formats:
        p.error(
            f"--formats: expected a comma-separated subset of {FORMATS + CTA_VARIANTS}, "
            f"got {args.formats!r}"
        )
    args.formats = formats
    dry = args.dry_run
    args.repeats = args.repeats if args.repeats is not None else (1 if dry else 2)
    args.layers = args.layers if args.layers is not None else (2 if dry else 32)
    args.prompt = args.prompt if args.prompt is not None else (4 if dry else 128)
    args.new = args.new if args.new is not None else (3 if dry else 128)
    try:
        args.batches = tuple(
            int(b) for b in (args.batches or ("1" if dry else "1,4,8,16")).split(",")
        )
    except ValueError:
        p.error(f"--batches: expected comma-separated integers, got {args.batches!r}")
    for name, value, low in (
        ("--layers", args.layers, 1),
        ("--prompt", args.prompt, 1),
        ("--new", args.new, 2),
        ("--repeats", args.repeats, 1),
        *(("--batches", b, 1) for b in args.batches),
    ):
        if value < low:
            p.error(f"{name}: expected an integer >= {low}, got {value}")
    return args


# -- the model and its formats -------------------------------------------------------------


def build_model(args, device):
    """The bf16 LlamaForCausalLM, random weights made on ``device`` (no fp32 copy)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **{**(DRY if args.dry_run else LLAMA3_8B), "num_hidden_layers": args.layers}
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


def random_q2(linear, group: int, numerics, device):
    """A Q2Linear of ``linear``'s shape with random codes and block scale Q2_SCALE."""
    import torch

    from q2gemv import Q2Weight
    from q2gemv.formats.q2_0 import block_bytes, row_bytes
    from q2gemv.torch import Q2Linear

    n, k = linear.out_features, linear.in_features
    layer = Q2Linear(
        Q2Weight.from_bytes(np.zeros(n * row_bytes(k, group), np.uint8), n, k, group),
        numerics=numerics,
    ).to(device)
    blocks = layer.raw.view(n, k // group, block_bytes(group))
    blocks[..., 2:].random_(0, 256)
    scale = torch.tensor([Q2_SCALE], dtype=torch.float16, device=device).view(torch.uint8)
    blocks[..., :2].copy_(scale.expand(n, k // group, 2))
    return layer


def random_nvfp4(linear, numerics, device):
    """An Nvfp4Linear of ``linear``'s shape: random E2M1 codes, block scale 1.0, global 0.02/3."""
    from q2gemv import Nvfp4Weight
    from q2gemv.torch import Nvfp4Linear

    n, k = linear.out_features, linear.in_features
    weight = Nvfp4Weight.from_parts(
        np.zeros((n, k // 2), np.uint8),
        np.full((n, k // 16), NVFP4_SCALE_BITS, np.uint8),
        np.float32(NVFP4_GLOBAL),
    )
    layer = Nvfp4Linear(weight, numerics=numerics).to(device)
    layer.packed.random_(0, 256)
    return layer


def random_gemlite(linear, bits: int, group: int, device):
    """gemlite's A16Wn layer (``bits``-bit codes, group ``group``): random codes, scale 0.02."""
    import torch
    from gemlite.helper import A16Wn

    n, k = linear.out_features, linear.in_features
    codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device=device)
    scales = torch.full((n, k // group), 0.02, dtype=torch.bfloat16, device=device)
    zeros = torch.full((n, k // group), (2**bits - 1) / 2, dtype=torch.bfloat16, device=device)
    return A16Wn(device=str(device)).from_weights(
        codes, scales, zeros, W_nbits=bits, group_size=group
    )


def swap_projections(model, make) -> None:
    """Replace the 7 projections of every decoder layer by ``make(current layer)``."""
    for layer in model.model.layers:
        for parent, attr in PROJECTIONS:
            owner = getattr(layer, parent)
            setattr(owner, attr, make(getattr(owner, attr)))


_FORCED: dict = {}  # exact-kernel module -> its own warps_for, while a CTA variant runs


def cta_variant(fmt: str) -> str:
    """The base format of ``fmt``; for a ``*_w8`` variant, the family's exact kernels take 8-warp
    CTAs from now on (until the next call): their ``warps_for`` is replaced. Any other format
    puts the launcher's own choice back."""
    for mod, own in _FORCED.items():
        mod.warps_for = own
    _FORCED.clear()
    if fmt not in CTA_VARIANTS:
        return fmt
    base = fmt.removesuffix("_w8")
    if base == "q2_0":
        from q2gemv.cuda.q2_0 import exact as mod
    else:
        from q2gemv.cuda.nvfp4 import exact as mod
    _FORCED[mod] = mod.warps_for
    mod.warps_for = lambda n, k, m: mod.WARPS
    return base


def to_format(model, fmt: str, args, device) -> None:
    fmt = cta_variant(fmt)
    if fmt == "q2_0":
        swap_projections(model, lambda lin: random_q2(lin, args.group, args.numerics, device))
    elif fmt == "nvfp4":
        swap_projections(model, lambda lin: random_nvfp4(lin, args.numerics, device))
    elif fmt.startswith("gemlite_a16w"):
        bits = int(fmt.removeprefix("gemlite_a16w"))
        swap_projections(model, lambda lin: random_gemlite(lin, bits, args.group, device))
    elif fmt != "bf16":
        raise ValueError(f"fmt: unknown format {fmt!r}")


# -- timing and profile -------------------------------------------------------------------


def _timer(device):
    """``elapsed_ms(fn)``: CUDA events on a GPU, wall clock on the CPU."""
    import torch

    if device.type == "cuda":

        def elapsed(fn) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)

    else:

        def elapsed(fn) -> float:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3

    return elapsed


def time_decode(model, args, device, batch: int) -> dict:
    import torch

    from q2gemv.torch import CapturedDecoder

    decoder = CapturedDecoder(model, max_len=args.prompt + args.new)
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, model.config.vocab_size, (batch, args.prompt), generator=gen).to(device)
    elapsed = _timer(device)
    decoder.generate(ids, args.new)  # warm-up: compiles, captures
    prefill, steps = [], []
    for _ in range(args.repeats):
        prefill.append(elapsed(lambda: decoder.prefill(ids)))
        # the decode steps timed on their own: a prefill's host time (eager layers) varies
        # by far more than a decode step lasts, so generate - prefill is no measurement
        steps.append(elapsed(lambda: [decoder.step() for _ in range(args.new - 1)]))
    pre = statistics.median(prefill)
    per_token = statistics.median(steps) / (args.new - 1)
    row = dict(prefill_ms=pre, ms_per_token=per_token, tokens_per_s=batch / per_token * 1e3)
    if batch == 1:
        eager = CapturedDecoder(model, max_len=args.prompt + args.new, capture=False)
        n = min(8, args.new)
        same = torch.equal(decoder.generate(ids, n), eager.generate(ids, n))
        row["graph_vs_eager"] = "equal" if same else "DIFFERENT"
    return row


def _device_us(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def _is_gpu(evt) -> bool:
    kind = getattr(evt, "device_type", None)
    return kind is not None and str(kind).endswith(("CUDA", "PrivateUse1")) and _device_us(evt) > 0


# Kernel names counted as the quantized layers': numba's mangled names start _ZN6cudapy
# and hold the module path (q2gemv...); gemlite's Triton kernels are named *A16fWn*.
OURS = {
    "q2_0": re.compile(r"cudapy|q2gemv"),
    "nvfp4": re.compile(r"cudapy|q2gemv"),
    "gemlite_a16w2": re.compile(r"A16fWn|gemlite", re.I),
    "gemlite_a16w4": re.compile(r"A16fWn|gemlite", re.I),
}
OURS.update({v: OURS[v.removesuffix("_w8")] for v in CTA_VARIANTS})


def profile_steps(model, args, device, fmt: str, steps: int = 8) -> list[dict]:
    """Kernel times of ``steps`` eager decode steps at batch 1: the ten longest and the share."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from q2gemv.torch import CapturedDecoder

    decoder = CapturedDecoder(model, max_len=args.prompt + steps + 1, capture=False)
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt)).to(device)
    decoder.prefill(ids)
    decoder.step()  # compiles what the first step compiles, outside the profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps - 1):
            decoder.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if _is_gpu(e)]
    total = sum(_device_us(e) for e in kernels)
    pattern = OURS.get(fmt)
    ours = sum(_device_us(e) for e in kernels if pattern is not None and pattern.search(e.key))
    rows = [
        dict(
            format=fmt,
            kernel="(quantized GEMV kernels, all)",
            calls="",
            device_us_per_step=ours / (steps - 1),
            share=ours / total if total else float("nan"),
        ),
        dict(
            format=fmt,
            kernel="(all kernels)",
            calls="",
            device_us_per_step=total / (steps - 1),
            share=1.0,
        ),
    ]
    for e in sorted(kernels, key=_device_us, reverse=True)[:10]:
        rows.append(
            dict(
                format=fmt,
                kernel=e.key[:160],
                calls=e.count,
                device_us_per_step=_device_us(e) / (steps - 1),
                share=_device_us(e) / total if total else float("nan"),
            )
        )
    return rows


# -- output ------------------------------------------------------------------------------


def _prefix(args, device) -> str:
    import torch

    if args.dry_run:
        return "cpu_dry_run"
    name = torch.cuda.get_device_name(device)
    return "h200" if "H200" in name else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def write_csv(path: Path, rows: list[dict], columns) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})


def plot(path: Path, rows: list[dict]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for fmt in dict.fromkeys(r["format"] for r in rows):
        pts = [
            (r["batch"], r["tokens_per_s"])
            for r in rows
            if r["format"] == fmt and r["status"] == "ok"
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=fmt)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode tokens/s (all sequences)")
    ax.set_title("Llama-3-8B-shaped decode, CUDA graph per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def table(rows: list[dict]) -> str:
    lines = [f"{'format':<15}{'batch':>6}{'ms/token':>10}{'tokens/s':>11}{'speedup':>9}  status"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['format']:<15}{r['batch']:>6}{'':>10}{'':>11}{'':>9}  {r['status']}")
            continue
        lines.append(
            f"{r['format']:<15}{r['batch']:>6}{r['ms_per_token']:>10.3f}{r['tokens_per_s']:>11.1f}"
            f"{r['speedup']:>9.2f}  ok"
        )
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    out = []
    for fmt, batch, want in TARGETS:
        got = [
            r["speedup"]
            for r in rows
            if (r["format"], r["batch"], r["status"]) == (fmt, batch, "ok")
        ]
        if got and got[0] == got[0]:
            verdict = "met" if got[0] >= want else "MISSED"
            out.append(f"target {fmt} batch {batch} >= {want}x bf16: {got[0]:.2f}x {verdict}")
        else:
            out.append(f"target {fmt} batch {batch} >= {want}x bf16: not measured")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import transformers

    if args.dry_run:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench_decode: no CUDA device (use --dry-run for the CPU smoke run)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    args.out.mkdir(parents=True, exist_ok=True)
    prefix = _prefix(args, device)
    base = dict(
        device="cpu" if args.dry_run else torch.cuda.get_device_name(device),
        torch=torch.__version__,
        transformers=transformers.__version__,
        layers=args.layers,
        prompt=args.prompt,
        new=args.new,
        repeats=args.repeats,
        dry_run=int(args.dry_run),
    )
    t0 = time.perf_counter()
    model = build_model(args, device)
    rows: list[dict] = []
    profile_rows: list[dict] = []
    bf16 = {}
    for fmt in args.formats:
        try:
            to_format(model, fmt, args, device)
        except Exception as err:  # a peer that does not run here: recorded, not fatal
            for batch in args.batches:
                rows.append(
                    {**base, "format": fmt, "batch": batch, "status": f"unavailable: {err!r}"[:200]}
                )
            print(f"[{time.perf_counter() - t0:6.1f}s] {fmt}: unavailable ({err!r})", flush=True)
            continue
        for batch in args.batches:
            row = {**base, "format": fmt, "batch": batch, "graph_vs_eager": "", "status": "ok"}
            try:
                row.update(time_decode(model, args, device, batch))
            except Exception as err:
                row["status"] = f"failed: {err!r}"[:200]
            if row["status"] == "ok":
                if fmt == "bf16":
                    bf16[batch] = row["ms_per_token"]
                row["speedup"] = (
                    bf16[batch] / row["ms_per_token"] if batch in bf16 else float("nan")
                )
            rows.append(row)
            ms = row.get("ms_per_token", float("nan"))
            print(
                f"[{time.perf_counter() - t0:6.1f}s] {fmt} batch {batch}: {row['status']} "
                f"{ms:.3f} ms/token, {row.get('speedup', float('nan')):.2f}x bf16",
                flush=True,
            )
            # after every point: a run cut short by its time limit keeps what it measured
            write_csv(args.out / f"{prefix}_decode.csv", rows, COLUMNS)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if not args.no_profile:
            try:
                profile_rows += profile_steps(model, args, device, fmt)
            except Exception as err:
                profile_rows.append(dict(format=fmt, kernel=f"profile failed: {err!r}"[:200]))
    write_csv(args.out / f"{prefix}_decode.csv", rows, COLUMNS)
    if profile_rows:
        write_csv(
            args.out / f"{prefix}_decode_profile.csv",
            profile_rows,
            ("format", "kernel", "calls", "device_us_per_step", "share"),
        )
    plotted = plot(args.out / f"{prefix}_decode.png", rows)
    print(f"wrote {args.out / f'{prefix}_decode.csv'}" + (" and the plot" if plotted else ""))
    for r in profile_rows:
        if r.get("kernel") == "(quantized GEMV kernels, all)" and r["share"] == r["share"]:
            print(
                f"profile {r['format']}: quantized GEMV kernels {r['share']:.1%} of a decode step's GPU time"
            )
    print(
        f"elapsed {time.perf_counter() - t0:.1f}s"
        + ("  (dry run: CPU wall clock)" if args.dry_run else "")
    )
    if not args.dry_run:  # the targets are the H200's; a CPU dry run says nothing about them
        print("\n".join(targets(rows)))
    print(table(rows))
    return 0 if all(r["status"] == "ok" or r["format"].startswith("gemlite") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

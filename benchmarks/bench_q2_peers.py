"""Exact Q2_0 or NVFP4 GEMV beside its peers, in one run: public call, GEMV alone, the seed
contract, torch bf16, gemlite, tinygemm int4.

    export PYTHONPATH=$PWD/src:$PWD/.peers/gemlite-0.6.0.post2   # gemlite: `pip download gemlite`
    python3 benchmarks/bench_q2_peers.py --out DIR                 # 4 shapes x M 1..32, g128
    python3 benchmarks/bench_q2_peers.py --out DIR --shapes 16384x16384 --ms 1,8 --group 64
    python3 benchmarks/bench_q2_peers.py --out DIR --format nvfp4  # NVFP4, gemlite A16W4

Per (shape, M), all timed the same way (:class:`q2gemv.bench.timing.GraphTimer`: a CUDA
graph of calls that rotates through enough weight copies to exceed 2x L2, median of
``--repeats`` replays), torch tensors throughout:

* ``public_us``: ``q2gemv.gemv(a, w, out=out)`` (``w`` from ``Q2Weight.to_device()`` or
  ``Nvfp4Weight.to_device()``, ``a`` torch bf16 [M, K]): the prepare and the GEMV, as a
  user calls it;
* ``gemv_us``: the GEMV alone on activations prepared once (the public call's launches
  without its prepare, pre-bound as in ``bench_exact.py``);
* ``seed_us``: ``q2gemv.gemv(a, w, out=out, numerics="seed")`` (the seed contract's
  kernels, as the tier plan picks them; the first such call rebuilds the storage bytes
  on the device, before timing);
* ``bf16_us``: ``torch.matmul(a, W.T, out=out)`` with a dense bf16 W (cuBLAS);
* ``gemlite_us``: gemlite's ``A16Wn`` layer, 2-bit (Q2_0) or 4-bit (NVFP4) codes, group
  ``--group``, bf16 (when ``import gemlite`` works; else empty, the reason in
  ``gemlite_note``);
* ``tinygemm_us``: torch's own int4 GEMM (``torch.ops.aten._weight_int4pack_mm`` on a weight
  packed by ``_convert_weight_to_int4pack``, group 128, bf16 scales and zeros: the
  gpt-fast / torchao int4 path), 4.25 bits a weight.

``floor_us`` is the weight bytes (codes and scales) over the streaming-read ceiling
measured in the same run. Bits: the public call's output of every (shape, M) with M in
``CHECK_MS`` is compared with the exact reference (:mod:`q2gemv.reference.exact`). Writes
``DIR/h200_q2_peers.csv`` / ``DIR/h200_nvfp4_peers.csv`` and the plot beside it (time
against M per shape), then prints the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

SHAPES = (
    (16384, 16384),
    (5120, 5120),
    (17408, 5120),
    (5120, 17408),
    (4096, 4096),  # Llama-3-8B: q/o
    (1024, 4096),  # k/v
    (14336, 4096),  # gate/up
    (4096, 14336),  # down
)
MS = (1, 2, 4, 8, 16, 32)
CHECK_MS = (1, 16)
L2_BYTES = 60 * 2**20


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: benchmarks/results/<date>_q2_peers or _nvfp4_peers/",
    )
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,...")
    p.add_argument("--ms", default=",".join(map(str, MS)))
    p.add_argument("--format", default="q2_0", choices=tuple(FORMATS))
    p.add_argument("--group", type=int, default=128, choices=(64, 128), help="Q2_0 and gemlite")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-seed", action="store_true", help="skip the seed contract's timing")
    p.add_argument("--no-gemlite", action="store_true", help="skip gemlite (its autotuning)")
    args = p.parse_args(argv)
    args.out = args.out or dated(f"{'q2' if args.format == 'q2_0' else 'nvfp4'}_peers")
    args.shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    args.ms = [int(m) for m in args.ms.split(",")]
    return args


# format -> (CSV/plot name, gemlite code bits, family, exact reference, label)
FORMATS = {
    "q2_0": ("h200_q2_peers", 2, "q2_0", "q2_0_gemv_exact", "Q2_0"),
    "nvfp4": ("h200_nvfp4_peers", 4, "w4a16", "w4a16_gemv_exact", "NVFP4"),
}


def gemlite_layers(n: int, k: int, group: int, copies: int, bits: int = 2):
    """``copies`` gemlite A16Wn layers of random ``bits``-bit codes (scale 0.02), or (None, why)."""
    try:
        import torch
        from gemlite.helper import A16Wn
    except Exception as e:  # an optional peer: its absence is a row note, not a failure
        return None, f"import: {type(e).__name__}: {e}"
    layers = []
    for _ in range(copies):
        codes = torch.randint(0, 2**bits, (n, k), dtype=torch.uint8, device="cuda")
        scales = torch.full((n, k // group), 0.02, dtype=torch.bfloat16, device="cuda")
        zeros = torch.full((n, k // group), (2**bits - 1) / 2, dtype=torch.bfloat16, device="cuda")
        layers.append(
            A16Wn(device="cuda").from_weights(codes, scales, zeros, W_nbits=bits, group_size=group)
        )
    return layers, ""


def tinygemm_layers(n: int, k: int, copies: int):
    """``copies`` (packed int4 weight, scales-and-zeros) pairs for ``_weight_int4pack_mm``, group
    128, or (None, why)."""
    try:
        import torch

        layers = []
        for _ in range(copies):
            w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
            packed = torch.ops.aten._convert_weight_to_int4pack(w, 8)
            sz = torch.empty(k // 128, n, 2, dtype=torch.bfloat16, device="cuda")
            sz[..., 0] = 0.02
            sz[..., 1] = 0.0
            layers.append((packed, sz))
        return layers, ""
    except Exception as e:  # an optional peer: its absence is a row note, not a failure
        return None, f"{type(e).__name__}: {e}"[:200]


def main(argv=None) -> int:
    args = parse_args(argv)
    import ml_dtypes
    import torch
    from numba import cuda

    import q2gemv
    from q2gemv import bench
    from q2gemv.bench import timing
    from q2gemv.cuda.runtime import launcher
    from q2gemv.reference import exact as rex

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_exact import random_weight
    from bench_exact_w4a16 import random_weight as random_nvfp4

    name, bits, family, ref, label = FORMATS[args.format]
    reference = getattr(rex, ref)

    args.out.mkdir(parents=True, exist_ok=True)
    timer = timing.GraphTimer()
    ceiling = timing.read_ceiling(timer)
    print(f"read ceiling {ceiling / 1e9:.0f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    rows = []
    for n, k in args.shapes:
        if args.format == "q2_0":
            w = random_weight(rng, n, k, args.group)
        else:
            w = random_nvfp4(rng, n, k)
        copies = bench.rotation_copies(w.nbytes, L2_BYTES)
        dws = [w.to_device() for _ in range(copies)]
        dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        peers, note = (None, "not run (--no-gemlite)")
        if not args.no_gemlite:
            peers, note = gemlite_layers(n, k, args.group, copies, bits)
        tiny, tiny_note = tinygemm_layers(n, k, copies)
        for m in args.ms:
            a16 = rng.standard_normal((m, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
            a = torch.from_numpy(a16.view(np.int16)).view(torch.bfloat16).to("cuda")
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in dws]
            group = args.group if args.format == "q2_0" else 16
            row = {"format": args.format, "n": n, "k": k, "group": group, "m": m}
            row["weight_bytes"] = w.nbytes

            def median_us(calls) -> float:
                t = timer.time_sequence(calls, args.repeats).per_call_s
                return float(np.median(t)) * 1e6

            public = [
                lambda h, d=d, o=o, a=a: q2gemv.gemv(a, d, out=o)
                for d, o in zip(dws, outs, strict=True)
            ]
            row["public_us"] = median_us(public)
            if m in CHECK_MS:
                got = outs[0].cpu().view(torch.int16).numpy().view(np.uint16)
                want = reference(a16, w).view(np.uint16)
                row["mismatch"] = int((got != want).sum())
            # the GEMV alone: the public call's launches less its prepare (run once here),
            # pre-bound as bench_exact.py binds them (q2gemv.prepare is the host API)
            d_a = cuda.to_device(a16.view(np.uint16))
            d_outs = [cuda.device_array((m, n), np.uint16) for _ in dws]
            seqs = [
                launcher.prebind(launcher.exact_launches(family, d_a, d, o))
                for d, o in zip(dws, d_outs, strict=True)
            ]
            for lk in seqs[0]:
                lk(0)
            alone = [lk for seq in seqs for lk in seq[1:]]
            row["gemv_us"] = median_us(alone) * len(alone) / len(seqs)
            if not args.no_seed:
                seed = [
                    lambda h, d=d, o=o, a=a: q2gemv.gemv(a, d, out=o, numerics="seed")
                    for d, o in zip(dws, outs, strict=True)
                ]
                row["seed_us"] = median_us(seed)
            bf16 = [
                lambda h, W=W, o=o, a=a: torch.matmul(a, W.t(), out=o)
                for W, o in zip(dense, outs, strict=True)
            ]
            row["bf16_us"] = median_us(bf16)
            if peers is not None:
                try:
                    row["gemlite_us"] = median_us([lambda h, L=L, a=a: L(a) for L in peers])
                except Exception as e:  # a peer that fails at one M is a note, not a stop
                    row["gemlite_note"] = f"{type(e).__name__}: {e}"[:200]
            else:
                row["gemlite_note"] = note
            if tiny is not None:
                try:
                    mm = torch.ops.aten._weight_int4pack_mm
                    row["tinygemm_us"] = median_us(
                        [lambda h, P=P, Z=Z, a=a, mm=mm: mm(a, P, 128, Z) for P, Z in tiny]
                    )
                except Exception as e:  # a peer that fails at one M is a note, not a stop
                    row["tinygemm_note"] = f"{type(e).__name__}: {e}"[:200]
            else:
                row["tinygemm_note"] = tiny_note
            row["floor_us"] = w.nbytes / ceiling * 1e6
            row["vs_bf16"] = row["bf16_us"] / row["public_us"]
            if "gemlite_us" in row:
                row["vs_gemlite"] = row["gemlite_us"] / row["public_us"]
            if "tinygemm_us" in row:
                row["vs_tinygemm"] = row["tinygemm_us"] / row["public_us"]
            rows.append(row)
            print(
                f"{label} {n}x{k} g{group} M={m:2d} public {row['public_us']:7.1f} us "
                f"(gemv {row['gemv_us']:6.1f}) bf16 {row['bf16_us']:6.1f} "
                f"gemlite {row.get('gemlite_us', float('nan')):6.1f} "
                f"tinygemm {row.get('tinygemm_us', float('nan')):6.1f} floor {row['floor_us']:5.1f} "
                f"{row['vs_bf16']:5.2f}x bf16 mism {row.get('mismatch', '-')}",
                flush=True,
            )
            timing.flush_deferred_frees()
        del dws, dense, peers, tiny
        timing.flush_deferred_frees()
        write(rows, args.out, name, label)  # after every shape: a run cut short keeps its rows
    bad = sum(r.get("mismatch", 0) for r in rows)
    print("BITS:", "all checked cases bit-exact" if bad == 0 else f"{bad} mismatching elements")
    return 1 if bad else 0


def write(rows: list[dict], out: Path, name: str = "h200_q2_peers", label: str = "Q2_0") -> None:
    from q2gemv.bench.results import write_csv

    path = write_csv(rows, out / f"{name}.csv", list(dict.fromkeys(f for r in rows for f in r)))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"wrote {path} (no matplotlib: no plot)")
        return
    shapes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 4), squeeze=False)
    for ax, (n, k) in zip(axes[0], shapes, strict=True):
        sel = [r for r in rows if (r["n"], r["k"]) == (n, k)]
        ms = [r["m"] for r in sel]
        for key, what in (
            ("public_us", "q2gemv exact (public call)"),
            ("gemv_us", "q2gemv GEMV alone"),
            ("seed_us", "q2gemv seed contract"),
            ("bf16_us", "torch bf16"),
            ("gemlite_us", f"gemlite A16W{4 if label == 'NVFP4' else 2}"),
            ("tinygemm_us", "tinygemm int4 (torch)"),
            ("floor_us", f"{label} read floor"),
        ):
            ys = [r.get(key, np.nan) for r in sel]
            ax.plot(ms, ys, marker="o", label=what)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{n}x{k} g{sel[0]['group']}")
        ax.set_xlabel("M")
        ax.set_ylabel("us")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    print(f"wrote {path} and the plot")


if __name__ == "__main__":
    sys.exit(main())

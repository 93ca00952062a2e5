"""Exact-contract NVFP4 GEMV (``w4a16_gemv_exact``) on the H200: bits, then time per M.

    export PYTHONPATH=$PWD/src
    python3 benchmarks/bench_exact_w4a16.py --out DIR             # full matrix
    python3 benchmarks/bench_exact_w4a16.py --quick --out DIR     # 16384^2 and 5120^2, 3 M

For every (shape, M): ``w4a16_gemv_exact`` including its activation prepare
(``exact``), the GEMV alone on prepared operands (``gemv_only``), the seed
contract's tier plan as ``gemv(..., numerics="seed")`` dispatches it (``seed``,
``seed_kernel``) and torch bf16 ``F.linear`` (``bf16``), all in one process.
Timing: CUDA-graph replay of a sequence that rotates through enough weight
copies to exceed 2x L2 (cold weights), median of 7 replays
(:class:`q2gemv.bench.timing.GraphTimer`). ``ceiling_pct``: weight bytes /
time against the streaming-read ceiling measured in the same run. Bits:
the checked cases are compared with ``q2gemv.reference.exact`` (uint16,
every element). Writes ``DIR/h200_exact_w4a16.csv`` and prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

SHAPES = ((16384, 16384), (5120, 5120), (17408, 5120), (5120, 17408))
MS = (1, 2, 4, 8, 9, 16, 17, 32, 33)
QUICK_MS = (1, 8, 16)
REPEATS = 7


def random_weight(rng, n: int, k: int):
    """NVFP4 codes uniform over all 16, E4M3 scales over a realistic range, a ModelOpt-like g."""
    from q2gemv import Nvfp4Weight

    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    scales = rng.integers(0x20, 0x60, size=(n, k // 16), dtype=np.uint8)  # 2**-5 .. 2**4
    return Nvfp4Weight.from_codes(codes, scales, np.float32(0.00123))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/<date>_exact_w4a16/"
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ms", help="comma-separated M values (default: the full list)")
    p.add_argument("--shapes", help="e.g. 16384x16384,5120x5120 (default: all four)")
    p.add_argument(
        "--warps", type=int, choices=(4, 8, 16), help="force this many warps a CTA (default: auto)"
    )
    args = p.parse_args(argv)
    args.out = args.out or dated("exact_w4a16")
    import ml_dtypes
    import torch
    from numba import cuda

    import q2gemv
    from q2gemv import bench
    from q2gemv.bench import timing
    from q2gemv.cuda.nvfp4 import exact as xw
    from q2gemv.cuda.nvfp4 import seed as w4a16
    from q2gemv.cuda.runtime import launcher
    from q2gemv.reference.exact import w4a16_gemv_exact

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_exact import write_rows

    if args.warps:
        xw.warps_for = lambda n, k, m: args.warps
    args.out.mkdir(parents=True, exist_ok=True)
    l2 = 60 * 2**20
    timer = timing.GraphTimer()
    ceil = timing.read_ceiling(timer)  # streaming-read ceiling, same run (1 GiB)
    print(f"read ceiling {ceil / 1e9:.0f} GB/s", flush=True)
    shapes = SHAPES[:2] if args.quick else SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    ms = QUICK_MS if args.quick else MS
    if args.ms:
        ms = tuple(int(x) for x in args.ms.split(","))
    rng = np.random.default_rng(0)
    rows = []
    for n, k in shapes:
        wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w = random_weight(rng, n, k)
        copies = bench.rotation_copies(w.nbytes, l2)
        dws = [w4a16.DeviceNvfp4Weight.upload(w) for _ in range(copies)]
        for m in ms:
            a = rng.standard_normal((m, k)).astype(np.float32)
            a[:, rng.integers(0, k, 4)] *= 1000.0  # a few "massive activations"
            a16 = a.astype(ml_dtypes.bfloat16)
            d_a = cuda.to_device(a16.view(np.uint16))
            outs = [cuda.device_array((m, n), np.uint16) for _ in dws]
            seqs = [
                launcher.prebind(launcher.exact_launches("w4a16", d_a, dw, o))
                for dw, o in zip(dws, outs, strict=True)
            ]
            row = {"n": n, "k": k, "m": m, "weight_bytes": w.nbytes}
            check = m in (1, 9, 17, 33) if n * k <= 5120 * 17408 else m in (1, 16)
            if check:
                for lk in seqs[0]:
                    lk(0)
                cuda.synchronize()
                got = outs[0].copy_to_host()
                t0 = time.time()
                want = w4a16_gemv_exact(a16, w).view(np.uint16)
                row["ref_s"] = round(time.time() - t0, 1)
                row["mismatch"] = int((got != want).sum())
            calls = [lk for s in seqs for lk in s]
            row["exact_us"] = np.median(timer.time_sequence(calls, REPEATS).per_call_s) * 1e6
            row["exact_us"] *= len(calls) / len(seqs)
            gcalls = [lk for s in seqs for lk in s[1:]]
            t = np.median(timer.time_sequence(gcalls, REPEATS).per_call_s) * 1e6
            row["gemv_only_us"] = t * len(gcalls) / len(seqs)
            plan = list(q2gemv.plan(w, m, numerics="seed"))
            row["seed_kernel"] = "+".join(sorted({kn for _, _, kn in plan}))
            sl = [
                launcher.prebind(
                    [launcher.seed_launch(kn, d_a[r0 : r0 + rr], dw, o[r0 : r0 + rr], rr)]
                )[0]
                for dw, o in zip(dws, outs, strict=True)
                for r0, rr, kn in plan
            ]
            t = np.median(timer.time_sequence(sl, REPEATS).per_call_s) * 1e6
            row["seed_us"] = t * len(sl) / len(dws)
            ta = torch.from_numpy(a).to("cuda", torch.bfloat16)
            tout = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

            def lin(handle, ta=ta, tout=tout, wt=wt):
                torch.matmul(ta, wt.t(), out=tout)

            row["bf16_us"] = np.median(timer.time_sequence([lin] * 4, REPEATS).per_call_s) * 1e6
            row["floor_us"] = w.nbytes / ceil * 1e6
            row["ceiling_pct"] = 100 * row["floor_us"] / row["exact_us"]
            row["vs_bf16"] = row["bf16_us"] / row["exact_us"]
            row["seed_vs_bf16"] = row["bf16_us"] / row["seed_us"]
            rows.append(row)
            print(
                f"{n}x{k} M={m:2d} exact {row['exact_us']:7.1f} us "
                f"(gemv {row['gemv_only_us']:6.1f}) seed {row['seed_us']:7.1f} "
                f"bf16 {row['bf16_us']:6.1f} floor {row['floor_us']:5.1f} "
                f"{row['ceiling_pct']:4.0f}% {row['vs_bf16']:5.2f}x "
                f"mism {row.get('mismatch', '-')}",
                flush=True,
            )
            del seqs, outs, sl
            timing.flush_deferred_frees()
        del dws
        path = write_rows(rows, args.out, "h200_exact_w4a16.csv")  # after every shape
    print(f"read ceiling {ceil / 1e9:.0f} GB/s; wrote {path}")
    bad = sum(r.get("mismatch", 0) for r in rows)
    print("BITS:", "all checked cases bit-exact" if bad == 0 else f"{bad} mismatching elements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

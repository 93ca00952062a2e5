"""Exact-contract Q2_0 GEMV on the H200: bits against the reference, then time per M.

    export PYTHONPATH=$PWD/src
    python3 benchmarks/bench_exact.py --out DIR            # full matrix (about 4 minutes)
    python3 benchmarks/bench_exact.py --quick --out DIR    # 2 shapes, M = 1, 8, 16

For every (shape, group, M): ``q2_0_gemv_exact`` including its activation
prepare (``exact``), the GEMV alone on prepared operands (``gemv_only``), the
seed contract's default Q2_0 kernel (``seed``, M <= 8) and torch bf16
``F.linear`` (``bf16``), all in one process. Timing: CUDA-graph replay of a
sequence of calls that rotates through enough weight copies to exceed 2x L2
(cold weights), median of 7 replays (:class:`q2gemv.bench.timing.GraphTimer`).
``ceiling_pct`` is the weight bytes / time against the streaming-read ceiling
measured in the same run. Bits: every case listed in ``CHECK`` is compared
with ``q2gemv.reference.exact`` (uint16, all elements).

Writes ``DIR/h200_exact.csv`` and prints a table.
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
MS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 32, 33)
QUICK_MS = (1, 8, 16)
REPEATS = 7


def random_weight(rng, n: int, k: int, group: int):
    from q2gemv import Q2Weight

    codes = rng.integers(0, 3, size=(n, k), dtype=np.uint8)  # ternary, as quantizers emit
    scales = (rng.random((n, k // group)) * 0.02 + 0.001).astype(np.float16)
    return Q2Weight.from_codes(codes, scales, group)


def write_rows(rows: list[dict], out: Path, name: str = "h200_exact.csv") -> Path:
    """``out/name`` from ``rows`` (floats to 2 decimals), rewritten whole (also for
    ``bench_exact_w4a16.py``)."""
    from q2gemv.bench.results import write_csv

    fields = list(dict.fromkeys(f for r in rows for f in r))
    cells = [{k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    return write_csv(cells, out / name, fields)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/<date>_exact/"
    )
    p.add_argument("--quick", action="store_true")
    p.add_argument("--groups", default="128,64")
    p.add_argument("--ms", help="comma-separated M values (default: the full list)")
    p.add_argument("--shapes", help="NxK,... (default: the four shapes above; g64 on any)")
    args = p.parse_args(argv)
    args.out = args.out or dated("exact")
    import torch
    from numba import cuda

    from q2gemv import bench
    from q2gemv.bench import timing
    from q2gemv.cuda.q2_0 import seed as q2_0
    from q2gemv.cuda.runtime import launcher
    from q2gemv.dispatch.seed_rules import default_q2_kernel
    from q2gemv.reference.exact import q2_0_gemv_exact

    args.out.mkdir(parents=True, exist_ok=True)
    l2 = 60 * 2**20
    timer = timing.GraphTimer()
    ceil = timing.read_ceiling(timer)  # streaming-read ceiling, same run (1 GiB)
    print(f"read ceiling {ceil / 1e9:.0f} GB/s", flush=True)
    shapes = SHAPES[:2] if args.quick else SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(x) for x in s.split("x")) for s in args.shapes.split(","))
    ms = QUICK_MS if args.quick else MS
    if args.ms:
        ms = tuple(int(x) for x in args.ms.split(","))
    groups = tuple(int(g) for g in args.groups.split(","))
    rng = np.random.default_rng(0)
    rows = []
    for n, k in shapes:
        wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for group in groups:
            if group == 64 and (n, k) not in SHAPES[:2] and not args.shapes:
                continue
            w = random_weight(rng, n, k, group)
            copies = bench.rotation_copies(w.nbytes, l2)
            dws = [q2_0.DeviceQ2Weight.upload(w)] + [
                q2_0.DeviceQ2Weight.upload(w) for _ in range(copies - 1)
            ]
            for m in ms:
                a = rng.standard_normal((m, k)).astype(np.float32)
                a[:, rng.integers(0, k, 4)] *= 1000.0  # a few "massive activations"
                import ml_dtypes

                a16 = a.astype(ml_dtypes.bfloat16)
                d_a = cuda.to_device(a16.view(np.uint16))
                outs = [cuda.device_array((m, n), np.uint16) for _ in dws]
                seqs = [
                    launcher.prebind(launcher.exact_launches("q2_0", d_a, dw, o))
                    for dw, o in zip(dws, outs, strict=True)
                ]
                row = {"n": n, "k": k, "group": group, "m": m, "weight_bytes": w.nbytes}
                # bits
                check = m in (1, 5, 16, 33) if n * k <= 5120 * 17408 else m in (1, 16)
                if check:
                    for lk in seqs[0]:
                        lk(0)
                    cuda.synchronize()
                    got = outs[0].copy_to_host()
                    t0 = time.time()
                    want = q2_0_gemv_exact(a16, w).view(np.uint16)
                    row["ref_s"] = round(time.time() - t0, 1)
                    row["mismatch"] = int((got != want).sum())
                calls = [lk for s in seqs for lk in s]
                row["exact_us"] = np.median(timer.time_sequence(calls, REPEATS).per_call_s) * 1e6
                row["exact_us"] *= len(calls) / len(seqs)
                gseqs = [s[1:] for s in seqs]
                gcalls = [lk for s in gseqs for lk in s]
                t = np.median(timer.time_sequence(gcalls, REPEATS).per_call_s) * 1e6
                row["gemv_only_us"] = t * len(gcalls) / len(gseqs)
                if m <= 8:
                    name = default_q2_kernel(m, n)  # the seed contract's default (one launch)
                    sl = [
                        launcher.prebind([launcher.seed_launch(name, d_a, dw, o, m)])[0]
                        for dw, o in zip(dws, outs, strict=True)
                    ]
                    row["seed_us"] = np.median(timer.time_sequence(sl, REPEATS).per_call_s) * 1e6
                ta = torch.from_numpy(a).to("cuda", torch.bfloat16)
                tout = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

                def lin(handle, ta=ta, tout=tout, wt=wt):
                    torch.matmul(ta, wt.t(), out=tout)

                row["bf16_us"] = np.median(timer.time_sequence([lin] * 4, REPEATS).per_call_s) * 1e6
                row["floor_us"] = w.nbytes / ceil * 1e6
                row["ceiling_pct"] = 100 * row["floor_us"] / row["exact_us"]
                row["vs_bf16"] = row["bf16_us"] / row["exact_us"]
                rows.append(row)
                print(
                    f"{n}x{k} g{group} M={m:2d} exact {row['exact_us']:7.1f} us "
                    f"(gemv {row['gemv_only_us']:6.1f}) seed {row.get('seed_us', float('nan')):7.1f} "
                    f"bf16 {row['bf16_us']:6.1f} floor {row['floor_us']:5.1f} "
                    f"{row['ceiling_pct']:4.0f}% {row['vs_bf16']:5.2f}x "
                    f"mism {row.get('mismatch', '-')}",
                    flush=True,
                )
                del seqs, outs
                timing.flush_deferred_frees()
            del dws
            path = write_rows(rows, args.out)  # after every (shape, group): a cut run keeps them
    print(f"read ceiling {ceil / 1e9:.0f} GB/s; wrote {path}")
    bad = sum(r.get("mismatch", 0) for r in rows)
    print("BITS:", "all checked cases bit-exact" if bad == 0 else f"{bad} mismatching elements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

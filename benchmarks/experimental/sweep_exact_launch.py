"""The exact Q2_0 GEMVs' launch shapes, measured: the default and the batched variant per (shape, M).

    python3 benchmarks/experimental/sweep_exact_launch.py --out DIR                  # 8 shapes x M 1..32
    python3 benchmarks/experimental/sweep_exact_launch.py --out DIR --shapes 4096x4096 --ms 8,32

Per (shape, M) the GEMV alone (activations prepared once; the launches pre-bound; a CUDA
graph rotating through weight copies larger than 2x L2, median of ``--repeats``) for each
candidate: ``q2_0_gemv_exact`` (chunks of 8 rows) at 4, 8 and 16 warps a CTA with K split
across CTAs in 1 to 8 parts (``--family default`` for these alone), and the batched
variant ``q2_0_gemv_exact_batched`` (:mod:`q2gemv.cuda.q2_0.exact_batched`, one launch for up
to 32 rows) at 4 and 8 warps with K split in 1, 2, 4, 8 or 16 parts (each part keeping at
least 2 steps). The shape each one's rule picks is marked ``chosen``; every
candidate's bits are compared with the first candidate's (they must be equal: the exact
contract), and the first candidate's with the exact reference where ``M * N * K`` is small.
torch bf16 ``matmul`` in the same run. Writes ``DIR/h200_exact_launch_sweep.csv``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

SHAPES = (
    (16384, 16384),
    (4096, 4096),
    (1024, 4096),
    (14336, 4096),
    (4096, 14336),
    (5120, 5120),
    (17408, 5120),
    (5120, 17408),
)
MS = (1, 2, 4, 8, 16, 32)
L2_BYTES = 60 * 2**20
REF_MAX = 2**31  # M * N * K up to which the reference is computed on the host


def candidates(n: int, k: int, m: int, full: bool = True, family: str = "both", split: bool = True):
    """``(batched, warps, parts, cols, max_regs)`` of each candidate launch shape. The default
    kernel: 4, 8 and 16 warps, each with K split across CTAs in 1, 2, 3, 4, 6 or 8 parts
    (each warp keeping at least one step a part; ``split`` False: 1 part only). The batched variant (``family`` "both" or
    "batched", M >= 2; ``full``: 4 and 8 warps with every K split; else 4 and 8 warps with
    and without a 128-register cap, and 4 warps with K in 2 and 4 parts)."""
    steps = -(-k // 128)
    out = []
    if family in ("both", "default"):
        out = [
            (False, w, parts, 1, None)
            for w in (4, 8, 16)
            for parts in ((1, 2, 3, 4, 6, 8) if split else (1,))
            if parts == 1 or steps >= w * parts
        ]
    if m < 2 or family == "default":
        return out
    if full:
        for warps in (4, 8):
            for parts in (1, 2, 4, 8, 16):
                if parts == 1 or steps // parts >= 2:
                    out.append((True, warps, parts, 1, None))
        return out
    for warps, regs in ((4, None), (4, 128), (8, None), (8, 128)):
        out.append((True, warps, 1, 1, regs))
    for parts in (2, 4):
        if steps // parts >= 4:
            out.append((True, 4, parts, 1, None))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: benchmarks/results/<date>_exact_launch_sweep/",
    )
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    p.add_argument("--ms", default=",".join(map(str, MS)))
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--short", action="store_true", help="the short list (see candidates)")
    p.add_argument("--family", default="both", choices=("both", "default", "batched"))
    p.add_argument("--no-split", action="store_true", help="the default kernel unsplit only")
    p.add_argument(
        "--format",
        default="q2_0",
        choices=("q2_0", "nvfp4"),
        help="nvfp4: w4a16_gemv_exact at 4, 8 and 16 warps (no K split, no batched variant)",
    )
    args = p.parse_args(argv)
    args.out = args.out or dated("exact_launch_sweep")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    ms = [int(m) for m in args.ms.split(",")]

    import ml_dtypes
    import torch
    from numba import cuda

    from q2gemv import bench
    from q2gemv.bench import timing
    from q2gemv.bench.results import write_csv
    from q2gemv.cuda.nvfp4 import exact as xw
    from q2gemv.cuda.q2_0 import exact as ex
    from q2gemv.cuda.q2_0 import exact_batched as xb
    from q2gemv.cuda.runtime import launcher
    from q2gemv.dispatch.plan import ChunkPlan
    from q2gemv.reference import exact as rex

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    nvfp4 = args.format == "nvfp4"
    if nvfp4:
        from bench_exact_w4a16 import random_weight as w4_weight

        def random_weight(rng, n, k, group):
            return w4_weight(rng, n, k)

        reference, family = rex.w4a16_gemv_exact, "w4a16"
        exact_name, max_m = "w4a16_gemv_exact", xw.MAX_M
    else:
        from bench_exact import random_weight

        reference, family = rex.q2_0_gemv_exact, "q2_0"
        exact_name, max_m = "q2_0_gemv_exact", ex.MAX_M
    w4_warps_for = xw.warps_for

    args.out.mkdir(parents=True, exist_ok=True)
    xb.register()
    warps_for, parts_for, batch_rule = ex.warps_for, ex.parts_for, xb.launch_rule
    batched_for = ex.batched_for
    timer = timing.GraphTimer()
    rng = np.random.default_rng(0)
    rows, bad = [], 0
    for n, k in shapes:
        w = random_weight(rng, n, k, args.group)
        copies = bench.rotation_copies(w.nbytes, L2_BYTES)
        dws = [w.to_device() for _ in range(copies)]
        dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        for m in ms:
            a16 = rng.standard_normal((m, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
            d_a = cuda.to_device(a16.view(np.uint16))
            ta = torch.from_numpy(a16.view(np.int16)).view(torch.bfloat16).to("cuda")
            touts = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in dws]
            bf16 = [
                lambda h, W=W, o=o, ta=ta: torch.matmul(ta, W.t(), out=o)
                for W, o in zip(dense, touts, strict=True)
            ]
            bf16_us = float(np.median(timer.time_sequence(bf16, args.repeats).per_call_s)) * 1e6
            # the launches q2gemv.gemv makes: rows past 8 in one batched launch where
            # batched_for says so, else the default's 8-row launches
            wm = warps_for(n, k, min(m, 8))
            picks = {(False, wm, parts_for(n, k, min(m, 8), wm), 1, None)}
            if nvfp4:
                picks = {(False, w4_warps_for(n, k, min(m, max_m)), 1, 1, None)}
            elif batched_for(n, k, min(m, xb.MAX_M)):
                br = batch_rule(n, k, min(m, xb.MAX_M))
                picks = {(True, br.warps, br.parts, br.cols, br.max_regs)}
            first = None
            cands = candidates(n, k, m, not args.short, args.family, not args.no_split)
            if nvfp4:
                cands = [(False, w, 1, 1, None) for w in (4, 8, 16)]
            for batched, warps, parts, cols, regs in cands:
                name = xb.NAME if batched else exact_name
                plan = ChunkPlan(m, xb.MAX_M if batched else max_m, lambda rows, nm=name: nm)
                ex.warps_for = lambda n_, k_, m_, w=warps: w
                xw.warps_for = lambda n_, k_, m_, w=warps: w
                ex.parts_for = lambda n_, k_, m_, w_, p=parts: p
                ex.batched_for = lambda n_, k_, m_: False  # the default: 8-row launches
                rule = xb.LaunchRule(warps, parts, cols, regs)
                xb.launch_rule = lambda n_, k_, m_, r=rule: r
                try:
                    outs = [cuda.device_array((m, n), np.uint16) for _ in dws]
                    seqs = [
                        launcher.prebind(launcher.launches(family, "exact", plan, d, d_a, o))
                        for d, o in zip(dws, outs, strict=True)
                    ]
                    for lk in seqs[0]:
                        lk(0)
                    cuda.synchronize()
                    got = outs[0].copy_to_host()
                    alone = [lk for seq in seqs for lk in seq[1:]]
                    t = timer.time_sequence(alone, args.repeats).per_call_s
                    us = float(np.median(t)) * 1e6 * len(alone) / len(seqs)
                finally:
                    ex.warps_for, ex.parts_for, xb.launch_rule = warps_for, parts_for, batch_rule
                    ex.batched_for = batched_for
                    xw.warps_for = w4_warps_for
                if first is None:
                    first = got
                    if m * n * k <= REF_MAX:
                        want = reference(a16, w).view(np.uint16)
                        bad += int((got != want).sum())
                mism = int((got != first).sum())
                bad += mism
                row = {
                    "n": n,
                    "k": k,
                    "m": m,
                    "batched": int(batched),
                    "warps": warps,
                    "parts": parts,
                    "cols": cols,
                    "max_regs": regs or "",
                    "gemv_us": round(us, 2),
                    "bf16_us": round(bf16_us, 2),
                    "chosen": int((batched, warps, parts, cols, regs) in picks),
                    "mismatch": mism,
                }
                rows.append(row)
                print(
                    f"{n}x{k} M={m:2d} {'B' if batched else 'U'} w{warps:2d} "
                    f"p{parts:2d} c{cols} r{regs or '-'} {us:8.2f} us  bf16 {bf16_us:7.2f}"
                    f"{'  <- rule' if row['chosen'] else ''}{'  MISMATCH' if mism else ''}",
                    flush=True,
                )
            timing.flush_deferred_frees()
        del dws, dense
        timing.flush_deferred_frees()
        write_csv(rows, args.out / "h200_exact_launch_sweep.csv", list(rows[0]))
    best = {}
    for r in rows:
        key = (r["n"], r["k"], r["m"])
        if key not in best or r["gemv_us"] < best[key]["gemv_us"]:
            best[key] = r
    print("\nshape        M   best (build warps parts)   bf16")
    for (n, k, m), r in best.items():
        print(
            f"{n}x{k} {m:3d} {r['gemv_us']:8.2f} ({'B' if r['batched'] else 'U'} w{r['warps']} "
            f"p{r['parts']} c{r['cols']} r{r['max_regs'] or '-'})  {r['bf16_us']:7.2f}"
        )
    print("BITS:", "all candidates bit-equal" if bad == 0 else f"{bad} mismatching elements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

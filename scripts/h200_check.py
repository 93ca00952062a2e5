"""Every kernel on real-model shapes against its reference, bit for bit (GPU only).

    python scripts/h200_check.py [--quick] [--out DIR]

Q2_0: q2_0_gemv, q2_0_gemv_vec, q2_0_gemv_vec_batchm on 5120x5120,
17408x5120 and 5120x17408 (N x K), both groups, M in 1..9, 16, 17, random
codes including code 3. The exact contract's q2_0_gemv_exact on the same
shapes and groups, M in 1..9, 16, 17, 33, activations with a few 1000x
outliers. NVFP4: the exact contract's w4a16_gemv_exact on 5120x5120,
17408x5120 and 5120x17408, M in 1..9, 16, 17, 33 (all 16 codes, E4M3
scales across 2**-6..2**8, a negative global scale, 1000x outliers); the
seed tiers on the first two shapes. Both exact kernels also on fp16 activations
(rows reported as ``<kernel>+fp16``): the same shapes and M, one row of fp16
subnormals and one of values near 65504 (outputs past the fp16 range: +-Inf).
The reference is computed once per (shape, group) for the largest M: rows
are independent, so the first M rows are the expectation for every M.
Prints a summary table last; writes a CSV under --out.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

from q2gemv import Q2Weight, reference
from q2gemv.cuda.exact_contract import act_suffix
from q2gemv.cuda.q2_0 import seed as q2cuda
from q2gemv.formats.act import BF16 as BF16_ACT
from q2gemv.formats.act import FP16
from q2gemv.formats.bf16 import BF16
from q2gemv.golden.check import compare_bits
from q2gemv.host.call import run_kernel

SHAPES = ((5120, 5120), (17408, 5120), (5120, 17408))
MS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17)


def random_q2_weight(rng, n: int, k: int, g: int):
    """Random codes (code 3 included) and fp32-rounded scales; the host weight and its upload."""
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    scales = (rng.standard_normal((n, k // g)) * 0.02).astype(np.float32)
    w = Q2Weight.from_codes(codes, scales, group=g)
    return w, q2cuda.DeviceQ2Weight.upload(w)


def check_row(kernel: str, n: int, k: int, g: int, m: int, got, want, ref_s: float) -> dict:
    """One result row (and the mismatch report on stderr when the bits differ)."""
    rep = compare_bits(got, want)
    if not rep.ok:
        print(rep.format(f"{kernel} {n}x{k} g{g} m={m}"), file=sys.stderr)
    return dict(
        family="q2_0",
        kernel=kernel,
        n=n,
        k=k,
        group=g,
        m=m,
        elements=got.size,
        mismatches=rep.mismatches,
        ref_s=round(ref_s, 2),
    )


def q2_rows(rng, quick: bool) -> list[dict]:
    rows = []
    shapes = SHAPES[:1] if quick else SHAPES
    for n, k in shapes:
        for g in (64, 128):
            w, dw = random_q2_weight(rng, n, k, g)
            a = rng.standard_normal((max(MS), k)).astype(BF16)
            t0 = time.perf_counter()
            want = {
                "q2_0_gemv": reference.q2_0_gemv(a, w).view(np.uint16),
                "vec": reference.q2_0_gemv_vec(a, w).view(np.uint16),
            }
            t_ref = time.perf_counter() - t0
            for name in q2cuda.KERNELS:
                exp = want["q2_0_gemv" if name == "q2_0_gemv" else "vec"]
                for m in MS:
                    got = run_kernel(name, a[:m].view(np.uint16), dw)
                    rows.append(check_row(name, n, k, g, m, got, exp[:m], t_ref))
            print(f"q2_0 {n}x{k} g{g}: done", file=sys.stderr, flush=True)
    return rows


def exact_acts(rng, m: int, k: int, act: str) -> np.ndarray:
    """Activations [m, k] (bf16 or fp16): normal rows with a few 1000x outliers; for fp16 the
    second row is fp16 subnormals only, the third values near 65504 (sums past the range)."""
    a32 = rng.standard_normal((m, k)).astype(np.float32)
    a32[:, rng.integers(0, k, 4)] *= 1000.0  # "massive activations"
    if act == "bf16":
        return a32.astype(BF16)
    a32[1] = rng.integers(-1023, 1024, k) * 2.0**-24
    a32[2] = rng.uniform(30000.0, 65504.0, k) * np.sign(rng.standard_normal(k))
    return a32.astype(FP16.dtype)


EXACT_MS = (*MS, 33)


def exact_checks(rng, kernel: str, reference_fn, w, dw, g: int, label: str) -> list[dict]:
    """``kernel`` on bf16, then fp16, activations (:func:`exact_acts`) at every M of
    :data:`EXACT_MS`, against ``reference_fn(a, w)``; one line ``label act: done`` a format."""
    rows = []
    for act in (BF16_ACT, FP16):
        a = exact_acts(rng, max(EXACT_MS), w.k, act.name)
        name = kernel + act_suffix(act)
        t0 = time.perf_counter()
        want = reference_fn(a, w).view(np.uint16)
        t_ref = time.perf_counter() - t0
        for m in EXACT_MS:
            got = run_kernel(kernel, a[:m].view(np.uint16), dw, act=act)
            rows.append(check_row(name, w.n, w.k, g, m, got, want[:m], t_ref))
        print(f"{label.format(act=act.name)}: done", file=sys.stderr, flush=True)
    return rows


def exact_rows(rng, quick: bool) -> list[dict]:
    from q2gemv.reference.exact import q2_0_gemv_exact

    rows = []
    for n, k in SHAPES[:1] if quick else SHAPES:
        for g in (64, 128):
            w, dw = random_q2_weight(rng, n, k, g)
            label = f"q2_0 exact {{act}} {n}x{k} g{g}"
            rows += exact_checks(rng, "q2_0_gemv_exact", q2_0_gemv_exact, w, dw, g, label)
    return rows


def w4_exact_rows(rng, quick: bool) -> list[dict]:
    from q2gemv import Nvfp4Weight
    from q2gemv.cuda.nvfp4 import seed as wcuda
    from q2gemv.reference.exact import w4a16_gemv_exact

    rows = []
    for n, k in SHAPES[:1] if quick else SHAPES:
        codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
        scales = rng.integers(0x00, 0x7F, size=(n, k // 16), dtype=np.uint8) | np.uint8(0x20)
        w = Nvfp4Weight.from_codes(codes, scales, np.float32(-0.00123))
        dw = wcuda.DeviceNvfp4Weight.upload(w)
        label = f"w4a16 exact {{act}} {n}x{k}"
        checked = exact_checks(rng, "w4a16_gemv_exact", w4a16_gemv_exact, w, dw, 16, label)
        rows += [row | {"family": "w4a16"} for row in checked]
    return rows


def w4a16_rows(rng, quick: bool) -> list[dict]:
    try:
        from q2gemv.cuda.nvfp4 import seed as wcuda
        from q2gemv.formats.nvfp4 import Nvfp4Weight
        from q2gemv.reference.nvfp4 import w4a16_gemv
    except ImportError as e:
        print(f"W4A16 family not available: {e}", file=sys.stderr)
        return []
    rows = []
    shapes = SHAPES[:1] if quick else SHAPES[:2]
    for n, k in shapes:
        w = Nvfp4Weight.from_float(rng.standard_normal((n, k)).astype(np.float32) * 0.02)
        a = rng.standard_normal((33, k)).astype(BF16)
        want = w4a16_gemv(a, w).view(np.uint16)
        dw = wcuda.DeviceNvfp4Weight.upload(w)
        for name, spec in wcuda.SPECS.items():
            max_m = spec.max_m
            for m in sorted({1, 3, max_m // 2, max_m - 1, max_m}):
                got = run_kernel(name, a[:m].view(np.uint16), dw)
                rep = compare_bits(got, want[:m])
                rows.append(
                    dict(
                        family="w4a16",
                        kernel=name,
                        n=n,
                        k=k,
                        group=16,
                        m=m,
                        elements=got.size,
                        mismatches=rep.mismatches,
                        ref_s=0,
                    )
                )
                if not rep.ok:
                    print(rep.format(f"{name} {n}x{k} m={m}"), file=sys.stderr)
        print(f"w4a16 {n}x{k}: done", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="first shape only")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args()
    rng = np.random.default_rng(2026)
    rows = exact_rows(rng, args.quick) + w4_exact_rows(rng, args.quick)
    rows += q2_rows(rng, args.quick) + w4a16_rows(rng, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "h200_check.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    print(f"{'family':7} {'kernel':26} {'cases':>5} {'elements':>10} {'mismatching':>11}")
    for fam, kern in dict.fromkeys((r["family"], r["kernel"]) for r in rows):
        sel = [r for r in rows if r["kernel"] == kern]
        print(
            f"{fam:7} {kern:26} {len(sel):5d} {sum(r['elements'] for r in sel):10d} "
            f"{sum(r['mismatches'] for r in sel):11d}"
        )
    bad = sum(r["mismatches"] for r in rows)
    print("ALL BIT-EXACT" if bad == 0 else f"MISMATCHES: {bad}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Accuracy of the Q2_0 numerics contracts against the exact dot product (CPU, NumPy only).

    export PYTHONPATH=$PWD/src
    python3 benchmarks/accuracy_exact.py --out benchmarks/results     # ~2-3 minutes on 2 cores

For each group (128, 64) and input kind, ``y = a @ dequantize(w).T`` under

* ``exact``: :func:`q2gemv.reference.exact.q2_0_gemv_exact` (the exact contract), on bf16
  activations and (``--acts``) on fp16 activations of the same values (then fp16 out),
* ``seed``: :func:`q2gemv.reference.q2_0_gemv_vec` (the seed contract's order,
  that of every default seed Q2_0 kernel; bf16 only),

against ``x.w``, the dot product of the activations (in the row's format) with
``weight.dequantize()`` computed exactly (integers; a float64 BLAS matmul is
reported beside it as a sanity check). Errors are relative to the row's
largest ``|x.w|``: ``|y - x.w| / max_n |x.w[m, n]|``, max and median over all
outputs; "before rounding" is the same for the value each contract rounds to
the output format at the end (the exact contract's fixed-point sum; the seed's fp32
accumulator, extracted with the reference's own helpers and checked to
round to its output bits). ``not_correctly_rounded`` counts outputs whose
bits differ from x.w rounded once to the output format, ties to even.

Input kinds (weights: ``quantize_q2_0(N(0,1), method="absmean")``, ternary):

* ``normal``: activations N(0, 1).
* ``massive``: N(0, 1) with 4 outliers per row of magnitude ~1000 ("massive
  activations").
* ``cancelling``: ``a = [x, x']`` against ``w = [v, -v]`` (codes duplicated,
  scales negated), where ``x'`` equals ``x`` except one ulp (of the activation format)
  apart in 1/8 of the positions: ``x.w = sum v (x - x')`` is tiny beside its terms.

Writes ``OUT/cpu_accuracy_exact.csv`` and ``OUT/cpu_accuracy_exact.md``.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

KINDS = ("normal", "massive", "cancelling")
CONTRACTS = ("exact", "seed")  # the seed contract is bf16-only
FIELDS = [
    "group",
    "kind",
    "act",
    "n",
    "k",
    "m",
    "outputs",
    "contract",
    "max_rel_err",
    "median_rel_err",
    "max_rel_err_before_rounding",
    "median_rel_err_before_rounding",
    "not_correctly_rounded",
    "f64_matmul_max_rel_dev",
]


def exact_sums(aint: np.ndarray, weight) -> tuple[np.ndarray, int]:
    """``sum_k (code - 1) * d_b * aint[m, k]`` exactly: object ints [M, N] times ``2**p``.

    ``aint`` int64 [M, K] with |aint| < 2**44, so every block sum (at most 128
    terms of |code - 1| <= 2) is an integer below 2**53, exact in float64.
    """
    from q2gemv.reference.exact import fp16_scale_parts

    assert np.abs(aint).max() < 2**44, "activation integers too wide for exact float64 block sums"
    m, k = aint.shape
    g, nb = weight.group, weight.k // weight.group
    mant, exp, bad = fp16_scale_parts(weight.scales().view(np.uint16))
    assert not bad.any()
    emin = int(exp.min())
    scale = (mant.astype(object) * (2 ** (exp - emin)).astype(object)).astype(object)  # [N, nb]
    codes = weight.codes()
    total = np.zeros((m, weight.n), object)
    a_blocks = aint.reshape(m, nb, g).transpose(1, 0, 2).astype(np.float64)  # [nb, M, g]
    for r0 in range(0, weight.n, 1024):
        r1 = min(weight.n, r0 + 1024)
        w = (codes[r0:r1].astype(np.float64) - 1.0).reshape(r1 - r0, nb, g)
        s = np.matmul(a_blocks, w.transpose(1, 2, 0)).astype(np.int64)  # [nb, M, rows], exact
        total[:, r0:r1] = (s.transpose(1, 2, 0).astype(object) * scale[None, r0:r1]).sum(axis=2)
    return total, emin


def activation_integers(bits: np.ndarray, act) -> tuple[np.ndarray, np.ndarray]:
    """Activation bits [M, K] of format ``act`` -> ``(aint, s)``: ``a = aint * 2**-s[m]``
    exactly, per row."""
    b = bits.astype(np.int64)
    mb = act.mant_bits
    e = (b >> mb) & act.exp_max
    mant = np.where(e > 0, (b & ((1 << mb) - 1)) | (1 << mb), b & ((1 << mb) - 1))
    ulp = np.maximum(e, 1) + act.min_quantum - 1  # |a| = mant * 2**ulp
    nz = mant != 0
    lo = np.where(nz, ulp, 10**6).min(axis=1)
    s = -lo
    aint = np.where(nz, mant << np.clip(ulp + s[:, None], 0, 62), 0)
    aint = np.where((b & 0x8000) != 0, -aint, aint)
    return aint, s


def to_f64(total: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``total[m, n] * 2**p[m]`` as float64 (one rounding)."""
    f = np.frompyfunc(lambda t, q: math.ldexp(float(t), int(q)), 2, 1)
    return f(total, np.broadcast_to(p[:, None], total.shape)).astype(np.float64)


def seed_fp32(a, weight) -> np.ndarray:
    """The seed contract's fp32 value before bf16 rounding (``q2_0_gemv_vec``'s own helpers)."""
    from q2gemv.formats.bf16 import bf16_bits_to_f32
    from q2gemv.reference import q2_0 as seed
    from q2gemv.reference.fpmath import warp_tree_sum_f32

    lanes, width = 32, 16  # q2_0_gemv_vec: one warp, 16 codes per lane and word
    a32 = bf16_bits_to_f32(a.view(np.uint16))
    y = np.empty((a.shape[0], weight.n), np.float32)
    for r0 in range(0, weight.n, 512):
        r1 = min(weight.n, r0 + 512)
        cm1, d_unit = seed._weight_units(weight, r0, r1, lanes, width)
        y[:, r0:r1] = warp_tree_sum_f32(seed._lane_partials(a32, cm1, d_unit, weight.k // width))
    return y


def make_inputs(kind: str, rng, m: int, n: int, k: int, group: int, dtype):
    """(activations [m, k] of ``dtype`` (bf16 or fp16), Q2Weight [n, k]) of one input kind."""
    from q2gemv import Q2Weight, quantize_q2_0

    if kind != "cancelling":
        w = quantize_q2_0(rng.standard_normal((n, k)).astype(np.float32), group, "absmean")
        a = rng.standard_normal((m, k))
        if kind == "massive":
            for i in range(m):
                idx = rng.choice(k, 4, replace=False)
                a[i, idx] = 1000.0 * np.sign(a[i, idx]) * (1.0 + np.abs(rng.standard_normal(4)))
        return a.astype(dtype), w
    half = quantize_q2_0(rng.standard_normal((n, k // 2)).astype(np.float32), group, "absmean")
    codes = np.concatenate([half.codes(), half.codes()], axis=1)
    scales = np.concatenate([half.scales(), -half.scales()], axis=1)
    w = Q2Weight.from_codes(codes, scales, group)
    x = rng.standard_normal((m, k // 2)).astype(dtype)
    xb = x.view(np.uint16)
    flip = rng.random(xb.shape) < 1 / 8
    x2 = np.where(flip, xb + np.uint16(1), xb).astype(np.uint16)  # one ulp further from 0
    return np.concatenate([xb, x2], axis=1).view(dtype), w


def measure(kind: str, group: int, n: int, k: int, m: int, seed: int, act_name: str = "bf16"):
    """The rows of one (input kind, group, activation format): every contract that serves it."""
    from q2gemv import reference
    from q2gemv.formats.act import act_named
    from q2gemv.formats.bf16 import f32_to_bf16_bits
    from q2gemv.reference import exact as rex

    act = act_named(act_name)
    rng = np.random.default_rng(seed)  # the same weights and values for every format
    a, w = make_inputs(kind, rng, m, n, k, group, act.dtype)
    bits = a.view(np.uint16)
    aint, s = activation_integers(bits, act)
    total, emin = exact_sums(aint, w)
    p_true = emin - s
    xw = to_f64(total, p_true)
    nearest = np.frompyfunc(lambda v, p: rex.nearest_bits(v, p, act), 2, 1)
    correct = nearest(total, np.broadcast_to(p_true[:, None], total.shape)).astype(np.uint16)
    rowmax = np.abs(xw).max(axis=1, keepdims=True)
    assert (rowmax > 0).all()
    f64 = a.astype(np.float64) @ w.dequantize().astype(np.float64).T
    f64_dev = float((np.abs(f64 - xw) / rowmax).max())

    # the exact contract's value before its one rounding: sum w A 2**(E - 22)
    A, E, special = rex.fixed_point(bits, act)
    assert not special.any()
    ctotal, cemin = exact_sums(A, w)
    before = {"exact": to_f64(ctotal, E - rex.FRAC_BITS + cemin)}
    out = {"exact": rex.q2_0_gemv_exact(a, w).view(np.uint16)}
    assert np.array_equal(
        out["exact"],
        nearest(ctotal, np.broadcast_to((E - rex.FRAC_BITS + cemin)[:, None], ctotal.shape)),
    )
    if act_name == "bf16":  # the seed contract serves bf16 only
        y32 = seed_fp32(a, w)
        before["seed"] = y32.astype(np.float64)
        out["seed"] = reference.q2_0_gemv_vec(a, w).view(np.uint16)
        assert np.array_equal(out["seed"], f32_to_bf16_bits(y32)), "seed_fp32 lost the seed's bits"

    rows = []
    for c in out:
        y = out[c]
        yv = y.view(a.dtype).astype(np.float64)
        err = np.abs(yv - xw) / rowmax
        err0 = np.abs(before[c] - xw) / rowmax
        rows.append(
            {
                "group": group,
                "kind": kind,
                "act": act_name,
                "n": n,
                "k": k,
                "m": m,
                "outputs": m * n,
                "contract": c,
                "max_rel_err": f"{err.max():.3e}",
                "median_rel_err": f"{np.median(err):.3e}",
                "max_rel_err_before_rounding": f"{err0.max():.3e}",
                "median_rel_err_before_rounding": f"{np.median(err0):.3e}",
                "not_correctly_rounded": int((y != correct).sum()),
                "f64_matmul_max_rel_dev": f"{f64_dev:.1e}",
            }
        )
    return rows


def markdown(rows: list[dict], command: str) -> str:
    lines = [
        "# Accuracy of the exact and seed Q2_0 contracts, bf16 and fp16 (CPU, NumPy references)",
        "",
        f"Command: `{command}`",
        "",
        "Errors relative to the row's largest |x.w| (x.w: the exact dot product of the",
        "activations, in the row's format, with `weight.dequantize()`); max / median over all",
        'outputs of the case. "before rounding": the value each contract rounds to the output',
        'format last. "not correctly rounded": outputs whose bits differ from x.w rounded once',
        "to the output format (ties to even). The seed contract serves bf16 only.",
        "",
        "| group | input | act | N x K, M | contract | max err | median err "
        "| max err before rounding | median err before rounding | not correctly rounded |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['group']} | {r['kind']} | {r['act']} | {r['n']}x{r['k']}, {r['m']} "
            f"| {r['contract']} | {r['max_rel_err']} | {r['median_rel_err']} "
            f"| {r['max_rel_err_before_rounding']} | {r['median_rel_err_before_rounding']} "
            f"| {r['not_correctly_rounded']} of {r['outputs']} |"
        )
    dev = max((r["f64_matmul_max_rel_dev"] for r in rows), key=float)
    lines += [
        "",
        "A float64 BLAS matmul (`a.astype(float64) @ w.dequantize().astype(float64).T`) deviates",
        f"from the exact x.w by at most {dev} (relative to the row's largest |x.w|) on these inputs:",
        "the float64 dot product and the exact one are the same reference here.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: benchmarks/results/<date>_cpu_accuracy_exact/",
    )
    p.add_argument("--n", type=int, default=5120)
    p.add_argument("--k", type=int, default=5120)
    p.add_argument("--m", type=int, default=4, help="activation rows per input kind")
    p.add_argument("--groups", default="128,64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--acts", default="bf16,fp16", help="activation formats (bf16, fp16)")
    args = p.parse_args(argv)
    args.out = args.out or dated("cpu_accuracy_exact")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for group in (int(g) for g in args.groups.split(",")):
        for i, kind in enumerate(KINDS):
            t0 = time.perf_counter()
            new = []
            for act in args.acts.split(","):
                new += measure(kind, group, args.n, args.k, args.m, args.seed + 10 * group + i, act)
            rows += new
            for r in new:
                print(
                    f"g{group} {kind:10s} {r['act']} {r['contract']:5s} max {r['max_rel_err']} "
                    f"median {r['median_rel_err']} before rounding "
                    f"{r['max_rel_err_before_rounding']} / {r['median_rel_err_before_rounding']} "
                    f"wrong {r['not_correctly_rounded']}"
                )
            print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    with open(args.out / "cpu_accuracy_exact.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, FIELDS)
        wr.writeheader()
        wr.writerows(rows)
    command = "python3 benchmarks/accuracy_exact.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    (args.out / "cpu_accuracy_exact.md").write_text(markdown(rows, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

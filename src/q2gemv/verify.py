"""``q2gemv verify``: check the format against ggml's vectors and every kernel against its reference.

Backends: ``reference`` always; ``cuda`` on the GPU when one is present, else
under numba's CUDA simulator. The simulator must be chosen before numba is
imported, so it runs in a subprocess of this same command.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib import resources

import numpy as np

from .backends import gpu_present, simulator_requested
from .check import compare_bits
from .formats.bf16 import BF16
from .formats.q2_0 import Q2Weight, quantize_q2_0

KERNELS = ("q2_0_gemv", "q2_0_gemv_vec", "q2_0_gemv_vec_batchm")
# (n, k, m) per group: small enough for the simulator, covering tails and chunking.
CASES = ((1, 256, 1), (9, 256, 2), (7, 1024 + 128, 1), (17, 256, 9))


def ggml_vectors_check() -> tuple[int, int, list[str]]:
    """(cases, passes, failure lines) for ggml's own quantize/dequantize vectors."""
    path = resources.files("q2gemv.golden") / "data" / "ggml_q2_0_reference_vectors.npz"
    with resources.as_file(path) as p, np.load(p) as z:
        cases = passes = 0
        fails = []
        for g in (64, 128):
            for i in range(3):
                x, raw = z[f"g{g}_case{i}_x"], z[f"g{g}_case{i}_raw"]
                for what, got, want in (
                    ("quantize", quantize_q2_0(x, group=g).raw, raw),
                    (
                        "dequant",
                        Q2Weight.from_bytes(raw, *x.shape, group=g).dequantize(),
                        z[f"g{g}_case{i}_dequant"],
                    ),
                ):
                    cases += 1
                    rep = compare_bits(got, want)
                    passes += rep.ok
                    if not rep.ok:
                        fails.append(rep.format(f"ggml g{g} case{i} {what}"))
    return cases, passes, fails


def _case(seed: int, g: int, n: int, k: int, m: int):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)  # code 3 included
    scales = (rng.standard_normal((n, k // g)) * 0.05).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(BF16)
    return a, Q2Weight.from_codes(codes, scales, group=g)


def kernel_checks(backend: str) -> list[dict]:
    from . import api, reference

    rows = []
    for name in KERNELS:
        t0 = time.perf_counter()
        cases = passes = 0
        fails = []
        for g in (64, 128):
            for seed, (n, k, m) in enumerate(CASES):
                a, w = _case(seed, g, n, k, m)
                want = getattr(reference, name)(a, w)
                got = api.gemv(a, w, kernel=name, backend=backend)
                rep = compare_bits(got.view(np.uint16), want.view(np.uint16))
                cases += 1
                passes += rep.ok
                if not rep.ok:
                    fails.append(rep.format(f"{name} g{g} n={n} k={k} m={m}"))
        rows.append(
            dict(
                kernel=name,
                backend=backend,
                cases=cases,
                passes=passes,
                seconds=round(time.perf_counter() - t0, 2),
                failures=fails,
            )
        )
    return rows


def _cuda_rows_in_subprocess() -> list[dict]:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    cmd = [
        sys.executable,
        "-m",
        "q2gemv.cli",
        "verify",
        "--backend",
        "cuda",
        "--json",
        "--in-process",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"simulator subprocess failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["kernels"]


def run(args: argparse.Namespace) -> int:
    from .backends import cuda_kind

    report: dict = {"kernels": []}
    if not args.in_process:
        c, p, fails = ggml_vectors_check()
        report["ggml_vectors"] = dict(cases=c, passes=p, failures=fails)
    for backend in args.backend:
        if backend == "reference":
            continue  # the reference is the expectation the others are held to
        if args.in_process or gpu_present() or simulator_requested():
            kind = cuda_kind()
            rows = kernel_checks("cuda") if kind else []
            for r in rows:
                r["backend"] = f"cuda ({kind})"
        else:
            rows = _cuda_rows_in_subprocess()
        report["kernels"].extend(rows)
    ok = all(r["passes"] == r["cases"] for r in report["kernels"]) and (
        "ggml_vectors" not in report
        or report["ggml_vectors"]["passes"] == report["ggml_vectors"]["cases"]
    )
    if args.json:
        print(json.dumps(report, indent=1))
        return 0 if ok else 1
    if "ggml_vectors" in report:
        gv = report["ggml_vectors"]
        print(f"ggml Q2_0 vectors: {gv['passes']}/{gv['cases']} bit-exact")
        for f in gv["failures"]:
            print(f)
    print(f"{'kernel':24} {'backend':18} {'cases':>5} {'pass':>5} {'time s':>7}")
    for r in report["kernels"]:
        print(
            f"{r['kernel']:24} {r['backend']:18} {r['cases']:5d} {r['passes']:5d} "
            f"{r['seconds']:7.1f}"
        )
        for f in r["failures"]:
            print(f)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend", nargs="+", default=["reference", "cuda"], choices=["reference", "cuda"]
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=run)

#!/usr/bin/env python3
"""Run every kernel and tier under compute-sanitizer; report errors per tool.

Two modes:

* driver (default): for each tool in memcheck, racecheck, initcheck,
  synccheck, runs ``compute-sanitizer --tool TOOL --error-exitcode 99
  python3 scripts/sanitize_h200.py --worker``, parses its
  ``ERROR SUMMARY: N errors`` line (racecheck also prints a ``RACECHECK
  SUMMARY`` of hazards) and prints a table tool -> errors, worker status,
  cases checked, wall time. Exit status 0 only when every tool reports zero
  errors and every worker checked all its cases.
* ``--worker``: launches every kernel on the edge shapes once. Each output
  buffer is poisoned with 0xFFFF first (a NaN pattern no kernel writes:
  NaN outputs are the canonical 0x7FC0), then copied back and checked: no
  element may still hold 0xFFFF (every element was overwritten) and every
  element must equal the NumPy reference's bits.

Edge shapes: N in 1, 7, 9, 4097; K of one block (Q2_0: the group; NVFP4: 16
and the 512-element tile seam at 528) and 5120; M in 1, 7, 8, 9, 17 through
the wrappers' chunking (batchm kernels; the M=1 kernels take 1 and 2 rows,
one launch per row); both Q2_0 groups; W4A16: every tier forced plus the
automatic tier plan. The N=4097/K=5120 cases are few (sanitizers slow
kernels 10-100x): one per kernel.

Usage on the GPU machine (from the repository root)::

    python3 scripts/sanitize_h200.py                 # all four tools
    python3 scripts/sanitize_h200.py --tools memcheck
    python3 scripts/sanitize_h200.py --tools racecheck --families q2_0   # one half of a slow tool
    python3 scripts/sanitize_h200.py --worker        # no sanitizer: the checks only
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
FAMILIES = ("q2_0", "w4a16", "q2_0_exact", "q2_0_exact_wide", "w4a16_exact")
SANITIZER = "/usr/local/cuda/bin/compute-sanitizer"
POISON = 0xFFFF
REPO = Path(__file__).resolve().parents[1]


# -- worker ----------------------------------------------------------------------------------


def _q2_cases():
    """(kernel, group, n, k, m) for the Q2_0 family."""
    from q2gemv.cuda.q2_0 import seed as q2cuda

    cases = []
    for name, (_, max_m, _) in q2cuda.KERNELS.items():
        ms = (1, 2) if max_m == 1 else (1, 7, 8, 9, 17)
        for group in (64, 128):
            for n in (1, 7, 9):
                for m in ms:
                    cases.append((name, group, n, group, m))
            cases.append((name, group, 4097, group, ms[-1] if max_m > 1 else 1))
        cases.append((name, 128, 4097, 5120, 9 if max_m > 1 else 1))
    return cases


def _w4_cases():
    """(kernel or None for the automatic plan, n, k, m) for the W4A16 family."""
    from q2gemv.cuda.nvfp4 import seed as w4cuda

    cases = []
    for name in w4cuda.KERNEL_NAMES:
        max_m = w4cuda.spec_of(name).max_m
        ms = sorted({1, min(7, max_m), max_m, max_m + 1, 17})
        for n in (1, 7, 9):
            for k in (16, 528):
                for m in ms if (n, k) == (9, 528) else (1, max_m):
                    cases.append((name, n, k, m))
        cases.append((name, 4097, 16, max_m))
        cases.append((name, 4097, 5120, max_m))
    for m in (1, 5, 7, 8, 9, 17, 33):
        cases.append((None, 9, 528, m))
    return cases


def _exact_cases():
    """(group, n, k, m, warps, parts, finite) for q2_0_gemv_exact: row tails, blocks past the 8
    warps, every tile count, chunks, at the launch rule's CTA shape (warps, parts None); then
    the other CTA sizes and K split across CTAs forced (the integer atomics, the last CTA's
    rounding, the workspace left zero). ``finite`` False: the weight has one infinite scale."""
    cases = []
    for group in (64, 128):
        for n in (1, 7, 17):
            for m in (1, 2, 3, 5, 9, 17):
                cases.append((group, n, group * 9, m, None, None, False))
        cases.append((group, 4097, 5120, 16, None, None, False))
        cases.append((group, 4097, 5120, 33, None, None, False))
        for warps, parts, m in ((4, 1, 5), (16, 1, 3), (8, 3, 9), (4, 2, 1), (16, 2, 17)):
            cases.append((group, 17, group * 9, m, warps, parts, False))
    return cases


def _exact_wide_cases():
    """The same tuples for weights wide enough for the batched build (n = 14337: 897 row tiles,
    ``exact.batched_for``) in chunks of 9..32 rows and a last one of 1, with every scale finite
    (its one-word build) and with one infinite scale (its general build); family
    ``q2_0_exact_wide``, to be run alone where time is short."""
    return [
        (group, 14337, group * 3, m, None, None, finite)
        for group in (64, 128)
        for finite in (True, False)
        for m in (9, 33)
    ]


def _w4_exact_cases():
    """(n, k, m, warps) for w4a16_gemv_exact: row tails, both load paths (K % 128), steps past
    the 8 warps, every group count, chunks of 16, and two row tiles a CTA (n >= 8192, M > 8),
    at the launch rule's CTA size (None); then 4 and 16 warps forced."""
    cases = []
    for n in (1, 7, 17):
        for k in (144, 1152):
            for m in (1, 3, 5, 9, 17):
                cases.append((n, k, m, None))
    cases += [(8193, 256, 16, None), (8193, 256, 33, None), (4097, 5120, 16, None)]
    cases += [(17, 1152, 9, 4), (17, 1152, 3, 16)]
    return cases


def _poisoned_run(launches, d_a, dw, m, n, launch_raw):
    import numpy as np
    from numba import cuda

    d_out = cuda.to_device(np.full((m, n), POISON, np.uint16))
    for r0, rows, name in launches:
        launch_raw(name, d_a[r0 : r0 + rows], dw, d_out[r0 : r0 + rows], rows)
    cuda.synchronize()
    return d_out.copy_to_host()


def _smoke(cases, n_at: int):
    """A few small cases of each kernel: checks this script's logic on the CUDA simulator."""
    seen, out = set(), []
    for c in cases:
        if c[n_at] <= 9 and c[n_at + 1] <= 128 and c[0] not in seen:
            seen.add(c[0])
            out.append(c)
    return out


def worker(smoke: bool = False, families: tuple[str, ...] = FAMILIES) -> int:
    import numpy as np
    from numba import cuda

    from q2gemv import Nvfp4Weight, Q2Weight
    from q2gemv import reference as ref
    from q2gemv.cuda.nvfp4 import seed as w4cuda
    from q2gemv.cuda.q2_0 import seed as q2cuda
    from q2gemv.dispatch.nvfp4_tiers import W4a16BatchmTiers, plan_w4a16
    from q2gemv.formats.bf16 import BF16
    from q2gemv.golden.check import compare_bits

    rng = np.random.default_rng(2026)
    specials = np.array([0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x7F7F], np.uint16)
    failures, checked = [], 0

    def acts(m, k):
        a = rng.standard_normal((m, k)).astype(np.float32).astype(BF16)
        flat = a.view(np.uint16).reshape(-1)
        flat[rng.choice(flat.size, size=min(2, flat.size), replace=False)] = rng.choice(specials, 2)
        return a

    def check(label, got, want):
        nonlocal checked
        checked += 1
        left = int((got == POISON).sum())
        if left:
            failures.append(f"{label}: {left} of {got.size} outputs never written")
            return
        res = compare_bits(got, want)
        if res.mismatches:
            failures.append(f"{label}: {res.mismatches} outputs differ from the reference")

    weights: dict = {}
    refs: dict = {}
    q2_cases, w4_cases = _q2_cases(), _w4_cases()
    if smoke:
        q2_cases, w4_cases = _smoke(q2_cases, 2), _smoke(w4_cases, 1)
    q2_cases = q2_cases if "q2_0" in families else []
    w4_cases = w4_cases if "w4a16" in families else []
    ex_cases = _exact_cases() if "q2_0_exact" in families else []
    ex_cases += _exact_wide_cases() if "q2_0_exact_wide" in families else []
    w4x_cases = _w4_exact_cases() if "w4a16_exact" in families else []
    if smoke:
        ex_cases = [c for c in ex_cases if c[1] <= 7 and c[3] <= 3][:2]
        w4x_cases = [c for c in w4x_cases if c[0] <= 7 and c[1] <= 144 and c[2] <= 5][:2]
    for name, group, n, k, m in q2_cases:
        key = ("q2", group, n, k)
        if key not in weights:
            codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
            scales = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
            w = Q2Weight.from_codes(codes, scales, group=group)
            weights[key] = (w, q2cuda.DeviceQ2Weight.upload(w), acts(17, k))
        w, dw, a17 = weights[key]
        a = a17[:m]
        rfn = getattr(ref, name)
        rkey = (key, rfn)
        if rkey not in refs:  # rows are independent (batch invariance): one reference of 17 rows
            refs[rkey] = rfn(a17, w).view(np.uint16)
        max_m = q2cuda.KERNELS[name][1]
        launches = [(r0, min(max_m, m - r0), name) for r0 in range(0, m, max_m)]
        d_a = cuda.to_device(np.ascontiguousarray(a.view(np.uint16)))
        got = _poisoned_run(launches, d_a, dw, m, n, q2cuda.launch_raw)
        check(f"{name} group={group} n={n} k={k} m={m}", got, refs[rkey][:m])
    print(f"q2_0: {checked} cases", flush=True)

    tiers = W4a16BatchmTiers.resolve(w4cuda.KERNEL_NAMES)
    for name, n, k, m in w4_cases:
        key = ("w4", n, k)
        if key not in weights:
            codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
            sc = rng.integers(0x28, 0x40, (n, k // 16), dtype=np.uint8)
            sc.reshape(-1)[0] = 0x7F  # one NaN scale
            w = Nvfp4Weight.from_codes(codes, sc, 0.75)
            weights[key] = (w, w4cuda.DeviceNvfp4Weight.upload(w), acts(33, k))
        w, dw, a33 = weights[key]
        a = a33[:m]
        if key not in refs:
            refs[key] = ref.w4a16_gemv(a33, w).view(np.uint16)
        launches = plan_w4a16(m, tiers) if name is None else w4cuda.chunk_plan(name, m)
        d_a = cuda.to_device(np.ascontiguousarray(a.view(np.uint16)))
        got = _poisoned_run(launches, d_a, dw, m, n, w4cuda.launch_raw)
        check(f"{name or 'auto-plan'} n={n} k={k} m={m}", got, refs[key][:m])
    from q2gemv.cuda.nvfp4 import exact as w4x
    from q2gemv.cuda.q2_0 import exact as q2x
    from q2gemv.cuda.runtime import launcher
    from q2gemv.reference.exact import q2_0_gemv_exact

    rule = (q2x.warps_for, q2x.parts_for, w4x.warps_for)
    for group, n, k, m, warps, parts, finite in ex_cases:
        key = ("ex", group, n, k, finite)
        if key not in weights:
            codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
            scales = (rng.standard_normal((n, k // group)) * 0.05).astype(np.float16)
            if not finite:
                scales.reshape(-1)[0] = np.inf  # one non-finite scale: a NaN column
            w = Q2Weight.from_codes(codes, scales, group=group)
            weights[key] = (w, q2cuda.DeviceQ2Weight.upload(w), acts(33, k))
            refs[key] = q2_0_gemv_exact(weights[key][2], w).view(np.uint16)
        w, dw, a33 = weights[key]
        d_a = cuda.to_device(np.ascontiguousarray(a33[:m].view(np.uint16)))
        d_out = cuda.to_device(np.full((m, n), POISON, np.uint16))
        if warps is not None:
            q2x.warps_for = lambda n_, k_, m_, w=warps: w
            q2x.parts_for = lambda n_, k_, m_, w_, p=parts: p
        try:
            launcher.launch_all(launcher.exact_launches("q2_0", d_a, dw, d_out))
            cuda.synchronize()
        finally:
            q2x.warps_for, q2x.parts_for = rule[0], rule[1]
        shape = "" if warps is None else f" warps={warps} parts={parts}"
        shape += " finite" if finite else ""
        check(
            f"q2_0_gemv_exact group={group} n={n} k={k} m={m}{shape}",
            d_out.copy_to_host(),
            refs[key][:m],
        )
    from q2gemv.reference.exact import w4a16_gemv_exact

    for n, k, m, warps in w4x_cases:
        key = ("w4x", n, k)
        if key not in weights:
            codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
            sc = rng.integers(0x00, 0x7F, (n, k // 16), dtype=np.uint8)
            sc.reshape(-1)[0] = 0xFF  # one NaN scale: a NaN column
            w = Nvfp4Weight.from_codes(codes, sc, -0.75)
            weights[key] = (w, w4cuda.DeviceNvfp4Weight.upload(w), acts(33, k))
            refs[key] = w4a16_gemv_exact(weights[key][2], w).view(np.uint16)
        w, dw, a33 = weights[key]
        d_a = cuda.to_device(np.ascontiguousarray(a33[:m].view(np.uint16)))
        d_out = cuda.to_device(np.full((m, n), POISON, np.uint16))
        if warps is not None:
            w4x.warps_for = lambda n_, k_, m_, w=warps: w
        try:
            launcher.launch_all(launcher.exact_launches("w4a16", d_a, dw, d_out))
            cuda.synchronize()
        finally:
            w4x.warps_for = rule[2]
        shape = "" if warps is None else f" warps={warps}"
        check(f"w4a16_gemv_exact n={n} k={k} m={m}{shape}", d_out.copy_to_host(), refs[key][:m])
    print(f"total: {checked} cases, {len(failures)} failed", flush=True)
    for f in failures:
        print("FAIL", f, flush=True)
    print(f"WORKER cases={checked} failures={len(failures)}", flush=True)
    return 1 if failures else 0


# -- driver ----------------------------------------------------------------------------------

_ERR = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
# racecheck prints no ERROR SUMMARY; its last line reads
# "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
_RACE = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?")
_CASES = re.compile(r"WORKER cases=(\d+) failures=(\d+)")


def parse_log(text: str) -> dict:
    """Counts from one sanitizer run's output; None where its summary line is missing.

    ``errors`` comes from memcheck/initcheck/synccheck's ``ERROR SUMMARY`` or,
    for racecheck, from the errors in its ``RACECHECK SUMMARY``; ``hazards``
    from racecheck alone. A crashed or timed-out run has no summary: None.
    """
    errs = [int(x) for x in _ERR.findall(text)]
    races = _RACE.findall(text)
    errs += [int(e) for _, e in races]
    cases = _CASES.findall(text)
    return {
        "errors": sum(errs) if errs else None,
        "hazards": sum(int(h) for h, _ in races) if races else None,
        "cases": int(cases[-1][0]) if cases else None,
        "case_failures": int(cases[-1][1]) if cases else None,
    }


def run_tool(
    tool: str, sanitizer: str, timeout: float, log_dir: Path, families: tuple[str, ...] = FAMILIES
) -> dict:
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "99"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]
    cmd += [sys.executable, str(Path(__file__).resolve()), "--worker"]
    cmd += ["--families", ",".join(families)]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
            errors="replace"
        )
        rc = "timeout"
    wall = time.perf_counter() - t0
    tag = "" if tuple(families) == FAMILIES else "_" + "_".join(families)
    (log_dir / f"sanitize_{tool}{tag}.log").write_text(out)
    return {"tool": tool, "rc": rc, "wall_s": wall, **parse_log(out)}


def driver(
    tools, sanitizer: str, timeout: float, log_dir: Path, families: tuple[str, ...] = FAMILIES
) -> int:
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for tool in tools:
        print(f"running {tool} ...", flush=True)
        rows.append(run_tool(tool, sanitizer, timeout, log_dir, families))
        r = rows[-1]
        print(
            f"  {tool}: errors={r['errors']} rc={r['rc']} cases={r['cases']} ({r['wall_s']:.0f} s)",
            flush=True,
        )
    print()
    print(
        f"{'tool':<10} {'errors':>7} {'hazards':>8} {'worker rc':>10} {'cases':>6} {'failed':>7} {'wall s':>7}"
    )
    ok = True
    for r in rows:
        print(
            f"{r['tool']:<10} {str(r['errors']):>7} {str(r['hazards'] if r['hazards'] is not None else '-'):>8} "
            f"{str(r['rc']):>10} {str(r['cases']):>6} {str(r['case_failures']):>7} {r['wall_s']:>7.0f}"
        )
        ok &= r["errors"] == 0 and r["rc"] == 0 and r["case_failures"] == 0
    print(f"\nlogs: {log_dir}/sanitize_<tool>.log")
    print(
        "RESULT:",
        "zero errors, every output written and bit-exact" if ok else "PROBLEMS (see above)",
    )
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help="run the kernels (inside a sanitizer)")
    ap.add_argument("--smoke", action="store_true", help="with --worker: a few small cases only")
    ap.add_argument(
        "--tools", default=",".join(TOOLS), help="comma-separated subset of " + ",".join(TOOLS)
    )
    ap.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help="comma-separated subset of " + ",".join(FAMILIES) + " (split a slow tool in two)",
    )
    ap.add_argument("--sanitizer", default=SANITIZER)
    ap.add_argument("--timeout", type=float, default=140.0, help="seconds per tool")
    ap.add_argument("--log-dir", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    args = ap.parse_args()
    families = tuple(f for f in args.families.split(",") if f)
    bad = sorted(set(families) - set(FAMILIES)) or ([] if families else ["(none)"])
    if bad:
        ap.error(f"--families: expected names from {FAMILIES}, got {bad}")
    if args.worker:
        return worker(args.smoke, families)
    tools = [t for t in args.tools.split(",") if t]
    bad = sorted(set(tools) - set(TOOLS))
    if bad:
        ap.error(f"--tools: expected names from {TOOLS}, got {bad}")
    return driver(tools, args.sanitizer, args.timeout, args.log_dir, families)


if __name__ == "__main__":
    sys.exit(main())

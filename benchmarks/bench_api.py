"""The public API as a decode loop calls it: ``q2gemv.gemv(a, w_dev, out=out)``, host and GPU time.

    export PYTHONPATH=$PWD/src
    python3 benchmarks/bench_api.py --out DIR            # H200: the shapes below, torch bf16 beside
    python3 benchmarks/bench_api.py --dry-run --out DIR  # no GPU: the CUDA simulator, tiny shapes

What a user does: the weight uploaded once (``w.to_device()``), activations a
CUDA ``torch.bfloat16`` tensor, ``out=`` a preallocated bf16 tensor, then
``CALLS`` calls back to back (after ``WARMUP`` calls: the first call of a
buffer set validates and binds its launches, later ones hit the cache of
:func:`q2gemv.gemv`). Per row:

* ``host_us``: ``time.perf_counter`` around the call loop, divided by the
  calls: the host cost of one call (the enqueue; the GPU runs behind);
* ``wall_us``: the same loop plus a ``torch.cuda.synchronize()`` at the end;
* ``gpu_us``: CUDA events recorded around the loop on the current stream.

Cases: Q2_0 group 128 at 5120x5120 and 16384x16384, M = 1, 2, 4, 8, under
both contracts (``exact``: the Q2_0 default, exact_prepare + the GEMV;
``seed``: one launch per chunk of 8 rows); NVFP4 5120x5120 at M = 1, 4, 8
under both contracts (``exact``, now the NVFP4 default too; ``seed``: the tiers);
torch ``F.linear`` bf16 on the same shapes in the same run. Weights are warm
(one copy): this times the call path, not the weight stream (for that, see
``run_h200.py`` and ``bench_exact.py``).

Writes ``DIR/api_host.csv`` (``DIR/api_host_dry_run.csv`` with ``--dry-run``)
and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

CALLS = 50
WARMUP = 3
Q2_SHAPES = ((5120, 5120), (16384, 16384))
Q2_MS = (1, 2, 4, 8)
NVFP4_SHAPES = ((5120, 5120),)
NVFP4_MS = (1, 4, 8)
# --dry-run: the simulator runs 256 threads per CTA in Python, so one tiny shape, M = 1 and 2,
# one timed call after one warm-up (the warm-up binds, the timed call takes the cached path).
DRY = {"q2": ((16, 128),), "q2_ms": (1,), "nv": ((16, 64),), "nv_ms": (1,), "calls": 1, "warmup": 1}
FIELDS = ("case", "numerics", "n", "k", "m", "calls", "host_us", "wall_us", "gpu_us", "device")


def q2_weight(rng, n: int, k: int, group: int = 128):
    from q2gemv import Q2Weight

    codes = rng.integers(0, 3, size=(n, k), dtype=np.uint8)
    scales = (rng.random((n, k // group)) * 0.02 + 0.001).astype(np.float16)
    return Q2Weight.from_codes(codes, scales, group)


def nvfp4_weight(rng, n: int, k: int):
    from q2gemv import Nvfp4Weight

    return Nvfp4Weight.from_float(rng.standard_normal((n, k)).astype(np.float32))


class Runtime:
    """Where the buffers live and how the loop is timed: torch on a GPU, numba in the simulator."""

    def __init__(self, dry_run: bool):
        self.dry_run = dry_run
        self.torch = None
        try:
            import torch

            self.torch = torch
        except ImportError:
            if not dry_run:
                raise
        self.device = "simulator" if dry_run else self.torch.cuda.get_device_name()

    def acts(self, rng, m: int, k: int):
        bits = rng.standard_normal((m, k)).astype(np.float32).view(np.uint32) >> 16
        bits = bits.astype(np.uint16)
        if self.dry_run:
            from numba import cuda

            return cuda.to_device(bits)
        t = self.torch.from_numpy(bits.view(np.int16)).cuda()
        return t.view(self.torch.bfloat16)

    def empty(self, m: int, n: int):
        if self.dry_run:
            from numba import cuda

            return cuda.device_array((m, n), np.uint16)
        return self.torch.empty((m, n), dtype=self.torch.bfloat16, device="cuda")

    def sync(self) -> None:
        if self.dry_run:
            from numba import cuda

            cuda.synchronize()
        else:
            self.torch.cuda.synchronize()

    def time(self, call, calls: int, warmup: int) -> tuple[float, float, float | None]:
        """``(host_us, wall_us, gpu_us)`` per call over ``calls`` back-to-back calls."""
        for _ in range(warmup):
            call()
        self.sync()
        events = None
        if not self.dry_run:
            events = [self.torch.cuda.Event(enable_timing=True) for _ in range(2)]
            events[0].record()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        t1 = time.perf_counter()
        if events:
            events[1].record()
        self.sync()
        t2 = time.perf_counter()
        gpu = events[0].elapsed_time(events[1]) * 1e3 / calls if events else None
        return (t1 - t0) * 1e6 / calls, (t2 - t0) * 1e6 / calls, gpu


def run(dry_run: bool, calls: int, warmup: int) -> list[dict]:
    import q2gemv

    rt = Runtime(dry_run)
    rng = np.random.default_rng(0)
    q2_shapes, q2_ms = (DRY["q2"], DRY["q2_ms"]) if dry_run else (Q2_SHAPES, Q2_MS)
    nv_shapes, nv_ms = (DRY["nv"], DRY["nv_ms"]) if dry_run else (NVFP4_SHAPES, NVFP4_MS)
    cases = [("q2_0_g128", q2_weight, s, q2_ms, ("exact", "seed")) for s in q2_shapes]
    cases += [("nvfp4", nvfp4_weight, s, nv_ms, ("exact", "seed")) for s in nv_shapes]
    rows = []
    for case, make, (n, k), ms, contracts in cases:
        dw = make(rng, n, k).to_device()  # uploaded once, as a user does
        for m in ms:
            a, out = rt.acts(rng, m, k), rt.empty(m, n)
            for numerics in contracts:

                def call(a=a, dw=dw, out=out, numerics=numerics):
                    q2gemv.gemv(a, dw, out=out, numerics=numerics)

                host, wall, gpu = rt.time(call, calls, warmup)
                rows.append(_row(case, numerics, n, k, m, calls, host, wall, gpu, rt.device))
            if rt.torch is not None and not dry_run:
                rows.append(_torch_row(rt, rng, n, k, m, calls, warmup))
    return rows


def _torch_row(rt: Runtime, rng, n: int, k: int, m: int, calls: int, warmup: int) -> dict:
    torch = rt.torch
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).cuda().bfloat16()
    a = rt.acts(rng, m, k)

    def call():  # F.linear has no out=: it allocates its result, as a model's forward does
        torch.nn.functional.linear(a, w)

    host, wall, gpu = rt.time(call, calls, warmup)
    return _row("torch_bf16_linear", "-", n, k, m, calls, host, wall, gpu, rt.device)


def _row(case, numerics, n, k, m, calls, host, wall, gpu, device) -> dict:
    return {
        "case": case,
        "numerics": numerics,
        "n": n,
        "k": k,
        "m": m,
        "calls": calls,
        "host_us": f"{host:.2f}",
        "wall_us": f"{wall:.2f}",
        "gpu_us": "" if gpu is None else f"{gpu:.2f}",
        "device": device,
    }


def write(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)


def table(rows: list[dict]) -> str:
    head = f"{'case':<18} {'numerics':<8} {'n':>6} {'k':>6} {'m':>3} {'host_us':>9} {'wall_us':>9} {'gpu_us':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['case']:<18} {r['numerics']:<8} {r['n']:>6} {r['k']:>6} {r['m']:>3} "
            f"{r['host_us']:>9} {r['wall_us']:>9} {r['gpu_us'] or '-':>9}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/<date>_api_host/"
    )
    p.add_argument("--dry-run", action="store_true", help="CUDA simulator, tiny shapes, no GPU")
    p.add_argument("--calls", type=int, default=None, help=f"timed calls (default {CALLS})")
    args = p.parse_args(argv)
    args.out = args.out or dated("api_host")
    if args.dry_run and "numba" not in sys.modules:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")  # before numba's first import
    calls = args.calls or (DRY["calls"] if args.dry_run else CALLS)
    warmup = DRY["warmup"] if args.dry_run else WARMUP
    rows = run(args.dry_run, calls, warmup)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("api_host_dry_run.csv" if args.dry_run else "api_host.csv")
    write(rows, path)
    print(table(rows))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

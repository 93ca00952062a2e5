"""One batched exact GEMV (``q2_0_gemv_exact_batched``) for ncu, or its SASS and register use.

    ncu --clock-control none -k regex:body -c 2 --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats \\
        python3 benchmarks/experimental/profile_exact_batched.py 16384 16384 8 --warps 8 --parts 1
    python3 benchmarks/experimental/profile_exact_batched.py --sass 1 128 8   # groups, group, warps

``--sass NG GROUP WARPS`` prints that build's registers, local memory and a count of its
SASS instructions by opcode (needs a GPU) instead of running anything.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from numba import cuda

from q2gemv.cuda.q2_0 import exact_batched as xb
from q2gemv.cuda.runtime import launcher
from q2gemv.dispatch.plan import ChunkPlan


def sass(ng: int, group: int, warps: int, one_word: bool = False) -> int:
    kern = xb._batch_kernel(ng, group, warps, one_word=one_word)  # compiled for its signature
    regs = kern.get_regs_per_thread()
    local = kern.get_local_mem_per_thread()
    shared = kern.get_shared_mem_per_block()
    text = kern.inspect_sass()
    text = next(iter(text.values())) if isinstance(text, dict) else text
    ops = collections.Counter(
        m.group(1).split(".")[0]
        for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]*)", text)
    )
    print(
        f"build ng={ng} g{group} w{warps}{' one-word' if one_word else ''}: {regs} registers, {local} B local, {shared} B shared"
    )
    print(sum(ops.values()), "instructions:", dict(ops.most_common(25)))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shape", nargs="*", type=int, help="N K M")
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--parts", type=int, default=1)
    p.add_argument("--cols", type=int, default=1)
    p.add_argument("--regs", type=int, default=None)
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--sass", nargs=3, type=int, metavar=("NG", "GROUP", "WARPS"))
    p.add_argument("--one-word", action="store_true", help="--sass of the one-word build")
    args = p.parse_args(argv)
    if args.sass:
        return sass(*args.sass, args.one_word)
    n, k, m = args.shape
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench_exact import random_weight

    rng = np.random.default_rng(0)
    w = random_weight(rng, n, k, args.group)
    dw = w.to_device()
    a = rng.standard_normal((m, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
    d_a = cuda.to_device(a.view(np.uint16))
    d_out = cuda.device_array((m, n), np.uint16)
    xb.register()
    rule = xb.LaunchRule(args.warps, args.parts, args.cols, args.regs)
    xb.launch_rule = lambda n_, k_, m_: rule
    plan = ChunkPlan(m, xb.MAX_M, lambda rows: xb.NAME)
    launcher.launch_all(launcher.launches("q2_0", "exact", plan, dw, d_a, d_out))
    cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())

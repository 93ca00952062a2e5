"""Launch Q2_0 (or W4A16) kernels on one shape for a profiler to read (GPU only; times nothing).

    ncu --clock-control none --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section InstructionStats \\
        -o prof python3 benchmarks/experimental/profile_q2.py --kernels q2_0_gemv_vec_rt4:1,q2_0_gemv_vec_batchm_rt2:8
    ncu --import prof.ncu-rep --page details --csv > prof.csv

Each ``NAME:M`` is launched twice (the second launch is the one to read:
pass ``--launch-skip`` per kernel or read the last of each name) on random
codes (0..3; W4A16: every E2M1 code, E4M3 scales 2^-3..2^4) at ``--shape``.
``--candidates`` registers the kernels of ``benchmarks/experimental/candidates.py`` first.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shape", default="16384x16384")
    p.add_argument("--group", type=int, default=128)
    p.add_argument("--kernels", required=True, help="NAME:M,... (M rows per launch)")
    p.add_argument("--candidates", action="store_true")
    args = p.parse_args()
    if args.candidates:
        sys.path.insert(0, str(HERE))
        import candidates

        candidates.register()
    from numba import cuda

    from q2gemv import Q2Weight
    from q2gemv.cuda.q2_0 import seed as q2_0

    n, k = (int(x) for x in args.shape.split("x"))
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    scales = (rng.standard_normal((n, k // args.group)) * 0.02).astype(np.float32)
    weights = {
        "q2_0": lambda: q2_0.DeviceQ2Weight.upload(
            Q2Weight.from_codes(codes, scales, group=args.group)
        )
    }
    launchers = {"q2_0": q2_0.launch_raw}
    if any(spec.startswith("w4a16") for spec in args.kernels.split(",")):
        from q2gemv.cuda.nvfp4 import seed as w4a16
        from q2gemv.formats.nvfp4 import Nvfp4Weight

        packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        e4m3 = rng.integers(0x20, 0x60, (n, k // 16), dtype=np.uint8)
        weights["w4a16"] = lambda: w4a16.DeviceNvfp4Weight.upload(Nvfp4Weight(packed, e4m3, 0.01))
        launchers["w4a16"] = w4a16.launch_raw
    built = {}
    for spec in args.kernels.split(","):
        name, m = spec.split(":")
        m = int(m)
        fam = "w4a16" if name.startswith("w4a16") else "q2_0"
        if fam not in built:
            built[fam] = weights[fam]()
        a = cuda.to_device(rng.integers(0, 0x4000, (m, k), dtype=np.uint16))
        out = cuda.device_array((m, n), dtype=np.uint16)
        for _ in range(2):
            launchers[fam](name, a, built[fam], out, m)
        cuda.synchronize()
        print(f"launched {name} M={m} twice at {n}x{k}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

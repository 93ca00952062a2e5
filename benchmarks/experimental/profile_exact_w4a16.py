"""One exact NVFP4 GEMV (prepare + w4a16_gemv_exact) per (N, K, M), for ncu to profile.

    ncu --clock-control none -k regex:body -c 2 --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats --section MemoryWorkloadAnalysis \\
        python3 benchmarks/experimental/profile_exact_w4a16.py 16384 16384 1
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
from numba import cuda

from q2gemv import Nvfp4Weight
from q2gemv.cuda.nvfp4 import seed as w4a16
from q2gemv.cuda.runtime import launcher


def main(argv: list[str]) -> int:
    n, k, m = (int(x) for x in argv[:3])
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    scales = rng.integers(0x20, 0x60, size=(n, k // 16), dtype=np.uint8)
    dw = w4a16.DeviceNvfp4Weight.upload(Nvfp4Weight.from_codes(codes, scales, 0.00123))
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16).view(np.uint16)
    d_a = cuda.to_device(a)
    out = cuda.device_array((m, n), np.uint16)
    for _ in range(2):  # ncu -s 1: the second GEMV (its prepare is a kernel of its own)
        launcher.launch_all(launcher.exact_launches("w4a16", d_a, dw, out))
    cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

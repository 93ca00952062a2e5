"""One exact GEMV (prepare + q2_0_gemv_exact) per (M, shape), for ncu to profile.

    ncu --clock-control none -k regex:body -s 1 -c 1 --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats python3 benchmarks/experimental/profile_exact.py 16384 16384 1
    PATH=$PATH:/usr/local/cuda/bin python3 benchmarks/experimental/profile_exact.py --sass 2 128 > DIR/sass.txt

``--sass TILES GROUP`` prints the sm_90 SASS of that build (needs nvdisasm) and
a count of its instructions by opcode instead of running anything.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
from numba import cuda

from q2gemv import Q2Weight
from q2gemv.cuda.q2_0 import exact
from q2gemv.cuda.q2_0 import seed as q2_0
from q2gemv.cuda.runtime import launcher


def sass(nt: int, group: int) -> int:
    import collections
    import re

    kern = exact._q2_kernel(nt, group)
    text = kern.inspect_sass()
    text = next(iter(text.values())) if isinstance(text, dict) else text
    print(text)
    ops = collections.Counter(
        m.group(1).split(".")[0]
        for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]*)", text)
    )
    print(sum(ops.values()), "instructions:", dict(ops.most_common()))
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--sass":
        return sass(int(argv[1]), int(argv[2]))
    n, k, m = (int(x) for x in argv[:3])
    group = int(argv[3]) if len(argv) > 3 else 128
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, size=(n, k), dtype=np.uint8)
    scales = (rng.random((n, k // group)) * 0.02 + 0.001).astype(np.float16)
    dw = q2_0.DeviceQ2Weight.upload(Q2Weight.from_codes(codes, scales, group))
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16).view(np.uint16)
    d_a = cuda.to_device(a)
    out = cuda.device_array((m, n), np.uint16)
    for _ in range(2):
        launcher.launch_all(launcher.exact_launches("q2_0", d_a, dw, out))
    cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

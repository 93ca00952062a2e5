"""Test session set-up: pick the CUDA simulator on machines without a GPU.

numba reads NUMBA_ENABLE_CUDASIM once, when first imported, so this must
run before any test module imports numba. Set NUMBA_ENABLE_CUDASIM yourself
to override (``=0`` on a GPU machine forces the real device).
"""

from __future__ import annotations

import os
import sys

import pytest

from q2gemv.backends import gpu_present

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

if SIMULATED:
    # The simulator's BlockManager busy-polls its 256 threads from the launching thread
    # and never blocks, so a released thread may wait a whole switch interval for the GIL:
    # up to 256 x 5 ms per barrier at CPython's default. Measured on the 2-core machine
    # (tests/test_w4a16_cuda.py + tests/test_edge_values.py, one process): 889 s at 5 ms,
    # one launch alone 445 s (5 s in other runs); 265 s at 0.2 ms, no launch over 21 s.
    sys.setswitchinterval(2e-4)


def pytest_collection_modifyitems(config, items):
    # The ``slow`` tests first (a stable sort: the rest keep their order). Under pytest-xdist
    # (the README's ``-n auto``) each starts at once on a worker while the others share the
    # rest; last, one of them (``q2gemv verify`` on the simulator: ~1/3 of the CPU time)
    # would end the run alone.
    items.sort(key=lambda item: "slow" not in item.keywords)
    if not SIMULATED and gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (this run uses the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

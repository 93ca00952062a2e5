"""Test session set-up: pick the CUDA simulator on machines without a GPU.

numba reads NUMBA_ENABLE_CUDASIM once, when first imported, so this must
run before any test module imports numba. Set NUMBA_ENABLE_CUDASIM yourself
to override (``=0`` on a GPU machine forces the real device).
"""

from __future__ import annotations

import os

import pytest

from q2gemv.host.backends import gpu_present

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

SIMULATED = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

# Not set here: sys.setswitchinterval(2e-4). It made simulated launches much faster
# (the simulator's BlockManager busy-polls its 256 threads, so a released thread can
# wait a whole 5 ms switch interval: test_w4a16_cuda + test_edge_values 889 s -> 265 s),
# but with it the W4A16 simulator tests failed intermittently with wrong bits (one
# clean-clone CI run; one of two parallel runs of tests/cuda/nvfp4/test_seed.py), and not
# in two runs at the default interval. That race is understood and fixed: numba's
# simulator allocated shared arrays with an unlocked check-then-set, so some threads
# got a private "shared" array (cuda/runtime/dev.py now allocates under a lock; a test forces
# the interleaving). Re-measured on a heavily loaded 2-core machine (load 30), one
# process each, tests/cuda/nvfp4/test_seed.py: 5 ms 327 s wall, 168 s CPU; 0.2 ms 280 s
# wall, 214 s CPU (more sys time); under pytest -n 2 the extra CPU competes with the
# other worker. Set it again if an unloaded measurement of the README command says so.


def pytest_collection_modifyitems(config, items):
    # The ``slow`` tests first (a stable sort: the rest keep their order). Under pytest-xdist
    # (the README's ``-n auto``) each starts at once on a worker while the others share the
    # rest; last, one of them (a notebook, or ``q2gemv verify`` on the simulator) would end
    # the run alone.
    items.sort(key=lambda item: "slow" not in item.keywords)
    if not SIMULATED and gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a real CUDA GPU (this run uses the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_launch(monkeypatch):
    """Any kernel lookup fails the test: a refusal must come before the launch."""
    from q2gemv.cuda.nvfp4 import seed as w4cuda
    from q2gemv.cuda.q2_0 import seed as q2cuda

    def boom(name, *_):
        raise AssertionError(f"kernel {name} was reached: the bad call was not refused")

    monkeypatch.setattr(q2cuda, "compiled", boom)
    monkeypatch.setattr(w4cuda, "compiled", boom)

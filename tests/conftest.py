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

# Not set here: sys.setswitchinterval(2e-4) (faster simulated launches, but no gain under
# pytest -n 2 on a loaded machine; docs/design_notes.md, "Test suite" has the measurements).


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


@pytest.fixture
def h200_knobs():
    """Launch rules read the H200 entries of the ``tuning.json`` files (whatever GPU this is),
    and the current device's again after the test."""
    from q2gemv.cuda.runtime import tuning

    tuning.set_gpu_name("NVIDIA H200")
    yield
    tuning.set_gpu_name(None)

"""Every kernel compiles to PTX for sm_90 on a machine without a GPU, with no local memory.

Runs in a subprocess: this pytest process may have selected the simulator,
and numba decides that once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def ptx_summary():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run(
        [sys.executable, "-m", "q2gemv.cuda.ptx", "--cc", "9.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


EXPECTED = ["q2_0_gemv", "q2_0_gemv_vec", "q2_0_gemv_vec_batchm"]


def test_all_q2_kernels_compile(ptx_summary):
    assert set(EXPECTED) <= set(ptx_summary)


def test_no_local_memory(ptx_summary):
    offenders = [name for name, s in ptx_summary.items() if s["uses_local_memory"]]
    assert offenders == []


def test_q2_inner_loop_uses_fused_products_and_explicit_scale_rounding(ptx_summary):
    for name in EXPECTED:
        s = ptx_summary[name]
        assert s["fma.rn.f32"] >= 8, name  # the per-code fma chain
        assert s["mul.rn.f32"] >= 1 and s["add.rn.f32"] >= 1, name  # fmul_rn / fadd_rn
        assert s["shfl"] >= 5, name  # the butterfly


def test_batchm_unrolls_all_eight_rows(ptx_summary):
    # every one of the 8 accumulators has its own 16-fma chain: >= 8 * 16
    assert ptx_summary["q2_0_gemv_vec_batchm"]["fma.rn.f32"] >= 128

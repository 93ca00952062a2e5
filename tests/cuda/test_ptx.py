"""Every kernel compiles to PTX for sm_90 on a machine without a GPU, with no local memory.

Runs in subprocesses: this pytest process may have selected the simulator,
and numba decides that once per process. The exact family (about a minute
of NVVM on its own) compiles in a second process beside the seed's kernels.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from q2gemv.cuda.ptx import FAMILIES

SRC = Path(__file__).resolve().parents[2] / "src"

# one process each, in parallel: the seed kernels together, each exact module alone
GROUPS = [("q2_0", "w4a16"), *((f,) for f in FAMILIES if f not in ("q2_0", "w4a16"))]


def _compile_summary() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    assert sorted(f for g in GROUPS for f in g) == sorted(FAMILIES)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "q2gemv.cuda.ptx", "--cc", "9.0"]
            + [a for f in group for a in ("--family", f)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for group in GROUPS
    ]
    summary = {}
    for proc in procs:
        out, err = proc.communicate(timeout=1200)
        assert proc.returncode == 0, err[-3000:]
        summary.update(json.loads(out))
    return summary


@pytest.fixture(scope="module")
def ptx_summary(request, tmp_path_factory):
    """The PTX summary of every build, compiled once per test run.

    Under pytest-xdist each worker that gets a test of this module would compile
    everything again (minutes on a 2-core CI machine), so the workers of one run share
    it: the first compiles under a file lock in the run's shared temporary directory,
    the others read its JSON.
    """
    if not hasattr(request.config, "workerinput"):  # one process: nothing to share
        return _compile_summary()
    shared = tmp_path_factory.getbasetemp().parent  # this run's directory, all workers
    path = shared / "ptx_summary.json"
    with open(shared / "ptx_summary.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            path.write_text(json.dumps(_compile_summary()))
        return json.loads(path.read_text())


EXPECTED = ["q2_0_gemv", "q2_0_gemv_vec", "q2_0_gemv_vec_batchm"]


def _exact_names() -> list[str]:
    from q2gemv.cuda.q2_0 import exact

    return [name for name, _, _ in exact.ptx_specs()]


def test_every_registered_kernel_compiles(ptx_summary):
    """Every spec of the registry (q2gemv.dispatch.registry) has at least one build in the summary."""
    from q2gemv.dispatch import registry as kernels

    built = {name.split("@")[0] for name in ptx_summary}
    assert {s.name for s in kernels.specs()} <= built


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


def test_exact_kernels_compile_every_build(ptx_summary):
    from q2gemv.cuda.q2_0 import exact as ex

    names = _exact_names()
    assert "exact_prepare" in names and "exact_prepare+fp16" in names
    assert {n.endswith("+fp16") for n in names} == {True, False}  # both activation formats
    builds = [n.removesuffix("+fp16") for n in names if n.startswith("q2_0_gemv_exact@")]
    build_tags = [n.split("@")[1] for n in builds]  # e.g. m2g128, m2g128w16
    assert {t.split("g")[1].split("w")[0] for t in build_tags} == {"64", "128"}  # both groups
    sizes = {ex.build_suffix(w) for w in ex.CTA_WARPS}  # every CTA size warps_for picks
    assert {"w" + t.split("w")[1] if "w" in t else "" for t in build_tags} == sizes
    assert set(names) <= set(ptx_summary)


def test_exact_gemv_uses_the_int8_tensor_cores(ptx_summary):
    """Every q2_0_gemv_exact build issues mma.sync.aligned.m16n8k32 (IMMA), the prepare none."""
    for name in _exact_names():
        s = ptx_summary[name]
        if name.startswith("q2_0_gemv_exact@"):
            assert s["mma.sync.aligned.m16n8k32"] >= 1, name
            # the weight stream: the first step's load and the in-flight next step's, twice
            # (the loop body is written once per register set), none of it through L1
            assert s["ld.global.nc.L1::no_allocate"] >= 3, name
        else:
            assert s["mma.sync.aligned.m16n8k32"] == 0, name
        assert not s["uses_local_memory"], name
        assert s["fma.rn.f32"] == 0, name  # integer arithmetic only


def test_exact_w4a16_builds_use_k16_imma_and_no_float(ptx_summary):
    """Every w4a16_gemv_exact build (1 to 3 column tiles, 4, 8 or 16 warps) issues one k16 IMMA
    (s8 x u8) per block and column tile: 4 a step, the step written once per register set;
    no k32 IMMA, no float, nothing in local memory, the weights streamed past L1."""
    from q2gemv.cuda.nvfp4 import exact as exact_w4a16

    names = [name for name, _, _ in exact_w4a16.ptx_specs()]
    assert "w4a16_exact_prepare" in names and "w4a16_exact_prepare+fp16" in names
    builds = [n.removesuffix("+fp16") for n in names if n.startswith("w4a16_gemv_exact@c")]
    assert {int(n.split("w")[-1]) for n in builds} == set(exact_w4a16.CTA_WARPS)  # every size
    for name in names:
        s = ptx_summary[name]
        if name.startswith("w4a16_gemv_exact@c"):
            nct = int(name.split("@c")[1].split("w")[0])
            assert s["mma.m16n8k16.s8.u8"] == 2 * 4 * nct, name
            assert s["ld.global.nc.L1::no_allocate"] >= 2, name
        else:
            assert s["mma.m16n8k16.s8.u8"] == 0, name
        assert s["mma.sync.aligned.m16n8k32"] == 0, name
        assert not s["uses_local_memory"], name
        assert s["fma.rn.f32"] == 0, name


def test_exact_builds_wait_for_their_prepare_and_prepares_release_them(ptx_summary):
    """PDL (q2gemv.cuda.runtime.prebound): every build of a kernel whose spec says
    ``grid_wait`` has the griddepcontrol.wait it promises; each family's prepare lets it start."""
    from q2gemv.cuda.nvfp4 import exact as exact_w4a16
    from q2gemv.cuda.q2_0 import exact_batched
    from q2gemv.dispatch import registry as kernels

    waiting = {s.name for s in kernels.specs() if s.grid_wait}
    assert waiting == {"q2_0_gemv_exact", "w4a16_gemv_exact"}
    assert exact_batched.spec().grid_wait  # a variant registered on request
    waiting.add(exact_batched.NAME)
    names = _exact_names() + [name for name, _, _ in exact_w4a16.ptx_specs()]
    names += [name for name, _, _ in exact_batched.ptx_specs()]
    for name in names:
        s = ptx_summary[name]
        if name.split("@")[0] in waiting:
            assert s["griddepcontrol.wait"] == 1, name
        else:
            assert name.removesuffix("+fp16").endswith("prepare"), name
            assert s["griddepcontrol.launch_dependents"] == 1, name
            assert s["griddepcontrol.wait"] == 0, name
    for name, s in ptx_summary.items():  # no seed kernel claims a dependency it does not wait on
        if name.split("@")[0] not in waiting:
            assert s["griddepcontrol.wait"] == 0, name


def test_summary_counts_the_mma_form():
    from q2gemv.cuda.ptx import summarise

    ptx = (
        "\tmma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%r1, %r2, %r3, %r4}, "
        "{%r5, %r6, %r7, %r8}, {%r9, %r10}, {%r11, %r12, %r13, %r14};\n"
        "\tst.local.u32 [%rd1], %r1;\n"
    )
    s = summarise(ptx)
    assert s["mma.sync.aligned.m16n8k32"] == 1 and s["uses_local_memory"]
    assert summarise("\tld.global.u32 %r1, [%rd1];\n")["uses_local_memory"] is False


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(SRC), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True
    )


def test_ptx_without_nvvm_is_one_line_with_an_install_hint():
    r = _run(
        """
        import sys
        from numba.cuda.cudadrv.error import NvvmSupportError
        import q2gemv.cuda.ptx as ptx
        def no_nvvm(*args, **kwargs):
            raise NvvmSupportError("libNVVM cannot be found.\\nDo `conda install cudatoolkit`:\\n")
        ptx.compile_all = no_nvvm
        sys.exit(ptx.main(["--family", "q2_0"]))
        """,
        NUMBA_ENABLE_CUDASIM="0",
    )
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("q2gemv.cuda.ptx: libNVVM cannot be found.;")
    assert "pip install 'q2gemv[cu13]'" in lines[0]


def test_ptx_under_the_simulator_is_one_line(capsys):
    from q2gemv.cuda import ptx

    assert ptx.main(["--family", "q2_0"]) == 1  # conftest switched the simulator on
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NUMBA_ENABLE_CUDASIM unset" in err

"""Execute every notebook in ``notebooks/`` with nbclient; a failing cell fails the test.

Each notebook runs in its own fresh ``python3`` kernel process (ipykernel's
native kernel: this interpreter), so numba's once-per-process choice of
simulator or GPU is made inside the kernel, from the environment passed here.
Without a GPU that is ``NUMBA_ENABLE_CUDASIM=1`` (tests/conftest.py sets it),
and the notebooks keep their shapes small enough for the simulator.

Also checked without running anything: notebooks are committed without
outputs, and define no kernels (they import the package).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is in the test extra")

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 900  # the simulator runs one OS thread per CUDA thread; CI has 2 cores
EXPECTED = {
    "01_q2_0_format.ipynb",
    "02_bit_exact_kernels.ipynb",
    "03_w4a16_tiers.ipynb",
    "04_performance.ipynb",
    "05_exact_contract.ipynb",
    "06_models.ipynb",
}


def _read(path: Path):
    return nbformat.read(path, as_version=4)


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("MPLBACKEND", "Agg")
    # Decided here, not in the kernel: numba reads it once, at import.
    env["NUMBA_ENABLE_CUDASIM"] = os.environ.get("NUMBA_ENABLE_CUDASIM", "1")
    for switch in (
        "Q2GEMV_NO_GEMV_EXACT_M_TIERS",
        "ATLAS_NO_GEMV_EXACT_M_TIERS",
        "Q2GEMV_NO_BATCH8_RT",
        "ATLAS_NO_BATCH8_RT",
    ):
        env.pop(switch, None)  # the notebooks show the defaults, then set them on purpose
    return env


def test_all_notebooks_present():
    assert {p.name for p in NOTEBOOKS} >= EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_committed_without_outputs(path):
    nb = _read(path)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name} cell {i}: commit notebooks without outputs"
            assert cell.execution_count is None, f"{path.name} cell {i}: has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_defines_no_kernels(path):
    src = "\n".join(c.source for c in _read(path).cells if c.cell_type == "code")
    assert not re.search(r"cuda\s*\.\s*jit|@jit|numba\s*\.\s*jit", src), (
        f"{path.name}: notebooks import the package's kernels and define none"
    )


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path):
    nbclient = pytest.importorskip("nbclient", reason="nbclient is in the test extra")
    pytest.importorskip("ipykernel", reason="ipykernel is in the test extra")
    nb = _read(path)
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",  # ipykernel's native kernel: this interpreter
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
        allow_errors=False,
    )
    t0 = time.perf_counter()
    try:
        client.execute(env=_kernel_env())
    except nbclient.exceptions.CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell failed\n{e}", pytrace=False)
    print(f"{path.name}: executed in {time.perf_counter() - t0:.1f} s")


def _synthetic_gemv_csv(path: Path) -> None:
    """A tiny CSV in the ``q2gemv bench`` schema; SYNTHETIC numbers, only to exercise the plots."""
    cols = ["family", "kernel", "role", "selected", "n", "k", "m", "group", "time_us"]
    cols += ["gbps", "pct_read_ceiling", "bf16_us", "speedup_vs_bf16"]
    lines = [",".join(cols)]
    for m in (1, 2, 4, 8):
        bf16 = 10.0 + m
        for fam, kernel, role, sel, group, t in (
            ("bf16", "torch_linear", "baseline", "1", "", bf16),
            ("q2_0", "q2_0_gemv_vec_batchm", "batchm", "1", "128", 5.0 + m),
            ("w4a16", "w4a16_gemv_batch8", "tier", "1", "", 6.0 + m),
        ):
            lines.append(
                f"{fam},{kernel},{role},{sel},64,64,{m},{group},{t},1.0,{50 + m},{bf16},{bf16 / t}"
            )
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")


def _execute_in(nbclient, nb, cwd: Path) -> None:
    """Run notebook ``nb`` with ``cwd`` as its working directory (where it looks for results)."""
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(cwd)}},
    )
    client.execute(env=_kernel_env())


@pytest.mark.slow
def test_performance_notebook_plots_when_results_exist(tmp_path):
    nbclient = pytest.importorskip("nbclient", reason="nbclient is in the test extra")
    pytest.importorskip("matplotlib", reason="matplotlib is in the test extra")
    _synthetic_gemv_csv(tmp_path / "benchmarks" / "results" / "h200_gemv.csv")
    nb = _read(NOTEBOOK_DIR / "04_performance.ipynb")
    _execute_in(nbclient, nb, tmp_path)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert "12 timed rows from 1 file(s)" in text, text
    assert any("image/png" in o.get("data", {}) for o in outputs), "no figure drawn"


def _synthetic_peers_csv(path: Path) -> None:
    """A tiny CSV in bench_q2_peers.py's schema; SYNTHETIC numbers, only to exercise the plot."""
    cols = ["n", "k", "group", "m", "public_us", "gemv_us", "bf16_us", "gemlite_us", "floor_us"]
    lines = [",".join(cols)]
    for m in (1, 2, 8, 16):
        gemlite = "" if m > 8 else f"{4.0 + m}"
        lines.append(f"64,64,128,{m},{3.0 + m},{2.0 + m},10.0,{gemlite},1.0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_exact_notebook_plots_the_speed_csv_when_it_exists(tmp_path):
    nbclient = pytest.importorskip("nbclient", reason="nbclient is in the test extra")
    pytest.importorskip("matplotlib", reason="matplotlib is in the test extra")
    for name in ("h200_q2_peers.csv", "h200_nvfp4_peers.csv"):
        _synthetic_peers_csv(tmp_path / "benchmarks" / "results" / name)
    nb = _read(NOTEBOOK_DIR / "05_exact_contract.ipynb")
    _execute_in(nbclient, nb, tmp_path)
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.outputs)
    assert "4 rows from h200_q2_peers.csv" in text, text
    assert "4 rows from h200_nvfp4_peers.csv" in text, text
    figures = [o for o in last.outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 2, "expected one figure per format"

"""The golden suite: shipped data intact, every backend bit-exact, and failures reported.

* the reference runs every case in this process;
* ``q2gemv verify`` runs as a subprocess: on the cuda backend, a few checks
  of every family (the simulator runs the ``small`` ones and reports the
  rest as skipped), and on a GPU (``gpu`` marker) the whole suite; the whole
  suite on every backend this machine has is README command 1, which CI runs;
* a flipped byte, a truncated file and a one-ulp change in a kernel's output
  are each reported, never passed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from q2gemv.golden import gen, harness, report, store, suite

DATA = store.default_data_dir()


def _verify(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "q2gemv.cli", "verify", *args],
        capture_output=True,
        text=True,
        env=env,
    )


@pytest.fixture(scope="module")
def full_suite() -> suite.Suite:
    return suite.load_suite(strict=True)


def copy_data(tmp_path: Path) -> Path:
    """A writable copy of the shipped golden data (installed files may be read-only)."""
    dst = tmp_path / "data"
    shutil.copytree(DATA, dst)
    for p in dst.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return dst


@pytest.fixture
def data_copy(tmp_path) -> Path:
    return copy_data(tmp_path)


# -- the shipped data ----------------------------------------------------------------------------


def test_manifest_lists_every_data_file_with_sha_and_size():
    man = store.read_manifest(DATA)
    assert man["format_version"] == gen.FORMAT_VERSION
    assert man["generator"]["version"] == gen.GENERATOR_VERSION
    on_disk = {
        str(p.relative_to(DATA))
        for p in DATA.rglob("*")
        if p.is_file() and p.suffix in (".npz", ".json") and p.name != store.MANIFEST
    }
    assert on_disk == set(man["files"]) == set(suite.FILE_SET)
    assert store.file_problems(DATA, man) == {}
    for name, e in man["files"].items():
        assert len(e["sha256"]) == 64 and e["bytes"] > 0, name
        if e["kind"] == "generated":
            assert e["params"]["generator"].endswith(f"v{gen.GENERATOR_VERSION}"), name


def test_package_data_stays_small():
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert total < 3 * 2**20, f"golden data is {total} bytes"


def test_suite_covers_every_kernel_shape_and_special(full_suite):
    cases = full_suite.gemv
    for kernel in gen.KERNELS:
        mine = [c for c in cases if kernel in c.kernels]
        exact = kernel in gen.EXACT_KERNELS + gen.W4_EXACT_KERNELS
        assert {c.spec.m for c in mine} >= set(gen.M_SWEEP), kernel
        assert {c.spec.n for c in mine} >= set(gen.N_SWEEP), kernel
        kinds = gen.EXACT_ACT_KINDS if exact else gen.ACT_KINDS
        bf16 = [c for c in mine if c.family not in gen.FP16_FAMILIES]  # fp16: its own test
        assert {c.spec.act_kind for c in bf16} == set(kinds), kernel
        assert any(c.size_of(kernel) == "small" for c in mine), kernel
        assert any(c.spec.size == "large" and c.spec.n == 5120 for c in mine), kernel
    q2 = [c for c in cases if c.family == "q2_0"]
    for g in (64, 128):
        ks = {c.spec.k for c in q2 if c.spec.group == g}
        assert g in ks and 3 * g in ks, g  # one block and several
    assert {c.spec.weight_kind for c in q2} == set(gen.Q2_WEIGHT_KINDS)
    w4 = [c for c in cases if c.family == "w4a16"]
    assert {c.spec.weight_kind for c in w4} == set(gen.W4_WEIGHT_KINDS)
    assert {16, 48} <= {c.spec.k for c in w4}


def test_fp16_cases_cover_every_kind_and_special_output(full_suite):
    """The fp16 families: their own files, every fp16 activation kind, both groups, cases on the
    simulator, and expected outputs that hold +-Inf, NaN (0x7E00), +-0 and fp16 subnormals."""
    for fam, base in gen.FP16_FAMILIES.items():
        mine = [c for c in full_suite.gemv if c.family == fam]
        assert {c.file for c in mine} == {f"gemv_{fam}.npz"}, fam
        assert all(c.kernels == gen.FAMILY_KERNELS[base] for c in mine), fam
        assert {c.spec.act_kind for c in mine} == set(gen.FP16_ACT_KINDS), fam
        kernel = gen.FAMILY_KERNELS[base][0]
        assert any(c.size_of(kernel) == "small" for c in mine), fam
        want = np.concatenate([c.want(kernel).ravel() for c in mine])
        mag = want & 0x7FFF
        assert {0x7C00, 0xFC00, 0x7E00, 0x0000} <= set(want.tolist()), fam
        assert ((mag > 0) & (mag < 0x0400)).any(), fam  # subnormal outputs
        assert not ((mag > 0x7C00) & (want != 0x7E00)).any(), fam  # one NaN pattern
    q2 = [c for c in full_suite.gemv if c.family == "q2_0_exact_fp16"]
    assert {c.spec.group for c in q2} == {64, 128}
    assert 0x8000 in np.concatenate([c.want("q2_0_gemv_exact").ravel() for c in q2])  # -0


def test_w4_exact_cases_cross_every_seam_of_the_kernel(full_suite):
    """w4a16_gemv_exact: 16-row tiles, steps of 64 elements split over 8 warps (a padded last
    step when K % 64), 1 to 3 column tiles (M up to 2, 5, 8), 8 rows a launch; every scale and
    global-scale kind."""
    from q2gemv.cuda.nvfp4 import exact as xw

    mine = [c for c in full_suite.gemv if c.family == "w4a16_exact"]
    assert {c.file for c in mine} <= {"gemv_w4a16_exact.npz", suite.MODEL_FILE}
    assert all(c.kernels == gen.W4_EXACT_KERNELS for c in mine)
    assert {1, 15, 16, 17, 33} <= {c.spec.n for c in mine}
    assert {0, 1, 3, 4, 5, 8, 9, 16, 17, 32, 33} <= {c.spec.m for c in mine}
    assert max(xw.padded_k(c.spec.k) // xw.STEP for c in mine) > xw.WARPS  # more steps than warps
    assert {c.spec.k % xw.STEP == 0 for c in mine} == {True, False}  # whole and padded last steps
    assert {xw.tiles_for(min(c.spec.m, xw.MAX_M)) for c in mine if c.spec.m} == set(xw.TILES)
    assert set(gen.W4_EXACT_WEIGHT_KINDS) == {c.spec.weight_kind for c in mine}
    assert set(gen.EXACT_ACT_KINDS) == {c.spec.act_kind for c in mine}
    small = [c for c in mine if c.size_of("w4a16_gemv_exact") == "small"]
    assert {c.spec.k % xw.STEP == 0 for c in small} == {True, False}
    assert {0, 5, 17} <= {c.spec.m for c in small}  # no rows, two column tiles, three launches
    assert {"special_s", "gscale_nan", "gscale_neg"} <= {c.spec.weight_kind for c in small}
    assert gen.MAX_M["w4a16_gemv_exact"] == xw.MAX_M


def test_exact_cases_cross_every_seam_of_the_exact_kernel(full_suite):
    """q2_0_gemv_exact: 16 weight rows per CTA, 8 warps splitting the blocks, MAX_M rows a launch."""
    from q2gemv.cuda.q2_0 import exact

    mine = [c for c in full_suite.gemv if c.family == "q2_0_exact"]
    assert {c.file for c in mine} <= {"gemv_q2_0_exact.npz", suite.MODEL_FILE}
    assert all(c.kernels == gen.EXACT_KERNELS for c in mine)
    for g in (64, 128):
        cg = [c for c in mine if c.spec.group == g]
        assert {1, 15, 16, 17, 33} <= {c.spec.n for c in cg}, g
        assert {1, 2, 3, 5, 9, 16, 17, 33} <= {c.spec.m for c in cg}, g
        assert max(c.spec.k // g for c in cg) > exact.WARPS, g  # more blocks than warps
        assert set(gen.EXACT_WEIGHT_KINDS) == {c.spec.weight_kind for c in cg}, g
        assert set(gen.EXACT_ACT_KINDS) == {c.spec.act_kind for c in cg}, g
        small = [c for c in cg if c.size_of("q2_0_gemv_exact") == "small"]
        assert {"boundary", "nan", "outlier_huge"} <= {c.spec.act_kind for c in small}, g
    assert gen.MAX_M["q2_0_gemv_exact"] == exact.MAX_M
    small_m = {c.spec.m for c in mine if c.size_of("q2_0_gemv_exact") == "small"}
    assert {0, 1, 2, 3, 5, 9, 16, 17} <= small_m  # the 4-row groups and the row chunk seams
    assert {m % exact.BUILD_MAX_M for m in small_m} >= {0, 1}


def test_exact_boundary_case_hits_ties_subnormals_and_overflow(full_suite):
    """The boundary case's expected bits hold what it was built for (see gen.BOUNDARY_*)."""
    case = next(
        c for c in full_suite.gemv if c.spec.act_kind == "boundary" and c.spec.group == 128
        and c.spec.m == len(gen.BOUNDARY_E)
    )  # fmt: skip
    y = case.want("q2_0_gemv_exact")
    row0 = y[0, :12].tolist()  # e = 0, scale 1: the 12 subsets in order
    assert row0 == [
        0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x3FFF, 0x4000, 0x3FFF, 0x3B80, 0, 0, 0x3F80
    ]  # fmt: skip
    assert (
        y[0, 12:24] == np.array(row0, np.uint16) | np.where(np.array(row0) != 0, 0x8000, 0)
    ).all()
    top = gen.BOUNDARY_E.index(127)
    assert y[top, 5] == 0x7F7F and y[top, 6] == 0x7F80 and y[top, 7] == 0x7F7F  # overflow tie
    assert y[top, 18] == 0xFF80  # -Inf
    half = gen.BOUNDARY_E.index(-110)  # with scale 2**-24: 2**-134, half the smallest subnormal
    assert y[half, 24] == 0x0000 and y[half, 36] == 0x8000  # ties to +0 / -0, sign kept
    assert y[half, 25] == 0x0001  # just above the tie: the smallest subnormal
    assert (y[:, 9] == 0).all() and (y[:, 21] == 0).all()  # exact cancellation: +0


def test_golden_kernel_table_matches_the_kernel_modules():
    from q2gemv.cuda.nvfp4 import seed as w4cuda
    from q2gemv.cuda.q2_0 import exact
    from q2gemv.cuda.q2_0 import seed as q2cuda

    assert (
        gen.EXACT_KERNELS == ("q2_0_gemv_exact",) and gen.MAX_M[gen.EXACT_KERNELS[0]] == exact.MAX_M
    )
    assert gen.Q2_KERNELS == tuple(q2cuda.KERNELS)
    assert gen.W4A16_KERNELS == tuple(w4cuda.KERNEL_NAMES)
    for name in gen.Q2_KERNELS:
        assert gen.MAX_M[name] == q2cuda.KERNELS[name][1], name
    for name in gen.W4A16_KERNELS:
        assert gen.MAX_M[name] == w4cuda.SPECS[name].max_m, name


def test_w4a16_shapes_cross_the_activation_tile(full_suite):
    """Each W4A16 tier sees a K one block past its shared-memory tile, on the simulator too.

    Not the Q2_0 kernels: the M=1 ones load activations directly (no tile),
    and the batched ones are built per M since v4 and stage tile_k(M) codes
    a tile (1024 at M = 6..8, 4096 at M=2), while this suite's shapes were
    cut at the 1024-code tile they used at every M. Their seams are crossed by
    tests/cuda/q2_0/test_seed.py::test_several_staged_tiles (simulator and GPU,
    a partial second tile) and by scripts/h200_check.py (K = 5120 and 17408,
    M up to 17: several tiles).
    """
    from q2gemv.cuda.nvfp4 import seed as w4cuda

    for kernel in gen.W4A16_KERNELS:
        tile = w4cuda.TILE_K
        seams = [
            c for c in full_suite.gemv
            if kernel in c.kernels and c.spec.k > tile and c.spec.k % tile and c.spec.m
        ]  # fmt: skip
        assert seams, kernel
        assert any(c.size_of(kernel) == "small" for c in seams), kernel


def test_generator_is_pinned():
    # SplitMix64 from seed 0 (the published first outputs), then our label seeding.
    with np.errstate(over="ignore"):
        z = np.uint64(0) + np.arange(1, 4, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    assert [int(x) for x in z] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert gen.fields("x", 5, 2).tolist() == [
        (int(gen.words("x", 1)[0]) >> (2 * i)) & 3 for i in range(5)
    ]


# -- every backend -----------------------------------------------------------------------------------


def test_reference_reproduces_every_golden_check(full_suite):
    run = harness.run_backend(full_suite, suite.Selection.parse(None), "reference", quiet=True)
    bad = [r.details() for r in run.results if not r.ok]
    assert not bad, "\n".join(bad[:20])
    n_gemv = sum(len(c.kernels) for c in full_suite.gemv)
    assert run.counts()["pass"] > n_gemv  # every GEMV check plus the host format checks


def _verify_cuda_picks(s: suite.Suite) -> list[tuple[suite.GemvCase, str]]:
    """The first small check of every family (the simulator runs it) and the first medium
    and large checks (it skips them)."""
    first: dict[tuple[str, str], tuple[suite.GemvCase, str]] = {}
    for case in s.gemv:
        for k in case.kernels:
            first.setdefault((case.family, case.size_of(k)), (case, k))
    picks = [check for (_, size), check in first.items() if size == "small"]
    for wanted in ("medium", "large"):
        picks.append(next(check for (_, size), check in first.items() if size == wanted))
    return picks


@pytest.mark.slow
def test_verify_command_passes_on_the_cuda_backend_here():
    """``q2gemv verify --backend cuda``: the GPU here, or the simulator's small checks.

    (The reference half of the command is ``test_reference_reproduces_every_golden_check``,
    in this process; CI runs the whole plain ``q2gemv verify`` as README command 1.)
    """
    # The command's wiring, worker processes switching family, the JSON report and the
    # skip accounting, on a few checks of every family. Every small check on the simulator
    # is README command 1 (``q2gemv verify``, both backends), which CI runs before the
    # tests; the kernels' own simulator tests compare every kernel with its reference.
    full = suite.load_suite()
    picks = _verify_cuda_picks(full)
    cases = sorted({case.id for case, _ in picks})
    kernels = sorted({k for _, k in picks})
    proc = _verify("--backend", "cuda", "--json", "--kernel", *kernels, "--cases", *cases)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(proc.stdout)
    assert rep["ok"] and rep["integrity_problems"] == []
    (cuda,) = rep["backends"]
    c = cuda["counts"]
    assert c["fail"] == c["error"] == 0 and c["pass"] > 0
    assert "checks to run" in proc.stderr  # progress went to stderr, not into the JSON
    checks = suite.Selection.parse(cases, kernels).gemv_checks(full)
    assert c["checks"] == len(checks)
    if cuda["runs_on"].startswith("CUDA simulator"):
        small = [(case.family, k) for case, k in checks if case.size_of(k) == "small"]
        assert {f for f, _ in small} == {case.family for case in full.gemv}
        assert c["pass"] == len(small)
        assert c["skip"] == c["checks"] - len(small) > 0
        reasons = cuda["skip_reasons"]  # one per size class skipped: medium, large
        assert sum(reasons.values()) == c["skip"]
        assert all("simulator" in why for why in reasons)
        assert any("'large'" in why for why in reasons)
        assert any("'medium'" in why for why in reasons)
    else:
        assert c["skip"] == 0


@pytest.mark.gpu
def test_verify_on_the_gpu_runs_the_whole_suite():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = _verify("--backend", "cuda", "--json", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (cuda,) = json.loads(proc.stdout)["backends"]
    assert cuda["runs_on"].startswith("GPU") and cuda["counts"]["skip"] == 0


# -- failures are reported ----------------------------------------------------------------------


def _one_small_check(s: suite.Suite, kernel: str) -> suite.GemvCase:
    return next(
        c for c in s.gemv if c.size_of(kernel) == "small" and c.spec.m == 2 and c.spec.n >= 7
        and c.spec.act_kind == "normal" and kernel in c.kernels
    )  # fmt: skip


def _plus_one_ulp_at(y: np.ndarray, row: int, col: int) -> np.ndarray:
    y = np.array(y, np.uint16, copy=True)
    y[row, col] += 1  # one bf16 ulp (same sign and exponent for these values)
    return y


@pytest.mark.parametrize("backend", ["reference", "cuda"])
@pytest.mark.parametrize("kernel", ["q2_0_gemv_vec_batchm", "w4a16_gemv_batch4"])
def test_one_ulp_change_in_a_kernel_output_is_reported(full_suite, monkeypatch, backend, kernel):
    case = _one_small_check(full_suite, kernel)
    if backend == "reference":
        fn = harness.reference_function(case, kernel)
        mod = sys.modules[fn.__module__]
        attr = kernel if hasattr(mod, kernel) else fn.__name__
    else:
        from q2gemv.host import call as mod

        fn, attr = mod.run_kernel, "run_kernel"

    def broken(*args, **kw):
        y = fn(*args, **kw)
        bits = y.view(np.uint16) if y.dtype != np.uint16 else y
        return _plus_one_ulp_at(bits, 1, 3).view(y.dtype)

    monkeypatch.setattr(mod, attr, broken)
    (r,) = harness.run_gemv_checks([(case, kernel)], backend)
    want = int(case.want(kernel)[1, 3])
    assert r.status == "fail" and r.mismatches == 1
    assert r.first == [(1, 3, want + 1, want)]
    text = r.details()
    assert f"(row 1, col 3): got 0x{want + 1:04X} want 0x{want:04X}" in text
    assert "1 of" in text and kernel in text and case.id in text
    run = report.BackendRun(backend, "test", [r])
    assert report.exit_code([run], []) == 1
    assert report.verdict([run], []).startswith("FAIL")


def test_a_raising_kernel_is_an_error_not_a_crash(full_suite):
    case = _one_small_check(full_suite, "q2_0_gemv")

    def boom(case, kernel):
        raise RuntimeError("launch failed")

    (r,) = harness.run_gemv_checks([(case, "q2_0_gemv")], "cuda", runner=boom)
    assert r.status == "error" and "launch failed" in r.message


def test_drifted_generator_is_detected_for_rebuilt_inputs(full_suite, monkeypatch):
    model = next(c for c in full_suite.gemv if c.input_keys is None)
    real = gen.build_inputs

    def drifted(spec):
        x = real(spec)
        x["a"] = x["a"].copy()
        x["a"][0, 0] ^= 1
        return x

    monkeypatch.setattr(gen, "build_inputs", drifted)
    model.release()
    (r,) = harness.run_gemv_checks([(model, model.kernels[0])], "reference")
    assert r.status == "error" and "drifted" in r.message and model.file in r.message


# -- tampered data ----------------------------------------------------------------------------------


def _flip_byte(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x01
    path.write_bytes(bytes(b))


def test_flipped_byte_in_a_golden_file_is_reported(data_copy):
    target = data_copy / suite.GEMV_FILES["q2_0"]
    _flip_byte(target, target.stat().st_size // 2)
    with pytest.raises(store.GoldenIntegrityError, match=r"gemv_q2_0\.npz was modified"):
        suite.load_suite(data_copy, strict=True)
    s = suite.load_suite(data_copy)
    assert len(s.problems) == 1 and "gemv_q2_0.npz" in s.problems[0]
    assert all(c.file != "gemv_q2_0.npz" for c in s.gemv)  # never used


def test_verify_exits_nonzero_naming_a_tampered_file(data_copy):
    _flip_byte(data_copy / "table_bf16.json", 100)
    proc = _verify(
        "--data-dir", str(data_copy), "--backend", "reference", "--cases", "tables", "--quiet"
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "table_bf16.json was modified" in proc.stdout
    assert "table_bf16.json" in proc.stderr
    assert "FAIL" in proc.stdout and "tampered" in proc.stdout


def test_truncated_golden_file_is_reported(data_copy):
    target = data_copy / suite.ROUNDTRIP_FILE
    raw = target.read_bytes()
    target.write_bytes(raw[: len(raw) // 3])
    proc = _verify(
        "--data-dir", str(data_copy), "--backend", "reference", "--cases", "tables", "--json",
        "--quiet",
    )  # fmt: skip
    assert proc.returncode == 2
    rep = json.loads(proc.stdout)
    (problem,) = rep["integrity_problems"]
    assert "roundtrip.npz" in problem and "truncated" in problem
    assert not rep["ok"]


def test_missing_manifest_is_a_clear_error(data_copy):
    (data_copy / store.MANIFEST).unlink()
    proc = _verify("--data-dir", str(data_copy), "--backend", "reference")
    assert proc.returncode == 2 and "manifest" in proc.stderr and "missing" in proc.stderr


# -- the command line ------------------------------------------------------------------------------


def test_verify_selection_options():
    proc = _verify("--list", "--cases", "small", "--kernel", "q2_0_gemv_vec_rt4")
    assert proc.returncode == 0
    lines = [ln for ln in proc.stdout.splitlines() if "q2_0_gemv_vec_rt4" in ln]
    assert lines and all(ln.startswith("small") for ln in lines)
    assert _verify("--kernel", "no_such_kernel").returncode == 1
    proc = _verify("--cases", "nothing/matches/*", "--backend", "reference")
    assert proc.returncode == 1 and "matches no golden check" in proc.stderr


def test_verify_reference_subset_text_report():
    proc = _verify("--backend", "reference", "--cases", "ggml", "q2_0/g64/n9_*")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "host:ggml" in out and "q2_0_gemv_vec_batchm" in out
    assert "PASS:" in out.splitlines()[-1]
    assert "[reference]" in proc.stderr  # progress


def test_simulator_skips_are_reported_with_a_reason(full_suite):
    sel = suite.Selection.parse(["model"])
    run = harness.run_backend(full_suite, sel, "cuda", quiet=True) if (
        harness.cuda_runs_on() == "simulator"
    ) else None  # fmt: skip
    if run is None:
        pytest.skip("reason: on a GPU nothing is skipped (covered by the gpu test)")
    assert run.counts()["skip"] == run.counts()["checks"] > 0
    text = report.summary_text([run], [])
    assert "skipped [cuda]" in text and "large" in text

"""``q2gemv bench`` on the CPU: its refusals (before anything is built or written), the kernels
it covers, and ``--plot``. Nothing here times or launches anything.
"""

from __future__ import annotations

import argparse
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from q2gemv import bench as B
from q2gemv import cli
from q2gemv.host import backends
from tests.bench.test_formulas import _report, synthetic_rows
from tests.test_cli import _cli


def _args(argv):
    p = argparse.ArgumentParser()
    B.add_arguments(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("m", ["1000000000", "1-1000000000", "100000"])
def test_a_huge_m_is_refused_up_front_naming_m(m, tmp_path, capsys):
    tracemalloc.start()
    try:
        rc = B.run(_args(["--m", m, "--out", str(tmp_path / "out")]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 2
    err = capsys.readouterr().err
    assert "--m" in err and str(B.MAX_M) in err, err
    assert peak < 50 * 2**20  # refused before any launch list or M set was built
    assert not (tmp_path / "out").exists()


def test_the_largest_m_is_accepted():
    assert B.Settings.from_args(_args(["--m", str(B.MAX_M)])).ms == (B.MAX_M,)
    assert B.parse_ints(f"1-{B.MAX_M}")[-1] == B.MAX_M


def test_a_refused_run_leaves_no_out_folder(tmp_path, capsys, monkeypatch):
    out = tmp_path / "a" / "b"
    # too large for the simulator (the tests' backend) or, without it, no GPU: refused late
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert B.run(_args(["--shapes", "5120x5120", "--m", "1", "--out", str(out)])) == 2
    assert "too large for the CUDA simulator" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    monkeypatch.setattr("q2gemv.host.backends.gpu_present", lambda: False)
    assert B.run(_args(["--m", "1", "--out", str(out)])) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_an_out_that_cannot_be_made_is_still_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert B.run(_args(["--out", str(tmp_path / "file" / "sub")])) == 2
    assert "--out" in capsys.readouterr().err


# -- every registered kernel, the exact ones included -------------------------------------------


def test_kernels_takes_every_registered_kernel_and_builds_its_cases():
    from q2gemv.dispatch import registry as kernels

    names = [s.name for s in kernels.specs()]
    assert {"q2_0_gemv_exact", "w4a16_gemv_exact"} <= set(names)
    for name in names:
        st = B.Settings.from_args(_args(["--kernels", name, "--shapes", "16x512", "--m", "1,2,9"]))
        cases = B.build_cases(st.shapes, st.ms, kernels=st.kernels, groups=st.groups)
        timed = [c for c in cases if any(r[2] == name for r in c.launches)]
        assert timed, f"--kernels {name}: no case runs it"


def test_exact_cases_are_the_public_calls_chunks_at_every_m():
    cases = B.build_cases(((16, 512), (32, 1024)), (1, 8, 9, 33), groups=(64, 128), torch=False)
    exact = [c for c in cases if c.role == "exact"]
    table = B.exact_kernel_table()
    assert {c.kernel for c in exact} == set(table) == {"q2_0_gemv_exact", "w4a16_gemv_exact"}
    for c in exact:
        assert sum(rows for _, rows, _ in c.launches) == c.m
        assert all(rows <= table[c.kernel] and name == c.kernel for _, rows, name in c.launches)
        assert not c.selected  # "selected" stays the seed tier table's pick
    q2 = {(c.n, c.k, c.m, c.group) for c in exact if c.family == "q2_0"}
    assert q2 == {(n, k, m, g) for n, k in ((16, 512), (32, 1024)) for m in (1, 8, 9, 33)
                  for g in (64, 128)}  # fmt: skip


def test_an_exact_case_is_timed_as_prepare_then_chunks(monkeypatch):
    """The runner's call of an exact case: the launcher's plan over all M rows (its prepare
    first), pre-bound; nothing launched here."""
    from q2gemv.bench import runner

    case = next(
        c
        for c in B.build_cases(((16, 512),), (9,), kernels=("q2_0_gemv_exact",), torch=False)
        if c.m == 9
    )
    seen, ran = [], []

    def fake_launches(family, contract, plan, dw, a, out, stream=0):
        seen.append((family, contract, plan, a.shape, out.shape))
        return [(None, 1, 256, (), "exact_prepare"), (None, 1, 256, (), "q2_0_gemv_exact")] * 1

    monkeypatch.setattr(runner.launcher, "launches", fake_launches)
    monkeypatch.setattr(runner.launcher, "prebind", lambda ls: [ran.append] * len(ls))

    class Pool:
        family = "q2_0"
        a = [np.zeros((16, 512), np.uint16)]
        out = [np.zeros((16, 16), np.uint16)]
        dw = ["dw"]
        _plan_launches = staticmethod(runner._KernelPool._plan_launches)
        _launcher = runner._KernelPool._launcher

    call = runner._KernelPool.call(Pool(), case, 0)
    call(7)
    assert seen == [("q2_0", "exact", case.launches, (9, 512), (9, 16))]
    assert ran == [7, 7]  # both launches, on the timer's stream


# -- --plot ---------------------------------------------------------------------------------


def _measured_report(st):
    """A made-up run (SYNTHETIC times) of ``st``'s cases, as runner.execute would return it."""
    cases = B.build_cases(st.shapes, st.ms, kernels=st.kernels, groups=st.groups)
    rows = [
        B.case_row(c, time_us=10.0 + c.m, repeats=9, copies=2, calls_per_graph=32, check="ok")
        for c in cases
    ]
    B.derive(rows, ceiling_gbps=4000.0, sms=132, clock_hz=1.98e9)
    meta = B.base_meta(st)
    meta.update(device="NVIDIA H200", simulated=False, dry_run=False)
    return B.Report(rows=rows, meta=meta)


def test_plot_draws_what_the_run_measured(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    from q2gemv.bench import plot, runner

    monkeypatch.setattr("q2gemv.host.backends.simulator_requested", lambda: False)
    monkeypatch.setattr("q2gemv.host.backends.gpu_present", lambda: True)
    monkeypatch.setattr(runner, "execute", lambda st, cases: _measured_report(st))
    argv = ["--plot", "--shapes", "5120x5120", "--m", "1,2,8", "--prefix", "t"]
    assert B.run(_args([*argv, "--out", str(tmp_path)])) == 0
    png = tmp_path / "t_gemv.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "t_w4a16_tiers.png").exists()
    assert str(png) in capsys.readouterr().out  # listed with the files written
    labels = set(plot._series(B.read_csv(tmp_path / "t_gemv.csv")))
    assert {"Q2_0 q2_0_gemv_exact g128", "NVFP4 w4a16_gemv_exact"} <= labels


def test_plot_without_matplotlib_is_refused_before_the_run(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    assert B.run(_args(["--plot", "--out", str(tmp_path / "o")])) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_bench_help_states_the_prefix_rule_device_prefix_follows():
    import argparse

    from q2gemv.bench.command import add_arguments
    from q2gemv.bench.results import SIM_PREFIX, device_prefix

    p = argparse.ArgumentParser()
    add_arguments(p)
    (prefix,) = [a for a in p._actions if a.dest == "prefix"]
    assert "'_dryrun' appended for --dry-run on a GPU" in prefix.help
    assert device_prefix({"simulated": True, "dry_run": True}) == SIM_PREFIX
    assert device_prefix({"device": "NVIDIA H200", "dry_run": True}) == "h200_dryrun"


def test_bench_negative_seed_is_a_usage_error(capsys):
    rc, out, err = _cli(["bench", "--seed", "-1", "--dry-run"], capsys)
    assert rc == 2 and out == ""
    assert "--seed: expected an integer >= 0, got -1" in err and "Traceback" not in err


def _no_run(monkeypatch):
    from q2gemv.bench import runner

    def must_not_run(*args, **kwargs):
        raise AssertionError("cases ran before the outputs were checked")

    monkeypatch.setattr(runner, "execute", must_not_run)


@pytest.mark.parametrize("prefix", ["../x", "a/b", "..", "x\ny"])
def test_bench_prefix_must_be_a_file_name(tmp_path, monkeypatch, capsys, prefix):
    _no_run(monkeypatch)
    argv = ["bench", "--dry-run", "--out", str(tmp_path / "o"), "--prefix", prefix]
    rc, out, err = _cli(argv + ["--shapes", "128x128", "--m", "1", "--no-torch"], capsys)
    assert rc == 2 and out == ""
    assert (
        err.startswith("q2gemv bench: --prefix: expected a file name prefix")
        and err.count("\n") == 1
    ), err
    assert not (tmp_path / "x").exists()


def test_bench_unusable_out_is_refused_before_any_case_runs(tmp_path, monkeypatch, capsys):
    _no_run(monkeypatch)
    blocker = tmp_path / "file\x1bname"
    blocker.write_text("not a folder")
    argv = ["bench", "--dry-run", "--out", str(blocker / "sub")]
    rc, out, err = _cli(argv + ["--shapes", "128x128", "--m", "1", "--no-torch"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("q2gemv bench: --out: cannot create the folder") and "\x1b" not in err
    assert err.count("\n") == 1, err


def _no_gpu(monkeypatch, simulator: bool) -> None:
    monkeypatch.setattr(backends, "gpu_present", lambda: False)
    monkeypatch.setattr(backends, "simulator_requested", lambda: simulator)


def test_bench_without_a_gpu_is_one_line(monkeypatch, capsys):
    _no_gpu(monkeypatch, simulator=False)
    assert cli.main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no CUDA GPU" in err and "--dry-run" in err


def test_bench_refuses_shapes_the_simulator_cannot_run(monkeypatch, capsys):
    _no_gpu(monkeypatch, simulator=True)
    assert cli.main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "5120x5120" in err and f"N*K <= {B.SIM_MAX_NK}" in err and f"M <= {B.SIM_MAX_M}" in err
    assert cli.main(["bench", "--dry-run", "--shapes", "16x512", "--m", "33"]) == 2
    assert "M 33" in capsys.readouterr().err
    cases = B.build_cases(((16, 512),), (1, 2), torch=False)
    assert B.simulator_refusals(cases) == ""


def _settings(tmp_path, *argv):
    p = argparse.ArgumentParser()
    B.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path), *argv])
    args.command = "test"
    return B.Settings.from_args(args)


def test_bench_never_overwrites_results_by_default(tmp_path):
    defaults = _settings(tmp_path)
    assert Path(B.DEFAULT_OUT) != Path("benchmarks/results")
    rep = _report(synthetic_rows())
    first = B.write_outputs(rep, defaults)
    assert defaults.prefix == "h200_synthetic" and first["gemv"].name == "h200_synthetic_gemv.csv"
    before = first["gemv"].read_bytes()
    st = _settings(tmp_path, "--prefix", "h200_synthetic")
    second = B.write_outputs(_report(synthetic_rows()), st)
    assert st.prefix == "h200_synthetic_2" and second["gemv"].name == "h200_synthetic_2_gemv.csv"
    assert first["gemv"].read_bytes() == before
    st = _settings(tmp_path, "--prefix", "h200_synthetic", "--overwrite")
    assert B.write_outputs(_report(synthetic_rows()), st)["gemv"] == first["gemv"]


def test_device_prefix_names_the_device_and_the_simulator():
    assert B.device_prefix({"device": "NVIDIA H200"}) == "h200"
    assert B.device_prefix({"device": "NVIDIA H200", "dry_run": True}) == "h200_dryrun"
    assert B.device_prefix({"device": "CUDA simulator", "simulated": True}) == B.SIM_PREFIX


def test_a_simulator_summary_does_not_look_like_h200_results(tmp_path):
    rows = synthetic_rows()
    for r in rows:
        r["time_us"] = r["time_min_us"] = r["time_max_us"] = None
    B.derive(rows, ceiling_gbps=None, sms=None, clock_hz=None, device="CUDA simulator")
    rep = _report(rows)
    rep.meta.update(device="CUDA simulator", simulated=True, dry_run=True, sms=None, clock_mhz=None)
    md = B.summary_markdown(rep, _settings(tmp_path))
    assert "DRY RUN" in md and "NOTHING WAS TIMED" in md
    assert "132 SMs" not in md and "1980" not in md
    assert all(r["fma_floor_us"] is None for r in rows)
    assert all(h["q2"] is None for h in B.headline_rows(rows))  # no "fastest" untimed kernel
    assert "`q2_0_gemv" not in B.headline_table(rows)

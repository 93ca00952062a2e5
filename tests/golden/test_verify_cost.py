"""``q2gemv verify`` on a CPU-only machine: its cost said before the work, a line per kernel set,
and the quick form (``--backend reference``) in the help. Nothing here runs the simulator."""

from __future__ import annotations

import io
import os

import pytest

from q2gemv import cli
from q2gemv.golden import harness, report, suite, verify


def test_help_names_the_cost_and_the_quick_form(capsys):
    for argv in (["--help"], ["verify", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        text = " ".join(capsys.readouterr().out.split())
        assert "verify --backend reference" in text and "minutes" in text, argv


def test_the_simulator_cost_is_said_before_any_check_runs(monkeypatch, capsys):
    monkeypatch.setattr(harness, "cuda_runs_on", lambda: "simulator")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    said = []

    def fake_run_backend(s, sel, backend, **kw):
        said.append(capsys.readouterr().err)  # what stderr held when the first backend began
        return report.BackendRun(backend, "fake")

    monkeypatch.setattr(harness, "run_backend", fake_run_backend)
    args = cli.build_parser().parse_args(["verify", "--jobs", "2"])
    verify.run(args)
    first = " ".join(said[0].split())
    assert "CUDA simulator" in first and "q2gemv verify --backend reference" in first
    assert "about 2 min" in first or "about 3 min" in first, first  # measured: 125 s
    # nothing said when the simulator is not used, or when asked to be quiet
    said.clear()
    verify.run(cli.build_parser().parse_args(["verify", "--backend", "reference"]))
    assert "simulator" not in said[0]
    said.clear()
    verify.run(cli.build_parser().parse_args(["verify", "--quiet"]))
    assert said[0] == ""


def test_the_whole_small_set_is_estimated_at_minutes(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    s = suite.load_suite()
    todo = harness.simulator_checks(suite.Selection.parse(None).gemv_checks(s))
    assert 75 < harness.sim_estimate_s(todo, 2) < 250  # measured: 125 s on 2 cores
    assert harness.sim_estimate_s(todo, 1) > harness.sim_estimate_s(todo, 2)
    assert harness.sim_estimate_s([], 2) == 0


def _result(kernel: str, status: str = "pass") -> report.CheckResult:
    return report.CheckResult(f"case/{kernel}", kernel, "cuda", status, size="small")


def test_progress_prints_a_line_as_each_kernel_set_is_done():
    out = io.StringIO()
    kernels = ["q2_0_gemv", "w4a16_gemv_exact", "q2_0_gemv", "w4a16_gemv_exact"]
    prog = harness.Progress("cuda/simulator", 4, out, interval=1e9, kernels=kernels)
    prog.start("note")
    for k, status in zip(kernels, ["pass", "pass", "fail", "pass"], strict=True):
        prog.update(_result(k, status))
    lines = out.getvalue().splitlines()
    done = [ln for ln in lines if "checks done" in ln]
    assert [d.split("] ")[1].split(":")[0] for d in done] == ["q2_0_gemv", "w4a16_gemv_exact"]
    assert "all 2 checks done, 1 failed" in done[0] and "all 2 checks done, 0 failed" in done[1]
    assert lines[0] == "[cuda/simulator] 4 checks to run (note)"

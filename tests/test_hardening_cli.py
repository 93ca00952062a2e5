"""CLI and bench hardening (issue 16, round 2): no traceback without a GPU, simulator-sized
shapes only, committed results never overwritten, dry runs that cannot pass for H200 numbers,
help text everywhere, a closed pipe. Nothing here launches a kernel."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from q2gemv import bench as B
from q2gemv import cli
from q2gemv.host import backends
from tests.bench.test_formulas import _report, synthetic_rows


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


# -- the command line ------------------------------------------------------------------------


def _all_parsers(p: argparse.ArgumentParser, path=("q2gemv",)):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _all_parsers(sp, (*path, name))


def test_every_option_has_help_and_help_has_no_markup():
    for path, p in _all_parsers(cli.build_parser()):
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert a.help, f"{' '.join(path)} {a.option_strings or a.dest}: no help text"
        text = p.format_help()
        assert "``" not in text and ":func:" not in text, " ".join(path)


def test_verify_jobs_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "--jobs", "-3"])
    assert e.value.code == 2 and "--jobs: expected an integer >= 1" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly():
    proc = subprocess.Popen(
        [sys.executable, "-m", "q2gemv.cli", "verify", "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read().decode()
    proc.stderr.close()
    rc = proc.wait()
    assert rc == cli.EXIT_BROKEN_PIPE and "Traceback" not in err, (rc, err)


# -- docs and packaging -----------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_architecture_doc_names_only_what_exists():
    import importlib

    text = (ROOT / "docs" / "architecture.md").read_text()
    pat = (
        r"\b((?:api|dispatch\.\w+|host\.\w+|reference\.\w+|io(?:\.\w+)+|nn\.\w+|formats\.\w+"
        r"|golden\.\w+|cuda(?:\.\w+)+)"
        r"\.(\w+))"
    )
    names = {m[0] for m in re.findall(pat, text) if m[1] != "py"}
    assert "api.gemv" in names
    for dotted in sorted(names):
        mod, _, attr = dotted.rpartition(".")
        parent = importlib.import_module("q2gemv." + mod)
        if not hasattr(parent, attr):  # a submodule: it must import
            importlib.import_module(f"q2gemv.{dotted}")


def test_a_notebooks_extra_has_what_nbconvert_needs():
    text = (ROOT / "pyproject.toml").read_text()  # no tomllib on Python 3.10
    block = re.search(r"^notebooks = \[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml has no 'notebooks' extra"
    names = {re.split(r"[<>=\[]", d)[0] for d in re.findall(r'"([^"]+)"', block[1])}
    assert {"nbconvert", "ipykernel", "matplotlib", "numba-cuda"} <= names

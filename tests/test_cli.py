"""The ``q2gemv`` command line as a subprocess: what a terminal or a pipe receives."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from q2gemv import cli
from q2gemv.formats.q2_0 import quantize_q2_0
from q2gemv.io import save_q2_weights


def _q2gemv(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "q2gemv.cli", *argv],
        capture_output=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_inspect_prints_a_unicode_name_on_an_ascii_stdout(tmp_path):
    w = quantize_q2_0(np.ones((1, 128), dtype=np.float32), group=128)
    path = tmp_path / "u.gguf"
    save_q2_weights(path, {"blk.0.caf\u00e9.weight": w})
    r = _q2gemv("inspect", str(path), PYTHONIOENCODING="ascii")
    assert r.returncode == 0, r.stderr.decode()
    assert b"Traceback" not in r.stderr
    assert b"caf\\xe9" in r.stdout  # escaped, not dropped


SRC = Path(__file__).resolve().parents[1] / "src"


def test_version_flag_prints_the_package_version(capsys):
    import q2gemv
    from q2gemv.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"q2gemv {q2gemv.__version__}\n"


def _cli(argv, capsys):
    from q2gemv.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_verify_list_and_selection_errors_honour_json(capsys):
    import json

    rc, out, err = _cli(["verify", "--list", "--json", "--kernel", "q2_0_gemv_vec"], capsys)
    listed = json.loads(out)
    assert rc == 0 and listed["ok"] and listed["checks"]
    assert {c["kernel"] for c in listed["checks"]} <= {"q2_0_gemv_vec", "host"}
    assert any(c["kernel"] == "q2_0_gemv_vec" for c in listed["checks"])
    rc, out, err = _cli(["verify", "--json", "--kernel", "no_such_kernel"], capsys)
    assert rc == 1 and json.loads(out)["ok"] is False
    assert err.startswith("q2gemv verify: ") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["verify", "--list"], ["golden", "regen", "--dry-run"]])
def test_stdout_on_a_full_disk_is_one_line_and_status_1(argv):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "q2gemv.cli", *argv],
            env={**os.environ, "PYTHONPATH": str(SRC), "NUMBA_ENABLE_CUDASIM": "1"},
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "No space left on device" in r.stderr, r.stderr


def test_golden_regen_refusal_goes_to_stderr(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "q2gemv.cli", "golden", "regen", "--data-dir", str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(SRC), "NUMBA_ENABLE_CUDASIM": "1"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("golden regen: refused:"), r.stderr


def test_golden_regen_refusal_escapes_the_path(tmp_path, capsys):
    d = tmp_path / "gold\nen\x1b"
    d.mkdir()
    rc, out, err = _cli(["golden", "regen", "--data-dir", str(d)], capsys)
    assert rc == 1 and out == ""
    assert err.startswith("golden regen: refused:") and err.count("\n") == 1, err
    assert "\x1b" not in err


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

"""scripts/sanitize_h200.py's log parsing, on the summary lines compute-sanitizer prints.

The lines below are copied from real H200 runs (racecheck prints no ERROR
SUMMARY, only a RACECHECK SUMMARY), plus made-up failing counterparts so a
parser that ignored the numbers would fail.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def san():
    spec = importlib.util.spec_from_file_location(
        "q2gemv_sanitize", ROOT / "scripts" / "sanitize_h200.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


WORKER_OK = "q2_0: 111 cases\ntotal: 111 cases, 0 failed\nWORKER cases=111 failures=0\n"


@pytest.mark.parametrize(
    "tail, errors, hazards",
    [
        ("========= ERROR SUMMARY: 0 errors\n", 0, None),
        ("========= ERROR SUMMARY: 3 errors\n", 3, None),
        ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", 0, 0),
        ("========= RACECHECK SUMMARY: 5 hazards displayed (2 errors, 3 warnings)\n", 2, 5),
        ("========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n", 1, 1),
        ("", None, None),  # crashed or timed out: no summary, never read as zero
    ],
)
def test_parse_log_counts(san, tail, errors, hazards):
    got = san.parse_log("========= COMPUTE-SANITIZER\n" + WORKER_OK + tail)
    assert (got["errors"], got["hazards"]) == (errors, hazards)
    assert (got["cases"], got["case_failures"]) == (111, 0)


def test_parse_log_worker_failures(san):
    got = san.parse_log("WORKER cases=12 failures=0\nWORKER cases=40 failures=2\n")
    assert (got["cases"], got["case_failures"]) == (40, 2)  # the last worker line counts
    assert got["errors"] is None


def test_bad_family_is_refused(san, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["sanitize_h200.py", "--families", "q2_0,q3"])
    with pytest.raises(SystemExit):
        san.main()
    assert "--families: expected names from" in capsys.readouterr().err

"""``q2gemv bench`` on the CPU: its refusals (before anything is built or written), the kernels
it covers, and ``--plot``. Nothing here times or launches anything.
"""

from __future__ import annotations

import argparse
import tracemalloc

import pytest

from q2gemv import bench as B


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
    monkeypatch.setattr("q2gemv.backends.gpu_present", lambda: False)
    assert B.run(_args(["--m", "1", "--out", str(out)])) == 2
    assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_an_out_that_cannot_be_made_is_still_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert B.run(_args(["--out", str(tmp_path / "file" / "sub")])) == 2
    assert "--out" in capsys.readouterr().err

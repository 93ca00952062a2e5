"""Progress on long model-level work (q2gemv.tools.progress): off, on with tqdm, on without tqdm."""

from __future__ import annotations

import sys

import pytest

from q2gemv.tools.progress import AUTO_MIN_STEPS, Progress, track, wants_progress


def test_wants_progress_auto_needs_a_terminal_and_many_steps():
    assert wants_progress(None, AUTO_MIN_STEPS, True)
    assert not wants_progress(None, AUTO_MIN_STEPS - 1, True)
    assert not wants_progress(None, 10**6, False)
    for steps, tty in ((0, False), (10**6, True)):
        assert wants_progress(True, steps, tty) and not wants_progress(False, steps, tty)
    for bad in ("yes", 1, 0):
        with pytest.raises(TypeError, match="progress: expected None, True or False"):
            wants_progress(bad, 1, True)


def test_progress_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    with Progress("work", 2, True) as bar:
        bar.step("a")
        bar.step("b")
    assert capsys.readouterr().err == "work: 1/2 a\nwork: 2/2 b\n"
    assert list(track("xy", "auto", None)) == ["x", "y"]  # auto: silent without tqdm
    assert list(track("xy", "off", False)) == ["x", "y"]
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


def test_progress_with_tqdm_names_every_step(capsys):
    pytest.importorskip("tqdm")
    assert list(track(["first", "second", "third"], "work", True)) == ["first", "second", "third"]
    err = capsys.readouterr().err
    assert "work" in err and "3/3" in err
    assert all(name in err for name in ("first", "second", "third"))

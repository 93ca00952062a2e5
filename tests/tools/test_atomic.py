"""q2gemv.tools.atomic: the one way the package writes a file (temporary file, then rename)."""

from __future__ import annotations

import ast
import builtins
import errno
import os
from pathlib import Path

import pytest

from q2gemv.io.gguf.writer import save_q2_weights
from q2gemv.tools import atomic as _atomic
from tests.q2_cases import _q2

SRC = Path(__file__).resolve().parents[2] / "src"


class _FailingFile:
    """Wraps a real file; its write raises ``exc`` once ``after`` bytes have been written."""

    def __init__(self, f, after: int, exc: BaseException) -> None:
        self._f, self._left, self._exc = f, after, exc

    def write(self, data) -> int:
        data = memoryview(data).cast("B") if not isinstance(data, str) else data
        if len(data) > self._left:
            self._f.write(data[: self._left])
            self._left = 0
            raise self._exc
        self._left -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)


@pytest.mark.parametrize(
    "exc",
    [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt(), RuntimeError("x")],
    ids=["disk-full", "interrupt", "exception"],
)
def test_a_failed_save_leaves_the_original_and_no_temporary(tmp_path, monkeypatch, exc):
    p = tmp_path / "w.gguf"
    save_q2_weights(p, {"a": _q2()})
    original = p.read_bytes()
    real_fdopen, real_open = os.fdopen, builtins.open

    def failing(real):
        def opener(file, mode="r", *a, **kw):
            f = real(file, mode, *a, **kw)
            return _FailingFile(f, 100, exc) if set(mode) & set("wax+") else f

        return opener

    # Every way a writer could open its file fails after 100 bytes.
    monkeypatch.setattr(os, "fdopen", failing(real_fdopen))
    monkeypatch.setattr(builtins, "open", failing(real_open))
    bigger = {"a": _q2(8, 256, 64, 3), "b": _q2(8, 256, 128, 4)}
    with pytest.raises(type(exc)):
        save_q2_weights(p, bigger)
    monkeypatch.undo()
    assert p.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == ["w.gguf"]


def test_a_failed_fsync_leaves_the_original(tmp_path, monkeypatch):
    """A full disk can surface at fsync (delayed allocation): still nothing replaced."""
    p = tmp_path / "w.gguf"
    save_q2_weights(p, {"a": _q2()})
    original = p.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        save_q2_weights(p, {"b": _q2(4, 128, 64, 5)})
    monkeypatch.undo()
    assert p.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == ["w.gguf"]


def test_atomic_write_keeps_mode_and_follows_symlinks(tmp_path):
    real = tmp_path / "real.bin"
    real.write_bytes(b"old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    _atomic.write_bytes(link, b"new")
    assert link.is_symlink() and real.read_bytes() == b"new"
    assert (os.stat(real).st_mode & 0o777) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["link.bin", "real.bin"]


def _writers(tree: ast.AST) -> list[int]:
    """Lines of ``tree`` that write a file themselves: open() for writing, pathlib's
    write_bytes/write_text, ndarray.tofile, np.save/savez, safetensors' save_file."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "_atomic":
            continue  # the helper itself
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in ("write_bytes", "write_text", "tofile", "save", "savez", "save_file"):
            lines.append(node.lineno)
        elif name == "open":
            modes = [a for a in node.args[1:2]] + [
                k.value for k in node.keywords if k.arg == "mode"
            ]
            if any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax+") for m in modes):
                lines.append(node.lineno)
    return lines


def test_the_writer_scan_finds_writers():
    tree = ast.parse(
        "open(p, 'wb')\nopen(p, mode='a')\nq.write_text(s)\nnp.save(p, a)\nopen(p)\n_atomic.write_text(p, s)"
    )
    assert _writers(tree) == [1, 2, 3, 4]


def test_every_package_writer_goes_through_the_atomic_helper():
    """No module of the package writes a file itself: q2gemv.tools.atomic is the one place."""
    pkg = SRC / "q2gemv"
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        if path != pkg / "tools" / "atomic.py":
            text = path.read_text()
            bad += [f"{path.relative_to(pkg)}:{i}" for i in _writers(ast.parse(text))]
    assert bad == []

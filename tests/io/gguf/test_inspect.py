"""q2gemv.io.gguf.inspect and ``q2gemv inspect``: escaped names, keys and paths."""

from __future__ import annotations

from q2gemv import cli
from q2gemv.io.gguf.inspect import format_inspect
from tests.io.gguf.test_reader import ARR, STR, spec_gguf, write
from tests.q2_cases import _q2
from tests.test_cli import _cli


def test_inspect_escapes_a_path_with_a_newline(tmp_path, capsys):
    p = tmp_path / "a\nb\x1b[31m.gguf"
    p.write_bytes(b"not a gguf file at all")
    rc, out, err = _cli(["inspect", str(p)], capsys)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "\x1b" not in err and "a\\nb\\x1b[31m.gguf" in err


def test_inspect_escapes_names_and_keys(tmp_path, capsys):
    evil = "x\n  forged  Q2_0  (1, 1)  64  0  0\x1b[31m"
    w = _q2(4, 256, 128)
    data = spec_gguf(
        [(evil, STR, "v\x1b[0m"), ("tokens", ARR, (STR, ["a\nb"]))],
        [(evil, (256, 4), 142, None)],
        [w.raw.tobytes()],
    )
    p = write(tmp_path, data)
    text = format_inspect(p)
    assert "\x1b" not in text
    assert not any(ln.lstrip().startswith("forged") for ln in text.splitlines())  # no forged row
    rows = [ln for ln in text.splitlines() if "forged" in ln]
    assert len(rows) == 2 and all(ln.lstrip().startswith("x\\n") for ln in rows)  # key + tensor
    assert "\\x1b[31m" in text and "'v\\x1b[0m'" in text
    assert cli.main(["inspect", str(p)]) == 0
    assert "\x1b" not in capsys.readouterr().out

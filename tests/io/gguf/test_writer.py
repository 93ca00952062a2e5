"""q2gemv.io.gguf.writer.write_gguf: GGUFWriter's file, read back by q2gemv's reader."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from q2gemv.io.gguf.writer import save_q2_weights
from tests.q2_cases import _q2

pytest.importorskip("gguf")

from q2gemv.formats.q2_0 import quantize_q2_0  # noqa: E402
from q2gemv.io import load_q2_weights, read_gguf  # noqa: E402
from q2gemv.io.gguf.reader import GGUF_STRING, GGUF_UINT32  # noqa: E402
from q2gemv.io.gguf.writer import GgufTensorOut, write_gguf  # noqa: E402


def _tensors():
    rng = np.random.default_rng(0)
    q128 = quantize_q2_0(rng.standard_normal((3, 256)).astype(np.float32), group=128)
    q64 = quantize_q2_0(rng.standard_normal((5, 64)).astype(np.float32), group=64)
    norm = rng.standard_normal(7).astype(np.float32)
    emb = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16).view(np.uint16)
    return (
        q128,
        q64,
        norm,
        emb,
        [
            GgufTensorOut("a.weight", (3, 256), 142, lambda: np.asarray(q128.raw), 128),
            GgufTensorOut("b.weight", (5, 64), 42, lambda: np.asarray(q64.raw), 64),
            GgufTensorOut("norm.weight", (7,), 0, lambda: norm),
            GgufTensorOut("emb.weight", (4, 6), 30, lambda: emb),
        ],
    )


def test_write_gguf_reads_back(tmp_path):
    q128, q64, norm, emb, tensors = _tensors()
    path = tmp_path / "t.gguf"
    write_gguf(path, "llama", [("llama.block_count", 1, GGUF_UINT32, None),
                               ("general.name", "t", GGUF_STRING, None)], tensors)  # fmt: skip
    gf = read_gguf(path)
    assert gf.metadata["general.architecture"] == "llama"
    assert gf.metadata["llama.block_count"] == 1 and gf.metadata["general.name"] == "t"
    assert gf.metadata["q2gemv.q2_0.group.b.weight"] == 64
    assert [(t.name, t.type_name, t.ne) for t in gf.tensors] == [
        ("a.weight", "PQ2_0", (256, 3)),
        ("b.weight", "Q2_0", (64, 5)),
        ("norm.weight", "F32", (7,)),
        ("emb.weight", "BF16", (6, 4)),
    ]
    assert all(t.offset % 32 == 0 for t in gf.tensors) and gf.file_size % 32 == 0
    q = load_q2_weights(path)
    assert q["a.weight"].group == 128 and q["b.weight"].group == 64
    assert np.array_equal(np.asarray(q["a.weight"].raw), np.asarray(q128.raw))
    assert np.array_equal(np.asarray(q["b.weight"].raw), np.asarray(q64.raw))
    t = gf.tensor("norm.weight")
    assert np.array_equal(np.fromfile(path, "<f4", 7, offset=t.offset), norm)
    t = gf.tensor("emb.weight")
    assert np.array_equal(np.fromfile(path, "<u2", 24, offset=t.offset).reshape(4, 6), emb)


def test_write_gguf_refusals_and_atomicity(tmp_path):
    *_, tensors = _tensors()
    path = tmp_path / "t.gguf"
    path.write_bytes(b"old")
    bad = [
        (GgufTensorOut("x", (2, 128), 142, lambda: b"", 64), "type 142 with group 64"),
        (GgufTensorOut("x" * 64, (2,), 0, lambda: b""), "expected 1 to 63 bytes"),
        (GgufTensorOut("x", (2, 96), 42, lambda: b"", 64), "not \\[n, k\\*64\\]"),
        (GgufTensorOut("x", (2,), 2, lambda: b""), "type 2 is not"),
        (GgufTensorOut("x", (2,), 0, lambda: np.zeros(3, np.float32)), "gave 12 bytes"),
    ]
    for t, match in bad:
        with pytest.raises(ValueError, match=match):
            write_gguf(path, "llama", [], [*tensors, t])

    def boom():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_gguf(path, "llama", [], [*tensors, GgufTensorOut("x", (2,), 0, boom)])
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["t.gguf"]


SRC = Path(__file__).resolve().parents[3] / "src"


def test_saving_over_the_mapped_source_keeps_the_process_and_the_file(tmp_path):
    """load_q2_weights maps the file; saving over it used to truncate it in place (SIGBUS).

    Run in a child process: before the fix the child died of SIGBUS (it would kill pytest).
    """
    p = tmp_path / "w.gguf"
    save_q2_weights(p, {"a": _q2(4, 256, 64, 1), "b": _q2(3, 128, 128, 2)})
    code = textwrap.dedent(
        f"""
        import numpy as np
        from q2gemv.io.gguf import load_q2_weights, save_q2_weights
        p = {str(p)!r}
        ws = load_q2_weights(p)
        before = {{k: w.raw.tobytes() for k, w in ws.items()}}
        save_q2_weights(p, ws)                      # over the file ws is mapped from
        assert {{k: w.raw.tobytes() for k, w in ws.items()}} == before  # old map intact
        ws[\"b\"] = ws.pop(\"a\")                     # save again, different content
        save_q2_weights(p, ws)
        print(\"ok\")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "ok"
    back = load_q2_weights(p)
    assert list(back) == ["b"]
    assert back["b"].raw.tobytes() == _q2(4, 256, 64, 1).raw.tobytes()
    assert sorted(os.listdir(tmp_path)) == ["w.gguf"]


@pytest.mark.parametrize("alignment", [2**33, 2**32, 4, 3, True, 64.0, "64", np.int64(3)])
def test_save_alignment_out_of_range_names_the_argument(tmp_path, alignment):
    with pytest.raises(ValueError, match=r"alignment: expected a power of two from 8 to 2\*\*31"):
        save_q2_weights(tmp_path / "a.gguf", {"w": _q2(4, 128, 128)}, alignment=alignment)


@pytest.mark.parametrize("alignment", [np.int64(64), np.uint32(64)])
def test_save_accepts_numpy_integer_alignments(tmp_path, alignment):
    p = tmp_path / "a.gguf"
    w = _q2(4, 128, 128)
    save_q2_weights(p, {"w": w}, alignment=alignment)
    assert read_gguf(p).alignment == 64
    assert load_q2_weights(p)["w"].raw.tobytes() == w.raw.tobytes()

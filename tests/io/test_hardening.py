"""Loader hardening (issue 16, round 2): GGUF overlaps, unknown types, alignment, name length,
big metadata arrays, directories, escaped ``inspect`` output, the package reading back its own
small files; safetensors deep JSON; writer argument checks."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest

from q2gemv import cli
from q2gemv.formats.q2_0 import quantize_q2_0
from q2gemv.io.gguf.inspect import format_inspect
from q2gemv.io.gguf.reader import GgufError, load_q2_weights, read_gguf
from q2gemv.io.gguf.writer import save_q2_weights
from q2gemv.io.safetensors.reader import SafetensorsError, load_nvfp4_weights
from tests.io.gguf.test_reader import ARR, F32, STR, U8, U32, spec_gguf, write


def _q2(n: int, k: int, group: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return quantize_q2_0(rng.standard_normal((n, k)).astype(np.float32), group=group)


# -- GGUF reader -----------------------------------------------------------------------------


def test_small_q2_tensors_at_the_same_offset_overlap(tmp_path):
    w = _q2(1, 128, 64)  # 36 bytes: fits group 64 and 128 alike at alignment 32
    blob = w.raw.tobytes()
    p = write(tmp_path, spec_gguf((), [("a", (128, 1), 42, 0), ("b", (128, 1), 42, 0)], [blob]))
    with pytest.raises(GgufError, match="overlaps tensor"):
        read_gguf(p)
    with pytest.raises(GgufError, match="overlaps tensor"):
        load_q2_weights(p, ambiguous_group=64)


@pytest.mark.parametrize("type_id", [99, 0xFF])
def test_an_unknown_tensor_type_is_refused_not_dropped(tmp_path, type_id):
    w = _q2(4, 256, 128)
    tensors = [("q", (256, 4), 142, None), ("x", (256, 4), type_id, None)]
    p = write(tmp_path, spec_gguf((), tensors, [w.raw.tobytes(), w.raw.tobytes()]))
    with pytest.raises(GgufError, match=rf"'x'.*unknown tensor type id {type_id}"):
        load_q2_weights(p)
    assert read_gguf(p).tensor("x").nbytes is None  # read_gguf / inspect still list it


@pytest.mark.parametrize("alignment", [1, 2, 4, 12])
def test_alignment_must_be_a_power_of_two_multiple_of_8(tmp_path, alignment):
    p = write(tmp_path, spec_gguf([("general.alignment", U32, alignment)], alignment=8))
    with pytest.raises(GgufError, match="general.alignment.*multiple of 8"):
        read_gguf(p)
    ok = write(tmp_path, spec_gguf([("general.alignment", U32, 8)], alignment=8), "ok.gguf")
    assert read_gguf(ok).alignment == 8


@pytest.mark.parametrize("length, ok", [(63, True), (64, False), (1000, False)])
def test_tensor_names_longer_than_ggml_allows_are_refused(tmp_path, length, ok):
    w = _q2(4, 256, 128)
    p = write(tmp_path, spec_gguf((), [("n" * length, (256, 4), 142, None)], [w.raw.tobytes()]))
    if ok:
        assert load_q2_weights(p)["n" * length].group == 128
    else:
        with pytest.raises(GgufError, match=f"{length} bytes long.*at most 63"):
            read_gguf(p)


def test_a_big_metadata_array_is_read_without_python_objects(tmp_path):
    count = 1 << 20  # 4 MiB of f32; as a list of Python floats it would be ~32 MiB
    vals = np.arange(count, dtype="<f4")
    raw_kv = b"".join(
        [struct.pack("<Q", 6), b"scores", struct.pack("<IIQ", ARR, F32, count), vals.tobytes()]
    )
    p = write(tmp_path, spec_gguf((), raw_kv=raw_kv))
    tracemalloc.start()
    try:
        gf = read_gguf(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    got = gf.metadata["scores"]
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and not got.flags.writeable
    np.testing.assert_array_equal(got, vals)
    assert peak < 2 * vals.nbytes, f"peak {peak} bytes for {vals.nbytes} bytes of data"
    assert "array[float32] x 1048576  [0.0, 1.0, 2.0, 3.0, ...]" in format_inspect(p)


def test_string_and_nested_metadata_arrays_cost_about_their_file_size(tmp_path):
    """Issue 33 item 16: a Python object per element made nested arrays cost ~14x their bytes
    in the file (a NumPy array per 13-byte inner array) and short strings ~6x."""
    n = 40_000
    kvs = [
        ("nested", ARR, (ARR, [(U8, [i % 251]) for i in range(n)])),
        ("strs", ARR, (STR, [f"t{i % 10}" for i in range(n)])),
        ("deep", ARR, (ARR, [(ARR, [(STR, ["x", "yz"])]), (ARR, [])])),
    ]
    p = write(tmp_path, spec_gguf(kvs))
    size = p.stat().st_size
    tracemalloc.start()
    try:
        gf = read_gguf(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * size, f"peak {peak} bytes for a file of {size} bytes"
    nested, strs, deep = (gf.metadata[k] for k in ("nested", "strs", "deep"))
    assert len(nested) == n and nested[7].tolist() == [7] and nested[-1].tolist() == [(n - 1) % 251]
    assert isinstance(nested[3], np.ndarray) and not nested[3].flags.writeable
    assert len(strs) == n and strs[12] == "t2" and strs[-1] == f"t{(n - 1) % 10}"
    assert strs[:3] == ["t0", "t1", "t2"] and list(strs)[:2] == ["t0", "t1"]
    assert deep == [[["x", "yz"]], []] and deep.tolist() == [[["x", "yz"]], []]
    text = format_inspect(p)
    assert "array[array] x 40000" in text and "[[0], [1], [2], [3], ...]" in text
    q = tmp_path / "again.gguf"
    save_q2_weights(q, {}, {k: gf.metadata[k] for k in ("nested", "strs", "deep")})
    again = read_gguf(q).metadata
    assert again["strs"] == strs and again["nested"] == nested and again["deep"] == deep


def test_metadata_array_counts_beyond_the_file_are_refused_before_reading(tmp_path):
    raw_kv = b"".join([struct.pack("<Q", 1), b"a", struct.pack("<IIQ", ARR, ARR, 2**60)])
    with pytest.raises(GgufError, match="truncated"):
        read_gguf(write(tmp_path, spec_gguf((), raw_kv=raw_kv)))


def test_a_directory_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(GgufError, match="is a directory"):
        read_gguf(tmp_path)
    with pytest.raises(GgufError, match="is a directory"):
        load_q2_weights(tmp_path)
    assert cli.main(["inspect", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


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


# -- the package reads back what it writes ------------------------------------------------------


@pytest.mark.parametrize("group, type_id", [(64, None), (64, 42), (128, 42), (128, None)])
def test_small_files_of_our_own_read_back_unaided(tmp_path, group, type_id):
    ws = {"a": _q2(4, 128, group), "b": _q2(1, 256, group, 1)}
    p = tmp_path / "small.gguf"
    save_q2_weights(p, ws, type_id=type_id)
    got = load_q2_weights(p)
    for name, w in ws.items():
        assert got[name].group == group and got[name].raw.tobytes() == w.raw.tobytes()
    assert read_gguf(p).tensor("a").group == group
    assert "64|128?" not in format_inspect(p)


def test_a_recorded_group_must_agree_with_the_size(tmp_path):
    w = _q2(64, 512, 64)  # large enough for the size to decide: group 64 only
    data = spec_gguf(
        [("q2gemv.q2_0.group.w", U32, 128)], [("w", (512, 64), 42, None)], [w.raw.tobytes()]
    )
    with pytest.raises(GgufError, match="records group 128"):
        read_gguf(write(tmp_path, data))
    bad = spec_gguf([("q2gemv.q2_0.group.w", U32, 32)], [("w", (512, 64), 42, None)], [b"\0"])
    with pytest.raises(GgufError, match="expected 64 or 128"):
        read_gguf(write(tmp_path, bad, "bad.gguf"))
    with pytest.raises(ValueError, match="q2gemv.q2_0.group"):
        save_q2_weights(tmp_path / "x.gguf", {"w": w}, {"q2gemv.q2_0.group.w": 64})


# -- writer arguments -----------------------------------------------------------------------------


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


# -- safetensors ------------------------------------------------------------------------------


def test_safetensors_deeply_nested_header_is_the_loaders_error(tmp_path):
    header = b"[" * 100_000 + b"]" * 100_000
    p = tmp_path / "deep.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(SafetensorsError, match="nested too deeply"):
        load_nvfp4_weights(p)

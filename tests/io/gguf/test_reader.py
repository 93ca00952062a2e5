"""GGUF reader/writer: round trips, a spec-built file, the gguf package, every error path."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from q2gemv import cli
from q2gemv.formats.q2_0 import Q2Weight, block_bytes, quantize_q2_0
from q2gemv.io.gguf.inspect import format_inspect
from q2gemv.io.gguf.reader import (
    GgufError,
    load_q2_weights,
    q2_groups_for_room,
    q2_sizes,
    read_gguf,
)
from q2gemv.io.gguf.writer import save_q2_weights
from tests.q2_cases import _q2

from ..mapping import mmap_of

# -- an independent minimal GGUF writer, from the specification ---------------
# Value type ids and layout per ggml docs/gguf.md; deliberately not importing
# anything from q2gemv.io so that a shared misreading cannot hide.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f"}
_FMT.update({BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"})


def s_(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def v_(vtype: int, value) -> bytes:
    """Encode one value of a metadata type; arrays are (elem_type, [values])."""
    if vtype == STR:
        return s_(value)
    if vtype == ARR:
        elem, items = value
        return struct.pack("<IQ", elem, len(items)) + b"".join(v_(elem, x) for x in items)
    return struct.pack(_FMT[vtype], value)


def spec_gguf(
    kvs=(),
    tensors=(),
    blobs=(),
    *,
    version: int = 3,
    alignment: int = 32,
    raw_kv: bytes | None = None,
) -> bytes:
    """A GGUF file: kvs = [(key, type, value)], tensors = [(name, ne, type, rel_offset)].

    ``blobs`` are laid out at their tensors' relative offsets (None: offsets
    computed here, each blob padded to the alignment).
    """
    kv = b"".join(s_(k) + struct.pack("<I", t) + v_(t, v) for k, t, v in kvs)
    if raw_kv is not None:
        kv += raw_kv
    n_kv = len(kvs) + (raw_kv is not None)
    pad = lambda n: -n % alignment  # noqa: E731
    offsets, rel = [], 0
    for b in blobs:
        offsets.append(rel)
        rel += len(b) + pad(len(b))
    infos = b""
    for i, (name, ne, ttype, off) in enumerate(tensors):
        off = offsets[i] if off is None else off
        infos += s_(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", ttype, off)
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), n_kv) + kv + infos
    out = head + b"\0" * pad(len(head))
    for b in blobs:
        out += b + b"\0" * pad(len(b))
    return out


def plain(value):
    """Metadata as Python values: numeric arrays come back as NumPy arrays (no per-element
    objects); compare them as lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def write(tmp_path, data: bytes, name: str = "f.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def rand_q2(n: int, k: int, group: int, seed: int = 0) -> Q2Weight:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 4, size=(n, k), dtype=np.uint8)  # code 3 (+2) included
    scales = rng.standard_normal((n, k // group)).astype(np.float16)
    return Q2Weight.from_codes(codes, scales, group)


# -- the pure group rule -------------------------------------------------------


def test_q2_sizes_are_block_counts_times_block_bytes():
    assert q2_sizes(8 * 256, 256) == {64: 32 * 18, 128: 16 * 34}
    assert q2_sizes(3 * 192, 192) == {64: 9 * 18}  # 192 is not a multiple of 128
    assert q2_sizes(100, 100) == {}


@pytest.mark.parametrize("alignment", [8, 32, 64])
def test_q2_groups_for_room_exhaustive(alignment):
    for k in (64, 128, 192, 256, 384):
        for n in (1, 2, 3, 7, 16, 33):
            sizes = q2_sizes(n * k, k)
            for room in range(0, max(sizes.values()) + 2 * alignment):
                want = tuple(g for g, s in sizes.items() if s <= room < s + alignment)
                assert q2_groups_for_room(n * k, k, room, alignment) == want


def test_q2_groups_for_room_unambiguous_from_64_alignments():
    # the two sizes differ by n_elements/64 bytes: a tie needs that under the alignment
    for n_el in range(128, 8192 + 1, 128):
        sizes = q2_sizes(n_el, 128)
        padded = {g: -(-s // 32) * 32 for g, s in sizes.items()}
        groups = {len(q2_groups_for_room(n_el, 128, r, 32)) for r in padded.values()}
        if n_el >= 64 * 32:
            assert groups == {1}, n_el
    assert q2_groups_for_room(128, 128, 64, 32) == (64, 128)


# -- round trips ---------------------------------------------------------------

SHAPES = [(1, 128), (7, 256), (9, 384), (16, 1024), (33, 2048), (4, 64 * 33)]


@pytest.mark.parametrize("group", [64, 128])
def test_round_trip_bit_identical_and_mapped(tmp_path, group):
    weights = {
        f"blk.{i}.w": rand_q2(n, k, group, seed=i)
        for i, (n, k) in enumerate(SHAPES)
        if k % group == 0 and n * k >= 64 * 32  # unambiguous sizes (see the tie test)
    }
    p = tmp_path / "w.gguf"
    save_q2_weights(p, weights)
    got = load_q2_weights(p)
    info = read_gguf(p)
    assert list(got) == list(weights)
    for name, w in weights.items():
        g = got[name]
        assert (g.n, g.k, g.group) == (w.n, w.k, w.group)
        assert g.raw.tobytes() == w.raw.tobytes()
        # no copy: the bytes live in the file's memory map, at the tensor's offset
        m = mmap_of(g.raw)
        whole = np.frombuffer(m, dtype=np.uint8)
        assert np.shares_memory(g.raw, whole)
        assert g.raw.ctypes.data - whole.ctypes.data == info.tensor(name).offset
        assert not g.raw.flags.owndata and not g.raw.flags.writeable
        t = info.tensor(name)
        assert t.ne == (w.k, w.n) and t.group == group and t.offset % 32 == 0
        assert t.type_id == (142 if group == 128 else 42)
        np.testing.assert_array_equal(g.codes(), w.codes())


def test_round_trip_small_shapes_with_tiebreak(tmp_path):
    # tiny tensors cannot be told apart by size: 142 is g128 by id, 42 needs a hint
    w128 = {"a": rand_q2(1, 128, 128), "b": rand_q2(7, 128, 128, 1)}
    p = tmp_path / "small128.gguf"
    save_q2_weights(p, w128)  # type 142
    got = load_q2_weights(p)
    assert all(got[k].raw.tobytes() == w.raw.tobytes() for k, w in w128.items())
    assert {w.group for w in got.values()} == {128}

    p42 = tmp_path / "small42.gguf"
    save_q2_weights(p42, w128, type_id=42)  # the writer records each group: reads back unaided
    assert {w.group for w in load_q2_weights(p42).values()} == {128}
    # a foreign type-42 file (no recorded group) leaves the tie to the caller
    p42 = write(
        tmp_path,
        spec_gguf((), [("a", (128, 1), 42, None), ("b", (128, 7), 42, None)],
                  [w128["a"].raw.tobytes(), w128["b"].raw.tobytes()]),
        "foreign42.gguf",
    )  # fmt: skip
    with pytest.raises(GgufError, match=r"'a'.*alike.*ambiguous_group"):
        load_q2_weights(p42)
    got = load_q2_weights(p42, ambiguous_group=128)
    assert got["b"].raw.tobytes() == w128["b"].raw.tobytes() and got["b"].group == 128
    assert read_gguf(p42).tensor("a").group is None
    assert "64|128?" in format_inspect(p42)

    w64 = {"c": rand_q2(3, 64, 64)}  # k=64: only group 64 can divide the rows
    save_q2_weights(p, w64)
    assert load_q2_weights(p)["c"].group == 64
    with pytest.raises(ValueError, match="ambiguous_group"):
        load_q2_weights(p, ambiguous_group=32)


def test_group128_written_as_type42_loads_as_group128(tmp_path):
    w = {"blk.0.ffn_up.weight": rand_q2(24, 512, 128), "blk.0.ffn_down.weight": rand_q2(8, 768, 64)}
    p = tmp_path / "old_prism.gguf"
    save_q2_weights(p, w, type_id=42)
    info = read_gguf(p)
    assert {t.type_id for t in info.tensors} == {42}
    got = load_q2_weights(p)
    assert got["blk.0.ffn_up.weight"].group == 128
    assert got["blk.0.ffn_down.weight"].group == 64
    for k in w:
        assert got[k].raw.tobytes() == w[k].raw.tobytes()


def test_layout_matches_the_spec_writer_byte_for_byte(tmp_path):
    a, b = rand_q2(5, 256, 128), rand_q2(3, 320, 64)
    meta = {"general.architecture": "llama", "n": 7, "pi": 3.25, "ok": True, "v": ["x", "yz"]}
    p = tmp_path / "ours.gguf"
    save_q2_weights(p, {"a": a, "b": b}, meta, alignment=64)
    want = spec_gguf(
        [
            ("general.architecture", STR, "llama"),
            ("n", I32, 7),
            ("pi", F32, 3.25),
            ("ok", BOOL, True),
            ("v", ARR, (STR, ["x", "yz"])),
            ("general.alignment", U32, 64),
            ("q2gemv.q2_0.group.a", U32, 128),  # each tensor's group, recorded
            ("q2gemv.q2_0.group.b", U32, 64),
        ],
        [("a", (256, 5), 142, None), ("b", (320, 3), 42, None)],
        [a.raw.tobytes(), b.raw.tobytes()],
        alignment=64,
    )
    assert p.read_bytes() == want


def test_metadata_round_trip_types_and_values(tmp_path):
    meta = {
        "s": "héllo ✓",
        "i": -5,
        "big": 2**40,
        "huge": 2**63,
        "f": 0.1,
        "d": np.float64(0.1),
        "u8": np.uint8(200),
        "i16": np.int16(-300),
        "b": False,
        "ints": [1, 2, 2**33],
        "floats": [0.5, 0.25],
        "bools": [True, False],
        "strs": ["a", "", "ü"],
        "nested": [[1, 2], [3]],
        "arr": np.arange(4, dtype=np.uint16),
        "empty": np.zeros(0, dtype=np.float32),
    }
    p = tmp_path / "m.gguf"
    save_q2_weights(p, {}, meta)
    gf = read_gguf(p)
    md, ty = {k: plain(v) for k, v in gf.metadata.items()}, gf.metadata_types
    assert list(md) == [*meta, "general.alignment"]
    arrays = {k: v for k, v in gf.metadata.items() if k in ("ints", "floats", "bools", "arr")}
    assert all(isinstance(v, np.ndarray) and not v.flags.writeable for v in arrays.values())
    assert md["s"] == "héllo ✓" and ty["s"] == (STR,)
    assert md["i"] == -5 and ty["i"] == (I32,)
    assert md["big"] == 2**40 and ty["big"] == (I64,)
    assert md["huge"] == 2**63 and ty["huge"] == (U64,)
    assert md["f"] == float(np.float32(0.1)) and ty["f"] == (F32,)
    assert md["d"] == 0.1 and ty["d"] == (F64,)
    assert md["u8"] == 200 and ty["u8"] == (U8,)
    assert md["i16"] == -300 and ty["i16"] == (I16,)
    assert md["b"] is False and ty["b"] == (BOOL,)
    assert md["ints"] == [1, 2, 2**33] and ty["ints"] == (ARR, I64)
    assert md["floats"] == [0.5, 0.25] and ty["floats"] == (ARR, F32)
    assert md["bools"] == [True, False] and ty["bools"] == (ARR, BOOL)
    assert md["strs"] == ["a", "", "ü"] and ty["strs"] == (ARR, STR)
    assert md["nested"] == [[1, 2], [3]] and ty["nested"] == (ARR, ARR)
    assert md["arr"] == [0, 1, 2, 3] and ty["arr"] == (ARR, U16)
    assert md["empty"] == [] and ty["empty"] == (ARR, F32)
    assert md["general.alignment"] == 32 and ty["general.alignment"] == (U32,)
    assert gf.tensors == () and gf.version == 3


# -- files built from the spec, read by our reader ----------------------------


@pytest.mark.parametrize("version", [2, 3])
def test_reads_a_spec_built_file(tmp_path, version):
    q = rand_q2(6, 256, 128)
    q64 = rand_q2(2, 448, 64)
    f32 = np.arange(12, dtype="<f4").reshape(3, 4)
    kvs = [
        ("general.architecture", STR, "test"),
        ("u8", U8, 255),
        ("i8", I8, -128),
        ("u16", U16, 65535),
        ("i16", I16, -32768),
        ("u32", U32, 2**32 - 1),
        ("i32", I32, -(2**31)),
        ("f32", F32, 1.5),
        ("bool", BOOL, True),
        ("u64", U64, 2**64 - 1),
        ("i64", I64, -(2**63)),
        ("f64", F64, -2.5e300),
        ("tokens", ARR, (STR, ["<s>", "</s>", "ß"])),
        ("scores", ARR, (F32, [0.0, -1.0, 2.5])),
        ("nested", ARR, (ARR, [(U8, [1, 2]), (U8, [])])),
        ("general.alignment", U32, 64),
    ]
    tensors = [("q", (256, 6), 142, None), ("norm", (4, 3), 0, None), ("q64", (448, 2), 42, None)]
    data = spec_gguf(
        kvs,
        tensors,
        [q.raw.tobytes(), f32.tobytes(), q64.raw.tobytes()],
        version=version,
        alignment=64,
    )
    p = write(tmp_path, data)
    gf = read_gguf(p)
    assert gf.version == version and gf.alignment == 64 and gf.file_size == len(data)
    for key, t, v in kvs:
        want = v if t != ARR else [x[1] for x in v[1]] if v[0] == ARR else v[1]
        assert plain(gf.metadata[key]) == want, key
        assert gf.metadata_types[key] == ((t, v[0]) if t == ARR else (t,)), key
    assert [t.name for t in gf.tensors] == ["q", "norm", "q64"]
    assert gf.data_offset % 64 == 0
    norm = gf.tensor("norm")
    assert norm.ne == (4, 3) and (norm.n, norm.k) == (3, 4) and norm.nbytes == 48
    assert norm.type_name == "F32" and norm.group is None
    raw = data[norm.offset : norm.offset + norm.nbytes]
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(3, 4), f32)
    got = load_q2_weights(p)
    assert set(got) == {"q", "q64"}  # F32 skipped
    assert got["q"].raw.tobytes() == q.raw.tobytes() and got["q"].group == 128
    assert got["q64"].raw.tobytes() == q64.raw.tobytes() and got["q64"].group == 64


def test_shapes_1d_and_3d_map_to_n_k(tmp_path):
    one = rand_q2(1, 2048, 128)
    three = rand_q2(2 * 3, 512, 64)
    tensors = [("one", (2048,), 142, None), ("three", (512, 3, 2), 42, None)]
    p = write(tmp_path, spec_gguf([], tensors, [one.raw.tobytes(), three.raw.tobytes()]))
    got = load_q2_weights(p)
    assert (got["one"].n, got["one"].k, got["one"].group) == (1, 2048, 128)
    assert (got["three"].n, got["three"].k, got["three"].group) == (6, 512, 64)
    assert got["three"].raw.tobytes() == three.raw.tobytes()
    text = format_inspect(p)
    assert "(6, 512) ne=[512, 3, 2]" in text and "(1, 2048)" in text


def test_tensor_at_room_end_without_trailing_padding(tmp_path):
    # a writer that does not pad the last tensor still gives an exact room
    q = rand_q2(3, 1024, 64)
    data = spec_gguf([], [("q", (1024, 3), 42, None)], [q.raw.tobytes()])
    data = data[: len(data) - (-q.nbytes % 32)]
    p = write(tmp_path, data)
    assert load_q2_weights(p)["q"].raw.tobytes() == q.raw.tobytes()


def test_format_inspect_lists_tensors(tmp_path):
    p = tmp_path / "i.gguf"
    save_q2_weights(
        p,
        {"blk.0.attn_q.weight": rand_q2(64, 512, 128), "blk.0.ffn.weight": rand_q2(32, 256, 64)},
        {"general.name": "tiny", "tokenizer.ggml.tokens": [f"t{i}" for i in range(100)]},
    )
    text = format_inspect(p)
    lines = text.splitlines()
    assert lines[0].startswith(f"{p}: GGUF v3, 2 tensors, 5 metadata keys, alignment 32")
    assert "array[string] x 100" in text and "'tiny'" in text
    row_q = next(s for s in lines if s.startswith("  blk.0.attn_q.weight")).split()
    assert row_q[:6] == ["blk.0.attn_q.weight", "PQ2_0", "(64,", "512)", "128", str(64 * 4 * 34)]
    row_f = next(s for s in lines if s.startswith("  blk.0.ffn.weight")).split()
    assert row_f[:6] == ["blk.0.ffn.weight", "Q2_0", "(32,", "256)", "64", str(32 * 4 * 18)]
    assert lines[-1] == f"total tensor bytes: {64 * 4 * 34 + 32 * 4 * 18}"


# -- cross-check with the gguf package -----------------------------------------


def _field_value(field):
    """A gguf ReaderField's Python value (``contents()`` where this gguf has it)."""
    if hasattr(field, "contents"):
        return field.contents()
    from gguf import GGUFValueType

    vals = [field.parts[i] for i in field.data]
    if field.types[-1] == GGUFValueType.STRING:
        vals = [bytes(v).decode("utf-8") for v in vals]
    else:
        vals = [v.tolist()[0] for v in vals]
    return vals if field.types[0] == GGUFValueType.ARRAY else vals[0]


@pytest.mark.parametrize("alignment", [None, 64])
def test_agrees_with_the_gguf_package(tmp_path, alignment):
    gguf = pytest.importorskip("gguf")
    p = tmp_path / "ref.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_uint32("llama.block_count", 2)
    w.add_int64("i64", -(2**40))
    w.add_float32("f32", 0.1)
    w.add_float64("f64", 0.1)
    w.add_bool("flag", True)
    w.add_string("name", "ünï")
    w.add_array("ints", [1, 2, 3])
    w.add_array("strs", ["a", "bc"])
    w.add_array("floats", [0.5, 1.5])
    if alignment:
        w.add_custom_alignment(alignment)
    rng = np.random.default_rng(1)
    arrays = {
        "tok_embd.weight": rng.standard_normal((5, 8)).astype(np.float32),
        "norm.weight": rng.standard_normal(7).astype(np.float32),
        "blk.0.attn.weight": rng.standard_normal((3, 16)).astype(np.float16),
        "x3d": rng.standard_normal((2, 3, 4)).astype(np.float16),
    }
    for name, a in arrays.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ref = gguf.GGUFReader(str(p))
    ours = read_gguf(p)
    assert ours.alignment == ref.alignment == (alignment or 32)
    assert ours.data_offset == ref.data_offset
    header = {f.name: _field_value(f) for f in ref.fields.values() if f.name.startswith("GGUF.")}
    assert header["GGUF.version"] == ours.version == 3
    assert header["GGUF.tensor_count"] == len(ours.tensors) == len(arrays)
    assert header["GGUF.kv_count"] == len(ours.metadata)
    ref_md = {f.name: f for f in ref.fields.values() if not f.name.startswith("GGUF.")}
    assert list(ref_md) == list(ours.metadata)
    for key, f in ref_md.items():
        assert plain(ours.metadata[key]) == _field_value(f), key
        assert ours.metadata_types[key] == tuple(int(t) for t in f.types), key
    assert [t.name for t in ref.tensors] == [t.name for t in ours.tensors]
    for rt, ot in zip(ref.tensors, ours.tensors, strict=True):
        assert rt.data_offset == ot.offset, rt.name
        assert rt.n_bytes == ot.nbytes, rt.name
        assert tuple(int(d) for d in rt.shape) == ot.ne, rt.name
        assert int(rt.tensor_type) == ot.type_id, rt.name
        a = arrays[rt.name]
        assert (ot.n, ot.k) == (int(np.prod(a.shape[:-1])), a.shape[-1])
        raw = np.fromfile(p, dtype=np.uint8, count=ot.nbytes, offset=ot.offset)
        assert raw.tobytes() == a.tobytes(), rt.name
    assert load_q2_weights(p) == {}


def test_metadata_encoding_matches_gguf_writer(tmp_path):
    gguf = pytest.importorskip("gguf")
    p = tmp_path / "ref.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_int32("i", -3)
    w.add_float32("f", 0.75)
    w.add_bool("b", False)
    w.add_string("s", "abc")
    w.add_array("a", [4, 5])
    w.add_custom_alignment(32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    q = tmp_path / "ours.gguf"
    meta = {"general.architecture": "llama", "i": -3, "f": 0.75, "b": False, "s": "abc"}
    save_q2_weights(q, {}, {**meta, "a": [4, 5]})
    assert q.read_bytes() == p.read_bytes()


# -- error paths ---------------------------------------------------------------


def _mixed_file() -> tuple[bytes, int]:
    """A file with metadata, two Q2 tensors and an F32 tensor last; and where its data ends."""
    q, q64 = rand_q2(4, 512, 128), rand_q2(2, 1024, 64)
    f32 = np.ones(5, dtype="<f4")  # 20 bytes, then 12 bytes of padding
    data = spec_gguf(
        [("general.architecture", STR, "x"), ("a", ARR, (I32, [1, 2, 3]))],
        [("q", (512, 4), 142, None), ("q64", (1024, 2), 42, None), ("v", (5,), 0, None)],
        [q.raw.tobytes(), q64.raw.tobytes(), f32.tobytes()],
    )
    return data, len(data) - 12


def test_truncated_at_every_byte_raises(tmp_path):
    data, data_end = _mixed_file()
    p = tmp_path / "t.gguf"
    assert len(load_q2_weights(write(tmp_path, data, "t.gguf"))) == 2
    assert read_gguf(p).tensor("v").offset + 20 == data_end
    for cut in range(len(data)):  # only the trailing padding may go
        p.write_bytes(data[:cut])
        if cut < data_end:
            with pytest.raises(GgufError, match=str(p)):
                read_gguf(p)
            with pytest.raises(GgufError):
                load_q2_weights(p)
        else:
            read_gguf(p)


def test_truncated_messages(tmp_path):
    data, _ = _mixed_file()
    p = write(tmp_path, data[:2])
    with pytest.raises(GgufError, match="truncated: magic"):
        read_gguf(p)
    p = write(tmp_path, data[:12])
    with pytest.raises(GgufError, match="truncated: tensor count"):
        read_gguf(p)
    p = write(tmp_path, data[:20])
    with pytest.raises(GgufError, match="truncated: metadata kv count"):
        read_gguf(p)
    p = write(tmp_path, data[:50])
    with pytest.raises(GgufError, match="truncated"):
        read_gguf(p)
    p = write(tmp_path, b"")
    with pytest.raises(GgufError, match="truncated"):
        read_gguf(p)
    gf = read_gguf(write(tmp_path, data))
    q64 = gf.tensor("q64")
    p = write(tmp_path, data[: q64.offset + 100])  # inside q64, before v
    with pytest.raises(GgufError, match="'q64'") as e:
        load_q2_weights(p)
    assert e.value.tensor == "q64" and e.value.path == str(p)


def test_bad_magic_and_versions(tmp_path):
    data, _ = _mixed_file()
    for magic in (b"GGUG", b"gguf", b"\0\0\0\0", b"GGML"):
        with pytest.raises(GgufError, match="bad magic"):
            read_gguf(write(tmp_path, magic + data[4:]))
    for version, msg in [(1, "v1"), (99, "unknown GGUF version 99"), (0, "unknown")]:
        with pytest.raises(GgufError, match=msg):
            read_gguf(write(tmp_path, data[:4] + struct.pack("<I", version) + data[8:]))
    with pytest.raises(GgufError, match="big-endian"):
        read_gguf(write(tmp_path, data[:4] + struct.pack(">I", 3) + data[8:]))


def test_v1_counts_are_refused_not_misread(tmp_path):
    # a v1 header has u32 counts; reading it as v2 would shift every field
    v1 = b"GGUF" + struct.pack("<III", 1, 0, 1) + s_("k") + struct.pack("<II", U32, 5)
    with pytest.raises(GgufError, match="v1"):
        read_gguf(write(tmp_path, v1))


def test_offset_past_end_of_file(tmp_path):
    q = rand_q2(4, 512, 128)
    for off, pat in [(1 << 40, "past the end"), (4096, "past the end|neither")]:
        data = spec_gguf([], [("w", (512, 4), 142, off)], [q.raw.tobytes()])
        with pytest.raises(GgufError, match=f"tensor 'w'.*({pat})"):
            read_gguf(write(tmp_path, data))
    f32 = np.ones(16, "<f4").tobytes()
    data = spec_gguf([], [("v", (16,), 0, 32)], [f32])  # 64 bytes of F32 at 32: 32 short
    with pytest.raises(GgufError, match="tensor 'v'.*past the end"):
        read_gguf(write(tmp_path, data))
    data = spec_gguf([], [("q", (512, 4), 142, 0)], [q.raw.tobytes()[:-40]])
    with pytest.raises(GgufError, match="tensor 'q'.*past the end"):
        load_q2_weights(write(tmp_path, data))


def test_misaligned_offset(tmp_path):
    q = rand_q2(4, 512, 128)
    data = spec_gguf([], [("w", (512, 4), 142, 16)], [b"\0" * 16 + q.raw.tobytes()])
    with pytest.raises(GgufError, match="tensor 'w'.*not a multiple of the alignment 32"):
        read_gguf(write(tmp_path, data))
    data = spec_gguf(
        [("general.alignment", U32, 16)],
        [("w", (512, 4), 142, 16)],
        [b"\0" * 16 + q.raw.tobytes()],
        alignment=16,
    )
    assert read_gguf(write(tmp_path, data)).tensor("w").offset % 16 == 0


def test_metadata_errors(tmp_path):
    bad_type = s_("k") + struct.pack("<I", 13) + b"\0" * 8
    with pytest.raises(GgufError, match="'k': unknown value type 13"):
        read_gguf(write(tmp_path, spec_gguf(raw_kv=bad_type)))
    bad_elem = s_("arr") + struct.pack("<IIQ", ARR, 42, 1) + b"\0" * 8
    with pytest.raises(GgufError, match="'arr': unknown array element type 42"):
        read_gguf(write(tmp_path, spec_gguf(raw_kv=bad_elem)))
    bad_bool = s_("b") + struct.pack("<IB", BOOL, 2)
    with pytest.raises(GgufError, match="'b'.*not 0 or 1"):
        read_gguf(write(tmp_path, spec_gguf(raw_kv=bad_bool)))
    bad_utf8 = s_(b"\xff\xfe") + struct.pack("<II", U32, 1)
    with pytest.raises(GgufError, match="UTF-8"):
        read_gguf(write(tmp_path, spec_gguf(raw_kv=bad_utf8)))
    huge_str = s_("s") + struct.pack("<IQ", STR, 1 << 60)
    with pytest.raises(GgufError, match="truncated"):
        read_gguf(write(tmp_path, spec_gguf(raw_kv=huge_str)))
    huge_arr = s_("a") + struct.pack("<IIQ", ARR, STR, 1 << 60)
    with pytest.raises(GgufError, match="truncated"):
        read_gguf(write(tmp_path, spec_gguf(raw_kv=huge_arr)))
    dup = [("k", U32, 1), ("k", U32, 2)]
    with pytest.raises(GgufError, match="duplicate metadata key 'k'"):
        read_gguf(write(tmp_path, spec_gguf(dup)))
    for a in (0, 48):
        with pytest.raises(GgufError, match="general.alignment"):
            read_gguf(write(tmp_path, spec_gguf([("general.alignment", U32, a)])))
    with pytest.raises(GgufError, match="general.alignment"):
        read_gguf(write(tmp_path, spec_gguf([("general.alignment", F32, 32.0)])))
    counts = b"GGUF" + struct.pack("<IQQ", 3, 1 << 62, 1 << 62)
    with pytest.raises(GgufError, match="cannot fit"):
        read_gguf(write(tmp_path, counts))


def test_tensor_info_errors(tmp_path):
    q = rand_q2(4, 512, 128)
    blob = [q.raw.tobytes()]
    cases = [
        ([("w", (512, 4, 1, 1, 1), 142, None)], blob, "'w'.*n_dims 5"),
        ([("w", (512, 4), 142, None), ("w", (512, 4), 142, 0)], blob, "'w'.*duplicate"),
        ([("w", (500, 4), 142, None)], blob, "'w'.*multiple of neither"),
        ([("w", (512, 4), 142, None), ("x", (4,), 0, 32)], blob, "'w'.*(overlaps|needs)"),
        ([("v", (3,), 2, None)], [b"\0" * 18], "'v'.*Q4_0.*multiple of its block 32"),
        ([("w", (128, 0), 42, None)], blob, "'w'.*is empty"),
        ([("x", (8,), 0, 0), ("w", (512, 4), 142, 2**64 - 32)], blob, "'w'.*past the end"),
    ]
    for tensors, blobs, pat in cases:
        with pytest.raises(GgufError, match=pat):
            read_gguf(write(tmp_path, spec_gguf([], tensors, blobs)))
    # an F32 tensor claimed to start inside a Q2 one: the Q2 room fits no group
    data = spec_gguf([], [("w", (512, 4), 142, 0), ("x", (8,), 0, 256)], [q.raw.tobytes()])
    with pytest.raises(GgufError, match="'w'.*(neither|needs)"):
        read_gguf(write(tmp_path, data))
    # two tensors at one offset
    f32 = np.ones(8, "<f4").tobytes()
    data = spec_gguf([], [("a", (8,), 0, 0), ("b", (8,), 0, 0)], [f32])
    with pytest.raises(GgufError, match="'a'.*overlaps tensor 'b'|'b'.*overlaps tensor 'a'"):
        read_gguf(write(tmp_path, data))


def test_pq2_whose_room_fits_only_group64(tmp_path):
    q64 = rand_q2(4, 512, 64)
    data = spec_gguf([], [("w", (512, 4), 142, None)], [q64.raw.tobytes()])
    with pytest.raises(GgufError, match="'w'.*PQ2_0 \\(142\\) is group 128.*only group 64"):
        load_q2_weights(write(tmp_path, data))
    data = spec_gguf([], [("w", (512, 4), 42, None)], [q64.raw.tobytes()])
    assert load_q2_weights(write(tmp_path, data))["w"].group == 64


def test_g128_bytes_read_as_g64_would_need_more_room(tmp_path):
    # the reported failure: g128 data taken as g64 reads past the tensor; here the
    # room decides g128, and a room too short for either group is refused
    q = rand_q2(64, 1024, 128)
    tail = np.ones(8, "<f4").tobytes()
    data = spec_gguf(
        [], [("w", (1024, 64), 42, None), ("t", (8,), 0, None)], [q.raw.tobytes(), tail]
    )
    gf = read_gguf(write(tmp_path, data))
    assert gf.tensor("w").group == 128 and gf.tensor("w").room < q2_sizes(64 * 1024, 1024)[64]


def test_unknown_tensor_type_is_listed_not_sized(tmp_path):
    data = spec_gguf([], [("x", (16,), 77, None)], [b"\0" * 16])
    gf = read_gguf(write(tmp_path, data))
    assert gf.tensor("x").nbytes is None and gf.tensor("x").type_name == "type77"
    assert "type77" in format_inspect(write(tmp_path, data))


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        read_gguf(tmp_path / "nope.gguf")


def test_save_argument_errors(tmp_path):
    p = tmp_path / "e.gguf"
    w128, w64 = rand_q2(2, 128, 128), rand_q2(2, 64, 64)
    with pytest.raises(TypeError, match=r"weights\['a'\]"):
        save_q2_weights(p, {"a": np.zeros(4, np.uint8)})
    with pytest.raises(TypeError, match="weights"):
        save_q2_weights(p, [w128])
    with pytest.raises(ValueError, match="under 64 bytes"):
        save_q2_weights(p, {"x" * 64: w128})
    save_q2_weights(p, {"x" * 63: w128})
    with pytest.raises(ValueError, match=r"type_id: 142.*weights\['b'\] is group 64"):
        save_q2_weights(p, {"a": w128, "b": w64}, type_id=142)
    with pytest.raises(ValueError, match="type_id"):
        save_q2_weights(p, {"a": w128}, type_id=2)
    for a in (0, 4, 48, True):
        with pytest.raises(ValueError, match="alignment"):
            save_q2_weights(p, {"a": w128}, alignment=a)
    with pytest.raises(TypeError, match=r"metadata\['d'\]"):
        save_q2_weights(p, {}, {"d": {"x": 1}})
    with pytest.raises(TypeError, match=r"metadata\['n'\]"):
        save_q2_weights(p, {}, {"n": None})
    with pytest.raises(ValueError, match="empty list"):
        save_q2_weights(p, {}, {"e": []})
    with pytest.raises(TypeError, match="mixed element types"):
        save_q2_weights(p, {}, {"m": [1, "a"]})
    with pytest.raises(ValueError, match="64 bits"):
        save_q2_weights(p, {}, {"big": 2**64})
    with pytest.raises(ValueError, match="disagrees with alignment=32"):
        save_q2_weights(p, {}, {"general.alignment": 64})
    save_q2_weights(p, {}, {"general.alignment": 64}, alignment=64)
    assert read_gguf(p).alignment == 64
    with pytest.raises(TypeError, match="metadata"):
        save_q2_weights(p, {}, [("a", 1)])


def test_block_bytes_used_by_the_rule_are_the_format_ones():
    assert block_bytes(64) == 18 and block_bytes(128) == 34
    w = quantize_q2_0(np.ones((2, 256), np.float32), 64)
    assert q2_sizes(2 * 256, 256)[64] == w.nbytes


def _gguf_with_alignment(path: Path, layout: int, claimed: int, n_tensors: int = 2) -> None:
    """A GGUF written by the ``gguf`` package padded to ``layout``, whose ``general.alignment``
    then says ``claimed`` (the u32 patched in place)."""
    import gguf

    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_custom_alignment(layout)
    for i in range(n_tensors):
        wr.add_tensor(f"t{i}", np.arange(1, 9 + 8 * i, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    data = bytearray(path.read_bytes())
    at = data.index(b"general.alignment") + len(b"general.alignment") + 4  # key, u32 type
    assert int.from_bytes(data[at : at + 4], "little") == layout
    data[at : at + 4] = claimed.to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_gguf_read_with_its_own_alignment(tmp_path):
    from q2gemv.io.gguf.reader import read_gguf

    p = tmp_path / "ok.gguf"
    _gguf_with_alignment(p, 64, 64)
    f = read_gguf(p)
    assert f.alignment == 64 and f.data_offset % 64 == 0
    t1 = f.tensor("t1")
    got = np.frombuffer(p.read_bytes()[t1.offset : t1.offset + t1.nbytes], np.float32)
    np.testing.assert_array_equal(got, np.arange(1, 17, dtype=np.float32))


@pytest.mark.parametrize(("layout", "claimed"), [(64, 32), (64, 128), (32, 64)])
def test_gguf_whose_alignment_disagrees_with_its_layout_is_refused(tmp_path, layout, claimed):
    from q2gemv.io.gguf.reader import GgufError, read_gguf

    for n_tensors in (1, 2, 3):  # header ends at different offsets: some agree by chance
        p = tmp_path / f"bad{n_tensors}.gguf"
        _gguf_with_alignment(p, layout, claimed, n_tensors)
        data = p.read_bytes()
        try:
            f = read_gguf(p)
        except GgufError as e:
            assert "alignment" in str(e) or "past the end" in str(e), e
            continue
        # accepted: then every tensor must be where the layout put it (same bytes as written)
        for i in range(n_tensors):
            t = f.tensor(f"t{i}")
            got = np.frombuffer(data[t.offset : t.offset + t.nbytes], np.float32)
            want = np.arange(1, 9 + 8 * i, dtype=np.float32)
            np.testing.assert_array_equal(got, want, err_msg=f"{p.name}: read off")


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

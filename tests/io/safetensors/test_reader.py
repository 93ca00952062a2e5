"""NVFP4 from safetensors: both ecosystem layouts, the divisor conversion, no copy, errors."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest

from q2gemv.formats.nvfp4 import Nvfp4Weight, e2m1_decode, e4m3_decode
from q2gemv.io.safetensors.reader import SafetensorsError, find_nvfp4_layers, load_nvfp4_weights

from ..mapping import mmap_of

stn = pytest.importorskip("safetensors.numpy")

F8 = ml_dtypes.float8_e4m3fn


def make_weight(n: int, k: int, seed: int = 0) -> Nvfp4Weight:
    rng = np.random.default_rng(seed)
    return Nvfp4Weight.from_float(rng.standard_normal((n, k)).astype(np.float32))


def modelopt(prefix: str, w: Nvfp4Weight, g=None, scalar: bool = False) -> dict:
    g = np.float32(w.global_scale if g is None else g)
    return {
        f"{prefix}.weight": np.array(w.packed),
        f"{prefix}.weight_scale": np.array(w.scales).view(F8),
        f"{prefix}.weight_scale_2": np.array(g) if scalar else np.array([g]),
        f"{prefix}.input_scale": np.array([1.0], np.float32),  # W4A4 state: ignored
    }


def compressed(prefix: str, w: Nvfp4Weight, g_ct, scales_u8: bool = False) -> dict:
    s = np.array(w.scales)
    return {
        f"{prefix}.weight_packed": np.array(w.packed),
        f"{prefix}.weight_scale": s if scales_u8 else s.view(F8),
        f"{prefix}.weight_global_scale": np.array([g_ct], np.float32),
        f"{prefix}.input_global_scale": np.array([1.0], np.float32),
    }


def save(tmp_path, tensors: dict, name: str = "m.safetensors"):
    p = tmp_path / name
    stn.save_file(tensors, str(p))
    return p


def raw_file(tmp_path, header: dict, data: bytes, name: str = "raw.safetensors", n=None):
    h = json.dumps(header).encode()
    p = tmp_path / name
    p.write_bytes(struct.pack("<Q", len(h) if n is None else n) + h + data)
    return p


def assert_same(got: Nvfp4Weight, want: Nvfp4Weight) -> None:
    assert got.packed.tobytes() == want.packed.tobytes()
    assert got.scales.tobytes() == want.scales.tobytes()
    assert (got.n, got.k) == (want.n, want.k)


# -- the layouts ---------------------------------------------------------------


@pytest.mark.parametrize("scalar", [False, True])
def test_modelopt_layout(tmp_path, scalar):
    w = make_weight(9, 64)
    tensors = modelopt("model.layers.0.mlp.down_proj", w, scalar=scalar)
    tensors["model.norm.weight"] = np.ones(64, ml_dtypes.bfloat16)
    tensors["lm_head.weight"] = np.ones((3, 64), ml_dtypes.bfloat16)
    got = load_nvfp4_weights(save(tmp_path, tensors))
    assert list(got) == ["model.layers.0.mlp.down_proj"]
    g = got["model.layers.0.mlp.down_proj"]
    assert_same(g, w)
    assert g.global_scale == w.global_scale  # a multiplier, taken as stored
    np.testing.assert_array_equal(g.dequantize().view(np.uint32), w.dequantize().view(np.uint32))


@pytest.mark.parametrize("scales_u8", [False, True])
def test_compressed_tensors_layout_power_of_two_divisor_is_exact(tmp_path, scales_u8):
    w = make_weight(7, 128, seed=1)
    tensors = compressed("model.layers.3.self_attn.q_proj", w, 4.0, scales_u8=scales_u8)
    got = load_nvfp4_weights(save(tmp_path, tensors))["model.layers.3.self_attn.q_proj"]
    assert_same(got, w)
    assert got.global_scale == 0.25
    # w = e2m1 * (s / g_ct) with g_ct = 4 is exactly e2m1 * s * 0.25
    ref = e2m1_decode(w.codes()) * np.repeat(e4m3_decode(w.scales), 16, axis=1)
    want = (ref / np.float32(4.0)).astype(np.float32)
    np.testing.assert_array_equal(got.dequantize().view(np.uint32), want.view(np.uint32))


def test_compressed_tensors_divisor_becomes_fp32_reciprocal(tmp_path):
    w = make_weight(4, 32, seed=2)
    g_ct = np.float32(3.0)  # 1/3 is not an fp32 value: the one rounding of the convention
    got = load_nvfp4_weights(save(tmp_path, compressed("p", w, g_ct)))["p"]
    assert got.global_scale == float(np.float32(1.0) / g_ct)
    assert got.global_scale != 1 / 3
    assert abs(got.global_scale - 1 / 3) <= 2.0**-24 * (1 / 3)  # half an ulp, relative
    # each weight within one fp32 ulp of the divisor form e2m1 * (s / g_ct)
    es = e2m1_decode(w.codes()) * np.repeat(e4m3_decode(w.scales), 16, axis=1)
    want = (es / g_ct).astype(np.float32)
    have = got.dequantize()
    ulp = np.spacing(np.abs(want))
    assert np.all(np.abs(have.astype(np.float64) - want) <= ulp)
    assert np.any(have != want)  # the rounding is real for this divisor


def test_both_layouts_of_one_weight_agree(tmp_path):
    w = make_weight(5, 48, seed=3)
    g = 2.0**-7  # a power of two: divisor 2^7 and multiplier 2^-7 are the same scale
    w = Nvfp4Weight.from_parts(w.packed, w.scales, g)
    tensors = {**modelopt("a", w), **compressed("b", w, 2.0**7)}
    got = load_nvfp4_weights(save(tmp_path, tensors))
    assert sorted(got) == ["a", "b"]
    assert got["a"].global_scale == got["b"].global_scale == g
    np.testing.assert_array_equal(got["a"].dequantize(), got["b"].dequantize())


def test_views_of_the_mapped_file_no_copy(tmp_path):
    w = make_weight(16, 256, seed=4)
    p = save(tmp_path, modelopt("x", w))
    got = load_nvfp4_weights(p)["x"]
    for arr in (got.packed, got.scales):
        m = mmap_of(arr)
        whole = np.frombuffer(m, dtype=np.uint8)
        assert np.shares_memory(arr, whole)
        assert not arr.flags.writeable and not arr.flags.owndata
    # the address is where the header says the tensor lies
    n = struct.unpack("<Q", p.read_bytes()[:8])[0]
    hdr = json.loads(p.read_bytes()[8 : 8 + n])
    whole = np.frombuffer(mmap_of(got.packed), dtype=np.uint8)
    begin = 8 + n + hdr["x.weight"]["data_offsets"][0]
    assert got.packed.ctypes.data - whole.ctypes.data == begin


def test_header_agrees_with_the_safetensors_package(tmp_path):
    from safetensors import safe_open

    w = make_weight(3, 32, seed=5)
    tensors = {**modelopt("m", w), "extra": np.arange(10, dtype=np.float32)}
    p = save(tmp_path, tensors)
    got = load_nvfp4_weights(p)["m"]
    with safe_open(str(p), framework="np") as f:
        np.testing.assert_array_equal(f.get_tensor("m.weight"), got.packed)
        assert f.get_tensor("m.weight_scale_2")[0] == np.float32(got.global_scale)
        assert f.get_slice("m.weight_scale").get_dtype() == "F8_E4M3"
        assert list(f.get_slice("m.weight_scale").get_shape()) == list(got.scales.shape)
    np.testing.assert_array_equal(got.scales, np.array(w.scales))


def test_sharded_directory(tmp_path):
    w1, w2 = make_weight(4, 32, seed=6), make_weight(6, 64, seed=7)
    t1, t2 = modelopt("l1", w1), compressed("l2", w2, 2.0)
    d = tmp_path / "ckpt"
    d.mkdir()
    # l1's scale_2 and l2's packed sit in the other shard
    a = {
        k: v for k, v in {**t1, **t2}.items() if k not in ("l1.weight_scale_2", "l2.weight_packed")
    }
    b = {k: v for k, v in {**t1, **t2}.items() if k in ("l1.weight_scale_2", "l2.weight_packed")}
    save(d, a, "model-00001-of-00002.safetensors")
    save(d, b, "model-00002-of-00002.safetensors")
    got = load_nvfp4_weights(d)
    assert_same(got["l1"], w1)
    assert_same(got["l2"], w2)
    assert got["l2"].global_scale == 0.5
    save(d, {"l1.weight": np.zeros((4, 16), np.uint8)}, "model-extra.safetensors")
    with pytest.raises(SafetensorsError, match="'l1.weight'.*duplicate"):
        load_nvfp4_weights(d)


# -- layer detection (pure) ----------------------------------------------------


def test_find_nvfp4_layers_keeps_only_nvfp4():
    dtypes = {
        "a.weight": "U8",
        "a.weight_scale": "F8_E4M3",
        "a.weight_scale_2": "F32",
        "b.weight_packed": "U8",
        "b.weight_scale": "U8",
        "b.weight_global_scale": "F32",
        "fp8.weight": "F8_E4M3",  # ModelOpt FP8: per-tensor F32 scale, not NVFP4
        "fp8.weight_scale": "F32",
        "int4.weight_packed": "I32",  # compressed-tensors pack-quantized int4
        "int4.weight_scale": "BF16",
        "int4.weight_shape": "I64",
        "mxfp4.weight": "U8",  # E8M0 scales as U8, no weight_scale_2
        "mxfp4.weight_scale": "U8",
        "norm.weight": "BF16",
        "lonely": "F32",
    }
    got = find_nvfp4_layers(dtypes)
    assert got == {
        "a": ("modelopt", ("a.weight", "a.weight_scale", "a.weight_scale_2")),
        "b": (
            "compressed-tensors",
            ("b.weight_packed", "b.weight_scale", "b.weight_global_scale"),
        ),
    }


MODELOPT_FULL = {"p.weight": "U8", "p.weight_scale": "F8_E4M3", "p.weight_scale_2": "F32"}
CT_FULL = {"p.weight_packed": "U8", "p.weight_scale": "F8_E4M3", "p.weight_global_scale": "F32"}


@pytest.mark.parametrize(
    "full, drop",
    [(MODELOPT_FULL, k) for k in MODELOPT_FULL] + [(CT_FULL, k) for k in CT_FULL],
)
def test_find_nvfp4_layers_missing_companion(full, drop):
    dtypes = {k: v for k, v in full.items() if k != drop}
    with pytest.raises(ValueError, match=f"layer 'p' is missing '{drop}'"):
        find_nvfp4_layers(dtypes)


def test_find_nvfp4_layers_both_layouts():
    with pytest.raises(ValueError, match="both"):
        find_nvfp4_layers({**MODELOPT_FULL, **CT_FULL})


# -- errors through the loader ---------------------------------------------------


@pytest.mark.parametrize("drop", ["weight", "weight_scale", "weight_scale_2"])
def test_missing_companion_modelopt(tmp_path, drop):
    t = modelopt("layer", make_weight(2, 32))
    del t[f"layer.{drop}"]
    p = save(tmp_path, t)
    with pytest.raises(SafetensorsError, match=f"{p}.*'layer' is missing 'layer.{drop}'"):
        load_nvfp4_weights(p)


@pytest.mark.parametrize("drop", ["weight_packed", "weight_scale", "weight_global_scale"])
def test_missing_companion_compressed_tensors(tmp_path, drop):
    t = compressed("layer", make_weight(2, 32), 1.0)
    del t[f"layer.{drop}"]
    with pytest.raises(SafetensorsError, match=f"'layer' is missing 'layer.{drop}'"):
        load_nvfp4_weights(save(tmp_path, t))


def test_wrong_shapes_and_dtypes(tmp_path):
    w = make_weight(4, 64)
    cases = [
        ("p.weight_scale", np.zeros((4, 3), np.uint8).view(F8), r"'p.weight_scale'.*\(4, 4\)"),
        ("p.weight_scale", np.zeros((5, 4), np.uint8).view(F8), r"'p.weight_scale'.*\(4, 4\)"),
        ("p.weight_scale", np.zeros((4, 4), np.float16), "'p.weight_scale'.*dtype F16"),
        ("p.weight_scale_2", np.ones(2, np.float32), r"'p.weight_scale_2'.*\[2\]"),
        ("p.weight_scale_2", np.ones(1, np.float64), "'p.weight_scale_2'.*dtype F64"),
        ("p.weight", np.zeros(32, np.uint8), "'p.weight'.*2-D"),
        ("p.weight", np.zeros((4, 12), np.uint8), "'p.weight'.*k = 24 is not a multiple of 16"),
        ("p.weight", np.zeros((4, 0), np.uint8), "'p.weight'.*non-empty"),
    ]
    for name, value, pat in cases:
        t = modelopt("p", w)
        t[name] = value
        with pytest.raises(SafetensorsError, match=pat):
            load_nvfp4_weights(save(tmp_path, t))
    t = compressed("p", w, 2.0)
    t["p.weight_packed"] = np.zeros((4, 32), np.int32)  # with a global scale: NVFP4 intended
    with pytest.raises(SafetensorsError, match="'p.weight_packed'.*dtype I32, expected U8"):
        load_nvfp4_weights(save(tmp_path, t))


def test_corrupt_files(tmp_path):
    t = modelopt("p", make_weight(2, 32))
    good = save(tmp_path, t).read_bytes()
    n = struct.unpack("<Q", good[:8])[0]
    cases = [
        (good[:5], "truncated"),
        (good[: 8 + n // 2], "truncated: the header"),
        (good[:-3], "outside the .* data bytes"),
        (struct.pack("<Q", 200_000_000) + good[8:], "exceeds"),
        (good[:8] + b"\xff" + good[9:], "not UTF-8 JSON"),
        (good[:8] + b"[" + good[9:], "not UTF-8 JSON"),
    ]
    for data, pat in cases:
        p = tmp_path / "bad.safetensors"
        p.write_bytes(data)
        with pytest.raises(SafetensorsError, match=pat):
            load_nvfp4_weights(p)
    with pytest.raises(SafetensorsError, match="not an object"):
        load_nvfp4_weights(raw_file(tmp_path, [1, 2], b""))
    hdr = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}
    with pytest.raises(SafetensorsError, match="'a': 4 data bytes for F32 \\[2\\]"):
        load_nvfp4_weights(raw_file(tmp_path, hdr, b"\0" * 8))
    hdr = {
        "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
        "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]},
    }
    with pytest.raises(SafetensorsError, match="'a': data overlaps tensor 'b'"):
        load_nvfp4_weights(raw_file(tmp_path, hdr, b"\0" * 12))
    hdr = {"a": {"dtype": "U8", "shape": [8]}}
    with pytest.raises(SafetensorsError, match="'a': malformed"):
        load_nvfp4_weights(raw_file(tmp_path, hdr, b"\0" * 8))
    hdr = {"a": {"dtype": "U8", "shape": [-8], "data_offsets": [0, 8]}}
    with pytest.raises(SafetensorsError, match="'a': malformed"):
        load_nvfp4_weights(raw_file(tmp_path, hdr, b"\0" * 8))


def test_unknown_dtypes_elsewhere_are_tolerated(tmp_path):
    w = make_weight(2, 32)
    tensors = modelopt("p", w)
    data, hdr, off = b"", {}, 0
    for name, a in tensors.items():
        dt = {"uint8": "U8", "float8_e4m3fn": "F8_E4M3", "float32": "F32"}[a.dtype.name]
        b = np.ascontiguousarray(a).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        data, off = data + b, off + len(b)
    hdr["future"] = {"dtype": "F4", "shape": [4], "data_offsets": [off, off + 2]}
    hdr["__metadata__"] = {"format": "pt"}
    got = load_nvfp4_weights(raw_file(tmp_path, hdr, data + b"\0\0"))
    assert_same(got["p"], w)


def test_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_nvfp4_weights(tmp_path / "nope.safetensors")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_nvfp4_weights(tmp_path / "empty")
    (tmp_path / "zero.safetensors").write_bytes(b"")
    with pytest.raises(SafetensorsError, match="truncated"):
        load_nvfp4_weights(tmp_path / "zero.safetensors")


@pytest.mark.parametrize(
    "layout, value",
    [("modelopt", np.nan), ("modelopt", np.inf), ("modelopt", -np.inf)]
    + [("compressed", np.nan), ("compressed", np.inf), ("compressed", 0.0)],
)
def test_non_finite_global_scales_are_refused(tmp_path, layout, value):
    """Issue 33 item 14: a NaN/Inf global scale (or a divisor of 0: an infinite multiplier)
    made every weight of the layer NaN or Inf; refused naming file and tensor."""
    w = make_weight(2, 32)
    if layout == "modelopt":
        t, g_name = modelopt("p", w, g=value), "p.weight_scale_2"
    else:
        t, g_name = compressed("p", w, value), "p.weight_global_scale"
    path = save(tmp_path, t)
    with pytest.raises(SafetensorsError, match="global scale") as info:
        load_nvfp4_weights(path)
    assert (info.value.path, info.value.tensor) == (str(path), g_name)


def test_safetensors_load_refuses_a_divisor_with_an_infinite_reciprocal(tmp_path):
    from safetensors.numpy import save_file

    from q2gemv.io.safetensors.reader import load_nvfp4_weights

    p = tmp_path / "ct.safetensors"
    save_file(
        {
            "l.weight_packed": np.zeros((2, 8), np.uint8),
            "l.weight_scale": np.full((2, 1), 0x38, np.uint8),
            "l.weight_global_scale": np.array([1e-40], np.float32),
        },
        str(p),
    )
    with pytest.raises(ValueError, match=r"weight_global_scale: expected a divisor"):
        load_nvfp4_weights(p)


def test_safetensors_deeply_nested_header_is_the_loaders_error(tmp_path):
    header = b"[" * 100_000 + b"]" * 100_000
    p = tmp_path / "deep.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(SafetensorsError, match="nested too deeply"):
        load_nvfp4_weights(p)

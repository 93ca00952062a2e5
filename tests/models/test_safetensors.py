"""``load_safetensors`` on hostile or inconsistent files (issue 33, item 14).

Safetensors files are written here byte by byte, so the ``safetensors`` package's own checks
cannot hide the loader's.
"""

from __future__ import annotations

import json
import math
import struct
import sys

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import q2gemv  # noqa: E402
from q2gemv.io import SafetensorsError  # noqa: E402
from q2gemv.torch import (  # noqa: E402
    Nvfp4Linear,
    load_safetensors,
    quantize_model,
)

from ..model_cases import tiny_llama  # noqa: E402

# -- item 14: safetensors, one reader, nothing dropped silently -------------------------------

F8 = ml_dtypes.float8_e4m3fn
_ST_DTYPES = {"uint8": "U8", "float8_e4m3fn": "F8_E4M3", "float32": "F32", "int32": "I32"}
_ST_DTYPES.update({"bfloat16": "BF16", "float16": "F16"})


def write_raw(path, tensors: dict, gap: int = 0):
    """A safetensors file written here (not by the package): ``gap`` zero bytes between tensors
    (valid for q2gemv's reader, refused by the ``safetensors`` package)."""
    header, data = {}, b""
    for name, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {
            "dtype": _ST_DTYPES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [len(data), len(data) + len(b)],
        }
        data += b + b"\0" * gap
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)
    return path


def bf16(t: torch.Tensor) -> np.ndarray:
    return (
        t.detach()
        .to(torch.bfloat16)
        .contiguous()
        .view(torch.int16)
        .numpy()
        .view(ml_dtypes.bfloat16)
    )


def modelopt_tensors(model, quantized=lambda name: name.endswith("_proj")) -> dict:
    """``model``'s state as a ModelOpt NVFP4 checkpoint: the ``quantized`` Linears NVFP4."""
    out = {}
    for name, p in model.state_dict().items():
        prefix = name.removesuffix(".weight")
        if name.endswith(".weight") and quantized(prefix):
            w = q2gemv.Nvfp4Weight.from_float(p.float().numpy())
            out[name] = np.array(w.packed)
            out[f"{prefix}.weight_scale"] = np.array(w.scales).view(F8)
            out[f"{prefix}.weight_scale_2"] = np.array([w.global_scale], np.float32)
            out[f"{prefix}.input_scale"] = np.array([1.0], np.float32)  # W4A4 state: ignored
        else:
            out[name] = bf16(p)
    return out


def small_model(bias: bool = True):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 16, bias=bias), torch.nn.LayerNorm(16)).to(
        torch.bfloat16
    )


def _first_linear(name: str) -> bool:
    return name == "0"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_safetensors_non_finite_global_scale_is_refused(tmp_path, value):
    model = small_model()
    t = modelopt_tensors(model, _first_linear)
    t["0.weight_scale_2"] = np.array([value], np.float32)
    path = write_raw(tmp_path / "m.safetensors", t)
    with pytest.raises(SafetensorsError, match="not finite") as info:
        load_safetensors(path, model)
    assert (info.value.path, info.value.tensor) == (str(path), "0.weight_scale_2")
    assert isinstance(model[0], torch.nn.Linear)


@pytest.mark.parametrize(
    "name, value",
    [
        ("0.weight_foo", np.zeros(4, np.float32)),  # unknown companion of an NVFP4 layer
        ("0.weight_zero_point", np.zeros((16, 2), np.uint8)),
        ("2.input_scale", np.ones(1, np.float32)),  # W4A4 state of a layer that is not there
        ("1.input_scale", np.ones(1, np.float32)),  # ... of a layer that is not NVFP4
    ],
)
def test_safetensors_unknown_tensors_are_refused_not_dropped(tmp_path, name, value):
    model = small_model()
    t = modelopt_tensors(model, _first_linear)
    t[name] = value
    path = write_raw(tmp_path / "m.safetensors", t)
    with pytest.raises(SafetensorsError) as info:
        load_safetensors(path, model)
    assert (info.value.path, info.value.tensor) == (str(path), name)
    assert isinstance(model[0], torch.nn.Linear)


@pytest.mark.parametrize(
    "bias, match",
    [
        (np.zeros(17, np.float32), r"shape \[17\], expected \[16\]"),
        (np.zeros(16, np.int32), "dtype I32"),
        (np.zeros((16, 1), np.float32), r"shape \[16, 1\]"),
    ],
)
def test_safetensors_bad_bias_names_file_and_tensor(tmp_path, bias, match):
    model = small_model()
    t = modelopt_tensors(model, _first_linear)
    t["0.bias"] = bias
    path = write_raw(tmp_path / "m.safetensors", t)
    with pytest.raises(SafetensorsError, match=match) as info:
        load_safetensors(path, model)
    assert (info.value.path, info.value.tensor) == (str(path), "0.bias")


def test_safetensors_bias_for_a_linear_without_one_is_refused(tmp_path):
    model = small_model(bias=False)
    t = modelopt_tensors(model, _first_linear)
    t["0.bias"] = np.zeros(16, np.float32)
    path = write_raw(tmp_path / "m.safetensors", t)
    with pytest.raises(SafetensorsError, match="no bias") as info:
        load_safetensors(path, model)
    assert info.value.tensor == "0.bias"


def test_safetensors_one_reader_for_everything(tmp_path, monkeypatch):
    """A file with gaps between tensors (valid for q2gemv's reader; the ``safetensors`` package
    raises its own non-ValueError error on it) loads, without that package installed."""
    source = small_model()
    t = modelopt_tensors(source, _first_linear)
    path = write_raw(tmp_path / "gaps.safetensors", t, gap=8)
    monkeypatch.setitem(sys.modules, "safetensors", None)  # any import of it fails
    target = small_model()
    with torch.no_grad():
        target[1].weight.zero_()
    load_safetensors(path, target)
    assert isinstance(target[0], Nvfp4Linear)
    assert torch.equal(target[1].weight, source[1].weight)
    assert torch.equal(target[0].bias, source[0].bias)
    broken = dict(t)
    broken["1.weight"] = np.zeros(16, np.float32)
    path = write_raw(tmp_path / "short.safetensors", broken)
    data = path.read_bytes()
    path.write_bytes(data[:-4])  # the last tensor cut short: the reader's error, naming it
    with pytest.raises(SafetensorsError, match="outside the"):
        load_safetensors(path, small_model())


def test_safetensors_tied_model_takes_a_stored_lm_head_equal_to_the_embedding(tmp_path):
    source = tiny_llama(layers=1, tie=True)
    t = modelopt_tensors(source)
    assert np.array_equal(t["lm_head.weight"], t["model.embed_tokens.weight"])  # both stored
    path = write_raw(tmp_path / "tied.safetensors", t)
    target = tiny_llama(layers=1, seed=1, tie=True)
    load_safetensors(path, target)
    assert target.lm_head.weight is target.model.embed_tokens.weight
    quantize_model(source, "nvfp4")
    ids = torch.randint(0, 192, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(target(ids).logits, source(ids).logits)


def test_safetensors_tied_model_refuses_a_different_lm_head(tmp_path):
    t = modelopt_tensors(tiny_llama(layers=1, tie=True))
    t["lm_head.weight"] = t["lm_head.weight"].copy()
    t["lm_head.weight"][3, 5] = -t["lm_head.weight"][3, 5] + 1
    path = write_raw(tmp_path / "tied.safetensors", t)
    target = tiny_llama(layers=1, seed=1, tie=True)
    with pytest.raises(SafetensorsError, match="tie_word_embeddings") as info:
        load_safetensors(path, target)
    assert info.value.tensor == "lm_head.weight"
    assert "model.embed_tokens.weight" in str(info.value)


def test_safetensors_tied_weight_cannot_be_an_nvfp4_layer(tmp_path):
    source = tiny_llama(layers=1, tie=True)
    t = modelopt_tensors(source, lambda p: p == "lm_head" or p.endswith("_proj"))
    del t["model.embed_tokens.weight"]
    path = write_raw(tmp_path / "tied.safetensors", t)
    target = tiny_llama(layers=1, seed=1, tie=True)
    with pytest.raises(SafetensorsError, match="ties its weight") as info:
        load_safetensors(path, target)
    assert info.value.tensor == "lm_head.weight"
    assert isinstance(target.lm_head, torch.nn.Linear)


def test_safetensors_kv_cache_scales_are_ignored_with_a_warning(tmp_path):
    model = small_model()
    t = modelopt_tensors(model, _first_linear)
    t["0.k_scale"] = np.ones(1, np.float32)  # ModelOpt: under k_proj / v_proj
    t["attn.v_scale"] = np.ones(1, np.float32)  # compressed-tensors: under self_attn
    path = write_raw(tmp_path / "m.safetensors", t)
    with pytest.warns(UserWarning, match=r"2 FP8 KV-cache scale.*'0.k_scale', 'attn.v_scale'"):
        load_safetensors(path, model)
    assert isinstance(model[0], Nvfp4Linear)

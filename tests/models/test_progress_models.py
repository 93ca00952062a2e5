"""``progress=`` of quantize_model, the loaders and the writers: nothing when False, every
layer or tensor when True (with tqdm and without it)."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

import q2gemv.torch  # noqa: E402,F401
from q2gemv.io import read_gguf  # noqa: E402
from q2gemv.torch import (  # noqa: E402
    load_gguf,
    load_safetensors,
    quantize_model,
    save_gguf,
    save_safetensors,
)

from ..model_cases import tiny_llama  # noqa: E402


def run_all(tmp_path, progress):
    """Quantize, save and load both formats with ``progress``; the names each step reports."""
    model = tiny_llama(layers=1)
    report = quantize_model(model, "q2_0", progress=progress)
    save_gguf(model, tmp_path / "m.gguf", progress=progress)
    load_gguf(tmp_path / "m.gguf", progress=progress)
    nv = tiny_llama(layers=1)
    nv_report = quantize_model(nv, "nvfp4", progress=progress)
    save_safetensors(nv, tmp_path / "ckpt", layout="modelopt", progress=progress)
    with torch.device("meta"):
        target = type(nv)(nv.config).to(torch.bfloat16)
    load_safetensors(tmp_path / "ckpt", target, progress=progress)
    gguf_tensors = [t.name for t in read_gguf(tmp_path / "m.gguf").tensors]
    return list(report.replaced), gguf_tensors, list(nv_report.replaced)


def test_progress_false_prints_nothing(tmp_path, capsys):
    run_all(tmp_path, False)
    out = capsys.readouterr()
    assert out.err == "" and out.out == ""


def test_progress_true_without_tqdm_reports_every_layer(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    layers, tensors, nv_layers = run_all(tmp_path, True)
    lines = capsys.readouterr().err.splitlines()
    want = [f"quantize_model: {i + 1}/{len(layers)} {n}" for i, n in enumerate(layers)]
    want += [f"save_gguf: {i + 1}/{len(tensors)} {n}" for i, n in enumerate(tensors)]
    want += [f"load_gguf: {i + 1}/{len(tensors)} {n}" for i, n in enumerate(tensors)]
    want += [f"quantize_model: {i + 1}/{len(nv_layers)} {n}" for i, n in enumerate(nv_layers)]
    assert lines[: len(want)] == want
    saved = [line for line in lines[len(want) :] if line.startswith("save_safetensors: ")]
    loaded = [line for line in lines[len(want) :] if line.startswith("load_safetensors: ")]
    assert len(saved) == 3 * len(nv_layers) + 5  # 3 per layer; embed, 3 norms, lm_head
    assert len(loaded) == len(nv_layers)
    assert {line.split()[-1] for line in loaded} == set(nv_layers)


def test_progress_true_with_tqdm_names_every_layer(tmp_path, capsys):
    pytest.importorskip("tqdm")
    layers, tensors, _ = run_all(tmp_path, True)
    err = capsys.readouterr().err
    for desc in (
        "quantize_model",
        "save_gguf",
        "load_gguf",
        "save_safetensors",
        "load_safetensors",
    ):
        assert desc in err, desc
    assert all(name in err for name in layers + tensors)


def test_progress_argument_is_checked_first(tmp_path):
    model = tiny_llama(layers=1)
    for call in (
        lambda: quantize_model(model, "q2_0", progress="on"),
        lambda: load_gguf(tmp_path / "missing.gguf", progress=1),
        lambda: load_safetensors(tmp_path / "missing", model, progress="on"),
    ):
        with pytest.raises(TypeError, match="progress"):
            call()
    assert isinstance(model.model.layers[0].mlp.up_proj, torch.nn.Linear)

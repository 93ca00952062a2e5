"""q2gemv.io.safetensors.writer.write_safetensors: the reference reader and q2gemv's agree."""

from __future__ import annotations

import os
import struct

import ml_dtypes
import numpy as np
import pytest

from q2gemv.io.safetensors.reader import _parse_header
from q2gemv.io.safetensors.writer import SafetensorsOut, write_safetensors


def _tensors():
    rng = np.random.default_rng(1)
    packed = rng.integers(0, 256, (3, 8), dtype=np.uint8)
    scale = np.array([0.75], np.float32)
    bias = rng.standard_normal(5).astype(ml_dtypes.bfloat16).view(np.uint16)
    return (
        packed,
        scale,
        bias,
        [
            SafetensorsOut("l.weight_packed", "U8", (3, 8), lambda: packed),
            SafetensorsOut("l.bias", "BF16", (5,), lambda: bias),
            SafetensorsOut("l.weight_global_scale", "F32", (1,), lambda: scale),
            SafetensorsOut("l.weight_scale", "F8_E4M3", (3, 1), lambda: packed[:, :1].copy()),
        ],
    )


def test_write_safetensors_reads_back_with_both_readers(tmp_path):
    packed, scale, bias, tensors = _tensors()
    path = tmp_path / "m.safetensors"
    write_safetensors(path, tensors, {"producer": "test"})
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    assert n % 8 == 0
    entries, meta = _parse_header(data, len(data), str(path))
    assert meta == {"format": "pt", "producer": "test"}
    # decreasing element size, then the given order; back to back from the data start
    assert [e.name for e in sorted(entries.values(), key=lambda e: e.begin)] == [
        "l.weight_global_scale", "l.bias", "l.weight_packed", "l.weight_scale"]  # fmt: skip
    assert max(e.end for e in entries.values()) == len(data)
    safetensors = pytest.importorskip("safetensors")
    with safetensors.safe_open(str(path), framework="np") as f:
        assert np.array_equal(f.get_tensor("l.weight_packed"), packed)
        assert np.array_equal(f.get_tensor("l.weight_global_scale"), scale)
        assert f.metadata() == meta


def test_write_safetensors_refusals_and_atomicity(tmp_path):
    *_, tensors = _tensors()
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(ValueError, match="distinct"):
        write_safetensors(path, [*tensors, tensors[0]])
    with pytest.raises(ValueError, match="unknown safetensors dtype"):
        write_safetensors(path, [SafetensorsOut("x", "F4", (2,), lambda: b"")])
    with pytest.raises(ValueError, match="str to str"):
        write_safetensors(path, tensors, {"n": 1})
    short = SafetensorsOut("x", "F32", (2,), lambda: np.zeros(1, np.float32))
    with pytest.raises(ValueError, match="gave 4 bytes, expected 8"):
        write_safetensors(path, [*tensors, short])
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["m.safetensors"]

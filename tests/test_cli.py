"""The ``q2gemv`` command line as a subprocess: what a terminal or a pipe receives."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from q2gemv.formats.q2_0 import quantize_q2_0
from q2gemv.io import save_q2_weights


def _q2gemv(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "q2gemv.cli", *argv],
        capture_output=True,
        env={**os.environ, **env},
        timeout=120,
    )


def test_inspect_prints_a_unicode_name_on_an_ascii_stdout(tmp_path):
    w = quantize_q2_0(np.ones((1, 128), dtype=np.float32), group=128)
    path = tmp_path / "u.gguf"
    save_q2_weights(path, {"blk.0.caf\u00e9.weight": w})
    r = _q2gemv("inspect", str(path), PYTHONIOENCODING="ascii")
    assert r.returncode == 0, r.stderr.decode()
    assert b"Traceback" not in r.stderr
    assert b"caf\\xe9" in r.stdout  # escaped, not dropped

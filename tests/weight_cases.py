"""Small weights, raw parts and activations shared by the API-edge tests (issue 16):
ownership of a weight's bytes (tests/formats/), out= overlap and argument refusals
(tests/test_api.py), device-weight sizes and plan checks (tests/cuda/)."""

from __future__ import annotations

import numpy as np

from q2gemv import Q2Weight
from q2gemv.formats.bf16 import BF16

N, K = 3, 128


def _q2_raw(n=N, k=K, group=64) -> np.ndarray:
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 4, (n, k), dtype=np.uint8)
    scales = rng.standard_normal((n, k // group)).astype(np.float16)
    return np.array(Q2Weight.from_codes(codes, scales, group).raw)  # a writeable copy


def _nv_parts(n=N, k=K):
    rng = np.random.default_rng(6)
    packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales = rng.integers(0x20, 0x40, (n, k // 16), dtype=np.uint8)
    return packed, scales


def _chain(x: np.ndarray):
    """x and every ndarray base below it."""
    while isinstance(x, np.ndarray):
        yield x
        x = x.base


def _writeable_inputs(x: np.ndarray):
    ro_view = x.view()
    ro_view.flags.writeable = False
    owned_ro = x.copy()
    owned_ro.flags.writeable = False
    return {"writeable": x, "read-only-view-of-writeable": ro_view, "owned-read-only": owned_ro}


M = 2


def _acts(m=M, k=K, seed=7):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(BF16)

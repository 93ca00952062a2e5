"""q2gemv.formats._frozen: copies of a weight (pickle, copy, deepcopy) stay as immutable as the original."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from q2gemv.formats._frozen import is_frozen
from tests.q2_cases import _q2


def _weights():
    from q2gemv.formats.nvfp4 import Nvfp4Weight

    nv = Nvfp4Weight.from_float(np.linspace(-2, 5, 96, dtype=np.float32).reshape(3, 32))
    return [("q2", _q2(2, 128, 64), ("raw",)), ("nvfp4", nv, ("packed", "scales"))]


def _copies(w):
    return {
        "pickle": pickle.loads(pickle.dumps(w)),
        "pickle-0": pickle.loads(pickle.dumps(w, protocol=0)),
        "deepcopy": copy.deepcopy(w),
        "copy": copy.copy(w),
    }


@pytest.mark.parametrize("kind", ["q2", "nvfp4"])
def test_copies_of_a_weight_cannot_be_made_writeable(kind):
    """After pickle or deepcopy, raw.flags.writeable = True used to succeed and writes landed."""
    _, w, fields = next(x for x in _weights() if x[0] == kind)
    for how, c in _copies(w).items():
        assert type(c) is type(w), how
        for f in fields:
            arr = getattr(c, f)
            assert arr.tobytes() == getattr(w, f).tobytes(), (how, f)
            with pytest.raises(ValueError):
                arr.flags.writeable = True
            base = arr.base
            while isinstance(base, np.ndarray):  # no view down the chain can be either
                with pytest.raises(ValueError):
                    base.flags.writeable = True
                base = base.base
    if kind == "nvfp4":
        assert all(c.global_scale == w.global_scale for c in _copies(w).values())


def test_is_frozen_decides_by_the_memory():
    b = np.frombuffer(bytes(8), np.uint8)
    assert is_frozen(b) and is_frozen(b[2:].reshape(2, 3))
    assert not is_frozen(np.zeros(8, np.uint8))
    ro = np.zeros(8, np.uint8)
    ro.flags.writeable = False
    assert not is_frozen(ro)  # it owns its memory: it can be flagged writeable again
    assert not is_frozen(np.frombuffer(bytearray(8), np.uint8))
    assert is_frozen(np.frombuffer(memoryview(bytes(8)), np.uint8))
    assert not is_frozen(np.frombuffer(memoryview(bytearray(8)).toreadonly(), np.uint8))

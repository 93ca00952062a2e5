"""q2gemv.host.prepared: prepared activations are fixed once made."""

from __future__ import annotations

import numpy as np
import pytest


def test_prepared_bits_cannot_be_made_writeable():
    """prepare(a).bits.flags.writeable = True used to succeed: the bits could then change
    behind the device operands (cuda and reference results differed)."""
    import ml_dtypes

    import q2gemv

    for one_d in (False, True):
        a = np.arange(1, 2 * 64 + 1, dtype=np.float32).reshape(2, 64).astype(ml_dtypes.bfloat16)
        x = a[0] if one_d else a
        p = q2gemv.prepare(x, backend="reference")
        with pytest.raises(ValueError):
            p.bits.flags.writeable = True
        x.view(np.uint16)[...] = 0  # the caller's array does not reach it either
        assert p.bits.all()
    hand = q2gemv.PreparedActivations(np.ones((1, 64), np.uint16), False, "reference")
    with pytest.raises(ValueError):
        hand.bits.flags.writeable = True

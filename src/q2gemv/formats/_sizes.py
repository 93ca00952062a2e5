"""Sizes as callers pass them: the one check every format's shapes go through."""

from __future__ import annotations

import operator

import numpy as np


def as_size(v, name: str) -> int:
    """Size ``v`` (an int, NumPy integer or ``__index__`` object; not a bool) as a Python int.

    Sizes are multiplied together, and a NumPy fixed-width integer
    (``np.int16(4000) * 18``) would wrap silently; Python ints do not overflow.
    Raises TypeError naming ``name`` when ``v`` is a bool or not an integer.
    """
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}") from None

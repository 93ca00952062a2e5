"""Who owns a weight's bytes: wrap memory nobody can write, copy everything else.

A weight (:class:`~q2gemv.Q2Weight`, :class:`~q2gemv.Nvfp4Weight`) must not
change behind the package's back. NumPy's ``writeable`` flag alone does not
ensure that: a read-only view of a writeable array can be flagged writeable
again (``w.raw.flags.writeable = True``), and the caller still holds the
writeable original. So the rule is decided by the memory, not by the flag:

* memory that no Python object can write (the chain of ``.base`` ends in a
  read-only buffer: ``bytes``, a read-only ``mmap`` such as the loaders' file
  maps, a read-only ``memoryview`` of one of those) is wrapped without a copy;
* anything else (a writeable array, a read-only view of one, an array that
  owns its memory, a ``bytearray``) is copied once into an immutable
  ``bytes`` object, so no array, view or base of the weight can be made
  writeable again.
"""

from __future__ import annotations

import numpy as np


def check_u8(x, name: str, ndim: int, kind: str = "array") -> np.ndarray:
    """``x`` if it is a numpy uint8 array of ``ndim`` dimensions (TypeError/ValueError naming
    ``name``): what a weight's bytes must be before :func:`frozen` takes them."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy uint8 array, got {type(x).__name__}")
    if x.dtype != np.uint8:
        raise TypeError(f"{name}: expected dtype uint8, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D {kind}, got shape {x.shape}")
    return x


def is_frozen(x: np.ndarray) -> bool:
    """True when no Python object can write ``x``'s memory (see the module docstring).

    An ndarray that owns its memory can always be flagged writeable again, so
    only a chain of views ending in a read-only buffer object counts.
    """
    obj: object = x
    for _ in range(256):  # view chains are short; bounded in case of a cycle
        if isinstance(obj, np.ndarray):
            if obj.flags.writeable or obj.base is None:
                return False
            obj = obj.base
        elif isinstance(obj, memoryview):
            if not obj.readonly or obj.obj is None:
                return False
            obj = obj.obj
        else:
            try:
                with memoryview(obj) as mv:  # type: ignore[arg-type]
                    return mv.readonly
            except TypeError:  # not a buffer: cannot tell, so not frozen
                return False
    return False


def frozen(x: np.ndarray) -> np.ndarray:
    """``x`` itself when :func:`is_frozen` (and C-contiguous), else an immutable copy.

    The copy lives in a ``bytes`` object (C order, same dtype and shape): its
    ``writeable`` flag cannot be set, through the array or any view of it.
    """
    if x.flags.c_contiguous and is_frozen(x):
        return x
    data = np.ascontiguousarray(x).tobytes()
    return np.frombuffer(data, dtype=x.dtype).reshape(x.shape)

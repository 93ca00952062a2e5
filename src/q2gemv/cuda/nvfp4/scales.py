"""The E4M3 block scale as an exact integer, on the device: the one rule both the exact
GEMV's scale table and the layout's row sums use (:func:`q2gemv.formats.nvfp4_layout.scale_units`
is its host twin)."""

from __future__ import annotations

from numba import cuda, int32


@cuda.jit(device=True, inline="always")
def scale_entry(b, gsign):
    """E4M3 bits ``b`` -> ``+-mant << (max(e, 1) - 1)``, the scale in units of 2**-9, with
    the sign flipped when ``gsign`` is 1 (a negative global scale); 0 for NaN (0x7F/0xFF)."""
    b = int32(b)
    if (b & 0x7F) == 0x7F:
        return int32(0)  # NaN: flagged elsewhere (the row sums), contributes nothing
    e = (b >> 3) & 15
    f = b & 7
    mant = f | 8 if e > 0 else f
    v = int32(mant << (max(e, 1) - 1))
    return -v if ((b >> 7) ^ gsign) != 0 else v

"""Independent oracles of the exact contract's step 2 for the reference tests: the definition
in exact rationals, for any 16-bit activation format, sharing no code with the library."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction


def floor_log2(x: Fraction) -> int:
    """``floor(log2 x)`` of a positive rational, exactly."""
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fraction(2) ** e > x:
        e -= 1
    while Fraction(2) ** (e + 1) <= x:
        e += 1
    return e


def fixed_point(row, inf: int, value: Callable[[int], Fraction]) -> tuple[list, int | None, bool]:
    """Step 2 by the definition on the bit patterns ``row``: ``(A, E, special)``; ``E`` None
    for a zero or special row. ``inf``: the format's +Inf bits (an exponent field of all ones
    is NaN or Inf); ``value(h)``: the exact value of finite bits ``h``."""
    row = [int(h) for h in row]
    if any((h & inf) == inf for h in row):
        return [0] * len(row), None, True
    vals = [value(h) for h in row]
    nz = [abs(v) for v in vals if v != 0]
    if not nz:
        return [0] * len(row), None, False
    e = max(floor_log2(v) for v in nz)
    return [round(v * Fraction(2) ** (22 - e)) for v in vals], e, False

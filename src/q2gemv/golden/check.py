"""Bit-exact comparison and the one failure reporter every test and harness uses."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class BitReport:
    """Outcome of a bitwise comparison of two arrays of the same shape."""

    shape: tuple[int, ...]
    mismatches: int
    first: list[tuple[tuple[int, ...], int, int]] = field(default_factory=list)
    width: int = 4

    @property
    def ok(self) -> bool:
        """True when no element differs."""
        return self.mismatches == 0

    def format(self, label: str = "", context=None) -> str:
        """Count plus the first ten mismatches: index, hex got, hex want (and inputs)."""
        head = f"{label}: " if label else ""
        if self.ok:
            return f"{head}bit-exact ({int(np.prod(self.shape))} elements)"
        lines = [
            f"{head}{self.mismatches} of {int(np.prod(self.shape))} elements differ "
            f"(shape {self.shape}); first {len(self.first)}:"
        ]
        for idx, got, want in self.first:
            extra = f"  {context(idx)}" if context else ""
            lines.append(
                f"  at {idx}: got 0x{got:0{self.width}X} want 0x{want:0{self.width}X}{extra}"
            )
        return "\n".join(lines)


def _bits(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind in "ui":
        return x
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def compare_bits(got: np.ndarray, want: np.ndarray, limit: int = 10) -> BitReport:
    """Compare the bit patterns of ``got`` and ``want`` (arrays of one shape and item width).

    Float arrays are viewed as unsigned ints of their width (bf16 -> uint16,
    float32 -> uint32), so NaN payloads and -0.0 count. ``limit``: how many
    mismatches (index, got bits, want bits) the report keeps, in C order.
    Raises ValueError on a shape mismatch, TypeError on a width mismatch.
    """
    g, w = _bits(got), _bits(want)
    if g.shape != w.shape:
        raise ValueError(f"shape mismatch: got {g.shape}, want {w.shape}")
    if g.dtype.itemsize != w.dtype.itemsize:
        raise TypeError(f"width mismatch: got {g.dtype}, want {w.dtype}")
    diff = g != w
    count = int(diff.sum())
    first = []
    for idx in np.argwhere(diff)[:limit]:
        t = tuple(int(i) for i in idx)
        first.append((t, int(g[t]), int(w[t])))
    return BitReport(tuple(g.shape), count, first, width=2 * g.dtype.itemsize)


def assert_bits_equal(got: np.ndarray, want: np.ndarray, label: str = "", context=None) -> None:
    """Raise AssertionError with the shared report unless every bit of ``got`` equals ``want``.

    ``label`` prefixes the report; ``context``, if given, is called with each
    mismatching index and its string appended to that line (e.g. the inputs
    that produced it). Raises as :func:`compare_bits` on shape/width mismatch.
    """
    rep = compare_bits(got, want)
    if not rep.ok:
        raise AssertionError(rep.format(label, context))

"""One-line error text for the command-line entry points (cli, verify, bench, golden regen)."""

from __future__ import annotations


def one_line(text: object) -> str:
    """``str(text)`` with control characters escaped: a path holding a newline or an ESC
    stays one line of an error message and cannot drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))

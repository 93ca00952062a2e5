"""What the command-line entry points (cli, verify, bench, golden regen) share.

One-line error text, and the integer argument types of their parsers.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def one_line(text: object) -> str:
    """``str(text)`` with control characters escaped: a path holding a newline or an ESC
    stays one line of an error message and cannot drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``, else a usage error saying so."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {low}, got {text!r}"
            ) from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {v}")
        return v

    parse.__name__ = f"int_at_least_{low}"
    return parse

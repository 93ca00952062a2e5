"""The ``q2gemv`` command: ``verify`` (the main job), ``inspect``, ``golden``, ``bench``.

Every subcommand reports a usage or data problem as one line on stderr
(control characters escaped: :func:`one_line`), never a traceback; text that
stdout's encoding cannot hold is printed escaped (``\\xe9``); an
output that cannot be written (stdout on a full disk) is one such line
and status 1. A closed stdout (``q2gemv verify --list | head``) ends
the command quietly with status 141 (128 + SIGPIPE, what a shell reports).
"""

from __future__ import annotations

import argparse
import os
import sys

from .tools.command import one_line

DESCRIPTION = (
    "Bit-exact low-bit decode GEMV kernels (GGUF Q2_0, NVFP4 W4A16). "
    "Start with 'q2gemv verify' (minutes on a CPU-only machine; 'q2gemv verify --backend "
    "reference' takes seconds); 'q2gemv COMMAND --help' describes each command."
)
EXIT_BROKEN_PIPE = 141


def _inspect(args: argparse.Namespace) -> int:
    from .io.gguf.inspect import format_inspect
    from .io.gguf.reader import GgufError

    try:
        text = format_inspect(args.file)
    except (GgufError, OSError) as e:
        print(f"q2gemv inspect: {one_line(e)}", file=sys.stderr)
        return 1
    print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__, bench
    from .golden import regen as golden_regen
    from .golden import verify

    p = argparse.ArgumentParser(prog="q2gemv", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"q2gemv {__version__}")
    sub = p.add_subparsers(dest="subcommand", required=True, metavar="COMMAND", title="commands")
    verify.add_arguments(
        sub.add_parser(
            "verify",
            help="prove every available backend bit-exact against the golden vectors",
            description="Check the golden data's integrity, then run every golden check on "
            "each backend. Without a GPU the cuda backend runs on numba's CUDA simulator: "
            "minutes of CPU work (the command prints its estimate first); the quick form, "
            "'q2gemv verify --backend reference', checks the NumPy references in seconds. "
            "Exit status: 0 every check that ran is bit-exact, 1 a check failed or errored "
            "or none ran, 2 the golden data is unusable.",
        )
    )
    golden_regen.add_arguments(
        sub.add_parser(
            "golden",
            help="golden vectors: regen",
            description="Maintain the golden vectors (subcommand: regen).",
        )
    )
    bench.add_arguments(
        sub.add_parser(
            "bench",
            help="time kernels on the GPU (writes CSVs, a summary and, with --plot, figures)",
            description="Time every registered kernel (the exact contract's defaults and the "
            "seed kernels) on a CUDA GPU: cold weights, CUDA-graph replay, against the read "
            "ceiling, the FMA floor and torch bf16; --plot draws what it measured.",
        )
    )
    pi = sub.add_parser(
        "inspect",
        help="list the metadata and tensors of a GGUF file",
        description="List a GGUF file's metadata and tensors, with the Q2_0 group each "
        "tensor's size implies. Exit status 1 on a malformed or unreadable file.",
    )
    pi.add_argument("file", metavar="FILE.gguf", help="the GGUF file to list")
    pi.set_defaults(func=_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    _escape_unencodable()
    args = build_parser().parse_args(argv)
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader went away (`| head`): send what is left in Python's buffer nowhere
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as e:  # stdout on a full disk (/dev/full) or a failing device
        _drop_stdout()
        where = e.filename or "stdout"
        print(
            f"q2gemv {args.subcommand}: cannot write {one_line(where)}: "
            f"{one_line(e.strerror or e)}",
            file=sys.stderr,
        )
        return 1
    return rc


def _escape_unencodable() -> None:
    """Print what stdout's encoding cannot hold (``PYTHONIOENCODING=ascii``, a C locale)
    escaped (``\\xe9``), as stderr already does, rather than end in a UnicodeEncodeError."""
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is left in
    Python's buffer cannot fail again (a second, multi-line report at exit)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())

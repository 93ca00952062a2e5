"""The ``q2gemv`` command: ``verify`` (the main job), ``inspect``, ``golden``, ``bench``."""

from __future__ import annotations

import argparse
import sys


def _inspect(args: argparse.Namespace) -> int:
    from .io.gguf import GgufError, format_inspect

    try:
        print(format_inspect(args.file))
    except (GgufError, FileNotFoundError) as e:
        print(f"q2gemv inspect: {e}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import verify
    from .golden import regen as golden_regen

    p = argparse.ArgumentParser(prog="q2gemv", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    verify.add_arguments(sub.add_parser("verify", help="prove every available backend bit-exact"))
    golden_regen.add_arguments(sub.add_parser("golden", help="golden vectors: regen"))
    from . import bench

    bench.add_arguments(sub.add_parser("bench", help="time kernels on the GPU (writes CSV/plots)"))
    pi = sub.add_parser("inspect", help="list the tensors of a GGUF file")
    pi.add_argument("file")
    pi.set_defaults(func=_inspect)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

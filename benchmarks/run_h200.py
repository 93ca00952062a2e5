"""Run the decode-GEMV benchmark on the H200 and write CSV + plot + markdown summary.

    export PYTHONPATH=$PWD/src   # or pip install -e .
    python3 benchmarks/run_h200.py                    # full matrix -> benchmarks/results/<date>_matrix/
    python3 benchmarks/run_h200.py --quick --out /tmp/bench            # 2 shapes, M = 1, 4, 8
    NUMBA_ENABLE_CUDASIM=1 python3 benchmarks/run_h200.py --dry-run \\
        --shapes 16x512 --m 1,9 --out /tmp/sim                         # simulator smoke run

Everything is measured by :mod:`q2gemv.bench` (method, byte formulas and
columns in its docstring and in benchmarks/README.md); this script adds the
plot (benchmarks/plot.py) and records the exact command line in the summary.
Exit status 1 when a case or a graph check failed its bit-for-bit check.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # plot.py and _paths.py beside this script

from _paths import dated  # noqa: E402

from q2gemv import bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    bench.add_arguments(p)
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    # this script writes a new run folder by default (q2gemv bench: ./q2gemv-bench)
    p.set_defaults(out=dated("matrix"))
    args = p.parse_args(argv)
    args.command = "python3 benchmarks/run_h200.py " + shlex.join(argv)
    rc = bench.run(args)
    csv_path = args.out / f"{args.prefix}_gemv.csv"
    if args.no_plot or not csv_path.exists():
        return rc
    import plot

    png = args.out / f"{args.prefix}_gemv.png"
    try:
        plot.plot(csv_path, png, title=f"q2gemv decode GEMV ({args.prefix})")
    except ImportError as e:  # matplotlib missing: the CSV and summary stand
        print(f"plot skipped: {e}", file=sys.stderr)
        return rc
    tiers_png = plot.plot_tiers(csv_path, args.out / f"{args.prefix}_w4a16_tiers.png")
    md = args.out / f"{args.prefix}_summary.md"
    cmd = f"python3 benchmarks/plot.py {csv_path} --out {png}"
    with open(md, "a") as f:
        f.write(f"\n## Plots\n\n![time, % of read ceiling and speed-up vs M]({png.name})\n\n")
        if tiers_png is not None:
            f.write(f"![W4A16 tiers]({tiers_png.name})\n\n")
            cmd += f" --tiers-out {tiers_png}"
        f.write(f"Made from `{csv_path.name}` by:\n\n```\n{cmd}\n```\n")
    print(f"wrote {png}" + (f", {tiers_png}" if tiers_png else ""))
    return rc


if __name__ == "__main__":
    sys.exit(main())

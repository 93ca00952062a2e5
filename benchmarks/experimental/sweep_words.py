"""Time the Q2_0 M=1 vec kernels at several word-batch sizes (GPU only).

    python3 benchmarks/experimental/sweep_words.py --out DIR [--shapes 16384x16384,5120x5120]

``q2gemv.cuda.q2_0.seed.WORDS_IN_FLIGHT`` sets how many words (16 codes) a lane
loads per row before it multiplies any of them. A kernel is compiled once per
process, so each setting runs ``benchmarks/run_h200.py`` in a fresh process
with the table patched; every run also times torch bf16 ``F.linear`` and the
streaming-read ceiling, so each row's ratios are measured side by side.
Every timed case is checked bit for bit against the reference by the bench.

Writes ``<out>/sweep_words_<kernel>_w<U>_gemv.csv`` per setting and
``<out>/sweep_words.csv`` (one row per kernel, U, shape), and prints that
table last.
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _paths.py
from _paths import dated  # noqa: E402

HERE = Path(__file__).resolve().parent
# kernel -> (WORDS_IN_FLIGHT key, batch sizes to try)
SETTINGS = {
    "q2_0_gemv_vec": ((1, 1), (1, 4, 8)),
    "q2_0_gemv_vec_rt4": ((1, 4), (1, 2, 4)),
}
PATCH = (
    "import runpy, sys; import q2gemv.cuda.q2_0.seed as q; q.WORDS_IN_FLIGHT[{key!r}] = {u}; "
    "sys.argv = {argv!r}; sys.exit(runpy.run_path({script!r}, run_name='__main__') or 0)"
)


def _num(x: str) -> float:
    """A CSV number; NaN where the bench left it empty (dry runs time nothing)."""
    try:
        return float(x)
    except ValueError:
        return float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=None, help="default: benchmarks/results/<date>_sweep_words/"
    )
    p.add_argument("--shapes", default="16384x16384,5120x5120")
    p.add_argument("--kernels", default=",".join(SETTINGS))
    args = p.parse_args()
    args.out = args.out or dated("sweep_words")
    args.out.mkdir(parents=True, exist_ok=True)
    rows, rc = [], 0
    for kernel in args.kernels.split(","):
        key, sizes = SETTINGS[kernel]
        for u in sizes:
            prefix = f"sweep_words_{kernel}_w{u}"
            argv = [
                "run_h200.py",
                *("--out", str(args.out), "--prefix", prefix, "--shapes", args.shapes),
                *("--m", "1", "--kernels", f"{kernel},bf16", "--no-overhead", "--no-plot"),
            ]
            code = PATCH.format(key=key, u=u, argv=argv, script=str(HERE.parent / "run_h200.py"))
            print(f"== {kernel} words={u}", flush=True)
            rc |= subprocess.run([sys.executable, "-c", code]).returncode
            path = args.out / f"{prefix}_gemv.csv"
            if not path.exists():
                continue
            got = list(csv.DictReader(open(path)))
            for r in got:
                if r["kernel"] == kernel:
                    rows.append(
                        {
                            "kernel": kernel,
                            "words": u,
                            "n": r["n"],
                            "k": r["k"],
                            "time_us": r["time_us"],
                            "bf16_us": r["bf16_us"],
                            "speedup_vs_bf16": r["speedup_vs_bf16"],
                            "pct_read_ceiling": r["pct_read_ceiling"],
                            "check": r["check"],
                        }
                    )
    if not rows:
        print("no results", file=sys.stderr)
        return 1
    with open(args.out / "sweep_words.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    print(
        f"{'kernel':20} {'words':>5} {'N x K':>12} {'us':>8} {'bf16 us':>8} {'vs bf16':>7} {'%ceil':>6} check"
    )
    for r in rows:
        print(
            f"{r['kernel']:20} {r['words']:>5} {r['n'] + 'x' + r['k']:>12} {_num(r['time_us']):8.1f} "
            f"{_num(r['bf16_us']):8.1f} {_num(r['speedup_vs_bf16']):6.2f}x "
            f"{_num(r['pct_read_ceiling']):5.1f}% {r['check']}"
        )
    return rc


if __name__ == "__main__":
    sys.exit(main())

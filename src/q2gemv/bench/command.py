"""``q2gemv bench`` (and ``benchmarks/run_h200.py``): its options and its entry point.

The top of the subpackage: imports :mod:`~q2gemv.bench.matrix` and
:mod:`~q2gemv.bench.results`, :mod:`~q2gemv.bench.runner` (numba, the GPU)
only when a run starts, and :mod:`~q2gemv.bench.plot` (matplotlib) only for
``--plot``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from ..tools.command import int_at_least, one_line
from .matrix import (
    MAX_M,
    QUICK_MS,
    QUICK_SHAPES,
    SIM_EXAMPLE_SHAPE,
    Settings,
    build_cases,
    simulator_refusals,
)
from .results import DEFAULT_OUT, SIM_PREFIX, text_summary, write_outputs

# -- CLI ------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``q2gemv bench`` and ``benchmarks/run_h200.py``."""
    p.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_OUT),
        metavar="DIR",
        help=f"output folder (default: ./{DEFAULT_OUT}; the committed benchmarks/results is "
        "only written when named here)",
    )
    p.add_argument(
        "--prefix",
        default=None,
        help="file name prefix (default: from the device, e.g. 'h200' on an NVIDIA H200, "
        f"'{SIM_PREFIX}' under the CUDA simulator, '_dryrun' appended for --dry-run on a GPU)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing PREFIX_* files in --out (default: write under PREFIX_2, "
        "PREFIX_3, ... instead)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"shapes {','.join(f'{n}x{k}' for n, k in QUICK_SHAPES)} and "
        f"M {','.join(map(str, QUICK_MS))} (unless --shapes/--m say otherwise)",
    )
    p.add_argument("--shapes", help="N x K list, e.g. 5120x5120,16384x16384 (default: all four)")
    p.add_argument(
        "--m", help=f"M list with ranges, e.g. 1-8,16,32 (default); each at most {MAX_M}"
    )
    p.add_argument(
        "--kernels",
        help="keep only these families (q2_0, w4a16, bf16) or kernel names, comma-separated: "
        "any registered kernel, the exact contract's (q2_0_gemv_exact, w4a16_gemv_exact) too",
    )
    p.add_argument("--group", default="128", help="Q2_0 group(s): 128 (default), 64 or 64,128")
    p.add_argument("--repeats", type=int, default=9, help="timed replays per case (>= 5; median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed replays per case")
    p.add_argument(
        "--min-calls",
        type=int,
        default=32,
        help="calls per timed sequence, at least (rounded up to a multiple of the copies)",
    )
    p.add_argument(
        "--timing",
        choices=("graph", "sleep"),
        default="graph",
        help="graph: CUDA-graph replay between events (default); sleep: launches queued "
        "behind a spin kernel",
    )
    p.add_argument(
        "--plot",
        action="store_true",
        help="also draw what the run measured: PREFIX_gemv.png (time, %% of the read ceiling, "
        "speed-up vs bf16 per M) and PREFIX_w4a16_tiers.png when W4A16 tiers were timed; "
        "needs matplotlib (pip install -e '.[plot]')",
    )
    p.add_argument("--no-torch", action="store_true", help="skip torch bf16 (and graph checks)")
    p.add_argument("--no-overhead", action="store_true", help="skip host overhead + graph check")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="launch every case once, check it, time nothing (forced under the CUDA simulator)",
    )
    p.add_argument("--l2-mib", type=float, help="L2 size for the rotation (default: from device)")
    p.add_argument("--clock-mhz", type=float, help="SM clock for the FMA floor (default: device)")
    p.add_argument("--ceiling-mib", type=int, default=2048, help="read-ceiling buffer (MiB)")
    p.add_argument("--overhead-calls", type=int, default=200, help="launches per host batch")
    p.add_argument(
        "--overhead-batches",
        type=int,
        default=9,
        help="host-overhead batches (median taken; default 9)",
    )
    p.add_argument(
        "--seed",
        type=int_at_least(0),  # NumPy generators take integers >= 0 (-1 was a traceback)
        default=2026,
        help="seed of the random weights and activations (an integer >= 0)",
    )
    p.set_defaults(func=run)


def _check_outputs(out: Path, prefix: str | None) -> None:
    """Before any case runs: ``--prefix`` is a plain file name (``../x`` would write outside
    ``--out``), and ``--out`` is a folder this process can write or create (found after the
    run, the results were lost). Creates nothing: the folder is made when the results are
    written, so a refused run leaves none behind. Raises ValueError saying which."""
    if prefix is not None and (
        prefix in ("", ".", "..")
        or "/" in prefix
        or os.sep in prefix
        or (os.altsep and os.altsep in prefix)
        or not prefix.isprintable()
    ):
        raise ValueError(f"--prefix: expected a file name prefix (no folders), got {prefix!r}")
    existing = out.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"--out: cannot create the folder {str(out)!r}: {str(existing)!r} is a file"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "folder" if existing == out.absolute() else "folder above it"
        raise ValueError(f"--out: the {what} {str(existing)!r} is not writable")


def draw(csv_path: Path, out: Path, prefix: str) -> dict[str, Path]:
    """``--plot``: the figures of :mod:`q2gemv.bench.plot` from the run's CSV, beside it."""
    from . import plot

    paths = {"plot": plot.plot(csv_path, out / f"{prefix}_gemv.png", f"q2gemv bench ({prefix})")}
    tiers = plot.plot_tiers(csv_path, out / f"{prefix}_w4a16_tiers.png")
    if tiers is not None:
        paths["tiers_plot"] = tiers
    return paths


def run(args: argparse.Namespace) -> int:
    """Entry point of ``q2gemv bench`` (and ``benchmarks/run_h200.py``); returns the exit code."""

    try:
        st = Settings.from_args(args)
        cases = build_cases(st.shapes, st.ms, kernels=st.kernels, groups=st.groups, torch=st.torch)
        _check_outputs(st.out, st.prefix)
        if st.plot and importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot needs matplotlib: pip install -e '.[plot]' (or leave --plot)")
    except ValueError as e:
        print(f"q2gemv bench: {one_line(e)}", file=sys.stderr)
        return 2
    if not cases:
        print("q2gemv bench: no cases selected", file=sys.stderr)
        return 2
    from ..host.backends import gpu_present, simulator_requested

    simulated = simulator_requested()
    if not simulated and not gpu_present():
        print(
            "q2gemv bench: no CUDA GPU on this machine (nothing to time). To smoke-test the "
            "run on the CPU: NUMBA_ENABLE_CUDASIM=1 q2gemv bench --dry-run "
            f"--shapes {SIM_EXAMPLE_SHAPE} --m 1,2",
            file=sys.stderr,
        )
        return 2
    if simulated:
        too_big = simulator_refusals(cases)
        if too_big:
            print(f"q2gemv bench: {too_big}", file=sys.stderr)
            return 2
    try:
        from . import runner

        report = runner.execute(st, cases)
    except RuntimeError as e:  # no usable device after all (driver, context)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(msg if msg.startswith("q2gemv bench:") else f"q2gemv bench: {msg}", file=sys.stderr)
        return 2
    try:
        paths = write_outputs(report, st)
    except OSError as e:
        where = one_line(e.filename or st.out)
        print(f"q2gemv bench: cannot write {where}: {e.strerror}", file=sys.stderr)
        return 2
    args.prefix = st.prefix  # the prefix used (benchmarks/run_h200.py plots its CSV)
    if st.plot:
        paths.update(draw(paths["gemv"], st.out, st.prefix))
    print(text_summary(report.rows))
    for line in report.summary_lines():
        print(line)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0 if report.ok else 1

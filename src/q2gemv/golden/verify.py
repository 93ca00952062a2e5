"""``q2gemv verify``: prove every available backend bit-exact against the golden vectors.

What it runs (see :mod:`q2gemv.golden`):

1. The integrity check: the manifest ``data/manifest.json`` against the
   files the suite expects (``golden.suite.expected_files``, both ways), and
   every file against its entry (size and sha256). A modified, truncated,
   missing, unlisted or unexpected file is reported by name and never used;
   the exit status is then 2.
2. Backend ``reference`` (always available): the host format checks (hand
   tables vs the format modules and ``ml_dtypes``, ggml's own quantize /
   dequantize vectors, pack -> bytes -> dequant round trips) and every GEMV
   case through each kernel's NumPy reference.
3. Backend ``cuda``: every GEMV case through the numba kernels, on the GPU
   in this process when one is present; otherwise under numba's CUDA
   simulator in worker subprocesses (the simulator must be chosen before
   numba is imported), which runs only the checks of size class ``small``
   and reports the rest as skipped, with the reason.

Without a GPU the cuda half takes minutes (about 2-3 on a 2-core CPU for the whole
suite); the command says so, with its estimate, before it starts, and prints a line
on stderr as each kernel's checks are done. ``q2gemv verify --backend reference``
is the quick form (seconds: the references and the host format checks only).

Progress goes to stderr; the report (or ``--json``) to stdout. Exit status:
0 every check that ran is bit-exact (and at least one ran); 1 a check failed
(bits differ) or errored, or nothing was checked; 2 the golden data is
unusable (a file tampered, missing, unlisted or unexpected; the manifest
missing or malformed; ``--data-dir`` not a directory).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..tools.command import int_at_least, one_line
from . import gen, harness, report, store, suite

MAX_FAILURES_SHOWN = 50


def _problem_exit(msg: str, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"ok": False, "exit_code": 2, "integrity_problems": [msg]}, indent=1))
    else:
        print(f"q2gemv verify: {one_line(msg)}", file=sys.stderr)
        print("FAIL: golden data unusable")
    return 2


def _usage_exit(msg: str, as_json: bool) -> int:
    """A selection problem: one escaped line on stderr, and in JSON mode the JSON too."""
    if as_json:
        print(json.dumps({"ok": False, "exit_code": 1, "error": msg}, indent=1))
    print(f"q2gemv verify: {one_line(msg)}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    try:
        sel = suite.Selection.parse(args.cases, args.kernel)
    except ValueError as e:
        return _usage_exit(str(e), args.json)
    try:
        s = suite.load_suite(args.data_dir)
    except store.GoldenError as e:
        return _problem_exit(str(e), args.json)
    for p in s.problems:
        print(f"q2gemv verify: TAMPERED/UNUSABLE: {one_line(p)}", file=sys.stderr)

    n_gemv = len(sel.gemv_checks(s))
    n_host = len(sel.host_cases(s))
    if n_gemv + n_host == 0 and not s.problems:
        return _usage_exit(
            f"the selection (--cases {args.cases or ['all']}, "
            f"--kernel {args.kernel or 'all'}) matches no golden check",
            args.json,
        )
    if args.list and args.json:
        checks = [{"size": c.size_of(k), "kernel": k, "case": c.id} for c, k in sel.gemv_checks(s)]
        checks += [{"size": "small", "kernel": "host", "case": h.id} for h in sel.host_cases(s)]
        code = 2 if s.problems else 0
        print(json.dumps({"ok": code == 0, "exit_code": code, "checks": checks}, indent=1))
        return code
    if args.list:
        for c, k in sel.gemv_checks(s):
            print(f"{c.size_of(k):6} {k:24} {c.id}")
        for h in sel.host_cases(s):
            print(f"{'small':6} {'host':24} {h.id}")
        return 2 if s.problems else 0  # files that failed integrity are not listed

    backends = list(dict.fromkeys(args.backend))
    if "cuda" in backends and not args.quiet and harness.cuda_runs_on() == "simulator":
        # said before the reference half runs: minutes of CPU work must not come unannounced
        todo = harness.simulator_checks(sel.gemv_checks(s))
        if todo:
            jobs = args.jobs or harness.default_jobs()
            print(f"q2gemv verify: {harness.sim_notice(todo, jobs)}", file=sys.stderr, flush=True)
    runs = []
    for backend in backends:
        runs.append(harness.run_backend(s, sel, backend, jobs=args.jobs, quiet=args.quiet))
    code = report.exit_code(runs, s.problems)
    if args.json:
        print(json.dumps(_json_report(s, runs, code), indent=1))
        return code
    failures = [r for run in runs for r in run.results if r.status in ("fail", "error")]
    for r in failures[:MAX_FAILURES_SHOWN]:
        print(r.details())
    if len(failures) > MAX_FAILURES_SHOWN:
        print(f"... {len(failures) - MAX_FAILURES_SHOWN} more failures (use --json for all)")
    if failures:
        print()
    man = s.manifest
    n_files = len(suite.expected_files())
    print(
        f"golden data: {s.data_dir} (format v{man.get('format_version')}, generator "
        f"v{man.get('generator', {}).get('version')}): {n_files} files expected, "
        f"{max(0, n_files - len(s.problems))} intact"
    )
    print(report.summary_text(runs, s.problems, by_kernel=not args.brief))
    return code


def _json_report(s: suite.Suite, runs: list[report.BackendRun], code: int) -> dict:
    return {
        "ok": code == 0,
        "exit_code": code,
        "data_dir": str(s.data_dir),
        "format_version": s.manifest.get("format_version"),
        "generator_version": s.manifest.get("generator", {}).get("version"),
        "integrity_problems": s.problems,
        "verdict": report.verdict(runs, s.problems),
        "backends": [
            {
                "backend": run.backend,
                "runs_on": run.runs_on,
                "seconds": round(run.seconds, 3),
                "counts": run.counts(),
                "skip_reasons": run.skip_reasons(),
                "by_kernel": run.by_kernel(),
                "results": [r.to_json() for r in run.results],
            }
            for run in runs
        ],
    }


positive_int = int_at_least(1)  # argparse type: an integer >= 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        nargs="+",
        default=["reference", "cuda"],
        choices=list(harness.BACKEND_NAMES),
        help="backends to run (default: both; cuda = the GPU if present, else numba's CUDA "
        "simulator: minutes on a CPU; '--backend reference' alone takes seconds)",
    )
    p.add_argument(
        "--kernel",
        nargs="+",
        metavar="NAME",
        help=f"only these GEMV kernels (host format checks still run): {', '.join(gen.KERNELS)}",
    )
    p.add_argument(
        "--cases",
        nargs="+",
        metavar="SEL",
        help="all (default), a size class (small, medium, large), a set "
        f"({', '.join(suite.SETS)}) or a glob on case ids, e.g. 'q2_0/g64/*'",
    )
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help=f"simulator worker processes, N >= 1 (default: min(4, CPUs) = "
        f"{harness.default_jobs()})",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="golden data directory (default: the packaged one)",
    )
    p.add_argument("--list", action="store_true", help="list the selected checks and exit")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--brief", action="store_true", help="no per-kernel table, totals only")
    p.set_defaults(func=run)

"""Results of golden checks and how they are printed (text table, failure details, JSON).

One *check* is one case run through one kernel (a GEMV case) or one host
function (a format case: ``host:q2_0.pack`` ...) on one backend. Its
outcome is ``pass``, ``fail`` (bits differ), ``error`` (it raised, or the
case's data could not be used) or ``skip`` (with the reason).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

from .check import BitReport, compare_bits

STATUSES = ("pass", "fail", "error", "skip")


@dataclass
class CheckResult:
    """Outcome of one check. ``first``: up to ten ``(row, col, got, want)`` bit patterns.

    For a GEMV check, row is the activation row m and col the output column n
    of the [M, N] result; for host checks of 1-D data col is the index and
    row 0.
    """

    case: str
    kernel: str
    backend: str
    status: str
    mismatches: int = 0
    elements: int = 0
    first: list[tuple[int, int, int, int]] = field(default_factory=list)
    width: int = 4  # hex digits of one element
    seconds: float = 0.0
    message: str = ""
    size: str = "small"

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def to_json(self) -> dict:
        d = asdict(self)
        d["first"] = [
            {"row": r, "col": c, "got": f"0x{g:0{self.width}X}", "want": f"0x{w:0{self.width}X}"}
            for r, c, g, w in self.first
        ]
        return d

    @classmethod
    def from_json(cls, d: dict) -> CheckResult:
        d = dict(d)
        d["first"] = [
            (x["row"], x["col"], int(x["got"], 16), int(x["want"], 16)) for x in d["first"]
        ]
        return cls(**d)

    def details(self) -> str:
        """Multi-line description of a failure: count, then (row, col): got, want in hex."""
        head = f"{self.status.upper()} [{self.backend}] {self.kernel} {self.case}"
        if self.status == "error":
            return f"{head}: {self.message}"
        if self.status == "skip":
            return f"{head}: skipped: {self.message}"
        if self.ok:
            return f"{head}: bit-exact ({self.elements} elements)"
        lines = [
            f"{head}: {self.mismatches} of {self.elements} elements differ; "
            f"first {len(self.first)}:"
        ]
        for r, c, g, w in self.first:
            lines.append(
                f"  (row {r}, col {c}): got 0x{g:0{self.width}X} want 0x{w:0{self.width}X}"
            )
        if self.message:
            lines.append(f"  {self.message}")
        return "\n".join(lines)


def result_from_bits(
    case: str, kernel: str, backend: str, got, want, seconds: float = 0.0, size: str = "small"
) -> CheckResult:
    """Compare bit patterns (:func:`q2gemv.golden.check.compare_bits`) and wrap the BitReport."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return CheckResult(
            case, kernel, backend, "error", elements=int(want.size), seconds=seconds, size=size,
            message=f"output shape {got.shape}, expected {want.shape}",
        )  # fmt: skip
    rep: BitReport = compare_bits(got.reshape(_as_2d(want.shape)), want.reshape(_as_2d(want.shape)))
    first = [(idx[0], idx[1], g, w) for idx, g, w in rep.first]
    return CheckResult(
        case, kernel, backend, "pass" if rep.ok else "fail", rep.mismatches,
        int(math.prod(want.shape)), first, rep.width, seconds, size=size,
    )  # fmt: skip


def _as_2d(shape: tuple[int, ...]) -> tuple[int, int]:
    """[M, N] stays; 1-D [X] reads as one row; higher ranks fold trailing axes into columns."""
    if len(shape) == 2:
        return shape
    if len(shape) < 2:
        return (1, int(math.prod(shape)))
    return (shape[0], int(math.prod(shape[1:])))


# -- summaries ---------------------------------------------------------------------------


@dataclass
class BackendRun:
    """Every check one backend was asked for, and what it runs on."""

    backend: str
    runs_on: str
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""

    def counts(self) -> dict[str, int]:
        c = {s: 0 for s in STATUSES}
        for r in self.results:
            c[r.status] += 1
        c["checks"] = len(self.results)
        c["mismatched_elements"] = sum(r.mismatches for r in self.results)
        return c

    def skip_reasons(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for r in self.results:
            if r.status == "skip":
                out[r.message] += 1
        return dict(out)

    def by_kernel(self) -> dict[str, dict[str, float]]:
        """Counts per GEMV kernel, and per host format set (``host:tables`` ...)."""
        out: dict[str, dict[str, float]] = {}
        for r in sorted(self.results, key=_row_order):
            d = out.setdefault(_row_key(r), {s: 0 for s in STATUSES} | {"mismatched": 0, "s": 0.0})
            d[r.status] += 1
            d["mismatched"] += r.mismatches
            d["s"] += r.seconds
        return out


def _row_key(r: CheckResult) -> str:
    if r.kernel.startswith("host:"):
        return "host:" + r.case.split("/", 1)[0]
    return r.kernel


def _row_order(r: CheckResult) -> tuple:
    from .gen import KERNELS

    key = _row_key(r)
    return (
        (0, key) if key.startswith("host:") else (1, KERNELS.index(key) if key in KERNELS else 99)
    )


def summary_text(runs: list[BackendRun], problems: list[str], by_kernel: bool = True) -> str:
    """The human report: per-kernel rows, per-backend totals, skips with reasons, verdict."""
    lines = []
    if by_kernel:
        lines.append(
            f"{'backend':10} {'kernel / host format set':28} {'checks':>6} {'pass':>6} {'fail':>5} "
            f"{'error':>5} {'skip':>5} {'mism.elems':>10} {'time s':>7}"
        )
        for run in runs:
            for kernel, d in run.by_kernel().items():
                lines.append(
                    f"{run.backend:10} {kernel:28} {sum(d[s] for s in STATUSES):6d} "
                    f"{d['pass']:6d} {d['fail']:5d} {d['error']:5d} {d['skip']:5d} "
                    f"{d['mismatched']:10d} {d['s']:7.1f}"
                )
        lines.append("")
    lines.append(
        f"{'backend':10} {'runs on':28} {'checks':>6} {'pass':>6} {'fail':>5} {'error':>5} "
        f"{'skip':>5} {'mism.elems':>10} {'time s':>7}"
    )
    for run in runs:
        c = run.counts()
        lines.append(
            f"{run.backend:10} {run.runs_on:28} {c['checks']:6d} {c['pass']:6d} {c['fail']:5d} "
            f"{c['error']:5d} {c['skip']:5d} {c['mismatched_elements']:10d} {run.seconds:7.1f}"
        )
    for run in runs:
        if run.note:
            lines.append(f"note [{run.backend}]: {run.note}")
        if not run.counts()["pass"] and not any(r.status in ("fail", "error") for r in run.results):
            lines.append(f"note [{run.backend}]: no check of the selection ran on this backend")
        for reason, n in run.skip_reasons().items():
            lines.append(f"skipped [{run.backend}]: {n} checks: {reason}")
    for p in problems:
        lines.append(f"TAMPERED/UNUSABLE: {p}")
    lines.append(verdict(runs, problems))
    return "\n".join(lines)


def verdict(runs: list[BackendRun], problems: list[str]) -> str:
    total = sum(r.counts()["checks"] for r in runs)
    bad = sum(r.counts()["fail"] + r.counts()["error"] for r in runs)
    skipped = sum(r.counts()["skip"] for r in runs)
    passed = sum(r.counts()["pass"] for r in runs)
    if problems or bad:
        why = []
        if bad:
            why.append(f"{bad} of {total} checks failed")
        if problems:
            why.append(f"{len(problems)} golden file(s) tampered or unusable")
        return "FAIL: " + "; ".join(why)
    tail = f", {skipped} skipped (reasons above)" if skipped else ""
    if not passed:
        return f"FAIL: nothing was checked (0 checks ran{tail}): zero checks is not a pass"
    return f"PASS: {passed} checks bit-exact{tail}"


def exit_code(runs: list[BackendRun], problems: list[str]) -> int:
    """0: every run check bit-exact; 1: a check failed or errored, or none ran; 2: golden data
    tampered or unusable."""
    if problems:
        return 2
    if any(r.status in ("fail", "error") for run in runs for r in run.results):
        return 1
    if not any(r.status == "pass" for run in runs for r in run.results):
        return 1
    return 0

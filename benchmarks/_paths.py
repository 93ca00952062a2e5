"""Where the benchmark scripts write by default: a new run folder ``results/<date>_<what>/``.

One folder per run (benchmarks/README.md, "Results"); a run folder gets a README.md saying
what was run, on what, and when.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def dated(what: str, day: date | None = None) -> Path:
    """``benchmarks/results/YYYY-MM-DD_<what>`` for today (or ``day``)."""
    return RESULTS / f"{(day or date.today()).isoformat()}_{what}"

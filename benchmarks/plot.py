"""Roofline-style plots of a ``q2gemv bench`` CSV: the command line of :mod:`q2gemv.bench.plot`.

    python3 benchmarks/plot.py benchmarks/results/2026-11-30_matrix_v4b/h200_gemv.csv --out benchmarks/results/2026-11-30_matrix_v4b/h200_gemv.png

(``q2gemv bench --plot`` draws the same figures from the run it made.)
"""

from __future__ import annotations

import sys

from q2gemv.bench.plot import main, plot, plot_tiers

__all__ = ["main", "plot", "plot_tiers"]

if __name__ == "__main__":
    sys.exit(main())

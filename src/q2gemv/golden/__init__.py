"""Golden vectors: shipped data + a harness that proves every backend bit-exact.

Layout of this package:

* ``data/`` — the golden files and ``manifest.json`` (sha256, size, format
  and generator versions, generator parameters); see :mod:`.suite` for the
  file list and :mod:`.store` for the manifest.
* :mod:`.gen` — the deterministic input generator and the suite definition.
* :mod:`.suite` — loading (after the integrity check) and selection.
* :mod:`.host` — host checks of the format code (tables, ggml, round trips).
* :mod:`.harness` — running checks on a backend (reference, GPU, simulator).
* :mod:`.report` — results, the summary table, JSON.
* :mod:`.regen` — ``q2gemv golden regen``.

Typical use::

    from q2gemv import golden
    s = golden.load_suite()                      # raises nothing; s.problems lists bad files
    sel = golden.Selection.parse(["small"])
    run = golden.run_backend(s, sel, "reference")
    print(golden.summary_text([run], s.problems))
"""

from __future__ import annotations

from .harness import run_backend, run_gemv_checks
from .report import BackendRun, CheckResult, summary_text
from .store import GoldenError, GoldenIntegrityError
from .suite import Selection, Suite, load_suite

__all__ = [
    "BackendRun",
    "CheckResult",
    "GoldenError",
    "GoldenIntegrityError",
    "Selection",
    "Suite",
    "load_suite",
    "run_backend",
    "run_gemv_checks",
    "summary_text",
]

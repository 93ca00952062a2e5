"""Time Q2_0 kernel candidates that are not registered, beside the registered kernels (GPU only).

    python3 benchmarks/candidates.py bench --out DIR [run_h200.py arguments ...]
    python3 benchmarks/candidates.py check [scripts/h200_check.py arguments ...]

Each candidate is a :func:`q2gemv.cuda.q2_0._make_vec_body` setting (rows per
warp, activation rows per launch, words in flight). This script registers
them in ``q2_0.KERNELS`` and ``launch.Q2_ROWS_PER_CTA`` for this process
only, then runs ``benchmarks/run_h200.py``, so torch bf16 and the read
ceiling are timed in the same run (``bench``), or ``scripts/h200_check.py``,
which compares every kernel, candidates included, bit for bit with the NumPy
reference on model shapes (``check``). Every candidate keeps the per-row order
of ``q2_0_gemv_vec``: that function is its reference.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from q2gemv import launch
from q2gemv.cuda import q2_0

HERE = Path(__file__).resolve().parent
# name -> (max_m, rows per warp, words in flight or None for the default, compiled per M)
CANDIDATES: dict[str, tuple[int, int, int | None, bool]] = {
    # 2 rows per warp at M=1 (since v4b the same build as q2_0_gemv_vec_batchm_rt2 at M=1)
    "cand_vec_rt2": (1, 2, None, False),
    "cand_batchm_rt4": (8, 4, None, True),
    # batchm_rt2 as before v4b: one build for every M, run-time row guards
    "cand_batchm_rt2_guarded": (8, 2, None, False),
}


def register() -> None:
    for name, (max_m, t, words, per_m) in CANDIDATES.items():

        def factory(m, mm=max_m, t=t, u=words, per_m=per_m):
            return q2_0._make_vec_body(m if per_m else mm, t, u, exact_m=per_m)

        q2_0.KERNELS[name] = (factory, max_m, per_m)
        launch.Q2_ROWS_PER_CTA[name] = 8 * t
    q2_0.ALIGNED_A_KERNELS |= set(CANDIDATES)


SCRIPTS = {"bench": HERE / "run_h200.py", "check": HERE.parent / "scripts" / "h200_check.py"}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in SCRIPTS:
        print(__doc__, file=sys.stderr)
        return 2
    register()
    script = SCRIPTS[sys.argv[1]]
    sys.argv = [str(script), *sys.argv[2:]]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())

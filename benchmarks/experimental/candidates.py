"""Time Q2_0 kernel candidates that are not registered, beside the registered kernels (GPU only).

    python3 benchmarks/experimental/candidates.py bench --out DIR [run_h200.py arguments ...]
    python3 benchmarks/experimental/candidates.py check [scripts/h200_check.py arguments ...]

Each candidate is a :func:`q2gemv.cuda.q2_0.seed._make_vec_body` setting (rows per
warp, activation rows per launch, words in flight). This script registers
them in the kernel registry (:func:`q2gemv.dispatch.registry.register`, ``golden=False``)
for this process only, then runs ``benchmarks/run_h200.py``, so torch bf16 and the read
ceiling are timed in the same run (``bench``), or ``scripts/h200_check.py``,
which compares every kernel, candidates included, bit for bit with the NumPy
reference on model shapes (``check``). Every candidate keeps the per-row order
of ``q2_0_gemv_vec``: that function is its reference.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from q2gemv.dispatch import registry as kernels

HERE = Path(__file__).resolve().parent
# name -> (max_m, rows per warp, words in flight or None for the default, compiled per M)
CANDIDATES: dict[str, tuple[int, int, int | None, bool]] = {
    # 2 rows per warp at M=1 (since v4b the same build as q2_0_gemv_vec_batchm_rt2 at M=1)
    "cand_vec_rt2": (1, 2, None, False),
    "cand_batchm_rt4": (8, 4, None, True),
    # batchm_rt2 as before v4b: one build for every M, run-time row guards
    "cand_batchm_rt2_guarded": (8, 2, None, False),
}


def candidate_spec(name: str, max_m: int, t: int, words: int | None, per_m: bool):
    """The registry spec of one candidate: the vec template, q2_0_gemv_vec's per-row order."""
    return kernels.KernelSpec(
        name, "q2_0", "seed", "q2gemv.reference.q2_0.q2_0_gemv_vec", "q2_0_vec",
        rows_per_cta=8 * t, max_m=max_m, per_m=per_m, a_align=16, rows_per_warp=t,
        words=words, golden=False,
    )  # fmt: skip


def register() -> None:
    for name, (max_m, t, words, per_m) in CANDIDATES.items():
        kernels.register(candidate_spec(name, max_m, t, words, per_m), replace=True)


BENCH = HERE.parent  # benchmarks/
SCRIPTS = {"bench": BENCH / "run_h200.py", "check": BENCH.parent / "scripts" / "h200_check.py"}


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

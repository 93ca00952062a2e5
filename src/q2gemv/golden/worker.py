"""Simulator worker: ``python -m q2gemv.golden.worker`` (started by the harness, not by hand).

Reads one JSON job on stdin, ``{"data_dir": ..., "checks": [[file, case_id, kernel], ...]}``,
runs each check on the cuda backend of THIS process (the parent sets
``NUMBA_ENABLE_CUDASIM=1`` so numba picks the simulator at import) and
writes one line per result on stdout: ``Q2GEMV-GOLDEN-RESULT {json}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> int:
    from .harness import RESULT_PREFIX, Runner, run_gemv_checks
    from .suite import load_gemv_file

    job = json.load(sys.stdin)
    data_dir = Path(job["data_dir"])
    cases = {}
    for name in sorted({f for f, _, _ in job["checks"]}):
        for c in load_gemv_file(data_dir, name):
            cases[c.id] = c
    runner = Runner("cuda")
    for _, case_id, kernel in job["checks"]:
        (r,) = run_gemv_checks([(cases[case_id], kernel)], "cuda", runner=runner)
        print(RESULT_PREFIX + json.dumps(r.to_json()), flush=True)
    runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

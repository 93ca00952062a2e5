#!/usr/bin/env bash
# Every GPU correctness check in one device call, run side by side (not timings).
#
#   OUT=/some/dir bash scripts/h200_validate.sh [SECONDS]
#
# Starts, in parallel, each under `timeout SECONDS` (default 540):
#   check      scripts/h200_check.py: every kernel on 5120x5120, 17408x5120, 5120x17408
#   verify     q2gemv verify --brief on the GPU (golden vectors)
#   pytest-seed the GPU tests of the seed contract's kernels (Q2_0 and W4A16)
#   pytest     the GPU tests: golden, the exact Q2_0 kernels (8-row and batched), the
#              simulator-lock and thread runtime tests, a compiled model's decode against
#              eager (the seed tests had this slot once; side by side with the sanitizers
#              they needed more than 375 s together)
#   pytest-api the GPU tests of the public paths: exact kernels' twins, fp16 activations
#              (the contract's device functions, both exact kernels), torch modules
#              (eager, torch.compile, CUDA graphs), launch cache, device weights, interop
#   fuzz       the gpu-marked hypothesis properties (larger shapes, more examples)
#   san-race-* compute-sanitizer racecheck, split in two halves by kernel family
#   san-mem    compute-sanitizer memcheck (its own job: sharing a slot with the other
#              two tools it ran out of time once the batched kernels were built per M)
#   san-other  compute-sanitizer initcheck, synccheck
# Logs go to $OUT/<job>.log; a table of exit codes (124 = hit the limit) is printed last.
# The jobs share the GPU, so nothing here may be read as a timing.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/h200_validate}
LIMIT=${1:-540}
mkdir -p "$OUT"
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1

declare -A CMD=(
  [check]="python3 scripts/h200_check.py --out $OUT"
  [verify]="python3 -m q2gemv.cli verify --brief"
  [pytest-seed]="python3 -m pytest -q -p no:cacheprovider tests/cuda/q2_0/test_seed.py tests/cuda/nvfp4/test_seed.py"
  [pytest]="python3 -m pytest -q -p no:cacheprovider tests/golden/test_harness.py tests/cuda/q2_0/test_exact.py tests/cuda/q2_0/test_exact_batched.py tests/host/test_backends.py tests/models/test_compile.py"
  [pytest-api]="python3 -m pytest -q -p no:cacheprovider tests/cuda/runtime/test_dev.py tests/cuda/nvfp4/test_exact.py tests/cuda/test_exact_contract.py tests/cuda/test_exact_fp16.py tests/nn/test_torch.py tests/cuda/runtime/test_launch_cache.py tests/host/test_device.py tests/cuda/runtime/test_interop.py tests/test_api.py"
  [fuzz]="python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fuzz.py --hypothesis-show-statistics"
  [san-race-q2]="python3 scripts/sanitize_h200.py --tools racecheck --families q2_0,q2_0_exact,q2_0_exact_wide --timeout $((LIMIT - 20)) --log-dir $OUT"
  [san-race-w4]="python3 scripts/sanitize_h200.py --tools racecheck --families w4a16,w4a16_exact --timeout $((LIMIT - 20)) --log-dir $OUT"
  [san-mem]="python3 scripts/sanitize_h200.py --tools memcheck --timeout $((LIMIT - 20)) --log-dir $OUT"
  [san-other]="python3 scripts/sanitize_h200.py --tools initcheck,synccheck --timeout $(((LIMIT - 30) / 2)) --log-dir $OUT"
)
declare -A PID
t0=$SECONDS
for job in "${!CMD[@]}"; do
  timeout "$LIMIT" bash -c "${CMD[$job]}" >"$OUT/$job.log" 2>&1 &
  PID[$job]=$!
done
printf '%-12s %4s %9s  %s\n' job rc done_by_s "last line"
for job in check verify pytest-seed pytest pytest-api fuzz san-race-q2 san-race-w4 san-mem san-other; do
  wait "${PID[$job]}"
  rc=$?
  printf '%-12s %4s %9s  %s\n' "$job" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$OUT/$job.log" | cut -c1-90)"
done

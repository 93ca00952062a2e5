"""Run golden checks on a backend: the NumPy reference, or the numba kernels (GPU or simulator).

* ``reference``: every selected check, in this process. Host format checks
  belong here too (they are NumPy code).
* ``cuda`` on a GPU: every selected GEMV check, in this process.
* ``cuda`` without a GPU (or with ``NUMBA_ENABLE_CUDASIM=1`` set): the CUDA
  simulator, which numba selects once, at import, so it runs in worker
  subprocesses started with ``NUMBA_ENABLE_CUDASIM=1`` (``jobs`` of them,
  sharded by an estimate of each check's cost). It runs only the checks of
  size class ``small``; the others are reported as skipped, with the reason.

Nothing here imports numba unless a cuda check runs in this process.
"""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..dispatch import registry
from ..host.backends import gpu_present, simulator_requested
from . import gen, host
from .report import BackendRun, CheckResult, result_from_bits
from .suite import GemvCase, HostCase, Selection, Suite

BACKEND_NAMES = ("reference", "cuda")
RESULT_PREFIX = "Q2GEMV-GOLDEN-RESULT "
SIM_SIZES = ("small",)


def sim_skip_reason(size: str) -> str:
    return (
        f"size class '{size}' is not run on the CUDA simulator (one OS thread per CUDA "
        f"thread: far too slow); it runs on the reference and on a real GPU"
    )


def simulator_checks(gemv: Iterable[tuple[GemvCase, str]]) -> list[tuple[GemvCase, str]]:
    """The checks of ``gemv`` the simulator runs (size classes :data:`SIM_SIZES`)."""
    return [(c, k) for c, k in gemv if c.size_of(k) in SIM_SIZES]


def cuda_runs_on() -> str:
    """``"gpu"`` or ``"simulator"``: where the cuda backend runs, decided without importing numba."""
    if simulator_requested() or not gpu_present():
        return "simulator"
    return "gpu"


# -- one check -----------------------------------------------------------------------------------


def family_spec(case: GemvCase):
    """The registry's spec of the weight family ``case`` is built in."""
    return registry.family(gen.weight_format(case.family))


def reference_function(case: GemvCase, kernel: str):
    """The NumPy reference of ``kernel`` (its spec's; one function serves every NVFP4 tier)."""
    return family_spec(case).reference(kernel)


class Runner:
    """Computes a kernel's output bits for a case on one backend, reusing work across kernels.

    The reference computes once per (case, reference function): the NVFP4
    tiers share one. The cuda backend uploads each case's weight once.
    """

    def __init__(self, backend: str):
        if backend not in BACKEND_NAMES:
            raise ValueError(f"backend: expected one of {BACKEND_NAMES}, got {backend!r}")
        self.backend = backend
        self._case: GemvCase | None = None
        self._cache: dict = {}

    def _switch(self, case: GemvCase) -> None:
        if self._case is not case:
            if self._case is not None:
                self._case.release()
            self._case, self._cache = case, {}

    def __call__(self, case: GemvCase, kernel: str) -> np.ndarray:
        self._switch(case)
        act = gen.act_format(case.family)  # bf16, or fp16 for the *_fp16 families
        if self.backend == "reference":
            fn = reference_function(case, kernel)
            if fn not in self._cache:
                self._cache[fn] = fn(act.from_bits(case.a_bits()), case.weight()).view(np.uint16)
            return self._cache[fn]
        from ..host import call

        if "w" not in self._cache:
            contract = registry.get(kernel).contract  # every kernel of a case: one contract
            self._cache["w"] = family_spec(case).as_device_weight(case.weight(), 0, contract)
        bits = np.ascontiguousarray(case.a_bits())
        # the kernel's chunks (an exact kernel: its activation prepare once, then the chunks)
        return call.run_kernel(kernel, bits, self._cache["w"], act=act)

    def close(self) -> None:
        self._switch(None)  # type: ignore[arg-type]


def run_check(
    case: GemvCase, kernel: str, backend: str, runner: Callable[[GemvCase, str], np.ndarray]
) -> CheckResult:
    """One (case, kernel) check; exceptions (a kernel that raises, drifted inputs) become errors."""
    t0 = time.perf_counter()
    size = case.size_of(kernel)
    try:
        want = case.want(kernel)
        got = runner(case, kernel)
    except Exception as e:  # noqa: BLE001 - reported per check, the run goes on
        return CheckResult(
            case.id, kernel, backend, "error", elements=0, seconds=time.perf_counter() - t0,
            message=f"{type(e).__name__}: {e}", size=size,
        )  # fmt: skip
    return result_from_bits(case.id, kernel, backend, got, want, time.perf_counter() - t0, size)


# -- progress ---------------------------------------------------------------------------------


class Progress:
    """Progress lines on stderr: at most one per ``interval`` s, one as each kernel's checks are
    all done (a kernel set), plus every failure at once."""

    def __init__(
        self, label: str, total: int, stream, interval: float = 2.0, kernels: Iterable[str] = ()
    ):
        """``stream``: where lines go (None: nowhere); ``kernels``: the kernel of each check to
        run (a line when the last check of a kernel is in; none without them)."""
        self.label, self.total, self.interval = label, total, interval
        self.stream = stream
        self.done = self.bad = 0
        self.t0 = self.last = time.perf_counter()
        self.kernel_total = Counter(kernels)
        self.kernel_done: Counter = Counter()
        self.kernel_bad: Counter = Counter()

    def start(self, note: str = "") -> None:
        extra = f" ({note})" if note else ""
        self._print(f"[{self.label}] {self.total} checks to run{extra}")

    def update(self, r: CheckResult) -> None:
        self.done += 1
        self.bad += r.status in ("fail", "error")
        now = time.perf_counter()
        if r.status in ("fail", "error"):
            self._print(r.details())
        self.kernel_done[r.kernel] += 1
        self.kernel_bad[r.kernel] += r.status in ("fail", "error")
        if self.kernel_done[r.kernel] == self.kernel_total.get(r.kernel):
            self._print(
                f"[{self.label}] {r.kernel}: all {self.kernel_total[r.kernel]} checks done, "
                f"{self.kernel_bad[r.kernel]} failed ({self.done}/{self.total} in all, "
                f"{now - self.t0:.0f} s)"
            )
            self.last = now
            return
        if (
            r.status in ("fail", "error")
            or now - self.last >= self.interval
            or self.done == self.total
        ):
            self.last = now
            self._print(
                f"[{self.label}] {self.done}/{self.total} checks, {self.bad} failed, "
                f"{now - self.t0:.0f} s: {r.kernel} {r.case}"
            )

    def _print(self, line: str) -> None:
        if self.stream is not None:
            print(line, file=self.stream, flush=True)


# -- in-process runs -------------------------------------------------------------------------


def run_gemv_checks(
    checks: Iterable[tuple[GemvCase, str]],
    backend: str,
    *,
    runner: Callable[[GemvCase, str], np.ndarray] | None = None,
    progress: Progress | None = None,
) -> list[CheckResult]:
    """Run (case, kernel) checks in this process (``runner`` overrides the backend: tests)."""
    own = runner is None
    runner = Runner(backend) if own else runner
    out = []
    with warnings.catch_warnings():
        # tiny golden shapes launch few CTAs by design; numba warns on every such launch
        warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU")
        try:
            for case, kernel in checks:
                r = run_check(case, kernel, backend, runner)
                out.append(r)
                if progress:
                    progress.update(r)
        finally:
            if own:
                runner.close()
    return out


def run_host_cases(cases: Iterable[HostCase]) -> list[CheckResult]:
    return [r for c in cases for r in host.run_host_case(c)]


# -- the simulator in subprocesses ------------------------------------------------------------


# A simulator worker's start in seconds (Python, numba, the first kernel builds), from a
# 2-core CPU (docs/design_notes.md, golden).
SIM_START_S = 15.0
# Wall seconds per unit of sim_cost: the whole small set (sim_cost 455) took 125 s with 2
# workers on a 2-core machine (2026-12-03, once the simulator's poll loop stopped holding
# the GIL: cuda.runtime.twins; 3-4 min before).
SIM_SECONDS_PER_COST = 0.5


def sim_estimate_s(checks: list[tuple[GemvCase, str]], jobs: int) -> float:
    """Rough wall seconds of ``checks`` on the simulator with ``jobs`` workers on this CPU:
    :func:`sim_cost` per worker times :data:`SIM_SECONDS_PER_COST`, plus one worker start."""
    if not checks:
        return 0.0
    workers = max(1, min(jobs, os.cpu_count() or 1, len(checks)))
    cost = sum(sim_cost(c, k) for c, k in checks) / workers
    return cost * SIM_SECONDS_PER_COST + SIM_START_S


def sim_notice(checks: list[tuple[GemvCase, str]], jobs: int) -> str:
    """What the simulator run of ``checks`` costs, and the quick form, in one line."""
    s = sim_estimate_s(checks, jobs)
    took = f"about {s / 60:.0f} min" if s >= 90 else f"about {s:.0f} s"
    return (
        f"no GPU here: the cuda backend runs {len(checks)} checks on numba's CUDA simulator "
        f"(one OS thread per CUDA thread), {took} with {jobs} worker process(es) on "
        f"{os.cpu_count() or 1} CPU(s). The NumPy reference alone takes seconds: "
        f"q2gemv verify --backend reference"
    )


def sim_cost(case: GemvCase, kernel: str) -> float:
    """Rough seconds of one check on the simulator (for sharding only): launches x CTAs x rows."""
    s = case.spec
    if s.m == 0:
        return 0.05
    from ..dispatch.plan import Q2_ROWS_PER_CTA

    width = gen.MAX_M[kernel]
    cols = Q2_ROWS_PER_CTA.get(kernel, 16 if kernel.endswith(("_rt2", "_exact")) else 8)
    launches = math.ceil(s.m / width)
    return launches * math.ceil(s.n / cols) * (0.5 + 0.3 * min(s.m, width)) * (1 + s.k / 2048)


def shard(checks: list[tuple[GemvCase, str]], jobs: int) -> list[list[tuple[GemvCase, str]]]:
    """Longest-first greedy split of the checks into ``jobs`` shards of similar estimated cost."""
    shards: list[list] = [[] for _ in range(max(1, jobs))]
    load = [0.0] * len(shards)
    for c in sorted(checks, key=lambda ck: -sim_cost(*ck)):
        i = load.index(min(load))
        shards[i].append(c)
        load[i] += sim_cost(*c)
    return [s for s in shards if s]


def _reader(proc: subprocess.Popen, q: queue.Queue, idx: int) -> None:
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith(RESULT_PREFIX):
            q.put((idx, CheckResult.from_json(json.loads(line[len(RESULT_PREFIX) :]))))
    q.put((idx, None))


def run_simulator_subprocesses(
    checks: list[tuple[GemvCase, str]],
    data_dir: Path,
    jobs: int,
    progress: Progress | None = None,
) -> list[CheckResult]:
    """Run checks under ``NUMBA_ENABLE_CUDASIM=1`` in ``jobs`` worker processes."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    procs, stderr_files = [], []
    q: queue.Queue = queue.Queue()
    shards = shard(checks, jobs)
    for i, part in enumerate(shards):
        job = {"data_dir": str(data_dir), "checks": [[c.file, c.id, k] for c, k in part]}
        ef = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - read after the worker exits
        p = subprocess.Popen(
            [sys.executable, "-m", "q2gemv.golden.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=ef,
            env=env,
            text=True,
        )
        p.stdin.write(json.dumps(job))  # type: ignore[union-attr]
        p.stdin.close()  # type: ignore[union-attr]
        procs.append(p)
        stderr_files.append(ef)
        threading.Thread(target=_reader, args=(p, q, i), daemon=True).start()
    got: dict[tuple[str, str], CheckResult] = {}
    open_ = len(procs)
    while open_:
        idx, r = q.get()
        if r is None:
            open_ -= 1
            continue
        got[(r.case, r.kernel)] = r
        if progress:
            progress.update(r)
    out = []
    for i, (p, part) in enumerate(zip(procs, shards, strict=True)):
        rc = p.wait()
        stderr_files[i].seek(0)
        tail = stderr_files[i].read()[-1500:]
        stderr_files[i].close()
        for c, k in part:
            r = got.get((c.id, k))
            if r is None:
                r = CheckResult(
                    c.id, k, "cuda", "error", size=c.size_of(k),
                    message=f"simulator worker exited with status {rc} before this check; "
                    f"its stderr ends: {tail.strip()[-600:]}",
                )  # fmt: skip
                if progress:
                    progress.update(r)
            out.append(r)
    return out


# -- one backend over a selection -------------------------------------------------------------------


def _device_name() -> str:
    try:
        from numba import cuda

        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception as e:  # noqa: BLE001 - only a label
        return f"unknown ({type(e).__name__})"


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def run_backend(
    suite: Suite,
    selection: Selection,
    backend: str,
    *,
    jobs: int | None = None,
    progress_stream=None,
    quiet: bool = False,
) -> BackendRun:
    """Run every selected check that ``backend`` serves; the simulator skips non-small sizes."""
    t0 = time.perf_counter()
    gemv = selection.gemv_checks(suite)
    stream = None if quiet else (progress_stream or sys.stderr)
    if backend == "reference":
        run = BackendRun("reference", "NumPy (this process)")
        hosts = run_host_cases(selection.host_cases(suite))
        bad = sum(not r.ok for r in hosts)
        prog = Progress("reference", len(gemv), stream, kernels=(k for _, k in gemv))
        prog.start(f"after {len(hosts)} host format checks, {bad} failed")
        for r in hosts:
            if not r.ok:
                prog._print(r.details())
        run.results = hosts + run_gemv_checks(gemv, "reference", progress=prog)
    else:
        where = cuda_runs_on()
        if where == "gpu":
            run = BackendRun("cuda", "GPU (this process)")
            prog = Progress("cuda/gpu", len(gemv), stream, kernels=(k for _, k in gemv))
            prog.start()
            run.results = run_gemv_checks(gemv, "cuda", progress=prog)
            run.runs_on = f"GPU: {_device_name()}"
        else:
            jobs = jobs or default_jobs()
            todo = simulator_checks(gemv)
            skipped = [
                CheckResult(
                    c.id,
                    k,
                    "cuda",
                    "skip",
                    size=c.size_of(k),
                    message=sim_skip_reason(c.size_of(k)),
                )  # fmt: skip
                for c, k in gemv
                if c.size_of(k) not in SIM_SIZES
            ]
            run = BackendRun("cuda", f"CUDA simulator ({jobs} processes)")
            prog = Progress("cuda/simulator", len(todo), stream, kernels=(k for _, k in todo))
            prog.start(
                f"{len(skipped)} larger checks skipped on the simulator; "
                f"about {sim_estimate_s(todo, jobs) / 60:.1f} min"
            )
            ran = run_simulator_subprocesses(todo, suite.data_dir, jobs, prog) if todo else []
            run.results = ran + skipped
    run.seconds = time.perf_counter() - t0
    return run

"""The GPU half of ``q2gemv bench``: rotated buffers, timed cases, read ceiling, host overhead.

:func:`execute` takes the settings and the case list of :mod:`q2gemv.bench`
and returns a :class:`~q2gemv.bench.Report`. Each (family, N, K, group)
gets a :class:`_Pool` of C rotated copies (weight, activations [max M, K],
output [max M, N]); every case on it is a sequence of calls, call i on copy
i mod C, each call the pre-bound launches of its row chunks (or one torch
``F.linear``), timed by the timer of :mod:`q2gemv.bench.timing`.

Runs on the GPU; under the CUDA simulator (or ``--dry-run``) every case is
launched once and checked, nothing is timed, torch is not used.
"""

from __future__ import annotations

import functools
import gc
import sys
import time
import traceback
import warnings

import numpy as np
from numba import config, cuda

from .. import api
from ..cuda.q2_0 import seed as q2cuda
from ..cuda.runtime import launcher, prebound
from ..dispatch import registry
from ..formats.bf16 import BF16
from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK
from ..formats.q2_0 import Q2Weight, block_bytes
from . import timing
from .formulas import (
    H200_FALLBACK,
    NVFP4_GROUP,
    TORCH_KERNEL,
    calls_per_graph,
    rotation_copies,
    weight_bytes,
)
from .matrix import Q2_BATCHM, Case, Settings
from .results import PREBOUND_PATH, Report, _f, base_meta, case_row, derive, progress_line

SIMULATED: bool = bool(config.ENABLE_CUDASIM)
CEILING_CALLS = 8  # reads of the 2 GiB buffer per timed sequence
SIM_CEILING_BYTES = 4096  # one CTA of the one-load-per-thread kernel under the simulator
REFERENCE_MAX_NK = 1 << 20
# Host launch cost does not depend on the shape; a small one keeps each kernel
# (~3-5 us) near the host's pace, so the launch queue never fills and blocks.
OVERHEAD_SHAPE = (2048, 2048)
GRAPH_CHECK_FILL = 0xFFFF  # the output is pre-filled with this; a launch must overwrite it
_PREBIND_FAILED: str | None = None  # why the cases fell back to dispatcher launches, if they did


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


# -- device facts -----------------------------------------------------------------------


class _Env:
    """Device facts, torch (optional) and the timer of this run."""

    def __init__(self, st: Settings, notes: list[str]):
        self.notes = notes
        self.simulated = SIMULATED
        self.dry = st.dry_run or SIMULATED
        if SIMULATED and not st.dry_run:
            notes.append("CUDA simulator: forced --dry-run (nothing timed)")
        if not SIMULATED and not cuda.is_available():
            raise RuntimeError(
                "q2gemv bench needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1 --dry-run)"
            )
        try:
            if not SIMULATED:
                cuda.current_context()
            dev = cuda.get_current_device()
        except Exception as e:  # noqa: BLE001 - driver/context errors become one line
            raise RuntimeError(f"q2gemv bench: no usable CUDA device ({_short(e)})") from e
        self.device = _device_name(dev)
        if SIMULATED:  # no SMs, no clock: never borrow the H200's numbers for a simulator run
            self.sms, self.sms_source = None, "simulator (no SMs)"
            self.clock_hz, self.clock_source = None, "simulator (no clock)"
        else:
            self.sms, self.sms_source = _attr(dev, "MULTIPROCESSOR_COUNT", H200_FALLBACK["sms"])
            clock_khz, self.clock_source = _attr(dev, "CLOCK_RATE", H200_FALLBACK["clock_khz"])
            self.clock_hz = clock_khz * 1e3
        if st.clock_hz:
            self.clock_hz, self.clock_source = st.clock_hz, "--clock-mhz"
        l2, self.l2_source = _attr(dev, "L2_CACHE_SIZE", H200_FALLBACK["l2_bytes"])
        if st.l2_bytes:
            l2, self.l2_source = st.l2_bytes, "--l2-mib"
        elif SIMULATED:
            l2, self.l2_source = 1, "simulator: 1 byte, so every pool rotates 2 copies"
        self.l2_bytes = int(l2)
        self.torch = None
        if st.torch and not SIMULATED:
            try:
                import torch

                if torch.cuda.is_available():
                    self.torch = torch
                else:
                    notes.append("torch sees no GPU: bf16 rows and graph checks skipped")
            except ImportError as e:
                notes.append(f"torch unavailable ({e}): bf16 rows and graph checks skipped")
        self.graph_timer = None
        if self.torch is not None:
            self.graph_timer = timing.GraphTimer()
        self.timer = self._pick_timer(st.timing)

    def _pick_timer(self, want: str):
        if self.dry:
            return timing.EagerOnce()
        if want == "graph" and self.graph_timer is not None:
            return self.graph_timer
        if want == "graph":
            self.notes.append(
                "no torch: timing with launches behind a spin kernel instead of graphs"
            )
        stream = self.graph_timer.stream if self.graph_timer is not None else None
        return timing.SleepTimer(stream)

    def fall_back_to_sleep(self, why: str) -> None:
        if isinstance(self.timer, timing.GraphTimer):
            self.notes.append(f"graph capture failed ({why}): timing behind a spin kernel instead")
            self.timer = timing.SleepTimer(self.graph_timer.stream)


def _device_name(dev) -> str:
    try:
        name = dev.name
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - the simulator's device has no name
        return "CUDA simulator" if SIMULATED else "unknown"


def _attr(dev, name: str, fallback):
    try:
        return int(getattr(dev, name)), "device"
    except Exception:  # noqa: BLE001 - simulator, or an attribute a driver dropped
        return int(fallback), f"assumed H200 value (device attribute {name} unavailable)"


# -- pools of rotated copies --------------------------------------------------------------


def _bf16_acts(rng, rows: int, k: int) -> np.ndarray:
    return rng.standard_normal((rows, k)).astype(np.float32).astype(BF16).view(np.uint16)


class _Pool:
    """C copies of (weight, activations, output) for one (family, N, K, group)."""

    family: str
    key: tuple = ()

    def __init__(self, n: int, k: int, group: int, max_m: int, l2_bytes: int):
        self.n, self.k, self.group, self.max_m = n, k, group, max_m
        self.per_copy = weight_bytes(self.family, n, k, group) + max_m * k * 2 + max_m * n * 2
        self.copies = rotation_copies(self.per_copy, l2_bytes)

    @property
    def rotated_mib(self) -> float:
        return self.copies * self.per_copy / 2**20

    def call(self, case: Case, j: int):
        raise NotImplementedError

    def check(self, case: Case, reference: bool) -> str:
        return ""


class _KernelPool(_Pool):
    """numba kernels: device weights via the family's upload, launches pre-bound."""

    def __init__(self, n, k, group, max_m, l2_bytes, rng):
        super().__init__(n, k, group, max_m, l2_bytes)
        self.host_weight = self._host_weight(rng)
        self.host_a = _bf16_acts(rng, max_m, k)
        self.dw = [self._upload(self.host_weight) for _ in range(self.copies)]
        self.a = [cuda.to_device(self.host_a) for _ in range(self.copies)]
        self.out = [cuda.device_array((max_m, n), dtype=np.uint16) for _ in range(self.copies)]
        cuda.synchronize()

    @staticmethod
    def _prebind(name, a, dw, out, rows, stream=0):
        """The pre-bound launch of seed kernel ``name`` on exactly these arrays (the launcher's)."""
        return launcher.prebind([launcher.seed_launch(name, a, dw, out, rows)], stream)[0]

    @staticmethod
    def _launch_raw(name, a, dw, out, rows, stream=0):
        """The same launch through numba's dispatcher (the family's ``launch_raw``)."""
        registry.family(registry.get(name).family).seed().launch_raw(name, a, dw, out, rows, stream)

    @staticmethod
    def _plan_launches(family, plan, a, dw, out, stream=0) -> list[tuple]:
        """The launcher's validated launches of ``plan`` ((row0, rows, kernel), ...) on
        ``a`` [M, K] into ``out`` [M, N]: the public call's. An exact-contract plan starts
        with its family's prepare over all M rows (its workspace allocated here, once)."""
        contract = registry.get(plan[0][2]).contract
        return launcher.launches(family, contract, plan, dw, a, out, stream)

    def call(self, case: Case, j: int):
        m = case.m
        launches = self._plan_launches(
            self.family, case.launches, self.a[j][:m], self.dw[j], self.out[j][:m]
        )
        pbs = self._launcher(launches)
        if len(pbs) == 1:
            return pbs[0]

        def call(h, pbs=pbs):
            for pb in pbs:
                pb(h)

        return call

    def _launcher(self, launches: list[tuple]) -> list:
        """The pre-bound launches; if they cannot be built, the dispatcher path, said once in notes.

        GPU times do not depend on the host path (graph replays, or calls queued
        behind a spin kernel); only the host-cost table does, and it says so.
        """
        global _PREBIND_FAILED
        try:
            return launcher.prebind(launches)
        except Exception as e:  # noqa: BLE001 - bad rows/shapes would fail launch_raw too
            if _PREBIND_FAILED is None:
                _PREBIND_FAILED = f"{launches[-1][4]}: {_short(e)}"
                _log(f"pre-bound launch unavailable ({_PREBIND_FAILED}): dispatcher launches")

        def call(h, launches=launches):
            launcher.launch_all(launches, cuda.external_stream(h) if h else 0)

        return [call]

    def check(self, case: Case, reference: bool) -> str:
        """Copy 0's output (left by the timed calls) vs an eager launch of the same plan."""
        m = case.m
        got = self.out[0][:m].copy_to_host()
        d_chk = cuda.device_array((m, self.n), dtype=np.uint16)
        launcher.launch_all(
            self._plan_launches(self.family, case.launches, self.a[0][:m], self.dw[0], d_chk)
        )
        want = d_chk.copy_to_host()
        bad = int(np.count_nonzero(got != want))
        if bad:
            return f"MISMATCH vs eager launch: {bad}/{want.size}"
        if reference:
            ref = self._reference(case).view(np.uint16)
            bad = int(np.count_nonzero(got != ref))
            if bad:
                return f"MISMATCH vs reference: {bad}/{ref.size}"
        return "ok"

    def _reference(self, case: Case) -> np.ndarray:
        """The NumPy reference of the case's kernel (every kernel of a plan gives its bits)."""
        fn = registry.family(self.family).reference(case.launches[0][2])
        return fn(self.host_a[: case.m].view(BF16), self.host_weight)


class _Q2Pool(_KernelPool):
    family = "q2_0"

    def _host_weight(self, rng) -> Q2Weight:
        n, k, g = self.n, self.k, self.group
        nblk, bb = n * (k // g), block_bytes(g)
        raw = np.empty((nblk, bb), dtype=np.uint8)
        raw[:, 2:] = rng.integers(0, 256, (nblk, bb - 2), dtype=np.uint8)  # codes 0..3, code 3 too
        d = rng.uniform(0.004, 0.04, nblk).astype(np.float16)
        raw[:, :2] = d.view(np.uint8).reshape(nblk, 2)
        return Q2Weight.from_bytes(raw.reshape(-1), n, k, g)

    @staticmethod
    def _upload(w):
        return q2cuda.DeviceQ2Weight.upload(w)


class _Nvfp4Pool(_KernelPool):
    family = "w4a16"

    def _host_weight(self, rng):
        from ..formats.nvfp4 import Nvfp4Weight

        n, k = self.n, self.k
        packed = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)  # every E2M1 code, -0 too
        # E4M3 exponent fields 4..11: scales 2^-3 .. 2^4 * 1.875, never NaN
        scales = rng.integers(0x20, 0x60, (n, k // NVFP4_BLOCK), dtype=np.uint8)
        return Nvfp4Weight(packed, scales, 0.01)

    @staticmethod
    def _upload(w):
        from ..cuda.nvfp4 import seed as w4a16

        return w4a16.DeviceNvfp4Weight.upload(w)


# The pool of each weight family's cases (a case of another family, "bf16", is torch's).
_POOLS: dict[str, type[_KernelPool]] = {pool.family: pool for pool in (_Q2Pool, _Nvfp4Pool)}


class _TorchPool(_Pool):
    """torch bf16 weights [N, K] and activations, ``F.linear`` per call."""

    family = "bf16"

    def __init__(self, n, k, group, max_m, l2_bytes, torch):
        super().__init__(n, k, group, max_m, l2_bytes)
        self.torch = torch
        gen = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        w0 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
        a0 = torch.randn(max_m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.w = [w0] + [w0.clone() for _ in range(self.copies - 1)]
        self.a = [a0] + [a0.clone() for _ in range(self.copies - 1)]
        torch.cuda.synchronize()

    def call(self, case: Case, j: int):
        linear = self.torch.nn.functional.linear
        a, w = self.a[j][: case.m], self.w[j]

        def call(h, a=a, w=w):
            linear(a, w)

        return call


def _pool_key(case: Case) -> tuple:
    return (case.family, case.n, case.k, case.group)


# -- one case -----------------------------------------------------------------------------


def _run_case(env: _Env, st: Settings, pool: _Pool, case: Case) -> dict:
    c = pool.copies
    n_calls = c if env.dry else calls_per_graph(c, st.min_calls)
    per_copy = [pool.call(case, j) for j in range(c)]
    seq = [per_copy[i % c] for i in range(n_calls)]
    try:
        t = env.timer.time_sequence(seq, st.repeats, st.warmup)
    except Exception as e:  # noqa: BLE001
        if not isinstance(env.timer, timing.GraphTimer):
            raise
        env.fall_back_to_sleep(_short(e))
        t = env.timer.time_sequence(seq, st.repeats, st.warmup)
    # the NumPy reference only where it is quick: dry runs on small shapes (the simulator)
    check = pool.check(case, reference=env.dry and case.n * case.k <= REFERENCE_MAX_NK)
    method = t.method + (f"; {t.starved} repeat(s) starved" if t.starved else "")
    ts = [x * 1e6 for x in t.per_call_s]
    return case_row(
        case,
        time_us=t.median_s * 1e6 if ts else None,
        time_min_us=min(ts) if ts else None,
        time_max_us=max(ts) if ts else None,
        repeats=len(ts),
        calls_per_graph=n_calls,
        copies=c,
        rotated_mib=pool.rotated_mib,
        check=check,
        timing=method,
    )


# -- read ceiling -------------------------------------------------------------------------------


def measure_ceiling(env: _Env, st: Settings, phase: str) -> list[dict]:
    nbytes = SIM_CEILING_BYTES if env.dry and SIMULATED else st.ceiling_bytes
    nbytes -= nbytes % 16
    buf = cuda.device_array(nbytes // 4, dtype=np.uint32)
    if SIMULATED:
        buf.copy_to_device(np.full(nbytes // 4, 0x5A5A5A5A, dtype=np.uint32))
    else:
        from numba.cuda.cudadrv import driver

        driver.device_memset(buf, 0x5A, nbytes)
    out = cuda.device_array(1, dtype=np.uint32)
    ctas = 1 if SIMULATED else env.sms * timing.READ_CTAS_PER_SM
    rows = []
    n_calls = 1 if env.dry else CEILING_CALLS
    for name, pb in timing.read_launches(buf, out, ctas).items():
        t = env.timer.time_sequence([pb] * n_calls, st.repeats, st.warmup)
        rows.append(_ceiling_row(phase, name, nbytes, t, "read"))
    if env.torch is not None and not env.dry:
        torch = env.torch
        half = nbytes // 2
        src = torch.full((half,), 7, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)

        def copy(h):
            dst.copy_(src)

        t = env.timer.time_sequence([copy] * n_calls, st.repeats, st.warmup)
        rows.append(_ceiling_row(phase, "torch_copy", 2 * half, t, "read+write"))
        del src, dst
    del buf
    return rows


def _ceiling_row(phase, method, nbytes, t: timing.Timing, counted) -> dict:
    s = t.median_s
    ok = t.per_call_s and np.isfinite(s) and s > 0
    return dict(
        phase=phase,
        method=method,
        bytes=nbytes,
        time_us=s * 1e6 if ok else None,
        gbps=nbytes / s / 1e9 if ok else None,
        counted=counted,
        timing=t.method,
    )


# -- host overhead and graph capture ------------------------------------------------------------


def _overhead_kernels(cases: list[Case]) -> list[tuple[str, str, int]]:
    """(family, kernel, m) pairs to measure: the Q2_0 M=1 and batch kernels, one W4A16 tier."""
    have = {(c.family, r[2]) for c in cases for r in c.launches if c.family in _POOLS}
    want = [
        ("q2_0", "q2_0_gemv_vec", 1),
        ("q2_0", Q2_BATCHM, 1),
        ("w4a16", "w4a16_gemv_batch4", 4),
    ]
    return [w for w in want if (w[0], w[1]) in have]


def _public_gemv(a, dw, out, name, family, stream) -> None:
    numerics = registry.get(name).contract
    api.gemv(a, dw, out=out, kernel=name, stream=stream, numerics=numerics)


def host_overhead(env: _Env, st: Settings, cases: list[Case], rng) -> list[dict]:
    """Host us per launch: numba dispatcher, launch_raw, the pre-bound path and ``q2gemv.gemv``."""
    if env.dry:
        return []
    n, k = OVERHEAD_SHAPE
    rows = []
    stream = cuda.stream()
    for family, name, m in _overhead_kernels(cases):
        pool = _POOLS[family](
            n, k, _group(st, family), m, 0, rng
        )  # l2 = 0: 2 copies, only copy 0 used
        a, dw, out = pool.a[0][:m], pool.dw[0], pool.out[0][:m]
        pb = pool._prebind(name, a, dw, out, m, stream)
        paths = {
            # kernel[grid, block, stream](...): re-typed and re-marshalled on every call
            "numba dispatcher": functools.partial(
                _dispatch, _dispatcher(family, name, m), pb, stream
            ),
            "q2gemv launch_raw": functools.partial(
                _launch_raw_on, family, name, a, dw, out, m, stream
            ),
            PREBOUND_PATH: pb,
            # the public call of a decode loop: after its first call, a cache hit + pb's launch
            "q2gemv.gemv cached": functools.partial(_public_gemv, a, dw, out, name, family, stream),
        }
        for path, fn in paths.items():
            med, lo = timing.host_us_per_call(
                fn, st.overhead_calls, st.overhead_batches, stream.synchronize
            )
            rows.append(
                dict(
                    path=path,
                    kernel=name,
                    n=n,
                    k=k,
                    m=m,
                    calls=st.overhead_calls,
                    batches=st.overhead_batches,
                    us_per_call=med,
                    us_min=lo,
                )
            )
            _log(f"host launch cost {path:<20} {name:<24} {med:7.2f} us/call (min {lo:.2f})")
        del pool, pb, paths
    return rows


def _dispatch(disp, pb: prebound.PreboundLaunch, stream) -> None:
    disp[pb.griddim, pb.blockdim, stream](*pb.args)


def _dispatcher(family: str, name: str, m: int):
    return registry.family(family).seed().compiled(name, m)


def _launch_raw_on(family, name, a, dw, out, m, stream):
    _POOLS[family]._launch_raw(name, a, dw, out, m, stream)


def _group(st: Settings, family: str) -> int:
    """The block size of ``family``'s weights in this run (the first of ``--group`` if it has one)."""
    return st.groups[0] if registry.family(family).grouped else NVFP4_GROUP


def graph_check(env: _Env, st: Settings, cases: list[Case], rng) -> list[dict]:
    """Each kernel of the run: its pre-bound launches (an exact kernel's prepare first)
    enqueued on ``cuda.external_stream`` of the torch stream while torch captures them,
    replayed once, compared bit for bit with an eager launch into another buffer."""
    if env.dry or env.graph_timer is None:
        return []
    torch = env.torch
    gt = env.graph_timer
    n, k = st.shapes[0]
    names = list(
        dict.fromkeys((c.family, r[2]) for c in cases if c.family in _POOLS for r in c.launches)
    )
    pools: dict[str, _KernelPool] = {}
    rows = []
    for family, name in names:
        max_m = registry.get(name).max_m
        m = min(max_m, max(st.ms))
        row = dict(kernel=name, n=n, k=k, m=m, ok=False, mismatches=None, elements=m * n, detail="")
        try:
            if family not in pools:
                pools[family] = _POOLS[family](n, k, _group(st, family), 32, 0, rng)
            pool = pools[family]
            a, dw = pool.a[0][:m], pool.dw[0]
            out_g, out_e = pool.out[0][:m], pool.out[1][:m]
            plan = ((0, m, name),)
            launcher.launch_all(pool._plan_launches(family, plan, a, dw, out_e))
            out_g.copy_to_device(np.full((m, n), GRAPH_CHECK_FILL, dtype=np.uint16))
            cuda.synchronize()
            pbs = launcher.prebind(pool._plan_launches(family, plan, a, dw, out_g))
            ext = cuda.external_stream(gt.handle)  # numba's wrapper of torch's stream

            def launch(h, pbs=pbs, ext=ext):
                for pb in pbs:
                    pb(stream=ext)

            g = gt.capture([launch])
            with torch.cuda.stream(gt.stream):
                g.replay()
            gt.stream.synchronize()
            del g
            got, want = out_g.copy_to_host(), out_e.copy_to_host()
            bad = int(np.count_nonzero(got != want))
            row.update(ok=bad == 0, mismatches=bad)
            if bad:
                row["detail"] = f"{bad} of {want.size} outputs differ"
        except Exception as e:  # noqa: BLE001 - reported, and timing falls back
            row["detail"] = _short(e)
            env.fall_back_to_sleep(row["detail"])
        _log(
            f"graph check {name:<26} {n}x{k} M={m}: "
            + ("bit-equal to eager" if row["ok"] else f"FAILED {row['detail']}")
        )
        rows.append(row)
    del pools
    return rows


# -- the run --------------------------------------------------------------------------------------


def _families_available(cases: list[Case], notes: list[str]) -> list[Case]:
    dropped: set[str] = set()
    for fam in dict.fromkeys(c.family for c in cases if c.family in _POOLS):
        spec = registry.family(fam)
        try:
            spec.device_class()
            mod = spec.seed()
            for name in ("launch_raw", "compiled", "spec_of"):
                getattr(mod, name)
        except Exception as e:  # noqa: BLE001 - another engineer's module may be mid-change
            notes.append(f"{spec.title} kernels unavailable ({_short(e)}): their cases dropped")
            dropped.add(fam)
    return [c for c in cases if c.family not in dropped]


def _free(torch=None) -> None:
    gc.collect()
    timing.flush_deferred_frees()
    if torch is not None:
        torch.cuda.empty_cache()


def execute(st: Settings, cases: list[Case]) -> Report:
    t_start = time.time()
    # grids under 128 CTAs (the spin kernel, tiny dry-run shapes) are intended here
    warnings.filterwarnings("ignore", message=r"Grid size \d+ will likely result in GPU")
    meta = base_meta(st)
    notes = meta["notes"]
    env = _Env(st, notes)
    if env.torch is None:
        cases = [c for c in cases if c.kernel != TORCH_KERNEL]  # no torch: no bf16 baseline
    cases = _families_available(cases, notes)
    meta.update(
        device=env.device,
        simulated=SIMULATED,
        dry_run=env.dry,
        sms=env.sms,
        sms_source=env.sms_source,
        clock_mhz=None if env.clock_hz is None else env.clock_hz / 1e6,
        clock_source=env.clock_source,
        l2_bytes=env.l2_bytes,
        l2_source=env.l2_source,
        versions=_versions(env.torch),
    )
    rng = np.random.default_rng(st.seed)
    facts = (
        "simulator: no SMs or clock"
        if env.sms is None
        else f"{env.sms} SMs, {env.clock_hz / 1e6:.0f} MHz, L2 {env.l2_bytes / 2**20:.0f} MiB"
    )
    _log(
        f"q2gemv bench: {len(cases)} cases on {env.device} ({facts}); "
        f"{'dry run' if env.dry else f'median of {st.repeats}, >= {st.min_calls} calls per graph'}"
    )
    report = Report(rows=[], meta=meta)
    if st.overhead:
        try:
            report.graph_check = graph_check(env, st, cases, rng)
            report.overhead = host_overhead(env, st, cases, rng)
        except Exception as e:  # noqa: BLE001 - the matrix still runs
            notes.append(f"host overhead / graph check aborted: {_short(e)}")
            traceback.print_exc()
        _free(env.torch)
    meta["timing"] = env.timer.method
    report.ceiling = measure_ceiling(env, st, "start")
    ceiling, method = _best_ceiling(report.ceiling)
    meta.update(read_ceiling_gbps=ceiling, read_ceiling_method=method)
    for c in report.ceiling:
        _log(f"read ceiling {c['method']:<28} {_f(c['gbps'], '.0f'):>6} GB/s ({c['counted']})")
    bf16_at: dict[tuple, float] = {}
    pool: _Pool | None = None
    for i, case in enumerate(cases, 1):
        key = _pool_key(case)
        try:
            if pool is None or pool.key != key:
                pool = None
                _free(env.torch)
                pool = _make_pool(env, case, cases, rng)
                pool.key = key
            row = _run_case(env, st, pool, case)
        except Exception as e:  # noqa: BLE001 - one broken case must not end the run
            row = case_row(case, check=f"error: {_short(e)}", timing=env.timer.method)
            traceback.print_exc()
        if case.kernel == TORCH_KERNEL and row.get("time_us") is not None:
            bf16_at[(case.n, case.k, case.m)] = row["time_us"]
        row["bf16_us"] = bf16_at.get((case.n, case.k, case.m))
        row["read_ceiling_gbps"] = ceiling
        _log(progress_line(i, len(cases), case, row))
        report.rows.append(row)
    pool = None
    _free(env.torch)
    if _PREBIND_FAILED:
        notes.append(
            f"pre-bound launches could not be built ({_PREBIND_FAILED}); the cases were "
            "launched through numba's dispatcher (GPU times are unaffected)"
        )
    end = measure_ceiling(env, st, "end")
    report.ceiling += end
    ceiling, method = _best_ceiling(report.ceiling)
    meta.update(read_ceiling_gbps=ceiling, read_ceiling_method=method, timing=env.timer.method)
    derive(report.rows, ceiling_gbps=ceiling, sms=env.sms, clock_hz=env.clock_hz, device=env.device)
    meta["wall_s"] = round(time.time() - t_start, 1)
    _log(f"q2gemv bench: done in {meta['wall_s']} s")
    return report


def _best_ceiling(rows: list[dict]) -> tuple[float | None, str]:
    reads = [r for r in rows if r["counted"] == "read" and r.get("gbps")]
    if not reads:
        return None, "not measured"
    best = max(reads, key=lambda r: r["gbps"])
    return best["gbps"], f"{best['method']} ({best['phase']} of run), 16 B per thread"


def _make_pool(env: _Env, case: Case, cases: list[Case], rng) -> _Pool:
    key = _pool_key(case)
    max_m = max(c.m for c in cases if _pool_key(c) == key)
    if case.family in _POOLS:
        return _POOLS[case.family](case.n, case.k, case.group, max_m, env.l2_bytes, rng)
    return _TorchPool(case.n, case.k, 0, max_m, env.l2_bytes, env.torch)


def _versions(torch) -> str:
    import numba

    parts = [f"numpy {np.__version__}", f"numba {numba.__version__}"]
    try:
        from importlib.metadata import version

        parts.append(f"numba-cuda {version('numba-cuda')}")
    except Exception:  # noqa: BLE001
        pass
    if torch is not None:
        parts.append(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    return ", ".join(parts)

"""``q2gemv bench``: decode-GEMV GPU times against the read ceiling, the FMA floor and torch bf16.

Method (design.md §6), all in one process and one run:

* **Cold weights.** Every (family, shape) gets C copies of its weight,
  activations and output, C the smallest count >= 2 whose total exceeds
  2 x the L2 (60 MB on the H200, read from the device); consecutive calls
  rotate through the copies, so no call finds its weight in L2.
* **GPU time only.** A case is a sequence of L calls (L a multiple of C, so
  the rotation continues unbroken across repeats), captured once into a CUDA
  graph and replayed; CUDA events bracket each replay (or, with
  ``--timing sleep``, the calls are queued behind a spin kernel). The time of
  a case is the median over ``--repeats`` (>= 5) replays of replay time / L.
  Kernels are launched through :class:`~q2gemv.cuda.prebound.PreboundLaunch`
  (one driver call each), torch through ``F.linear``.
* **Bytes moved** (the minimum a call must move; a chunked call still counts
  the weight once, so chunking shows up as lower GB/s):

  ======  ==========================================================
  Q2_0    N*(K/group)*(2+group/4) + M*K*2 + M*N*2
  NVFP4   N*K/2 + N*K/16 + 4 + M*K*2 + M*N*2   (codes, E4M3 scales, fp32 global)
  bf16    N*K*2 + M*K*2 + M*N*2                 (torch ``F.linear``, weight [N, K])
  ======  ==========================================================

  effective GB/s = bytes / time (1 GB = 1e9 B); % of the read ceiling =
  GB/s / the streaming-read ceiling measured in the same run (a numba kernel
  reading 2 GiB with one ``ld.global.v4.u32`` = 16 B per thread per load; the
  faster of two grid shapes, at the start and end of the run).
* **FMA issue floor** = N*K*M / (SMs * 128 * clock), SMs and clock read from
  the device: the time if every fp32 lane issued one useful FMA per clock.
  ``pct_fma_floor`` = 100 * floor / time (100 = at the floor).
* **torch bf16** ``F.linear(a [M, K], w [N, K])``, the same shape and M, also
  cold and graph-replayed; ``speedup_vs_bf16`` = bf16 time / kernel time.
* Q2_0 ``q2_0_gemv_vec_batchm`` at M is also compared with M x the time of
  the M=1 kernel ``q2_0_gemv_vec`` (``speedup_vs_m1_x_m``).

Every case's output (copy 0) is compared bit for bit with an eager
``launch_raw`` of the same chunks (column ``check``): it proves the
pre-bound argument packing, not the kernel (``q2gemv verify`` does that).

Outputs under ``--out`` (default ``./q2gemv-bench``, never ``benchmarks/results``
unless named; ``PREFIX`` defaults to the device, ``h200`` on an H200, ``simulator``
under the simulator; existing files are kept unless ``--overwrite``): ``PREFIX_gemv.csv``
(one row per case), ``PREFIX_ceiling.csv``, ``PREFIX_launch_overhead.csv``
(host us per launch: numba dispatcher vs ``launch_raw`` vs pre-bound),
``PREFIX_graph_check.csv`` (pre-bound launch captured in a torch CUDA graph
on its stream, replayed, compared with an eager launch), ``PREFIX_summary.md``
and ``PREFIX_run.json``. The plot is ``benchmarks/plot.py``'s.

The pure parts (matrix, formulas, floors, rotation, CSV, tables) import
nothing heavy and are unit-tested on the CPU; the GPU parts import numba
and torch when run.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .formats import q2_0 as q2fmt
from .formats.nvfp4 import BLOCK as NVFP4_BLOCK
from .tiers import (
    BATCH8_RT2,
    BATCH16,
    BATCH32,
    W4A16_BATCHM_WIDTHS,
    W4a16BatchmTiers,
    plan_w4a16,
    tier_kernel_name,
)

# -- the matrix ---------------------------------------------------------------------

# N x K of a 27B model's qkv/o and FFN projections, and a square 16k.
SHAPES: tuple[tuple[int, int], ...] = ((5120, 5120), (17408, 5120), (5120, 17408), (16384, 16384))
MS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)
# The seed's W4A16 table: every table tier at every M it serves, on these shapes.
W4A16_SWEEP_SHAPES: tuple[tuple[int, int], ...] = ((5120, 5120), (17408, 5120))
QUICK_SHAPES: tuple[tuple[int, int], ...] = ((5120, 5120), (17408, 5120))
QUICK_MS: tuple[int, ...] = (1, 4, 8)

FAMILIES = ("q2_0", "w4a16", "bf16")
Q2_BATCHM = "q2_0_gemv_vec_batchm"
Q2_M1_REFERENCE = "q2_0_gemv_vec"  # "M x (the M=1 kernel)" is M x this kernel's M=1 time
W4A16_TABLE_TIERS = tuple(tier_kernel_name(w) for w in W4A16_BATCHM_WIDTHS) + (BATCH8_RT2,)
W4A16_MAX_M = {
    **{tier_kernel_name(w): w for w in W4A16_BATCHM_WIDTHS},
    BATCH8_RT2: 8,
    BATCH16: 16,
    BATCH32: 32,
}
TORCH_KERNEL = "F.linear"
NVFP4_GROUP = NVFP4_BLOCK

FMA_LANES_PER_SM = 128  # fp32 FMA lanes per SM on sm_90
L2_ROTATE_FACTOR = 2  # rotated bytes must exceed this many L2s
H200_FALLBACK = {"sms": 132, "clock_khz": 1_980_000, "l2_bytes": 60 * 1024 * 1024}
DEFAULT_OUT = "q2gemv-bench"
SIM_PREFIX = "simulator"
# The CUDA simulator runs one OS thread per CUDA thread. Measured on a 2-core CPU machine:
# `NUMBA_ENABLE_CUDASIM=1 q2gemv bench --dry-run --no-overhead --shapes 16x512 --m 1` (6
# cases, 2 CTAs per launch) took 60 s, ~10 s a case; the cost grows with the CTAs, i.e.
# with N*K, and with M. 5120x5120 (640 CTAs a launch) would take hours a case, so larger
# shapes are refused under the simulator rather than left to run silently.
SIM_EXAMPLE_SHAPE = "16x512"
SIM_MAX_NK = 32768  # e.g. 64x512: one q2_0_gemv_vec case took 47 s (same command, --m 1)
SIM_MAX_M = 9  # one row past the batched kernels' 8-row chunk

BYTES_FORMULA = {
    "q2_0": "N*(K/group)*(2+group/4) + M*K*2 + M*N*2",
    "w4a16": "N*K/2 + N*K/16 + 4 + M*K*2 + M*N*2",
    "bf16": "N*K*2 + M*K*2 + M*N*2",
}
FMA_FLOOR_FORMULA = "N*K*M / (SMs*128*clock)"


# -- byte formulas, floors, rotation (pure) --------------------------------------


def weight_bytes(family: str, n: int, k: int, group: int = 0) -> int:
    """Bytes of one weight [N, K] as the kernel streams it."""
    if family == "q2_0":
        return n * (k // group) * q2fmt.block_bytes(group)
    if family == "w4a16":
        return n * k // 2 + n * (k // NVFP4_BLOCK) + 4
    if family == "bf16":
        return n * k * 2
    raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")


def bytes_moved(family: str, n: int, k: int, m: int, group: int = 0) -> int:
    """:data:`BYTES_FORMULA`: weight once + bf16 activations [M, K] + bf16 output [M, N]."""
    return weight_bytes(family, n, k, group) + m * k * 2 + m * n * 2


def fma_floor_s(n: int, k: int, m: int, sms: int, clock_hz: float) -> float:
    """N*K*M / (SMs * 128 * clock): every fp32 lane issuing one useful FMA per clock."""
    return n * k * m / (sms * FMA_LANES_PER_SM * clock_hz)


def rotation_copies(bytes_per_copy: int, l2_bytes: int, factor: int = L2_ROTATE_FACTOR) -> int:
    """Smallest count >= 2 of copies whose total strictly exceeds ``factor`` x L2."""
    if bytes_per_copy < 1:
        raise ValueError(f"bytes_per_copy: expected >= 1, got {bytes_per_copy}")
    return max(2, factor * l2_bytes // bytes_per_copy + 1)


def calls_per_graph(copies: int, min_calls: int) -> int:
    """Calls per timed sequence: a multiple of ``copies`` (unbroken rotation), >= ``min_calls``."""
    return copies * max(1, math.ceil(min_calls / copies))


# -- cases (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One timed (kernel or tier, shape, M); ``launches`` are one call's (row0, rows, kernel)."""

    family: str
    kernel: str
    n: int
    k: int
    m: int
    group: int
    role: str  # m1 | batchm | tier | dispatch | tier+dispatch | bf16
    launches: tuple[tuple[int, int, str], ...]
    selected: bool = False  # W4A16: what plan_w4a16 dispatches for this M

    @property
    def key(self) -> tuple:
        return (self.family, self.kernel, self.n, self.k, self.m, self.group)

    @property
    def label(self) -> str:
        g = f" g{self.group}" if self.family == "q2_0" else ""
        return f"{self.family} {self.kernel} {self.n}x{self.k}{g} M={self.m}"


def q2_kernel_table() -> dict[str, int]:
    """Every Q2_0 kernel of :mod:`q2gemv.cuda.q2_0` and the rows it serves per launch."""
    from .cuda.q2_0 import KERNELS  # imports numba, compiles nothing

    return {name: int(spec[1]) for name, spec in KERNELS.items()}


def chunks(m: int, max_m: int, kernel: str) -> tuple[tuple[int, int, str], ...]:
    return tuple((r0, min(max_m, m - r0), kernel) for r0 in range(0, m, max_m))


def _natural(name: str) -> tuple:
    """Sort key that puts batch4 before batch16."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def _kept(tokens: Sequence[str] | None, family: str, kernel: str) -> bool:
    return not tokens or family in tokens or kernel in tokens


def build_cases(
    shapes: Sequence[tuple[int, int]] = SHAPES,
    ms: Sequence[int] = MS,
    *,
    kernels: Sequence[str] | None = None,
    groups: Sequence[int] = (128,),
    sweep_shapes: Sequence[tuple[int, int]] = W4A16_SWEEP_SHAPES,
    tiers: W4a16BatchmTiers | None = None,
    exact_m: bool | None = None,
    torch: bool = True,
    q2_kernels: dict[str, int] | None = None,
) -> list[Case]:
    """The benchmark matrix, in run order (shape by shape; bf16 first in each shape).

    * Q2_0, per group, every kernel of ``q2_kernels`` (name -> rows per
      launch; default :func:`q2_kernel_table`): the M=1 kernels
      (``q2_0_gemv``, ``q2_0_gemv_vec``, ...) at M=1 only (larger M would be M
      launches: the M x (M=1) comparison is derived), the batched ones
      (``q2_0_gemv_vec_batchm``, ...) at every M, chunked by their row limit.
    * W4A16 on ``sweep_shapes``: every table tier (batch4..8, rt2) at every M
      of ``ms`` it serves (the seed's table); on every shape: the launches
      :func:`~q2gemv.tiers.plan_w4a16` dispatches for each M (``selected``).
    * bf16 ``F.linear`` at every (shape, M) that a kept kernel case has, so
      each has its bf16 time (``torch=False`` drops them).

    ``kernels``: keep only cases whose family (q2_0, w4a16, bf16) or kernel
    name is listed (None: all). ``tiers`` defaults to every W4A16 kernel present.
    """
    if tiers is None:
        tiers = W4a16BatchmTiers.resolve(W4A16_MAX_M)
    if q2_kernels is None:
        q2_kernels = q2_kernel_table()
    ms = sorted(set(int(m) for m in ms))
    if not ms or ms[0] < 1:
        raise ValueError(f"ms: expected M values >= 1, got {ms}")
    out: dict[tuple, Case] = {}
    sweep = {tuple(s) for s in sweep_shapes}
    for n, k in shapes:
        for g in groups:
            q2fmt.check_group(g)
            if k % g:
                raise ValueError(f"shape {n}x{k}: K is not a multiple of group {g}")
            for name, max_m in q2_kernels.items():
                if not _kept(kernels, "q2_0", name):
                    continue
                for m in ms if max_m > 1 else [m for m in ms if m == 1]:
                    role = "batchm" if max_m > 1 else "m1"
                    c = Case("q2_0", name, n, k, m, g, role, chunks(m, max_m, name))
                    out[c.key] = c
        if k % NVFP4_BLOCK:
            raise ValueError(f"shape {n}x{k}: K is not a multiple of the NVFP4 block {NVFP4_BLOCK}")
        if (n, k) in sweep:
            for name in W4A16_TABLE_TIERS:
                for m in ms:
                    if m <= W4A16_MAX_M[name] and _kept(kernels, "w4a16", name):
                        c = Case("w4a16", name, n, k, m, NVFP4_GROUP, "tier", chunks(m, m, name))
                        out[c.key] = c
        for m in ms:
            plan = tuple(plan_w4a16(m, tiers, exact_m=exact_m))
            names = list(dict.fromkeys(name for _, _, name in plan))
            label = "+".join(names)
            if not any(_kept(kernels, "w4a16", nm) for nm in names):
                continue
            key = ("w4a16", label, n, k, m, NVFP4_GROUP)
            if key in out:
                out[key] = replace(out[key], role="tier+dispatch", selected=True)
            else:
                out[key] = Case("w4a16", label, n, k, m, NVFP4_GROUP, "dispatch", plan, True)
    if torch:
        wanted = {(c.n, c.k, c.m) for c in out.values()}
        if kernels and "bf16" in kernels:
            wanted |= {(n, k, m) for n, k in shapes for m in ms}
        for n, k, m in wanted:
            c = Case("bf16", TORCH_KERNEL, n, k, m, 0, "bf16", ((0, m, TORCH_KERNEL),))
            out[c.key] = c
    order = {tuple(s): i for i, s in enumerate(shapes)}
    fam = {f: i for i, f in enumerate(FAMILIES[::-1])}  # bf16, w4a16, q2_0

    def sort_key(c: Case):
        return (order[(c.n, c.k)], fam[c.family], c.group, _natural(c.kernel), c.m)

    return sorted(out.values(), key=sort_key)


# -- argument parsing helpers (pure) -------------------------------------------------


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """``"5120x5120,17408x5120"`` -> ((5120, 5120), (17408, 5120)) (N x K)."""
    shapes = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            n, k = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape: expected NxK, got {part!r}") from None
        if n < 1 or k < 1:
            raise ValueError(f"shape: expected positive N and K, got {part!r}")
        shapes.append((n, k))
    if not shapes:
        raise ValueError("shapes: expected at least one NxK")
    return tuple(shapes)


def parse_ints(text: str, what: str = "m") -> tuple[int, ...]:
    """``"1-8,16,32"`` -> (1, 2, ..., 8, 16, 32), sorted, unique, each >= 1."""
    vals: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-"))
                vals.update(range(lo, hi + 1))
            else:
                vals.add(int(part))
        except ValueError:
            raise ValueError(
                f"{what}: expected integers or ranges like 1-8, got {part!r}"
            ) from None
    if not vals or min(vals) < 1:
        raise ValueError(f"{what}: expected values >= 1, got {text!r}")
    return tuple(sorted(vals))


def parse_tokens(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    return tuple(t for t in text.replace(" ", "").split(",") if t)


# -- result rows: derivation, CSV (pure) ---------------------------------------------

FIELDS = (
    "family",
    "kernel",
    "role",
    "selected",
    "n",
    "k",
    "m",
    "group",
    "launches_per_call",
    "time_us",
    "time_min_us",
    "time_max_us",
    "repeats",
    "calls_per_graph",
    "copies",
    "rotated_mib",
    "bytes",
    "gbps",
    "read_ceiling_gbps",
    "pct_read_ceiling",
    "fma_floor_us",
    "pct_fma_floor",
    "bf16_us",
    "speedup_vs_bf16",
    "m1_x_m_us",
    "speedup_vs_m1_x_m",
    "check",
    "timing",
    "bytes_formula",
    "sms",
    "clock_mhz",
    "device",
)
INT_FIELDS = {"n", "k", "m", "group", "launches_per_call", "repeats", "calls_per_graph", "copies"}
INT_FIELDS |= {"bytes", "sms"}
FLOAT_FIELDS = {
    "time_us",
    "time_min_us",
    "time_max_us",
    "rotated_mib",
    "gbps",
    "read_ceiling_gbps",
    "pct_read_ceiling",
    "fma_floor_us",
    "pct_fma_floor",
    "bf16_us",
    "speedup_vs_bf16",
    "m1_x_m_us",
    "speedup_vs_m1_x_m",
    "clock_mhz",
}


def simulator_refusals(cases: Sequence[Case]) -> str:
    """'' when every case is small enough for the CUDA simulator, else why not (in numbers)."""
    big = sorted({(c.n, c.k) for c in cases if c.n * c.k > SIM_MAX_NK})
    many = sorted({c.m for c in cases if c.m > SIM_MAX_M})
    if not big and not many:
        return ""
    what = []
    if big:
        what.append("shapes " + ", ".join(f"{n}x{k}" for n, k in big))
    if many:
        what.append("M " + ", ".join(map(str, many)))
    return (
        f"{' and '.join(what)} are too large for the CUDA simulator (one OS thread per CUDA "
        f"thread: hours, not seconds). It runs N*K <= {SIM_MAX_NK} and M <= {SIM_MAX_M}, "
        f"e.g. --dry-run --shapes {SIM_EXAMPLE_SHAPE} --m 1,2; time on a GPU."
    )


def case_row(case: Case, **measured) -> dict:
    """A result row for ``case`` with its identity filled in and ``measured`` merged."""
    row = dict.fromkeys(FIELDS)
    row.update(
        family=case.family,
        kernel=case.kernel,
        role=case.role,
        selected=case.selected,
        n=case.n,
        k=case.k,
        m=case.m,
        group=case.group,
        launches_per_call=len(case.launches),
        bytes_formula=BYTES_FORMULA[case.family],
    )
    row.update(measured)
    return row


def _ratio(num, den):
    if num is None or den is None or not den or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


def derive(
    rows: list[dict],
    *,
    ceiling_gbps: float | None,
    sms: int | None,
    clock_hz: float | None,
    device: str | None = None,
) -> None:
    """Fill the derived columns of ``rows`` in place (rows without a time get None).

    ``sms`` / ``clock_hz`` None (the simulator has neither): no FMA floor.

    bytes, GB/s, % of the read ceiling, the FMA floor (not for bf16: cuBLAS
    may use tensor cores), the bf16 time of the same (N, K, M) and the
    speed-up over it, and for Q2_0 batchm the M x (M=1 ``q2_0_gemv_vec``)
    time of the same (N, K, group) and the speed-up over it (every batched
    Q2_0 kernel, role ``batchm``).
    """
    bf16 = {(r["n"], r["k"], r["m"]): r.get("time_us") for r in rows if r["family"] == "bf16"}
    m1 = {
        (r["n"], r["k"], r["group"]): r.get("time_us")
        for r in rows
        if r["family"] == "q2_0" and r["kernel"] == Q2_M1_REFERENCE and r["m"] == 1
    }
    for r in rows:
        n, k, m = r["n"], r["k"], r["m"]
        t = r.get("time_us")
        t = t if t is not None and math.isfinite(t) else None
        r["bytes"] = bytes_moved(r["family"], n, k, m, r["group"])
        r["bytes_formula"] = BYTES_FORMULA[r["family"]]
        r["sms"] = sms
        r["clock_mhz"] = None if clock_hz is None else clock_hz / 1e6
        r["device"] = device
        r["read_ceiling_gbps"] = ceiling_gbps
        r["gbps"] = None if t is None else r["bytes"] / (t * 1e-6) / 1e9
        r["pct_read_ceiling"] = None
        if r["gbps"] is not None and ceiling_gbps:
            r["pct_read_ceiling"] = 100.0 * r["gbps"] / ceiling_gbps
        if r["family"] == "bf16" or not sms or not clock_hz:
            r["fma_floor_us"] = r["pct_fma_floor"] = None
        else:
            r["fma_floor_us"] = fma_floor_s(n, k, m, sms, clock_hz) * 1e6
            r["pct_fma_floor"] = None if t is None else 100.0 * r["fma_floor_us"] / t
        r["bf16_us"] = bf16.get((n, k, m))
        r["speedup_vs_bf16"] = _ratio(r["bf16_us"], t)
        r["m1_x_m_us"] = r["speedup_vs_m1_x_m"] = None
        if r["family"] == "q2_0" and r["role"] == "batchm":
            base = m1.get((n, k, r["group"]))
            if base is not None and math.isfinite(base):
                r["m1_x_m_us"] = m * base
                r["speedup_vs_m1_x_m"] = _ratio(r["m1_x_m_us"], t)


def _fmt_cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return "" if not math.isfinite(v) else f"{v:.6g}"
    return str(v)


def write_csv(rows: Iterable[dict], path: Path, fields: Sequence[str] = FIELDS) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt_cell(r.get(k)) for k in fields})
    return path


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV written by :func:`write_csv`, numbers typed, empty cells None."""
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            r: dict = {}
            for key, v in raw.items():
                if v == "" or v is None:
                    r[key] = None
                elif key in INT_FIELDS:
                    r[key] = int(float(v))
                elif key in FLOAT_FIELDS:
                    r[key] = float(v)
                elif key == "selected":
                    r[key] = v == "1"
                else:
                    r[key] = v
            rows.append(r)
    return rows


# -- tables (pure) ---------------------------------------------------------------------


def _f(v, spec: str = ".1f", suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:{spec}}{suffix}"


def md_table(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _shapes_of(rows: list[dict]) -> list[tuple[int, int]]:
    return list(dict.fromkeys((r["n"], r["k"]) for r in rows))


def _perf_cells(r: dict) -> list[str]:
    return [
        _f(r.get("time_us"), ".1f"),
        _f(r.get("gbps"), ".0f"),
        _f(r.get("pct_read_ceiling"), ".0f", "%"),
        _f(r.get("fma_floor_us"), ".1f"),
        _f(r.get("pct_fma_floor"), ".0f", "%"),
        _f(r.get("bf16_us"), ".1f"),
        _f(r.get("speedup_vs_bf16"), ".2f", "x"),
    ]


PERF_HEADERS = ["us", "GB/s", "% read ceiling", "FMA floor us", "% of floor", "bf16 us", "vs bf16"]


def q2_m1_table(rows: list[dict]) -> str:
    """Q2_0 at M=1: baseline vs vec vs batchm, per shape and group."""
    body = []
    for r in rows:
        if r["family"] == "q2_0" and r["m"] == 1:
            body.append(
                [f"{r['n']}x{r['k']}", f"g{r['group']}", f"`{r['kernel']}`"] + _perf_cells(r)
            )
    return md_table(["N x K", "group", "kernel"] + PERF_HEADERS, body)


def q2_batchm_table(rows: list[dict]) -> str:
    """The batched Q2_0 kernels at every M vs M x (the M=1 kernel ``q2_0_gemv_vec``)."""
    body = []
    for r in rows:
        if r["family"] == "q2_0" and r["role"] == "batchm":
            body.append(
                [f"{r['n']}x{r['k']}", f"g{r['group']}", f"`{r['kernel']}`", str(r["m"])]
                + [str(r["launches_per_call"])]
                + _perf_cells(r)
                + [_f(r.get("m1_x_m_us"), ".1f"), _f(r.get("speedup_vs_m1_x_m"), ".2f", "x")]
            )
    return md_table(
        ["N x K", "group", "kernel", "M", "launches"]
        + PERF_HEADERS
        + [f"M x {Q2_M1_REFERENCE}(M=1) us", "vs M x M=1"],
        body,
    )


def w4a16_tier_table(
    rows: list[dict], shapes: Sequence[tuple[int, int]] = W4A16_SWEEP_SHAPES
) -> str:
    """W4A16: every tier at every M it serves, on the seed's shapes (* = what dispatch picks)."""
    body = []
    want = {tuple(s) for s in shapes}
    for r in rows:
        if r["family"] == "w4a16" and (r["n"], r["k"]) in want and "tier" in (r["role"] or ""):
            name = f"`{r['kernel']}`" + (" *" if r.get("selected") else "")
            body.append([f"{r['n']}x{r['k']}", name, str(r["m"])] + _perf_cells(r))
    return md_table(["N x K", "tier", "M"] + PERF_HEADERS, body)


def _fastest(rows: list[dict]) -> dict | None:
    """The row with the least time; None when no row was timed (a dry run names no winner)."""
    timed = [r for r in rows if r.get("time_us") is not None and math.isfinite(r["time_us"])]
    return min(timed, key=lambda r: r["time_us"]) if timed else None


def headline_rows(rows: list[dict]) -> list[dict]:
    """Per (shape, M): bf16, the fastest Q2_0 kernel (any group) and the W4A16 tier dispatch picks."""
    out = []
    for n, k in _shapes_of(rows):
        sel = [r for r in rows if (r["n"], r["k"]) == (n, k)]
        for m in sorted({r["m"] for r in sel}):
            at = [r for r in sel if r["m"] == m]
            bf = next((r for r in at if r["family"] == "bf16"), None)
            q2 = _fastest([r for r in at if r["family"] == "q2_0"])
            w4 = next((r for r in at if r["family"] == "w4a16" and r.get("selected")), None)
            out.append(dict(n=n, k=k, m=m, bf16=bf, q2=q2, w4=w4))
    return out


def headline_table(rows: list[dict]) -> str:
    body = []
    for h in headline_rows(rows):
        q2, w4, bf = h["q2"] or {}, h["w4"] or {}, h["bf16"] or {}
        body.append(
            [
                f"{h['n']}x{h['k']}",
                str(h["m"]),
                _f(bf.get("time_us")),
                f"`{q2['kernel']}`" if q2 else "-",
                _f(q2.get("time_us")),
                _f(q2.get("pct_read_ceiling"), ".0f", "%"),
                _f(q2.get("pct_fma_floor"), ".0f", "%"),
                _f(q2.get("speedup_vs_bf16"), ".2f", "x"),
                f"`{w4['kernel']}`" if w4 else "-",
                _f(w4.get("time_us")),
                _f(w4.get("pct_read_ceiling"), ".0f", "%"),
                _f(w4.get("pct_fma_floor"), ".0f", "%"),
                _f(w4.get("speedup_vs_bf16"), ".2f", "x"),
            ]
        )
    return md_table(
        [
            "N x K",
            "M",
            "bf16 us",
            "fastest Q2_0",
            "us",
            "% ceil",
            "% floor",
            "vs bf16",
            "W4A16 tier",
            "us",
            "% ceil",
            "% floor",
            "vs bf16",
        ],
        body,
    )


def text_summary(rows: list[dict]) -> str:
    """The short stdout table: per (shape, M) bf16 vs the fastest Q2_0 vs the dispatched W4A16 tier."""
    lines = [
        f"{'N x K':>11} {'M':>3} {'bf16 us':>8} {'fastest Q2_0':>22} {'us':>8} {'x bf16':>6} "
        f"{'%ceil':>5} {'W4A16 tier':>14} {'us':>8} {'x bf16':>6} {'%ceil':>5}"
    ]
    for h in headline_rows(rows):
        q2, w4, bf = h["q2"] or {}, h["w4"] or {}, h["bf16"] or {}
        lines.append(
            f"{h['n']:>5}x{h['k']:<5} {h['m']:>3} {_f(bf.get('time_us')):>8} "
            f"{(q2.get('kernel') or '-').replace('q2_0_gemv', 'q2'):>22} "
            f"{_f(q2.get('time_us')):>8} {_f(q2.get('speedup_vs_bf16'), '.2f'):>6} "
            f"{_f(q2.get('pct_read_ceiling'), '.0f'):>5} "
            f"{(w4.get('kernel') or '-').replace('w4a16_gemv_', ''):>14} "
            f"{_f(w4.get('time_us')):>8} {_f(w4.get('speedup_vs_bf16'), '.2f'):>6} "
            f"{_f(w4.get('pct_read_ceiling'), '.0f'):>5}"
        )
    return "\n".join(lines)


def progress_line(i: int, total: int, case: Case, row: dict) -> str:
    t = row.get("time_us")
    parts = [f"[{i:>4}/{total}] {case.label}:"]
    if t is None:
        parts.append("(not timed)")
    else:
        parts.append(f"{t:9.2f} us")
        n, k, m, g = case.n, case.k, case.m, case.group
        gbps = bytes_moved(case.family, n, k, m, g) / (t * 1e-6) / 1e9
        parts.append(f"{gbps:7.0f} GB/s")
        ceil = row.get("read_ceiling_gbps")
        if ceil:
            parts.append(f"({100 * gbps / ceil:3.0f}% of read)")
        bf = row.get("bf16_us")
        if bf and case.family != "bf16":
            parts.append(f"bf16 {bf:.1f} us -> {bf / t:.2f}x")
    if row.get("copies"):
        parts.append(f"[{row['copies']} copies, {row.get('calls_per_graph')} calls]")
    if row.get("check"):
        parts.append(f"check={row['check']}")
    return " ".join(parts)


# -- CLI ------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``q2gemv bench`` and ``benchmarks/run_h200.py``."""
    p.add_argument(
        "--out",
        type=Path,
        default=Path(DEFAULT_OUT),
        metavar="DIR",
        help=f"output folder (default: ./{DEFAULT_OUT}; the committed benchmarks/results is "
        "only written when named here)",
    )
    p.add_argument(
        "--prefix",
        default=None,
        help="file name prefix (default: from the device, e.g. 'h200' on an NVIDIA H200, "
        f"'{SIM_PREFIX}' under the CUDA simulator, '_dryrun' appended for --dry-run)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing PREFIX_* files in --out (default: write under PREFIX_2, "
        "PREFIX_3, ... instead)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"shapes {','.join(f'{n}x{k}' for n, k in QUICK_SHAPES)} and "
        f"M {','.join(map(str, QUICK_MS))} (unless --shapes/--m say otherwise)",
    )
    p.add_argument("--shapes", help="N x K list, e.g. 5120x5120,16384x16384 (default: all four)")
    p.add_argument("--m", help="M list with ranges, e.g. 1-8,16,32 (default)")
    p.add_argument(
        "--kernels",
        help="keep only these families (q2_0, w4a16, bf16) or kernel names, comma-separated",
    )
    p.add_argument("--group", default="128", help="Q2_0 group(s): 128 (default), 64 or 64,128")
    p.add_argument("--repeats", type=int, default=9, help="timed replays per case (>= 5; median)")
    p.add_argument("--warmup", type=int, default=2, help="untimed replays per case")
    p.add_argument(
        "--min-calls",
        type=int,
        default=32,
        help="calls per timed sequence, at least (rounded up to a multiple of the copies)",
    )
    p.add_argument(
        "--timing",
        choices=("graph", "sleep"),
        default="graph",
        help="graph: CUDA-graph replay between events (default); sleep: launches queued "
        "behind a spin kernel",
    )
    p.add_argument("--no-torch", action="store_true", help="skip torch bf16 (and graph checks)")
    p.add_argument("--no-overhead", action="store_true", help="skip host overhead + graph check")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="launch every case once, check it, time nothing (forced under the CUDA simulator)",
    )
    p.add_argument("--l2-mib", type=float, help="L2 size for the rotation (default: from device)")
    p.add_argument("--clock-mhz", type=float, help="SM clock for the FMA floor (default: device)")
    p.add_argument("--ceiling-mib", type=int, default=2048, help="read-ceiling buffer (MiB)")
    p.add_argument("--overhead-calls", type=int, default=200, help="launches per host batch")
    p.add_argument(
        "--overhead-batches",
        type=int,
        default=9,
        help="host-overhead batches (median taken; default 9)",
    )
    p.add_argument(
        "--seed", type=int, default=2026, help="seed of the random weights and activations"
    )
    p.set_defaults(func=run)


@dataclass
class Settings:
    shapes: tuple[tuple[int, int], ...]
    ms: tuple[int, ...]
    kernels: tuple[str, ...] | None
    groups: tuple[int, ...]
    repeats: int
    warmup: int
    min_calls: int
    timing: str
    torch: bool
    overhead: bool
    dry_run: bool
    l2_bytes: int | None
    clock_hz: float | None
    ceiling_bytes: int
    overhead_calls: int
    overhead_batches: int
    seed: int
    out: Path
    prefix: str | None
    command: str
    quick: bool = False
    overwrite: bool = False
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        shapes = parse_shapes(args.shapes) if args.shapes else None
        ms = parse_ints(args.m) if args.m else None
        if args.quick:
            shapes = shapes or QUICK_SHAPES
            ms = ms or QUICK_MS
        if args.repeats < 5 and not args.dry_run:
            raise ValueError(f"--repeats: expected >= 5 (median of >= 5), got {args.repeats}")
        tokens = parse_tokens(args.kernels)
        if tokens:
            known = set(FAMILIES) | set(q2_kernel_table()) | set(W4A16_MAX_M)
            bad = [t for t in tokens if t not in known]
            if bad:
                raise ValueError(f"--kernels: unknown {bad}; expected among {sorted(known)}")
        return cls(
            shapes=shapes or SHAPES,
            ms=ms or MS,
            kernels=tokens,
            groups=parse_ints(args.group, "group"),
            repeats=args.repeats,
            warmup=args.warmup,
            min_calls=args.min_calls,
            timing=args.timing,
            torch=not args.no_torch,
            overhead=not args.no_overhead,
            dry_run=args.dry_run,
            l2_bytes=None if args.l2_mib is None else int(args.l2_mib * 2**20),
            clock_hz=None if args.clock_mhz is None else args.clock_mhz * 1e6,
            ceiling_bytes=args.ceiling_mib * 2**20,
            overhead_calls=args.overhead_calls,
            overhead_batches=args.overhead_batches,
            seed=args.seed,
            out=Path(args.out),
            prefix=args.prefix,
            command=getattr(args, "command", None) or "q2gemv bench " + shlex.join(sys.argv[2:]),
            quick=args.quick,
            overwrite=getattr(args, "overwrite", False),
        )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``q2gemv bench`` (and ``benchmarks/run_h200.py``); returns the exit code."""
    try:
        st = Settings.from_args(args)
        cases = build_cases(st.shapes, st.ms, kernels=st.kernels, groups=st.groups, torch=st.torch)
    except ValueError as e:
        print(f"q2gemv bench: {e}", file=sys.stderr)
        return 2
    if not cases:
        print("q2gemv bench: no cases selected", file=sys.stderr)
        return 2
    from .backends import gpu_present, simulator_requested

    simulated = simulator_requested()
    if not simulated and not gpu_present():
        print(
            "q2gemv bench: no CUDA GPU on this machine (nothing to time). To smoke-test the "
            "run on the CPU: NUMBA_ENABLE_CUDASIM=1 q2gemv bench --dry-run "
            f"--shapes {SIM_EXAMPLE_SHAPE} --m 1,2",
            file=sys.stderr,
        )
        return 2
    if simulated:
        too_big = simulator_refusals(cases)
        if too_big:
            print(f"q2gemv bench: {too_big}", file=sys.stderr)
            return 2
    try:
        from .cuda import bench_runner

        report = bench_runner.execute(st, cases)
    except RuntimeError as e:  # no usable device after all (driver, context)
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(msg if msg.startswith("q2gemv bench:") else f"q2gemv bench: {msg}", file=sys.stderr)
        return 2
    try:
        paths = write_outputs(report, st)
    except OSError as e:
        print(f"q2gemv bench: cannot write {e.filename or st.out}: {e.strerror}", file=sys.stderr)
        return 2
    args.prefix = st.prefix  # the prefix used (benchmarks/run_h200.py plots its CSV)
    print(text_summary(report.rows))
    for line in report.summary_lines():
        print(line)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0 if report.ok else 1


# -- outputs ------------------------------------------------------------------------------


@dataclass
class Report:
    """Everything one run measured."""

    rows: list[dict]
    meta: dict
    ceiling: list[dict] = field(default_factory=list)
    overhead: list[dict] = field(default_factory=list)
    graph_check: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        bad = [r for r in self.rows if r.get("check") not in (None, "", "ok")]
        bad += [g for g in self.graph_check if not g.get("ok")]
        return not bad

    def summary_lines(self) -> list[str]:
        out = []
        if self.meta.get("read_ceiling_gbps"):
            out.append(
                f"read ceiling: {self.meta['read_ceiling_gbps']:.0f} GB/s "
                f"({self.meta.get('read_ceiling_method')})"
            )
        for o in self.overhead:
            verdict = ""
            if o["path"] == PREBOUND_PATH:
                ok = o["us_per_call"] <= PREBOUND_TARGET_US
                verdict = f" (target <= {PREBOUND_TARGET_US:g} us: {'met' if ok else 'NOT met'})"
            out.append(
                f"host launch {o['path']:<22} {o['kernel']:<24} {o['us_per_call']:7.2f} us/call"
                + verdict
            )
        for g in self.graph_check:
            out.append(
                f"graph capture of pre-bound {g['kernel']}: "
                + ("bit-equal to eager" if g["ok"] else f"FAILED ({g.get('detail')})")
            )
        bad = [r for r in self.rows if r.get("check") not in (None, "", "ok")]
        if bad:
            out.append(
                f"{len(bad)} case(s) failed their check: "
                + ", ".join(
                    f"{r['kernel']} {r['n']}x{r['k']} M={r['m']}: {r['check']}" for r in bad[:5]
                )
            )
        for note in self.meta.get("notes", []):
            out.append(f"note: {note}")
        return out


PREBOUND_PATH = "pre-bound"
PREBOUND_TARGET_US = 8.0  # the bound on the host cost of a pre-bound launch
CEILING_FIELDS = ("phase", "method", "bytes", "time_us", "gbps", "counted", "timing")
OVERHEAD_FIELDS = ("path", "kernel", "n", "k", "m", "calls", "batches", "us_per_call", "us_min")
GRAPH_FIELDS = ("kernel", "n", "k", "m", "ok", "mismatches", "elements", "detail")


def summary_markdown(report: Report, st: Settings) -> str:
    meta = report.meta
    rows = report.rows
    if meta.get("simulated") or meta.get("dry_run"):
        where = "the CUDA simulator" if meta.get("simulated") else meta.get("device", "?")
        facts = (
            f"DRY RUN on {where}: every case launched once and checked bit for bit; "
            "NOTHING WAS TIMED. These are not measurements."
        )
    else:
        facts = (
            f"{meta.get('device', '?')}: {meta.get('sms')} SMs, "
            f"clock {meta.get('clock_mhz') or 0:.0f} MHz ({meta.get('clock_source')}), "
            f"L2 {meta.get('l2_bytes', 0) / 2**20:.0f} MiB ({meta.get('l2_source')}). "
            f"Timing: {meta.get('timing')}; median of {st.repeats} repeats; "
            f"cold weights rotated over > {L2_ROTATE_FACTOR} x L2."
        )
    title = "# q2gemv decode GEMV benchmark" + (
        " (dry run, not timed)" if meta.get("simulated") or meta.get("dry_run") else ""
    )
    parts = [
        title,
        "",
        "Made by:",
        "",
        "```",
        st.command,
        "```",
        "",
        f"{meta.get('date', '')}, {facts} Versions: {meta.get('versions')}.",
        "",
        "Bytes moved: " + "; ".join(f"{k}: `{v}`" for k, v in BYTES_FORMULA.items()) + ". "
        f"FMA issue floor: `{FMA_FLOOR_FORMULA}`; '% of floor' = 100 x floor / time. "
        "'% read ceiling' = effective GB/s / the streaming-read ceiling below. "
        "'vs bf16' = torch bf16 `F.linear` time / kernel time (> 1: faster).",
        "",
        "## Streaming-read ceiling (same run)",
        "",
        md_table(
            ["phase", "method", "bytes", "us", "GB/s", "counted"],
            [
                [
                    c["phase"],
                    c["method"],
                    str(c["bytes"]),
                    _f(c.get("time_us")),
                    _f(c.get("gbps"), ".0f"),
                    c["counted"],
                ]
                for c in report.ceiling
            ],
        ),
        "",
        f"Ceiling used: {_f(meta.get('read_ceiling_gbps'), '.0f')} GB/s "
        f"({meta.get('read_ceiling_method')}).",
        "",
    ]
    if report.overhead:
        parts += [
            "## Host cost of one launch",
            "",
            f"Back-to-back launches timed on the host (perf_counter), median of batches; "
            f"target for the pre-bound path: <= {PREBOUND_TARGET_US:g} us per call.",
            "",
            md_table(
                ["path", "kernel", "N x K", "M", "us / call (median)", "min"],
                [
                    [
                        o["path"],
                        f"`{o['kernel']}`",
                        f"{o['n']}x{o['k']}",
                        str(o["m"]),
                        _f(o["us_per_call"], ".2f"),
                        _f(o["us_min"], ".2f"),
                    ]
                    for o in report.overhead
                ],
            ),
            "",
        ]
    if report.graph_check:
        parts += [
            "## Pre-bound launches in a torch CUDA graph (external stream) vs eager",
            "",
            md_table(
                ["kernel", "N x K", "M", "bit-equal", "detail"],
                [
                    [
                        f"`{g['kernel']}`",
                        f"{g['n']}x{g['k']}",
                        str(g["m"]),
                        "yes" if g["ok"] else "NO",
                        g.get("detail") or "",
                    ]
                    for g in report.graph_check
                ],
            ),
            "",
        ]
    parts += ["## Per shape and M", "", headline_table(rows), ""]
    if any(r["family"] == "q2_0" and r["m"] == 1 for r in rows):
        parts += [
            "## Q2_0 at M=1: every kernel (baseline, vec, batchm, ...)",
            "",
            q2_m1_table(rows),
            "",
        ]
    if any(r["family"] == "q2_0" and r["role"] == "batchm" for r in rows):
        parts += [
            f"## Batched Q2_0 kernels vs M x {Q2_M1_REFERENCE} (M=1)",
            "",
            q2_batchm_table(rows),
            "",
        ]
    if any(r["family"] == "w4a16" and "tier" in (r["role"] or "") for r in rows):
        parts += [
            "## W4A16: every tier at every M it serves (* = the tier dispatch picks)",
            "",
            w4a16_tier_table(rows),
            "",
        ]
    for note in meta.get("notes", []):
        parts.append(f"* note: {note}")
    return "\n".join(parts) + "\n"


def device_prefix(meta: dict) -> str:
    """Default file prefix: a slug of the device name ('NVIDIA H200' -> 'h200'),
    :data:`SIM_PREFIX` under the simulator, ``_dryrun`` appended when nothing was timed."""
    if meta.get("simulated"):
        return SIM_PREFIX
    name = re.sub(r"^nvidia\s+", "", str(meta.get("device") or "gpu").strip(), flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"
    return slug + ("_dryrun" if meta.get("dry_run") else "")


OUTPUT_SUFFIXES = (
    "_gemv.csv",
    "_ceiling.csv",
    "_launch_overhead.csv",
    "_graph_check.csv",
    "_summary.md",
    "_run.json",
    "_gemv.png",
    "_w4a16_tiers.png",
)


def free_prefix(out: Path, prefix: str) -> str:
    """``prefix``, or ``prefix_2``, ``prefix_3``, ... : the first with no output file in ``out``."""
    cand, i = prefix, 1
    while any((out / f"{cand}{suf}").exists() for suf in OUTPUT_SUFFIXES):
        i += 1
        cand = f"{prefix}_{i}"
    return cand


def write_outputs(report: Report, st: Settings) -> dict[str, Path]:
    """Write the CSVs, summary and run JSON; never replaces a file unless ``st.overwrite``.

    ``st.prefix`` None takes :func:`device_prefix`; when files of the prefix
    exist (and not ``overwrite``) the first free ``prefix_N`` is used, with a
    note. ``st.prefix`` is set to the prefix written.
    """
    out = st.out
    wanted = st.prefix or device_prefix(report.meta)
    p = wanted if st.overwrite else free_prefix(out, wanted)
    if p != wanted:
        report.meta.setdefault("notes", []).append(
            f"{out}/{wanted}_* exists: wrote {p}_* instead (--overwrite replaces)"
        )
    st.prefix = p
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "gemv": write_csv(report.rows, out / f"{p}_gemv.csv"),
        "ceiling": write_csv(report.ceiling, out / f"{p}_ceiling.csv", CEILING_FIELDS),
    }
    if report.overhead:
        paths["overhead"] = write_csv(
            report.overhead, out / f"{p}_launch_overhead.csv", OVERHEAD_FIELDS
        )
    if report.graph_check:
        paths["graph"] = write_csv(report.graph_check, out / f"{p}_graph_check.csv", GRAPH_FIELDS)
    md = out / f"{p}_summary.md"
    md.write_text(summary_markdown(report, st))
    paths["summary"] = md
    js = out / f"{p}_run.json"
    js.write_text(json.dumps({**report.meta, "command": st.command}, indent=2, default=str) + "\n")
    paths["meta"] = js
    return paths


def base_meta(st: Settings) -> dict:
    """Run facts known without a device."""
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "shapes": [f"{n}x{k}" for n, k in st.shapes],
        "ms": list(st.ms),
        "groups": list(st.groups),
        "repeats": st.repeats,
        "warmup": st.warmup,
        "min_calls": st.min_calls,
        "dry_run": st.dry_run,
        "env_switches": {
            k: os.environ[k]
            for k in (
                "Q2GEMV_NO_GEMV_EXACT_M_TIERS",
                "ATLAS_NO_GEMV_EXACT_M_TIERS",
                "Q2GEMV_NO_BATCH8_RT",
                "ATLAS_NO_BATCH8_RT",
            )
            if k in os.environ
        },
        "started": time.time(),
        "notes": list(st.notes),
    }

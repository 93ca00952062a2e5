"""The ``q2gemv bench`` matrix: shapes, M values, cases, their launches, the run settings (pure).

Imports :mod:`q2gemv.bench.formulas` and the tier table; reading the Q2_0
kernel table (:func:`q2_kernel_table`) imports numba, compiling nothing.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..dispatch import registry
from ..dispatch.nvfp4_tiers import (
    BATCH8_RT2,
    W4A16_BATCHM_WIDTHS,
    W4a16BatchmTiers,
    plan_w4a16,
    tier_kernel_name,
)
from ..formats import q2_0 as q2fmt
from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK
from .formulas import FAMILIES, NVFP4_GROUP, TORCH_KERNEL

# -- the matrix ---------------------------------------------------------------------

# N x K of a 27B model's qkv/o and FFN projections, and a square 16k.
SHAPES: tuple[tuple[int, int], ...] = ((5120, 5120), (17408, 5120), (5120, 17408), (16384, 16384))
MS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)
# The seed's W4A16 table: every table tier at every M it serves, on these shapes.
W4A16_SWEEP_SHAPES: tuple[tuple[int, int], ...] = ((5120, 5120), (17408, 5120))
QUICK_SHAPES: tuple[tuple[int, int], ...] = ((5120, 5120), (17408, 5120))
QUICK_MS: tuple[int, ...] = (1, 4, 8)

Q2_BATCHM = "q2_0_gemv_vec_batchm"
Q2_M1_REFERENCE = "q2_0_gemv_vec"  # "M x (the M=1 kernel)" is M x this kernel's M=1 time
W4A16_TABLE_TIERS = tuple(tier_kernel_name(w) for w in W4A16_BATCHM_WIDTHS) + (BATCH8_RT2,)
W4A16_MAX_M = registry.table("w4a16", "seed")  # the registry's W4A16 kernels -> rows per launch
# Families whose weights take a block size per weight (the registry's FamilySpec.grouped): a
# case's label names its group.
GROUPED_FAMILIES = frozenset(f.name for f in registry.families() if f.grouped)
# The CUDA simulator runs one OS thread per CUDA thread. Measured on a 2-core CPU machine:
# `NUMBA_ENABLE_CUDASIM=1 q2gemv bench --dry-run --no-overhead --shapes 16x512 --m 1` (6
# cases, 2 CTAs per launch) took 60 s, ~10 s a case; the cost grows with the CTAs, i.e.
# with N*K, and with M. 5120x5120 (640 CTAs a launch) would take hours a case, so larger
# shapes are refused under the simulator rather than left to run silently.
SIM_EXAMPLE_SHAPE = "16x512"
SIM_MAX_NK = 32768  # e.g. 64x512: one q2_0_gemv_vec case took 47 s (same command, --m 1)
SIM_MAX_M = 9  # one row past the batched kernels' 8-row chunk
# The largest M a run takes. A decode GEMV serves a batch of tokens; far beyond this it is a
# GEMM, and each case holds [M, K] activations per rotated copy and one launch per 8 rows
# (M = 10**9 used to build 125 million launch entries, gigabytes, before any refusal).
MAX_M = 4096


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
    role: str  # m1 | batchm | tier | dispatch | tier+dispatch | exact | bf16
    # one call's plan; an exact case's call is its prepare over all M rows, then these chunks
    launches: tuple[tuple[int, int, str], ...]
    selected: bool = False  # W4A16: what plan_w4a16 dispatches for this M

    @property
    def key(self) -> tuple:
        return (self.family, self.kernel, self.n, self.k, self.m, self.group)

    @property
    def label(self) -> str:
        g = f" g{self.group}" if self.family in GROUPED_FAMILIES else ""
        return f"{self.family} {self.kernel} {self.n}x{self.k}{g} M={self.m}"


def q2_kernel_table() -> dict[str, int]:
    """Every Q2_0 seed kernel of the registry (:mod:`q2gemv.dispatch.registry`) and its rows per launch."""
    return dict(registry.table("q2_0", "seed"))


def exact_kernel_table() -> dict[str, int]:
    """Every exact-contract kernel of the registry (both families) and its rows per launch."""
    return {s.name: s.max_m for s in registry.specs(contract="exact")}


def _family_of(name: str) -> str:
    return registry.get(name).family


def kernel_names() -> tuple[str, ...]:
    """Every kernel ``--kernels`` takes: each registered kernel (:mod:`q2gemv.dispatch.registry`)."""
    return tuple(s.name for s in registry.specs())


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
    exact_kernels: dict[str, int] | None = None,
) -> list[Case]:
    """The benchmark matrix, in run order (shape by shape; bf16 first in each shape).

    * Q2_0, per group, every kernel of ``q2_kernels`` (name -> rows per
      launch; default :func:`q2_kernel_table`): the M=1 kernels
      (``q2_0_gemv``, ``q2_0_gemv_vec``, ...) at M=1 only (larger M would be M
      launches: the M x (M=1) comparison is derived), the batched ones
      (``q2_0_gemv_vec_batchm``, ...) at every M, chunked by their row limit.
    * W4A16 on ``sweep_shapes``: every table tier (batch4..8, rt2) at every M
      of ``ms`` it serves (the seed's table); on every shape: the launches
      :func:`~q2gemv.dispatch.nvfp4_tiers.plan_w4a16` dispatches for each M (``selected``).
    * a W4A16 seed kernel named in ``kernels`` (a tier off the sweep shapes,
      ``w4a16_gemv_batch16`` at M <= 8, a run-time candidate): at every M of
      ``ms`` it serves, on every shape.
    * the exact contract (the default of both formats), every kernel of
      ``exact_kernels`` (name -> rows per launch; default
      :func:`exact_kernel_table`) at every M and every shape (Q2_0 per group),
      chunked by its row limit; its call, the public call's launches, is the
      family's prepare over all M rows, then the chunks (role ``exact``).
    * bf16 ``F.linear`` at every (shape, M) that a kept kernel case has, so
      each has its bf16 time (``torch=False`` drops them).

    ``kernels``: keep only cases whose family (q2_0, w4a16, bf16) or kernel
    name is listed (None: all). ``tiers`` defaults to every W4A16 kernel present.
    """
    if tiers is None:
        tiers = W4a16BatchmTiers.resolve(W4A16_MAX_M)
    if q2_kernels is None:
        q2_kernels = q2_kernel_table()
    if exact_kernels is None:
        exact_kernels = exact_kernel_table()
    ms = sorted(set(int(m) for m in ms))
    if not ms or ms[0] < 1 or ms[-1] > MAX_M:
        raise ValueError(f"ms: expected M values in 1..{MAX_M}, got {ms}")
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
        for name, max_m in exact_kernels.items():
            fam = _family_of(name)
            if not _kept(kernels, fam, name):
                continue
            for g in groups if fam in GROUPED_FAMILIES else (NVFP4_GROUP,):
                for m in ms:
                    c = Case(fam, name, n, k, m, g, "exact", chunks(m, max_m, name))
                    out[c.key] = c
        if k % NVFP4_BLOCK:
            raise ValueError(f"shape {n}x{k}: K is not a multiple of the NVFP4 block {NVFP4_BLOCK}")
        named = [t for t in kernels or () if t in W4A16_MAX_M]
        for name in named:  # asked for by name: every M it serves, on every shape
            for m in (m for m in ms if m <= W4A16_MAX_M[name]):
                c = Case("w4a16", name, n, k, m, NVFP4_GROUP, "tier", chunks(m, m, name))
                out[c.key] = c
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


def parse_ints(text: str, what: str = "m", most: int | None = None) -> tuple[int, ...]:
    """``"1-8,16,32"`` -> (1, 2, ..., 8, 16, 32), sorted, unique, each >= 1 (and <= ``most``).

    A value or range end above ``most`` is refused before any range is expanded.
    """
    vals: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        try:
            lo, hi = (int(x) for x in part.split("-")) if "-" in part else (int(part),) * 2
        except ValueError:
            raise ValueError(
                f"{what}: expected integers or ranges like 1-8, got {part!r}"
            ) from None
        if most is not None and max(lo, hi) > most:
            raise ValueError(f"{what}: expected values of at most {most}, got {part!r}")
        vals.update(range(lo, hi + 1))
    if not vals or min(vals) < 1:
        raise ValueError(f"{what}: expected values >= 1, got {text!r}")
    return tuple(sorted(vals))


def parse_tokens(text: str | None) -> tuple[str, ...] | None:
    if not text:
        return None
    return tuple(t for t in text.replace(" ", "").split(",") if t)


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


# -- settings of one run ----------------------------------------------------------------


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
    plot: bool = False
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        shapes = parse_shapes(args.shapes) if args.shapes else None
        ms = parse_ints(args.m, "--m", most=MAX_M) if args.m else None
        if args.quick:
            shapes = shapes or QUICK_SHAPES
            ms = ms or QUICK_MS
        if args.repeats < 5 and not args.dry_run:
            raise ValueError(f"--repeats: expected >= 5 (median of >= 5), got {args.repeats}")
        tokens = parse_tokens(args.kernels)
        if tokens:
            known = set(FAMILIES) | set(kernel_names())
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
            plot=getattr(args, "plot", False),
        )

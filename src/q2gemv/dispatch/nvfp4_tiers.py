"""The W4A16 NVFP4 tier table: which ``w4a16_gemv_batch{M}`` kernel serves M activation rows.

One kernel template, ``w4a16_gemv_batchm`` with a compile-time ``MAX_M``, is built as
the tiers batch4 .. batch8. ``MAX_M`` sizes the code (accumulators, staged tile,
unrolled row loop); the run-time ``m < M`` guard skips a dead row's work but not its
instructions, so a wider tier is slower (measured: docs/design_notes.md). Hence the
exact-M tiers 5, 6, 7 and a pure decision that picks the narrowest present tier
covering M. Any covering tier gives the same bits (every tier keeps the same per-row
fp32 order).

What is decided where:

* :func:`select_tier` — pure: (m, which tiers are present, exact-M allowed)
  -> index into :data:`W4A16_BATCHM_WIDTHS`. No env reads.
* :func:`exact_m_tiers_enabled` / :func:`batch8_rt_enabled` — the kill
  switches, read from the environment once per process (:func:`reload_env`
  re-reads them). PRESENCE checks: ``=0`` and the empty string also switch
  the feature off.

  ==================================  ==========================================
  variable (or seed spelling)         effect when present
  ==================================  ==========================================
  ``Q2GEMV_NO_GEMV_EXACT_M_TIERS``    widths 5, 6, 7 are hidden from selection
  (``ATLAS_NO_GEMV_EXACT_M_TIERS``)   (4 and 8 never are): batch4 / batch8 only
  ``Q2GEMV_NO_BATCH8_RT``             width 8 resolves to classic
  (``ATLAS_NO_BATCH8_RT``)            ``w4a16_gemv_batch8``, not ``_batch8_rt2``
  ==================================  ==========================================

  Switches only remove tiers from selection; nothing is unloaded, so an A/B
  needs no rebuild.
* :class:`W4a16BatchmTiers` — which tier kernels the current target has.
* :func:`plan_w4a16` — the launches covering any M: the table for 1..8, the
  wide tiers ``w4a16_gemv_batch16`` (9..16) and ``w4a16_gemv_batch32``
  (17..32), and chunks of 32 rows beyond. The wide tiers are deliberately
  NOT in the table: folding them in would silently widen every caller that
  caps at 8.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import registry
from .plan import PLAN_MAX_M, ChunkPlan

W4A16_BATCHM_WIDTHS: tuple[int, ...] = (4, 5, 6, 7, 8)

# Indices of the exact-M widths (5, 6, 7): the only ones a kill switch hides.
FIRST_EXACT_M = 1
EXACT_M_LAST = 3

BATCH8_CLASSIC = "w4a16_gemv_batch8"
BATCH8_RT2 = "w4a16_gemv_batch8_rt2"
BATCH16 = "w4a16_gemv_batch16"
BATCH32 = "w4a16_gemv_batch32"
WIDE_MAX_M = 32  # rows per launch of the widest tier; larger M is chunked
EXPLAIN_MAX_LAUNCHES = 8  # explain_tier lists this many launches, then summarises (any m)

ENV_NO_EXACT_M = ("Q2GEMV_NO_GEMV_EXACT_M_TIERS", "ATLAS_NO_GEMV_EXACT_M_TIERS")
ENV_NO_BATCH8_RT = ("Q2GEMV_NO_BATCH8_RT", "ATLAS_NO_BATCH8_RT")


def tier_kernel_name(width: int) -> str:
    """Kernel name of the classic tier of ``width`` rows: ``w4a16_gemv_batch{width}``."""
    return f"w4a16_gemv_batch{width}"


# Every W4A16 kernel name and the rows one launch of it serves (its MAX_M); the kernel
# module's SPECS must agree (tests/dispatch/test_nvfp4_tiers.py checks it).
# Live read-only view of the registry (q2gemv.dispatch.registry): W4A16 seed kernel -> rows per launch.
W4A16_KERNEL_MAX_M = registry.table("w4a16", "seed")


def _check_m(m) -> int:
    """``m`` as a Python int in ``0 ..`` :data:`~q2gemv.dispatch.plan.PLAN_MAX_M` (``q2gemv.plan``'s bound).

    TypeError naming ``m`` for a bool or a non-integer; ValueError for a
    negative ``m`` or one beyond the kernels' int32 row counts.
    """
    if isinstance(m, (bool, np.bool_)) or not isinstance(m, (int, np.integer)):
        raise TypeError(f"m: expected an int, got {type(m).__name__}")
    m = int(m)
    if m < 0:
        raise ValueError(f"m: expected >= 0, got {m}")
    if m > PLAN_MAX_M:
        raise ValueError(
            f"m: expected at most {PLAN_MAX_M} rows (the kernels take int32 row counts), got {m}"
        )
    return m


def _check_exact_m(exact_m, allow_none: bool = True) -> bool | None:
    """``exact_m`` as a bool (or None where the switch's value is meant); TypeError naming it.

    A truthy string such as ``"no"`` must not switch the exact-M tiers on.
    """
    if exact_m is None and allow_none:
        return None
    if not isinstance(exact_m, (bool, np.bool_)):
        want = "a bool or None" if allow_none else "a bool"
        raise TypeError(f"exact_m: expected {want}, got {type(exact_m).__name__}")
    return bool(exact_m)


def _check_tiers(tiers) -> None:
    if not isinstance(tiers, W4a16BatchmTiers):
        raise TypeError(f"tiers: expected a W4a16BatchmTiers, got {type(tiers).__name__}")


def _check_present(present) -> tuple[bool, ...]:
    """``present`` as a tuple of 5 bools; TypeError/ValueError naming ``present`` otherwise."""
    if isinstance(present, (str, bytes)) or not hasattr(present, "__iter__"):
        raise TypeError(
            f"present: expected a sequence of {len(W4A16_BATCHM_WIDTHS)} bools, one per width "
            f"{W4A16_BATCHM_WIDTHS}, got {type(present).__name__}"
        )
    flags = tuple(present)
    if len(flags) != len(W4A16_BATCHM_WIDTHS):
        raise ValueError(
            f"present: expected {len(W4A16_BATCHM_WIDTHS)} flags, one per width "
            f"{W4A16_BATCHM_WIDTHS}, got {len(flags)}"
        )
    for f in flags:
        if not isinstance(f, (bool, np.bool_)):
            raise TypeError(f"present: expected bool flags, got {type(f).__name__} {f!r}")
    return tuple(bool(f) for f in flags)


# -- the pure decision -------------------------------------------------------------


def select_tier(m: int, present: Sequence[bool], exact_m: bool) -> int | None:
    """Index into :data:`W4A16_BATCHM_WIDTHS` of the narrowest tier that serves ``m`` rows.

    A tier serves ``m`` when its width covers ``m``, ``present[i]`` is true
    and, for the exact-M widths 5/6/7, ``exact_m`` allows it. Returns None
    for ``m == 0`` and when no tier in the table covers ``m`` (m > 8, or
    every covering tier absent/hidden): the caller falls back to the wide
    tiers. Narrowest-that-covers, not exact-only: a target missing a tier
    still dispatches, on the next wider (bit-identical, slower) tier.

    Raises TypeError naming ``m``, ``present`` (not a sequence of bools) or
    ``exact_m`` (not a bool); ValueError for ``m < 0`` or ``len(present) != 5``.
    """
    m = _check_m(m)
    present = _check_present(present)
    exact_m = _check_exact_m(exact_m, allow_none=False)
    if m == 0:
        return None
    for i, w in enumerate(W4A16_BATCHM_WIDTHS):
        hidden = not exact_m and FIRST_EXACT_M <= i <= EXACT_M_LAST
        if w >= m and present[i] and not hidden:
            return i
    return None


# -- environment switches (read once per process) ------------------------------------


@dataclass(frozen=True)
class EnvSwitches:
    """The kill switches as read from the environment, with the variable that set each."""

    exact_m: bool
    exact_m_source: str | None  # the variable that switched exact-M tiers off, if any
    batch8_rt: bool
    batch8_rt_source: str | None


def _first_present(names: Sequence[str]) -> str | None:
    return next((n for n in names if n in os.environ), None)


def _read_env() -> EnvSwitches:
    no_exact = _first_present(ENV_NO_EXACT_M)
    no_rt = _first_present(ENV_NO_BATCH8_RT)
    return EnvSwitches(no_exact is None, no_exact, no_rt is None, no_rt)


_switches: EnvSwitches | None = None


def env_switches() -> EnvSwitches:
    """The switches, read from ``os.environ`` on first call and cached for the process."""
    global _switches
    if _switches is None:
        _switches = _read_env()
    return _switches


def reload_env() -> EnvSwitches:
    """Re-read both kill switches from ``os.environ`` (after changing it) and cache the result.

    Selection reads the cache, so a changed variable takes effect only after
    this call; tables already resolved keep their width-8 kernel until
    re-resolved.
    """
    global _switches
    _switches = _read_env()
    registry.bump_policy_generation()  # what was planned under the older switches is stale
    return _switches


def exact_m_tiers_enabled() -> bool:
    """May widths 5/6/7 be selected? False when either exact-M kill switch is present."""
    return env_switches().exact_m


def batch8_rt_enabled() -> bool:
    """May width 8 resolve to the register-tiled ``_rt2`` variant? False when switched off."""
    return env_switches().batch8_rt


# -- the resolved table ------------------------------------------------------------------


# Which tier kernels build on this target: injected by the module that builds them
# (q2gemv.cuda.nvfp4 registers its buildable_kernels on import); tiers know nothing of cuda.
_resolver: Callable[[Sequence[str]], Iterable[str]] | None = None


def set_default_resolver(fn: Callable[[Sequence[str]], Iterable[str]] | None) -> None:
    """Install ``fn`` (names -> the ones that build; None: none) as the default of :meth:`W4a16BatchmTiers.resolve`."""
    global _resolver
    _resolver = fn


def _default_resolver(names: Sequence[str]) -> Iterable[str]:
    if _resolver is None:  # nothing that builds kernels is loaded: every registered one counts
        return [n for n in names if n in W4A16_KERNEL_MAX_M]
    return _resolver(names)


def candidate_kernel_names() -> tuple[str, ...]:
    """Every kernel name :meth:`W4a16BatchmTiers.resolve` may look up."""
    return tuple(tier_kernel_name(w) for w in W4A16_BATCHM_WIDTHS) + (BATCH8_RT2,)


@dataclass(frozen=True)
class W4a16BatchmTiers:
    """Per width of :data:`W4A16_BATCHM_WIDTHS`, the kernel name serving it or None (absent).

    ``W4a16BatchmTiers()`` is the "no NVFP4 kernels" table: every lookup
    declines. Build a real one with :meth:`resolve`. Each entry must be None
    or a W4A16 kernel (:data:`W4A16_KERNEL_MAX_M`) serving at least its
    width's rows: a table that would launch an unknown kernel, or more rows
    than a kernel serves, is refused here rather than at a launch.
    """

    kernels: tuple[str | None, ...] = field(default=(None,) * len(W4A16_BATCHM_WIDTHS))

    def __post_init__(self) -> None:
        ks = tuple(self.kernels)
        if len(ks) != len(W4A16_BATCHM_WIDTHS):
            raise ValueError(
                f"kernels: expected {len(W4A16_BATCHM_WIDTHS)} entries, one per width "
                f"{W4A16_BATCHM_WIDTHS}, got {len(ks)}"
            )
        for w, k in zip(W4A16_BATCHM_WIDTHS, ks, strict=True):
            if k is None:
                continue
            if not isinstance(k, str):
                raise TypeError(f"kernels: expected str or None entries, got {type(k).__name__}")
            if W4A16_KERNEL_MAX_M.get(k, 0) < w:
                known = [n for n, mm in W4A16_KERNEL_MAX_M.items() if mm >= w]
                raise ValueError(
                    f"kernels: width {w} expected None or a W4A16 kernel serving >= {w} rows "
                    f"({', '.join(known)}), got {k!r}"
                )
        object.__setattr__(self, "kernels", ks)

    @classmethod
    def resolve(
        cls,
        available: Iterable[str] | None = None,
        *,
        resolver: Callable[[Sequence[str]], Iterable[str]] | None = None,
    ) -> W4a16BatchmTiers:
        """Record which tier kernels the current target has.

        ``available``: kernel names to treat as present (tests pick subsets).
        When None, ``resolver(candidates)`` is asked which of
        :func:`candidate_kernel_names` build; the default resolver is the one
        installed by :func:`set_default_resolver` (:mod:`q2gemv.cuda.nvfp4`
        installs its ``buildable_kernels`` when imported: a tier that fails to
        build is simply absent; before that, every registered kernel counts). Width 8 resolves to
        ``w4a16_gemv_batch8_rt2`` when :func:`batch8_rt_enabled` and it is
        available (bit-exact with classic batch8), else to
        ``w4a16_gemv_batch8`` if available.
        """
        if available is None:
            available = (resolver or _default_resolver)(candidate_kernel_names())
        if isinstance(available, str):
            raise TypeError("available: expected an iterable of kernel names, got one str")
        have = set(available)
        ks: list[str | None] = []
        for w in W4A16_BATCHM_WIDTHS:
            if w == 8 and batch8_rt_enabled() and BATCH8_RT2 in have:
                ks.append(BATCH8_RT2)
            else:
                name = tier_kernel_name(w)
                ks.append(name if name in have else None)
        return cls(tuple(ks))

    def present(self) -> tuple[bool, ...]:
        """Which widths resolved: the ``present`` argument of :func:`select_tier`."""
        return tuple(k is not None for k in self.kernels)

    def _select(self, m: int, exact_m: bool | None) -> int | None:
        em = _check_exact_m(exact_m)
        return select_tier(m, self.present(), exact_m_tiers_enabled() if em is None else em)

    def kernel(self, m: int, *, exact_m: bool | None = None) -> str | None:
        """Name of the narrowest present tier covering ``m``, or None (the family declines).

        ``exact_m`` overrides :func:`exact_m_tiers_enabled` (None: use it).
        """
        i = self._select(m, exact_m)
        return None if i is None else self.kernels[i]

    def width(self, m: int, *, exact_m: bool | None = None) -> int | None:
        """Width of the tier :meth:`kernel` would pick, for logging and tests.

        Args:
            m: activation rows, an int >= 0.
            exact_m: overrides :func:`exact_m_tiers_enabled` (None: use it).

        Returns:
            One of :data:`W4A16_BATCHM_WIDTHS`, or None when the table declines
            (``m == 0``, ``m > 8``, or every covering tier absent or hidden).

        Raises:
            TypeError/ValueError naming ``m`` when it is not an int >= 0.
        """
        i = self._select(m, exact_m)
        return None if i is None else W4A16_BATCHM_WIDTHS[i]

    def has_base(self) -> bool:
        """Is the base tier (``w4a16_gemv_batch4``, the one every target carries) present?"""
        return self.kernels[0] is not None


# -- launch plan and explanation ---------------------------------------------------------


def _chunk_kernel(rows: int, tiers: W4a16BatchmTiers, exact_m: bool) -> str:
    if rows <= W4A16_BATCHM_WIDTHS[-1]:
        k = tiers.kernel(rows, exact_m=exact_m)
        if k is not None:
            return k
    return BATCH16 if rows <= 16 else BATCH32


def plan_w4a16(m: int, tiers: W4a16BatchmTiers, *, exact_m: bool | None = None) -> ChunkPlan:
    """Launches ``(row0, rows, kernel_name)`` covering ``m`` activation rows, in row order.

    Rows are cut into chunks of 32 (the last one shorter); each chunk of
    ``r`` rows runs on the table tier for ``r <= 8`` (:meth:`W4a16BatchmTiers.kernel`),
    else, or when the table declines, ``w4a16_gemv_batch16`` for ``r <= 16``
    and ``w4a16_gemv_batch32`` for ``r <= 32``. The wide tiers are assumed
    present (this package builds them on every target). Empty for ``m == 0``.
    Pure apart from reading the cached exact-M switch when ``exact_m`` is None.

    Args:
        m: activation rows, an int in ``0 ..`` :data:`~q2gemv.dispatch.plan.PLAN_MAX_M`
            (``2**31 - 1``, the bound of :func:`q2gemv.plan`).
        tiers: the resolved :class:`W4a16BatchmTiers`.
        exact_m: a bool overriding :func:`exact_m_tiers_enabled`, or None.

    Returns:
        A :class:`~q2gemv.dispatch.plan.ChunkPlan`: a sequence never materialised
        (O(1) memory for any ``m``; ``len``, indexing and iteration as a list;
        it compares equal to the list of its launches).

    Raises:
        TypeError: naming ``m`` (not an int, or a bool), ``tiers`` or
            ``exact_m`` (not a bool or None: a string such as ``"no"`` is refused).
        ValueError: naming ``m`` when negative or above ``2**31 - 1``.
    """
    m = _check_m(m)
    _check_tiers(tiers)
    em = _check_exact_m(exact_m)
    em = exact_m_tiers_enabled() if em is None else em
    return ChunkPlan(m, WIDE_MAX_M, lambda rows: _chunk_kernel(rows, tiers, em))


def check_plan(plan, m: int, max_m: dict[str, int] | None = None) -> list[tuple[int, int, str]]:
    """Refuse a launch plan before its first launch; returns it as a list.

    ``plan`` must be ``(row0, rows, kernel)`` launches that cover rows
    ``0 .. m-1`` exactly once, in order, each on a kernel of ``max_m``
    (default :data:`W4A16_KERNEL_MAX_M`: name -> rows per launch) with
    ``1 <= rows <=`` its max. A plan that fails only at its third launch
    would have written the first two chunks already; this check makes the
    whole plan fail or none of it. Pure; raises ValueError naming ``plan``.
    """
    m = _check_m(m)
    table = W4A16_KERNEL_MAX_M if max_m is None else max_m
    try:
        launches = [tuple(x) for x in plan]
    except TypeError:
        raise ValueError(
            f"plan: expected (row0, rows, kernel) launches, got {type(plan).__name__}"
        ) from None
    nxt = 0
    for i, x in enumerate(launches):
        if len(x) != 3:
            raise ValueError(f"plan: launch {i}: expected (row0, rows, kernel), got {x!r}")
        r0, rows, name = x
        if not isinstance(name, str) or name not in table:
            raise ValueError(f"plan: launch {i}: unknown kernel {name!r} (known: {list(table)})")
        ints = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (r0, rows))
        if not ints or r0 != nxt or not 1 <= rows <= table[name]:
            raise ValueError(
                f"plan: launch {i} {x!r}: expected rows {nxt}.. on 1..{table[name]} rows "
                f"of {name} (launches must cover 0..{m - 1} in order)"
            )
        nxt = r0 + rows
    if nxt != m:
        raise ValueError(f"plan: covers rows 0..{nxt - 1}, expected 0..{m - 1} (m = {m})")
    return launches


def explain_tier(m: int, tiers: W4a16BatchmTiers | None = None) -> str:
    """A multi-line, human explanation of how ``m`` rows are dispatched.

    States m, the table and its present mask, the exact-M switch and where
    its value came from, the chosen tier and why, and the launch plan.
    ``tiers=None`` resolves the table for the current target
    (:meth:`W4a16BatchmTiers.resolve`, which builds the kernels).

    ``m`` is checked as :func:`plan_w4a16` checks it (an int in ``0 .. 2**31 - 1``,
    the bound of :func:`q2gemv.plan`); ``tiers`` must be a :class:`W4a16BatchmTiers`
    or None. The launch list is summarised past a few launches, so the text
    stays short for any ``m``.
    """
    m = _check_m(m)
    if tiers is None:
        tiers = W4a16BatchmTiers.resolve()
    _check_tiers(tiers)
    sw = env_switches()
    present = tiers.present()
    lines = [f"m = {m}"]
    table = ", ".join(
        f"{w}: {k or 'absent'}" for w, k in zip(W4A16_BATCHM_WIDTHS, tiers.kernels, strict=True)
    )
    lines.append(f"tier table (width: kernel): {table}")
    lines.append(f"present mask: {present}")
    if sw.exact_m:
        lines.append(
            f"exact-M tiers 5/6/7: allowed (neither {' nor '.join(ENV_NO_EXACT_M)} is set)"
        )
    else:
        lines.append(f"exact-M tiers 5/6/7: hidden ({sw.exact_m_source} is set)")
    rt = "allowed" if sw.batch8_rt else f"off ({sw.batch8_rt_source} is set)"
    lines.append(f"batch8 register-tiled rt2 at table resolution: {rt}")
    if m == 0:
        lines.append("chosen: nothing (m = 0 launches no kernel)")
        return "\n".join(lines)
    i = select_tier(m, present, sw.exact_m)
    if i is not None:
        w = W4A16_BATCHM_WIDTHS[i]
        skipped = []
        for j, wj in enumerate(W4A16_BATCHM_WIDTHS[:i]):
            if wj < m:
                continue
            why = "absent" if not present[j] else "hidden by the exact-M switch"
            skipped.append(f"width {wj} {why}")
        reason = "narrowest present, allowed width covering m"
        if skipped:
            reason += " (" + "; ".join(skipped) + ")"
        lines.append(f"chosen: width {w} -> {tiers.kernels[i]}: {reason}")
    elif m <= W4A16_BATCHM_WIDTHS[-1]:
        lines.append(
            "chosen: no table tier covers m (every covering width absent or hidden); "
            f"the wide tier {BATCH16} serves it"
        )
    else:
        beyond = f"m > {W4A16_BATCHM_WIDTHS[-1]} is beyond the table"
        if m <= 16:
            lines.append(f"chosen: {BATCH16}: {beyond}; the wide tier batch16 serves 9..16 rows")
        elif m <= WIDE_MAX_M:
            lines.append(f"chosen: {BATCH32}: {beyond}; the wide tier batch32 serves 17..32 rows")
        else:
            lines.append(
                f"chosen: chunks of {WIDE_MAX_M} rows on {BATCH32}: {beyond} and the widest "
                f"tier; the last chunk of {m % WIDE_MAX_M or WIDE_MAX_M} rows by the same rule "
                f"(table tier for 1..8, {BATCH16} for 9..16, {BATCH32} for 17..32)"
            )
    count = -(-m // WIDE_MAX_M)
    if count <= EXPLAIN_MAX_LAUNCHES:
        plan = plan_w4a16(m, tiers, exact_m=sw.exact_m)
    else:  # summarised, never built in full: chunks are cut from row 0 in WIDE_MAX_M rows
        plan = plan_w4a16(WIDE_MAX_M * (EXPLAIN_MAX_LAUNCHES - 1), tiers, exact_m=sw.exact_m)
        r0 = (count - 1) * WIDE_MAX_M
        ((_, rows, name),) = plan_w4a16(m - r0, tiers, exact_m=sw.exact_m)
        plan = [*plan, f"... ({count - EXPLAIN_MAX_LAUNCHES} more like these)", (r0, rows, name)]
    lines.append(f"launches (row0, rows, kernel): {', '.join(map(str, plan))}")
    if count > EXPLAIN_MAX_LAUNCHES:
        lines[-1] += f"; {count} launches in all"
    return "\n".join(lines)

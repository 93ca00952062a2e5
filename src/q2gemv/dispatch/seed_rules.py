"""The seed contract's default kernels, one rule per family (pure: no numba, no device).

Under the exact contract every family has one kernel (its
:attr:`~q2gemv.dispatch.registry.FamilySpec.exact_kernel`), chunked by its ``max_m``.
Under the seed contract each family has its own measured rule: Q2_0 picks
one kernel by M and N (:func:`default_q2_kernel`), NVFP4 plans its tiers
(:func:`q2gemv.dispatch.nvfp4_tiers.plan_w4a16`). The registry names each family's rule
(:attr:`~q2gemv.dispatch.registry.FamilySpec.seed_plan`, ``.seed_reason``); the API
calls it through the spec and never asks which family it holds.

A rule's ``plan(weight, m, kernel)`` returns the launches (a
:class:`~q2gemv.dispatch.plan.ChunkPlan`; ``kernel``: a seed kernel of the family
to force, or None) and its ``reason(weight, m, kernel)`` the line
:func:`q2gemv.explain` prints for it, with whether the launches follow.
"""

from __future__ import annotations

from . import nvfp4_tiers, registry
from .plan import ChunkPlan

# Output rows from which the 4-rows-per-warp M=1 kernel wins (a smaller grid leaves SMs
# idle; measured: docs/design_notes.md, defaults).
Q2_RT4_MIN_N = 16384


def default_q2_kernel(m: int, n: int = 0) -> str:
    """The Q2_0 kernel :func:`q2gemv.gemv` uses for ``m`` activation rows and ``n`` output rows.

    Every choice computes the same bits (all share q2_0_gemv_vec's per-row order); the
    rule picks the fastest measured (docs/design_notes.md, defaults):

    * M=1 and ``n >= Q2_RT4_MIN_N``: ``q2_0_gemv_vec_rt4``;
    * otherwise ``q2_0_gemv_vec_batchm_rt2`` in chunks of
      :data:`~q2gemv.dispatch.registry.Q2_BATCHM_MAX_M`, built per M (at M=1 it loads
      activations directly).
    """
    if m == 1 and n >= Q2_RT4_MIN_N:
        return "q2_0_gemv_vec_rt4"
    return "q2_0_gemv_vec_batchm_rt2"


def default_w4a16_tiers() -> nvfp4_tiers.W4a16BatchmTiers:
    """Every tier this package builds counts as present; the kill switches still apply."""
    return nvfp4_tiers.W4a16BatchmTiers.resolve(available=nvfp4_tiers.candidate_kernel_names())


def q2_0_seed_plan(weight, m: int, kernel: str | None) -> ChunkPlan:
    """Q2_0, seed: ``m`` rows on the default kernel for ``weight``'s N (or ``kernel``), in chunks."""
    name = default_q2_kernel(m, weight.n) if kernel is None else kernel
    return ChunkPlan(m, registry.table("q2_0", "seed")[name], lambda rows: name)


def q2_0_seed_reason(weight, m: int, kernel: str | None) -> tuple[str, bool]:
    """Q2_0, seed: the kernel for ``m`` rows of ``weight`` (or ``kernel``) and why; launches follow."""
    name = kernel or default_q2_kernel(m, weight.n)
    if kernel:
        why = "forced by kernel="
    elif m == 1 and weight.n >= Q2_RT4_MIN_N:
        why = f"default for M=1, N >= {Q2_RT4_MIN_N}: 4 rows per warp"
    else:
        why = "default: 2 rows per warp, built for this M, chunks of 8"
    return f"m = {m}; kernel: {name if m else '-'} ({why})", True


def w4a16_seed_plan(weight, m: int, kernel: str | None) -> ChunkPlan:
    """NVFP4, seed: the tier plan of ``m`` rows, or one forced tier ``kernel`` covering ``m``.

    ``weight`` is not needed (the tiers depend on M alone); the signature is every seed rule's.
    """
    if kernel is None:
        t = default_w4a16_tiers()
        wide = (
            nvfp4_tiers.WIDE_MAX_M
        )  # plan_w4a16's chunk; its kernel depends only on the chunk's rows
        full = nvfp4_tiers.plan_w4a16(wide, t)[0][2]
        tail = nvfp4_tiers.plan_w4a16(m % wide, t)[0][2] if m % wide else full
        return ChunkPlan(m, wide, lambda rows: full if rows == wide else tail)
    table = registry.table("w4a16", "seed")
    if kernel not in table:
        raise ValueError(f"kernel: expected one of {tuple(table)}, got {kernel!r}")
    if m > table[kernel]:
        raise ValueError(
            f"kernel: {kernel} serves at most {table[kernel]} rows, got M={m} "
            "(leave kernel=None to let the tier plan chunk it)"
        )
    return ChunkPlan(m, max(m, 1), lambda rows: kernel)


def w4a16_seed_reason(weight, m: int, kernel: str | None) -> tuple[str, bool]:
    """NVFP4, seed: the forced tier ``kernel``, or the tier table's account for ``m`` rows.

    The account lists its own plan (no launches follow); ``weight`` is not needed.
    """
    if kernel is None:
        return nvfp4_tiers.explain_tier(m, default_w4a16_tiers()), False
    return f"m = {m}; kernel forced: {kernel}", True


__all__ = [
    "Q2_RT4_MIN_N",
    "default_q2_kernel",
    "default_w4a16_tiers",
    "q2_0_seed_plan",
    "q2_0_seed_reason",
    "w4a16_seed_plan",
    "w4a16_seed_reason",
]

"""``q2gemv.gemv`` and ``q2gemv.explain``: validate, pick a kernel and a backend, run.

Both families go through here: a :class:`~q2gemv.Q2Weight` runs the Q2_0
kernels, an :class:`~q2gemv.Nvfp4Weight` the W4A16 tiers. Nothing here
imports numba until a CUDA launch is asked for.

Two numerics contracts (``numerics=``, resolved by :func:`resolve_numerics`):

* ``"exact"`` — the result is a value, not an order: the bf16 nearest to
  the exact sum (:mod:`q2gemv.reference.exact`, ``docs/numerics.md``), so
  any kernel, K split or chunking of M gives the same bits. Kernels
  ``q2_0_gemv_exact`` and ``w4a16_gemv_exact``. The default for both families.
* ``"seed"`` — each kernel's documented fp32 order (the references in
  :mod:`q2gemv.reference`): the Q2_0 kernels of :data:`Q2_KERNELS` and
  every W4A16 tier (dispatched by ``select_tier`` with the kill switches).
"""

from __future__ import annotations

import functools

import numpy as np

from .dispatch import nvfp4_tiers, registry
from .dispatch.plan import PLAN_MAX_M, ChunkPlan  # noqa: F401 - PLAN_MAX_M: the bound of every planner
from .dispatch.seed_rules import (  # noqa: F401 - the seed rules, re-exported under their old api names
    Q2_RT4_MIN_N,
    default_q2_kernel,
    default_w4a16_tiers,
)
from .host import call
from .host.arrays import call_key, is_device_array
from .host.backends import describe_default, simulator_lock
from .host.call import (  # noqa: F401 - the road's checks, re-exported under their api names
    NUMERICS,
    check_call_args,
    check_m,
    check_out,
    family_spec,
    resolve_numerics,
    weight_arrays,
)

# Live read-only views of the registry (q2gemv.dispatch.registry): kernel -> activation rows per launch.
Q2_KERNELS = registry.table("q2_0", "seed")
# The exact contract's kernels (chunks cut by the launcher, after one exact_prepare over all rows).
Q2_EXACT_KERNELS = registry.table("q2_0", "exact")
W4A16_KERNELS = registry.table("w4a16", "seed")  # kernel -> max M per launch
W4_EXACT_KERNELS = registry.table("w4a16", "exact")
EXACT_Q2_KERNEL = registry.family("q2_0").exact_kernel
EXACT_W4_KERNEL = registry.family("w4a16").exact_kernel
EXPLAIN_MAX_LAUNCHES = nvfp4_tiers.EXPLAIN_MAX_LAUNCHES  # explain lists this many, then summarises


def weight_family(weight) -> tuple[str, bool]:
    """``("q2_0" | "w4a16", on_device)`` of a weight; TypeError naming ``weight`` otherwise."""
    spec, on_device = family_spec(weight)
    return spec.name, on_device


def plan(weight, m: int, kernel: str | None = None, *, numerics: str | None = None) -> ChunkPlan:
    """The launches ``(row0, rows, kernel)`` that serve ``m`` activation rows.

    Args:
        weight: a Q2Weight / Nvfp4Weight (or a device-resident one): picks the family.
        m: activation rows (int, 0 <= m <= :data:`PLAN_MAX_M`).
        kernel: a kernel name to force, or None for the default choice.
        numerics: ``"exact"``, ``"seed"`` or None (``"exact"`` unless a seed
            kernel is forced); see :func:`resolve_numerics`.

    Exact: the exact kernel in chunks of its rows per launch
    (:data:`Q2_EXACT_KERNELS`, :data:`W4_EXACT_KERNELS`: 8 for
    ``q2_0_gemv_exact`` and for ``w4a16_gemv_exact``; the contract's
    activation prepare runs once over all rows before them, it is not a plan
    entry). Q2_0, seed: the default kernel (or ``kernel``) in chunks of its
    rows per launch (1 for the M=1 kernels: one launch per activation row).
    W4A16, seed: the tier plan of :func:`q2gemv.dispatch.nvfp4_tiers.plan_w4a16`,
    or one forced tier, which must cover ``m`` (a forced tier is never
    chunked silently). Empty for m == 0. Returned as a
    :class:`q2gemv.dispatch.plan.ChunkPlan`: a sequence of those tuples (equal
    to the list of them) computed entry by entry, so even ``m = 2**31 - 1``
    costs nothing to describe; :func:`explain` summarises long plans.

    Raises:
        TypeError naming ``weight``; ValueError naming ``m``, ``kernel`` or ``numerics``.
    """
    return call.build_plan(weight, m, kernel, numerics).launches


def _serialised_in_simulator(fn):
    """Run ``fn`` under :func:`q2gemv.host.backends.simulator_lock` unless its backend is the reference.

    numba's CUDA simulator cannot run two calls at once (see that function);
    on a GPU the lock is a no-op. All arguments pass through unchanged.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if kwargs.get("backend") == "reference":
            return fn(*args, **kwargs)
        with simulator_lock():
            return fn(*args, **kwargs)

    return wrapper


def gemv(
    a: np.ndarray,
    weight,
    *,
    kernel: str | None = None,
    backend: str | None = None,
    out: np.ndarray | None = None,
    stream=None,
    numerics: str | None = None,
):
    """``y = a @ dequantize(weight).T`` in bf16 (or fp16), bit-exact across backends.

    Args:
        a: ``ml_dtypes.bfloat16`` activations, [K] or [M, K] (any M >= 0), or
            ``np.float16`` ones (exact contract only: fp16 in, fp16 out); or
            activations already on the GPU (see :mod:`q2gemv.cuda.runtime.interop`):
            a numba/CuPy device array of uint16 bf16 bits or a CUDA
            ``torch.bfloat16`` / ``torch.float16`` tensor, which stay on the device; or the
            result of :func:`q2gemv.prepare` (Q2_0 weights, exact contract
            only: the activations converted once for several GEMVs).
        weight: a :class:`~q2gemv.Q2Weight` or :class:`~q2gemv.Nvfp4Weight`
            (or their device-resident forms from ``.to_device()`` /
            ``q2gemv.cuda``, which imply ``backend="cuda"``).
        kernel: force one kernel. Exact: ``"q2_0_gemv_exact"``,
            ``"w4a16_gemv_exact"`` (chunks of 8 rows each). Q2_0 seed: ``"q2_0_gemv"``, ``"q2_0_gemv_vec"``,
            ``"q2_0_gemv_vec_rt4"`` (M=1 kernels: one launch per activation
            row), ``"q2_0_gemv_vec_batchm"``, ``"q2_0_gemv_vec_batchm_rt2"``
            (chunks of at most 8 rows); naming one runs the seed contract
            even with ``numerics`` left None. W4A16: any tier
            (``w4a16_gemv_batch4`` .. ``_batch8``, ``_batch8_rt2``,
            ``_batch16``, ``_batch32``; the seed contract), which must cover
            M. Default: see
            :func:`plan` and :func:`explain`.
        backend: ``"reference"`` (NumPy) or ``"cuda"`` (the numba kernels on
            the GPU, or the CUDA simulator when ``NUMBA_ENABLE_CUDASIM=1``).
            Default: ``"cuda"`` where available, else ``"reference"``.
        out: optional array of the result's shape to write into: numpy of ``a``'s dtype
            (bfloat16 or float16) for host ``a``, the same kind of device array (a torch
            tensor of ``a``'s dtype) for device ``a``.
        stream: CUDA backend only: a numba stream or a raw ``cudaStream_t``
            handle (int); default 0, or torch's current stream for torch ``a``.
        numerics: the contract, ``"exact"`` or ``"seed"``; None (default) is
            ``"exact"`` for both families (kernels ``q2_0_gemv_exact`` and
            ``w4a16_gemv_exact``, references in :mod:`q2gemv.reference.exact`:
            the bf16 nearest to the exact sum, the same bits for any M or
            chunking). ``"seed"`` is the seed's kernels and references
            exactly as before the exact contract (NVFP4: the tier plan of
            ``select_tier`` with its kill switches). See :func:`resolve_numerics`.

    Returns:
        bfloat16 [M, N] (or [N] for 1-D ``a``), float16 for float16 ``a``; ``out`` itself
        when given. For device ``a``: a device array of the same kind (see the interop
        module).

    Raises:
        TypeError / ValueError naming the argument, before anything is launched.

    Repeated calls: with a device-resident weight, device ``a`` and ``out=``,
    the first call validates everything and binds its launches (one driver
    call each); a later call with the same buffers (addresses, shapes,
    dtypes, strides), stream, ``kernel`` and ``numerics`` is a dictionary
    lookup on the weight plus those launches (:func:`call_key`).
    """
    cache = getattr(weight, "launch_cache", None)  # device-resident weights only
    key = None
    if cache is not None and out is not None and (backend is None or backend == "cuda"):
        key = call_key(a, out, stream, kernel, numerics)
        if key is not None:
            bound = cache.get(key)
            if bound is not None:
                bound()
                return out
    return _gemv(
        a, weight, kernel=kernel, backend=backend, out=out, stream=stream, numerics=numerics,
        key=key,
    )  # fmt: skip


@_serialised_in_simulator
def _gemv(a, weight, *, kernel, backend, out, stream, numerics, key):
    """:func:`gemv` past its cache: the call built (every check), then run."""
    c = call.build(a, weight, kernel=kernel, backend=backend, out=out, stream=stream,
                   numerics=numerics, key=key)  # fmt: skip
    return call.run(c)


def _numerics_line(family: str, mode: str, numerics: str | None, kernel: str | None) -> str:
    """The contract :func:`explain` reports, and why it applies."""
    if mode == "exact":
        what = (
            "exact (order-free: the bf16 nearest to the exact sum, one rounding, the same "
            "bits for any M, chunking or K split; docs/numerics.md, q2gemv.reference.exact)"
        )
    else:
        what = (
            "seed (each kernel's documented fp32 order; the reference of the same name in "
            "q2gemv.reference)"
        )
    fam = registry.family(family).title
    if numerics is not None:
        why = f"numerics={numerics!r}"
    elif kernel is not None:
        why = f"kernel={kernel!r} names a {mode} kernel: kernel= wins over the {fam} default"
    else:
        why = f"the {fam} default"
    return f"numerics: {what}; {why}"


def _launches_line(launches, count: int, m: int) -> str:
    """``launches (count): rows a..b on K, ...`` for the ``count`` launches serving ``m`` rows.

    Beyond :data:`EXPLAIN_MAX_LAUNCHES` launches: the first ones, how many are
    left out, and the last (``launches`` is a :class:`~q2gemv.dispatch.plan.ChunkPlan`:
    indexing it builds nothing else).
    """
    if count == 0:
        return "launches: none (m = 0)"
    if count <= EXPLAIN_MAX_LAUNCHES:
        shown = list(launches)
    else:
        shown = [*launches[: EXPLAIN_MAX_LAUNCHES - 1], launches[-1]]
    parts = [f"rows {r0}..{r0 + rows - 1} on {name}" for r0, rows, name in shown]
    if count > EXPLAIN_MAX_LAUNCHES:
        parts.insert(-1, f"... ({count - EXPLAIN_MAX_LAUNCHES} more like these)")
    return f"launches ({count}): " + ", ".join(parts)


def explain(weight, m: int, kernel: str | None = None, *, numerics: str | None = None) -> str:
    """Human-readable account of what :func:`gemv` would launch for ``m`` rows, and why.

    Args:
        weight: a Q2Weight / Nvfp4Weight (or a device-resident one).
        m: activation rows (int, 0 <= m <= :data:`PLAN_MAX_M`).
        kernel: a kernel name to force, or None for the default choice.
        numerics: ``"exact"``, ``"seed"`` or None (exact), as for :func:`gemv`.

    Returns a multi-line string: the weight, the backend, the numerics
    contract it picked and why, the chosen kernel or tier and the reason
    (for NVFP4 under the seed contract: the tier table, its present mask and
    the kill switches, from :func:`q2gemv.dispatch.nvfp4_tiers.explain_tier`), and the launches. Long plans are
    summarised (the first :data:`EXPLAIN_MAX_LAUNCHES` launches and a count),
    never built in full. Raises the same errors as :func:`plan`.
    """
    c = call.build_plan(weight, m, kernel, numerics)
    spec, mode, m, family = c.spec, c.mode, c.m, c.spec.name
    head = f"{family} weight n={weight.n} k={weight.k}" + (
        f" group={weight.group}" if spec.grouped else ""
    )
    lines = [head, describe_default(c.on_device)]  # which backend gemv would use
    lines.append(_numerics_line(family, mode, numerics, kernel))
    if mode == "exact":
        name = kernel or spec.exact_kernel
        why = "forced by kernel=" if kernel else "default for numerics='exact'"
        line, more = (
            f"m = {m}; kernel: {name if m else '-'} ({why}: its activation prepare once, then "
            f"chunks of {registry.get(name).max_m} rows)",
            True,
        )
    else:
        line, more = registry.resolve(spec.seed_reason)(weight, m, kernel)
    lines.append(line)
    if not more:
        return "\n".join(lines)  # the rule's account lists (or summarises) its own plan
    lines.append(_launches_line(c.launches, len(c.launches), m))
    return "\n".join(lines)


__all__ = [
    "gemv",
    "explain",
    "plan",
    "resolve_numerics",
    "default_q2_kernel",
    "weight_family",
    "is_device_array",
]

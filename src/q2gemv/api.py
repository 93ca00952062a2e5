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

from .dispatch import nvfp4_tiers as tiers
from .dispatch import plan as launch
from .dispatch import registry as kernels
from .dispatch.seed_rules import (  # noqa: F401 - the seed rules, re-exported under their old api names
    Q2_RT4_MIN_N,
    default_q2_kernel,
    default_w4a16_tiers,
)
from .formats.bf16 import BF16, as_bf16_rows, bits_to_bf16
from .host.arrays import call_key, check_stream, is_device_array, numba_stream
from .host.backends import BACKENDS, default_backend, describe_default, require_cuda, simulator_lock
from .host.prepared import PreparedActivations

# Live read-only views of the registry (q2gemv.dispatch.registry): kernel -> activation rows per launch.
Q2_KERNELS = kernels.table("q2_0", "seed")
# The exact contract's kernels (chunks cut by the launcher, after one exact_prepare over all rows).
Q2_EXACT_KERNELS = kernels.table("q2_0", "exact")
W4A16_KERNELS = kernels.table("w4a16", "seed")  # kernel -> max M per launch
W4_EXACT_KERNELS = kernels.table("w4a16", "exact")
EXACT_Q2_KERNEL = kernels.family("q2_0").exact_kernel
EXACT_W4_KERNEL = kernels.family("w4a16").exact_kernel
NUMERICS = ("exact", "seed")
PLAN_MAX_M = launch.PLAN_MAX_M  # int32 row counts: the one bound of every planner
EXPLAIN_MAX_LAUNCHES = tiers.EXPLAIN_MAX_LAUNCHES  # explain lists this many, then summarises


def family_spec(weight) -> tuple[kernels.FamilySpec, bool]:
    """``(family spec, on_device)`` of a weight; TypeError naming ``weight`` otherwise."""
    found = kernels.family_of(weight)
    if found is None:
        raise TypeError(
            "weight: expected a Q2Weight, Nvfp4Weight or their device-resident forms, "
            f"got {type(weight).__name__}"
        )
    return found


def weight_family(weight) -> tuple[str, bool]:
    """``("q2_0" | "w4a16", on_device)`` of a weight; TypeError naming ``weight`` otherwise."""
    spec, on_device = family_spec(weight)
    return spec.name, on_device


def weight_arrays(weight) -> dict[str, np.ndarray]:
    """The host arrays holding a weight's bytes, by attribute name (none for a device weight)."""
    found = kernels.family_of(weight)
    if found is None or found[1]:
        return {}
    return {name: getattr(weight, name) for name in found[0].weight_arrays}


def check_out(out, a, shape: tuple[int, ...], weight=None) -> None:
    """Refuse an ``out`` that is not a writeable bfloat16 array of ``shape``, or overlaps an input.

    Inputs are the activations ``a`` and the bytes of ``weight`` (when given):
    writing results over them would corrupt the call's own inputs (and, for
    a weight, every later call).
    """
    if not isinstance(out, np.ndarray) or out.dtype != BF16:
        got = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        raise TypeError(f"out: expected a bfloat16 numpy array, got {got}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out: expected a writeable array")
    if np.shares_memory(out, a):
        raise ValueError("out: must not alias the activations a")
    for name, arr in weight_arrays(weight).items():
        if np.shares_memory(out, arr):
            raise ValueError(f"out: must not overlap the weight's bytes (weight.{name})")


def resolve_numerics(family: str, numerics: str | None = None, kernel: str | None = None) -> str:
    """The contract a call runs under, ``"exact"`` or ``"seed"``; errors name the argument.

    Args:
        family: ``"q2_0"`` or ``"w4a16"`` (:func:`weight_family`).
        numerics: ``"exact"``, ``"seed"`` or None (the family's default).
        kernel: the kernel forced by ``kernel=``, or None.

    Rules: ``numerics=None`` is ``"exact"`` for both families, unless a
    forced kernel decides (a seed kernel, or a W4A16 tier, runs the seed
    contract: ``kernel=`` wins over the default); a kernel of the other
    contract than an explicit ``numerics`` is a ValueError naming
    ``kernel``. Validates ``numerics`` before anything else.
    """
    if numerics is not None and (not isinstance(numerics, str) or numerics not in NUMERICS):
        raise ValueError(
            f"numerics: expected one of {NUMERICS} or None (the weight family's default), "
            f"got {numerics!r}"
        )
    if kernel is None:
        return numerics or "exact"
    exact, seed = kernels.table(family, "exact"), kernels.table(family, "seed")
    if kernel in exact:
        if numerics == "seed":
            raise ValueError(
                f"kernel: {kernel} computes the exact contract, but numerics='seed' was asked "
                f"for (seed kernels: {', '.join(seed)})"
            )
        return "exact"
    if kernel in seed:
        if numerics == "exact":
            raise ValueError(
                f"kernel: {kernel} computes the seed contract, but numerics='exact' was asked "
                f"for (the exact kernel: {', '.join(exact)}; or leave numerics=None)"
            )
        return "seed"
    raise ValueError(f"kernel: expected one of {(*seed, *exact)}, got {kernel!r}")


def check_m(m) -> int:
    """``m`` as an int in ``0 .. PLAN_MAX_M``; ValueError naming ``m`` otherwise.

    The bound keeps :func:`plan` finite (one entry per launch) and matches the
    kernels' int32 row counts and offsets.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
        raise ValueError(f"m: expected an int >= 0, got {m!r}")
    if m > PLAN_MAX_M:
        raise ValueError(
            f"m: expected at most {PLAN_MAX_M} rows (the kernels take int32 row counts), got {m}"
        )
    return int(m)


def plan(
    weight, m: int, kernel: str | None = None, *, numerics: str | None = None
) -> launch.ChunkPlan:
    """The launches ``(row0, rows, kernel)`` that serve ``m`` activation rows.

    Args:
        weight: a Q2Weight / Nvfp4Weight (or a device-resident one): picks the family.
        m: activation rows (int, 0 <= m <= :data:`PLAN_MAX_M`).
        kernel: a kernel name to force, or None for the default choice.
        numerics: ``"exact"``, ``"seed"`` or None (``"exact"`` unless a seed
            kernel is forced); see :func:`resolve_numerics`.

    Exact: ``q2_0_gemv_exact`` in chunks of ``launch.Q2_EXACT_MAX_M`` rows,
    ``w4a16_gemv_exact`` in chunks of 16 (the contract's activation prepare
    runs once over all rows before them; it is not a plan entry). Q2_0, seed: the default kernel (or ``kernel``) in chunks of its
    rows per launch (1 for the M=1 kernels: one launch per activation row).
    W4A16, seed: the tier plan of :func:`q2gemv.dispatch.nvfp4_tiers.plan_w4a16`, or one forced
    tier, which must cover ``m`` (a forced tier is never chunked silently).
    Empty for m == 0. Returned as a :class:`q2gemv.dispatch.plan.ChunkPlan`: a
    sequence of those tuples (equal to the list of them) that is computed
    entry by entry, so even ``m = 2**31 - 1`` costs nothing to describe;
    :func:`explain` summarises long plans instead of listing them.

    Raises:
        TypeError naming ``weight``; ValueError naming ``m``, ``kernel`` or ``numerics``.
    """
    family, _ = weight_family(weight)
    check_call_args(kernel, None, None)
    m = check_m(m)
    mode = resolve_numerics(family, numerics, kernel)
    return _plan_iter(weight, family, mode, m, kernel)


def _plan_iter(weight, family: str, mode: str, m: int, kernel: str | None):
    """The entries of :func:`plan` as a sequence that is never materialised (arguments checked)."""
    spec = kernels.family(family)
    if mode == "exact":
        name = spec.exact_kernel if kernel is None else kernel
        return launch.ChunkPlan(m, kernels.get(name).max_m, lambda rows: name)
    return kernels.resolve(spec.seed_plan)(weight, m, kernel)


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
    """``y = a @ dequantize(weight).T`` in bf16, bit-exact across backends.

    Args:
        a: ``ml_dtypes.bfloat16`` activations, [K] or [M, K] (any M >= 0); or
            activations already on the GPU (see :mod:`q2gemv.cuda.runtime.interop`):
            a numba/CuPy device array of uint16 bf16 bits or a CUDA
            ``torch.bfloat16`` tensor, which stay on the device; or the
            result of :func:`q2gemv.prepare` (Q2_0 weights, exact contract
            only: the activations converted once for several GEMVs).
        weight: a :class:`~q2gemv.Q2Weight` or :class:`~q2gemv.Nvfp4Weight`
            (or their device-resident forms from ``.to_device()`` /
            ``q2gemv.cuda``, which imply ``backend="cuda"``).
        kernel: force one kernel. Exact: ``"q2_0_gemv_exact"`` (chunks
            of ``launch.Q2_EXACT_MAX_M`` = 8 rows), ``"w4a16_gemv_exact"``
            (chunks of 16 rows). Q2_0 seed: ``"q2_0_gemv"``, ``"q2_0_gemv_vec"``,
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
        out: optional array of the result's shape to write into: bfloat16
            numpy for host ``a``, the same kind of device array for device ``a``.
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
        bfloat16 [M, N] (or [N] for 1-D ``a``); ``out`` itself when given. For
        device ``a``: a device array of the same kind (see the interop module).

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
    """:func:`gemv` past its cache: every check, then the launches (bound and cached under ``key``)."""
    family, on_device = weight_family(weight)
    check_call_args(kernel, backend, stream, on_device)
    mode = resolve_numerics(family, numerics, kernel)
    if isinstance(a, PreparedActivations):
        return _gemv_prepared(
            a, weight, family, on_device, mode, backend=backend, out=out, stream=stream
        )
    if is_device_array(a):
        return _gemv_device(
            a, weight, family, kernel=kernel, backend=backend, out=out, stream=stream,
            numerics=mode, key=key,
        )  # fmt: skip
    bits, was_1d = as_bf16_rows(a, weight.k)
    m, n = bits.shape[0], weight.n
    shape = (n,) if was_1d else (m, n)
    if out is not None:
        check_out(out, a, shape, weight)
    backend = _backend(backend, on_device, default_backend)
    launches = _plan_iter(weight, family, mode, m, kernel)  # arguments checked above

    if m == 0:
        y = np.empty((0, n), np.uint16)
    elif backend == "reference":  # the reference of the plan's kernel (every launch: same bits)
        fn = kernels.family(family).reference(launches[0][2])
        y = fn(bits_to_bf16(bits), weight).view(np.uint16)
    else:  # the plan's launches (exact: exact_prepare once, then the chunks), one launcher
        from .cuda.runtime import launcher

        st = numba_stream(stream)
        dw = kernels.family(family).as_device_weight(weight, st, mode)  # seed: storage only
        y = launcher.run_host(family, mode, launches, bits, dw, st)
    result = bits_to_bf16(y.reshape(shape))
    if out is not None:
        out[...] = result
        return out
    return result


def check_call_args(kernel, backend, stream, on_device: bool = False) -> None:
    """``kernel``, ``backend`` and ``stream`` of :func:`gemv`, refused before :func:`plan`.

    Before anything is uploaded or launched: a kernel that is not a name
    (``kernel=["q2_0_gemv"]``), an unknown backend, ``backend="cuda"`` where
    neither a GPU nor the simulator serves (ValueError saying how to get one),
    and a stream that is not None, a raw ``cudaStream_t`` (int >= 0) or a
    numba stream (``stream="x"`` used to fail only after the kernel ran).
    """
    if kernel is not None and not isinstance(kernel, str):
        raise TypeError(
            f"kernel: expected a kernel name (str) or None, got {type(kernel).__name__}"
        )
    if backend is not None and (not isinstance(backend, str) or backend not in BACKENDS):
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if backend == "cuda" and not on_device:
        require_cuda()
    check_stream(stream)


def _backend(backend: str | None, on_device: bool, default) -> str:
    """The backend a call runs on (``backend`` already checked by :func:`check_call_args`).

    None: ``"cuda"`` for a device weight, else ``default()``. The reference
    backend cannot read a device weight (TypeError naming ``weight``).
    """
    if backend is None:
        backend = "cuda" if on_device else default()
    if backend == "reference" and on_device:
        raise TypeError("weight: the reference backend needs a host weight, not a device one")
    return backend


def _gemv_device(a, weight, family: str, *, kernel, backend, out, stream, numerics: str, key=None):
    """Device-resident activations: validate here, launch in :mod:`q2gemv.cuda.runtime.interop`."""
    if backend not in (None, "cuda"):
        raise ValueError(f"backend: activations on the GPU need backend='cuda', got {backend!r}")
    shape = tuple(a.shape)
    if len(shape) not in (1, 2):
        raise ValueError(f"a: expected shape [K] or [M, K], got {shape}")
    if shape[-1] != weight.k:
        raise ValueError(f"a: expected K={weight.k} columns (the weight's k), got {shape[-1]}")
    m = 1 if len(shape) == 1 else shape[0]
    launches = _plan_iter(weight, family, numerics, m, kernel)  # arguments checked by _gemv
    from .cuda.runtime import interop

    out_shape = (weight.n,) if len(shape) == 1 else (m, weight.n)
    return interop.gemv_device(
        a, weight, launches, out_shape, family=family, out=out, stream=stream,
        numerics=numerics, key=key,
    )  # fmt: skip


def _gemv_prepared(p, weight, family: str, on_device: bool, mode: str, *, backend, out, stream):
    """``gemv`` on :func:`q2gemv.prepare`'s result: Q2_0 exact only; bits equal to ``gemv(a, w)``."""
    spec = kernels.family(family)
    if not spec.prepared or mode != "exact":
        what = (
            f"an {spec.title} weight" if not spec.prepared else "numerics='seed' or a seed kernel"
        )
        raise ValueError(
            f"a: prepared activations (q2gemv.prepare) serve Q2_0 weights under the exact "
            f"contract only, not {what}; pass the bf16 array instead"
        )
    if p.k != weight.k:
        raise ValueError(f"a: expected K={weight.k} columns (the weight's k), got {p.k}")
    m, n = p.m, weight.n
    shape = (n,) if p.was_1d else (m, n)
    if out is not None:
        check_out(out, p.bits, shape, weight)
    backend = _backend(backend, on_device, lambda: p.backend)
    if m == 0:
        y = np.empty((0, n), np.uint16)
    elif backend == "reference":
        fn = spec.reference(spec.exact_kernel)
        y = fn(bits_to_bf16(p.bits), weight).view(np.uint16)
    else:
        if p.operands is None:
            raise ValueError(
                "a: these activations were prepared for the reference backend (no device "
                "operands); call q2gemv.prepare(a, backend='cuda') for the cuda backend"
            )
        from .host.prepared import run_prepared_cuda

        y = run_prepared_cuda(p, weight, numba_stream(stream))
    result = bits_to_bf16(y.reshape(shape))
    if out is not None:
        out[...] = result
        return out
    return result


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
    fam = kernels.family(family).title
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
    family, on_device = weight_family(weight)
    check_call_args(kernel, None, None)
    m = check_m(m)
    mode = resolve_numerics(family, numerics, kernel)
    spec = kernels.family(family)
    head = f"{family} weight n={weight.n} k={weight.k}" + (
        f" group={weight.group}" if spec.grouped else ""
    )
    lines = [head, describe_default(on_device)]  # which backend gemv would use
    lines.append(_numerics_line(family, mode, numerics, kernel))
    if mode == "exact":
        name = kernel or spec.exact_kernel
        why = "forced by kernel=" if kernel else "default for numerics='exact'"
        line, more = (
            f"m = {m}; kernel: {name if m else '-'} ({why}: its activation prepare once, then "
            f"chunks of {kernels.get(name).max_m} rows)",
            True,
        )
    else:
        line, more = kernels.resolve(spec.seed_reason)(weight, m, kernel)
    lines.append(line)
    if not more:
        return "\n".join(lines)  # the rule's account lists (or summarises) its own plan
    launches = _plan_iter(weight, family, mode, m, kernel)
    count = len(launches)
    lines.append(_launches_line(launches, count, m))
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

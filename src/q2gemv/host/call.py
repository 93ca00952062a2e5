"""One road from a call to a kernel: :class:`Call`, built and validated once, then run.

Every GEMV of the package is a :class:`Call`: :func:`q2gemv.gemv` on host
activations, on activations already on the GPU and on
:func:`q2gemv.prepare`'s result; :func:`q2gemv.plan` and
:func:`q2gemv.explain` (a call without activations); the golden harness's
single kernels (:func:`run_kernel`). :func:`build` checks everything, in one
order, before anything is uploaded or launched; :func:`run` runs it on the
reference backend or through :mod:`q2gemv.cuda.runtime.launcher`::

    gemv(a, w, ...) ──► build ──► Call(spec, mode, weight, activations, m/n/k, out, stream,
                          │             backend, launches, route)
                          │  host bits | device view | prepared operands
                          ▼
                         run ──► reference: the plan's kernel's NumPy reference
                              └► cuda: launcher.run_bits (host: upload, launches, download)
                                       | launcher.enqueue (device: launches, bound and cached)

Host and device calls differ only at the edges: host bits are uploaded and
the result downloaded; device activations stay where they are, and a call
with a device weight and ``out=`` binds its launches under its key
(:func:`q2gemv.host.arrays.call_key`) for :func:`q2gemv.gemv`'s fast path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dispatch import plan, registry
from ..formats.act import BF16 as BF16_ACT
from ..formats.act import ActFormat
from . import operands
from .arrays import check_stream, numba_stream
from .backends import BACKENDS, require_cuda
from .operands import check_act, check_out, weight_arrays  # noqa: F401 - re-exported (api)

NUMERICS = ("exact", "seed")


# -- the checks, in the order build() runs them -----------------------------------------------


def family_spec(weight) -> tuple[registry.FamilySpec, bool]:
    """``(family spec, on_device)`` of a weight; TypeError naming ``weight`` otherwise."""
    found = registry.family_of(weight)
    if found is None:
        raise TypeError(
            f"weight: expected a {registry.host_weight_names()} or their device-resident forms, "
            f"got {type(weight).__name__}"
        )
    return found


def check_call_args(kernel, backend, stream, on_device: bool = False) -> None:
    """``kernel``, ``backend`` and ``stream`` of :func:`q2gemv.gemv`, refused before a plan.

    Before anything is uploaded or launched: a kernel that is not a name
    (``kernel=["q2_0_gemv"]``), an unknown backend, ``backend="cuda"`` where
    neither a GPU nor the simulator serves (ValueError saying how to get one),
    and a stream that is not None, a raw ``cudaStream_t`` (int >= 0) or a
    numba stream.
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


def resolve_numerics(family: str, numerics: str | None = None, kernel: str | None = None) -> str:
    """The contract a call runs under, ``"exact"`` or ``"seed"``; errors name the argument.

    Args:
        family: ``"q2_0"`` or ``"w4a16"`` (:func:`q2gemv.api.weight_family`).
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
    exact, seed = registry.table(family, "exact"), registry.table(family, "seed")
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

    The bound keeps a plan finite (one entry per launch) and matches the
    kernels' int32 row counts and offsets.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
        raise ValueError(f"m: expected an int >= 0, got {m!r}")
    if m > plan.PLAN_MAX_M:
        raise ValueError(
            f"m: expected at most {plan.PLAN_MAX_M} rows (the kernels take int32 row counts), "
            f"got {m}"
        )
    return int(m)


# -- the call ----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Call:
    """One GEMV, validated: what :func:`run` needs and nothing it must check again.

    Attributes:
        spec: the weight's family; ``mode``: ``"exact"`` or ``"seed"``.
        weight: the caller's weight (host or device); ``dw``: the device weight
            the launches read (cuda backend; None otherwise).
        form: how the activations came: ``"host"`` (``a`` uint16 bf16 bits
            [M, K]), ``"device"`` (``a`` a uint16 device view [M, K] of the
            caller's array ``caller_a``), ``"prepared"`` (``a`` the
            :class:`~q2gemv.host.prepared.PreparedActivations`) or ``"plan"``
            (none: :func:`q2gemv.plan` / :func:`q2gemv.explain`).
        m, n, k: activation rows, output columns, the reduction length.
        shape: the result's shape, ``(N,)`` for 1-D activations or ``(M, N)``.
        out: the validated ``out`` (None: a new result); device form: ``result``
            is what is returned and ``d_out`` its uint16 [M, N] device view.
        stream: the numba stream (or 0) launches go on; backend: ``"reference"``
            or ``"cuda"``; launches: the plan, ``(row0, rows, kernel)`` entries.
        key: the call's launch-cache key (device weight, device ``a`` and ``out``).
        route: the call's registry entries, resolved once by :func:`build`
            (:class:`~q2gemv.dispatch.registry.Route`: the launching module and
            exact kernel on the cuda backend, the plan's reference on the
            reference backend); None for a plan.
        act: the activations' format, bf16 or fp16 (:mod:`q2gemv.formats.act`): the
            result's too.
    """

    spec: registry.FamilySpec
    mode: str
    weight: object
    on_device: bool
    form: str
    a: object
    m: int
    n: int
    k: int
    shape: tuple[int, ...]
    launches: object
    backend: str = "cuda"
    out: object = None
    stream: object = 0
    dw: object = None
    caller_a: object = None
    result: object = None
    d_out: object = None
    key: tuple | None = None
    route: registry.Route | None = None
    act: ActFormat = BF16_ACT


def build_plan(weight, m, kernel: str | None = None, numerics: str | None = None) -> Call:
    """The call :func:`q2gemv.plan` and :func:`q2gemv.explain` describe: ``m`` rows, no activations."""
    spec, on_device = family_spec(weight)
    check_call_args(kernel, None, None)
    m = check_m(m)
    mode = resolve_numerics(spec.name, numerics, kernel)
    launches = plan.plan_launches(weight, spec, mode, m, kernel)
    return Call(spec, mode, weight, on_device, "plan", None, m, weight.n, weight.k, (m, weight.n),
                launches, backend="")  # fmt: skip


def build(a, weight, *, kernel=None, backend=None, out=None, stream=None, numerics=None,
          key=None) -> Call:  # fmt: skip
    """Validate one :func:`q2gemv.gemv` call and return it as a :class:`Call`.

    Checks run in this order, each raising the TypeError / ValueError naming
    its argument: the weight, ``kernel`` / ``backend`` / ``stream``, ``numerics``
    (against ``kernel``), then the activations in their form (shape, K; on
    the host ``out`` and the backend for the weight: :func:`q2gemv.host.operands.take`),
    the plan; on the cuda backend the weight is then made device-resident (a
    host weight uploaded for this call); device activations: their bits,
    then ``out`` (:mod:`q2gemv.cuda.runtime.interop`).
    """
    spec, on_device = family_spec(weight)
    check_call_args(kernel, backend, stream, on_device)
    mode = resolve_numerics(spec.name, numerics, kernel)
    x = operands.take(a, weight, spec, mode, on_device, backend, out, stream)
    forced = spec.prepared_kernel if x.form == "prepared" else kernel
    launches = plan.plan_launches(weight, spec, mode, x.m, forced)
    if x.form != "device":
        st = numba_stream(stream)
        route = registry.route(spec, mode, launches, x.backend)
        # cuda: the device weight the launches read (seed: the storage bytes only)
        dw = spec.as_device_weight(weight, st, mode) if x.backend == "cuda" else None
        return Call(spec, mode, weight, on_device, x.form, x.a, x.m, weight.n, weight.k, x.shape,
                    launches, x.backend, out, st, dw, route=route, act=x.act)  # fmt: skip
    from ..cuda.runtime import interop  # activations on the GPU

    d_a = interop.device_bits(a, "a", x.kind)
    dw = spec.as_device_weight(weight, x.stream, mode)
    route = registry.route(spec, mode, launches)
    if mode == "exact":
        route.module.check_k(dw.k)
    result, d_out = interop.output(x.kind, a, d_a, dw, spec.device_arrays, x.shape, out, x.stream)
    return Call(spec, mode, weight, on_device, "device", d_a.reshape(x.m, dw.k), x.m, dw.n, dw.k,
                x.shape, launches, "cuda", out, x.stream, dw, a, result, d_out.reshape(x.m, dw.n),
                key, route, x.act)  # fmt: skip


# -- running it --------------------------------------------------------------------------------


def run(c: Call):
    """Run a built :class:`Call`; returns ``c.shape`` in the activations' dtype (bf16 or fp16;
    ``out`` itself when given)."""
    if c.m and c.backend == "cuda":
        y = _run_cuda(c)  # the device form: written into its device output, nothing to copy
        if c.form == "device":
            return c.result
    elif c.form == "device":
        return c.result
    elif c.m == 0:
        y = np.empty((0, c.n), np.uint16)
    else:  # the reference of the plan's kernel (every launch: same bits)
        bits = c.a.bits if c.form == "prepared" else c.a
        y = c.route.reference_fn(c.act.from_bits(bits), c.weight).view(np.uint16)
    result = c.act.from_bits(y.reshape(c.shape))
    if c.out is None:
        return result
    c.out[...] = result
    return c.out


def _run_cuda(c: Call):
    """The launches of ``c`` through the one launcher; host forms: uploaded, then downloaded."""
    from ..cuda.runtime import launcher

    route, st = c.route, c.stream
    if c.form == "device":
        cache = getattr(c.weight, "launch_cache", None) if c.key is not None else None
        keep = (c.caller_a, c.out, c.stream)
        launcher.enqueue(route, c.launches, c.dw, c.a, c.d_out, st, c.key, cache, keep, c.act)
        return None
    if c.form == "prepared":  # the operands made once by q2gemv.prepare: no prepare launch
        p = c.a
        return launcher.run_bits(route, c.launches, None, c.dw, st, p.operands,
                                 d_a=p.device_bits, act=c.act)  # fmt: skip
    return launcher.run_bits(route, c.launches, c.a, c.dw, st, act=c.act)


def run_kernel(
    kernel: str, a_bits: np.ndarray, weight, stream=0, act: ActFormat = BF16_ACT
) -> np.ndarray:
    """Kernel ``kernel`` over every row of host bits ``a_bits`` (uint16 [M, K] of format ``act``,
    bf16 by default; fp16 for an exact kernel only) -> uint16 [M, N] of the same format.

    A thin wrapper over the road for the golden harness, scripts and tests:
    a host call whose plan is the kernel's chunks of its ``max_m`` rows (one
    launch per row for the M=1 kernels; a W4A16 tier chunked too, where
    :func:`q2gemv.gemv` refuses a tier that does not cover M), run on the
    cuda backend. ``weight`` is a host or device weight of the kernel's
    family. Raises the launcher's errors (naming ``kernel``, ``weight``,
    ``a_bits``) before anything is launched.
    """
    from ..cuda.runtime.launcher import check_bits

    kspec = registry.get(kernel)
    spec = registry.family(kspec.family)
    st = numba_stream(stream)
    dw = spec.as_device_weight(weight, st, kspec.contract)
    check_bits(a_bits, dw.k)
    check_act(kspec.contract, act)
    m = a_bits.shape[0]
    launches = plan.ChunkPlan(m, kspec.max_m, lambda rows: kspec.name)
    route = registry.route(spec, kspec.contract, launches)
    c = Call(spec, kspec.contract, weight, True, "host", a_bits, m, dw.n, dw.k, (m, dw.n), launches,
             stream=st, dw=dw, route=route, act=act)  # fmt: skip
    return _run_cuda(c)


__all__ = ["Call", "build", "build_plan", "run", "run_kernel", "resolve_numerics"]

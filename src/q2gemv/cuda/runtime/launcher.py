"""The one launcher: a plan of launches ``(row0, rows, kernel)`` on device arrays, run or bound.

Every CUDA path of the package goes through here. The road
(:mod:`q2gemv.host.call`: :func:`q2gemv.gemv`, prepared activations, the golden
harness's single kernels) runs its call through :func:`run_bits` (host bits
in, host bits out) or :func:`enqueue` (device arrays: bound and cached
under the call's key, exact operands in a per-stream workspace), both over
:func:`launches`. Thin wrappers below the road, for
benchmarks and scripts that hold device arrays: :func:`exact_launches` (one
exact GEMV's launches) and :func:`seed_launch` (one seed launch, the families'
``launch_raw``), then :func:`launch_all` or :func:`prebind`. This module knows no family: each is
reached through its :class:`~q2gemv.dispatch.registry.FamilySpec`.
The plan itself comes from :func:`q2gemv.api.plan`; nothing here re-chunks it
(the exact contract's ``exact_prepare`` is the one launch that is not a plan
entry: it runs once, before the chunks, over all rows).

Two steps:

* :func:`launches` validates the whole plan against the arrays (every
  launch's rows, shapes, dtypes, alignment, weight size) and returns the
  launches ``(dispatcher, grid, block, args, name)``; nothing is enqueued
  until every one is valid.
* :func:`launch_all` enqueues them through numba's dispatcher, or
  :class:`BoundPlan` binds them once (:class:`~q2gemv.cuda.runtime.prebound.PreboundLaunch`:
  one ``cuLaunchKernel`` each, the arguments packed at bind time) and
  enqueues them on every call. On the simulator a bound launch goes through
  the dispatcher (same code path, same bits).
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np
from numba import cuda

from ...dispatch import registry
from ...dispatch.plan import ChunkPlan, check_alignment
from ...formats.act import BF16, ActFormat
from ...host.backends import SIMULATOR_LOCK
from .prebound import SIMULATED, PreboundLaunch


def launches(
    family: str,
    numerics: str,
    plan,
    dw,
    d_a,
    d_out,
    stream=0,
    ops=None,
    *,
    prepare: bool = True,
    act: ActFormat = BF16,
) -> list[tuple]:
    """The validated launches of ``plan`` on ``d_a`` (uint16 [M, K]) into ``d_out`` (uint16 [M, N]).

    Args:
        family: ``"q2_0"`` or ``"w4a16"``; ``numerics``: ``"seed"`` or ``"exact"``.
        plan: ``(row0, rows, kernel)`` entries covering rows ``0..M`` once, in order.
        dw: the device weight of ``family``.
        stream: the stream the exact contract's workspace belongs to (exact only).
        ops: exact only: the :class:`~q2gemv.cuda.q2_0.exact.ExactOperands` to fill
            (None: new ones are allocated).
        prepare: exact only: False when ``ops`` already hold ``d_a``'s operands
            (:func:`q2gemv.prepare`): no ``exact_prepare`` launch.
        act: exact only: the format of ``d_a``'s bits and ``d_out``'s (bf16 or fp16,
            :mod:`q2gemv.formats.act`); the seed contract is bf16 only.

    Returns ``(dispatcher, grid, block, args, name)`` per launch. Raises the
    family's TypeError/ValueError (naming ``a``, ``out``, ``m``, ``weight``,
    ``kernel``) before anything is enqueued.
    """
    route = registry.route(registry.family(family), numerics, plan)
    return _launches(route, plan, dw, d_a, d_out, stream, ops, prepare, act)


def _launches(
    route, plan, dw, d_a, d_out, stream, ops, prepare: bool = True, act: ActFormat = BF16
) -> list[tuple]:
    """:func:`launches` of a call whose registry entries are resolved (a ``registry.Route``)."""
    if route.contract == "exact":
        return _exact_launches(route, plan, dw, d_a, d_out, stream, ops, prepare, act)
    if act != BF16:
        raise ValueError(f"a: the seed contract is bf16-only, got {act.name} activations")
    mod = route.module  # the seed launch interface (registry.FamilySpec.seed_module)
    block = registry.THREADS_PER_CTA  # every kernel's CTA (the thread maps assume 256)
    out = []
    for r0, rows, name in plan:
        va, vo = d_a[r0 : r0 + rows], d_out[r0 : r0 + rows]
        grid, args = mod.launch_args(name, va, dw, vo, rows)
        out.append((name, rows, grid, block, args))
    compiled = mod.compiled  # looked up now: tests replace it to prove nothing launches
    return [(compiled(name, rows), g, b, a, name) for name, rows, g, b, a in out]


class ExactFamily(Protocol):
    """What a family's exact-contract module gives the launcher (the exact-family interface).

    The module is named by the family's :class:`~q2gemv.dispatch.registry.FamilySpec`
    (``exact_module``; its kernel: ``exact_kernel``, a registered spec). One
    GEMV under the exact contract is ``prepare_launch`` once over all rows
    (filling ``Operands``), then ``chunk_launches`` for the plan's chunks.
    """

    PREPARE: str  # the prepare kernel's name (launch lists, errors)
    # allocate(m, k, stream, act) -> ops (with .m, .k, .act: the activation format, which the
    # chunk launches round to); ops.prepare_args(d_a)
    Operands: type

    def check_k(self, k: int) -> None:
        """ValueError naming ``a`` for a K the kernel does not serve."""

    def prepare_launch(self, m: int, k: int, act: ActFormat = BF16) -> tuple:
        """``(kernel, grid, block)`` of the prepare over ``m`` rows of ``k`` (format ``act``)."""

    def chunk_launches(self, ops, dw, d_out, rows_of) -> list[tuple]:
        """Validated ``(kernel, grid, block, args)`` per chunk ``(row0, rows)`` of ``rows_of``."""


def exact_module(family: str) -> ExactFamily:
    """The exact contract's module of ``family`` (:class:`ExactFamily`), named by its spec."""
    return registry.family(family).exact()


def exact_kernel_of(family: str, plan) -> tuple[registry.KernelSpec, ExactFamily]:
    """The exact kernel a plan of ``family`` runs, and its module (:func:`q2gemv.dispatch.registry.module_of`).

    The kernel of the plan's first launch when it is an exact kernel of
    ``family`` (a variant registered beside the default), else the family's
    ``exact_kernel``; :func:`launches` then requires every launch to be of it.
    """
    route = registry.route(registry.family(family), "exact", plan)
    return route.kernel, route.module


def _exact_launches(
    route, plan, dw, d_a, d_out, stream, ops, prepare: bool = True, act: ActFormat = BF16
) -> list[tuple]:
    """The kernel's prepare over all rows (unless ``prepare`` is False), then the plan's chunks."""
    spec, mod = route.kernel, route.module
    m, k = (int(x) for x in d_a.shape)
    ops = _operands(mod, m, k, stream, ops, act)
    rows_of = []
    for r0, rows, name in plan:
        if name != spec.name or not 1 <= rows <= spec.max_m:
            raise ValueError(
                f"plan: launch at row {r0}: expected 1..{spec.max_m} rows of {spec.name}, "
                f"got {rows} of {name!r}"
            )
        rows_of.append((r0, rows))
    chunks = mod.chunk_launches(ops, dw, d_out, rows_of)  # validates the weight, out and rows
    check_alignment(spec.name, d_a, spec.a_align)  # the prepares load 16 bytes
    out = [(kern, grid, block, args, spec.name) for kern, grid, block, args in chunks]
    if prepare:  # once, over all rows, before the chunks
        out.insert(0, (*mod.prepare_launch(m, k, act), ops.prepare_args(d_a), mod.PREPARE))
    return out


def _operands(mod, m: int, k: int, stream, ops, act: ActFormat = BF16):
    """``ops`` checked against (M, K) and the format ``act``, or new operands of the exact
    module ``mod``."""
    mod.check_k(k)
    if ops is None:
        return mod.Operands.allocate(m, k, stream, act)
    if (ops.m, ops.k) != (m, k):
        raise ValueError(f"ops: expected operands for M={m}, K={k}, got M={ops.m}, K={ops.k}")
    if ops.act != act:
        raise ValueError(f"ops: expected operands of {act.name} activations, got {ops.act.name}")
    return ops


def prepare_device(family: str, d_a, stream=0, ops=None, act: ActFormat = BF16):
    """Run the family's exact-contract prepare on device bits ``d_a`` (uint16 [M, K] of format
    ``act``, bf16 or fp16).

    Returns the operands (``ops``, of the same (M, K) and format, filled instead of new
    ones: a graph-captured or repeated call must not allocate).
    """
    mod = exact_module(family)
    m, k = (int(x) for x in d_a.shape)
    ops = _operands(mod, m, k, stream, ops, act)
    if m:
        kernel, grid, block = mod.prepare_launch(m, k, act)
        kernel[grid, block, stream](*ops.prepare_args(d_a))
    return ops


def exact_plan(family: str, m: int) -> ChunkPlan:
    """The plan of ``m`` rows under the exact contract: chunks of the family's exact kernel."""
    spec = registry.get(registry.family(family).exact_kernel)
    return ChunkPlan(m, spec.max_m, lambda rows: spec.name)


def exact_launches(
    family: str, d_a, dw, d_out, stream=0, ops=None, act: ActFormat | None = None
) -> list[tuple]:
    """The validated launches of one exact GEMV over every row of ``d_a`` (uint16 [M, K]).

    The family's prepare, skipped when ``ops`` (the operands of an earlier
    prepare of ``d_a``) are given, then the chunks of :func:`exact_plan`.
    ``act``: the format of ``d_a`` and ``d_out`` (default: ``ops``'s, else bf16).
    A thin wrapper below the road, for scripts and benchmarks holding device
    arrays; :func:`q2gemv.gemv` builds its call in :mod:`q2gemv.host.call`.
    """
    plan = exact_plan(family, int(d_a.shape[0]))
    if act is None:
        act = BF16 if ops is None else ops.act
    return launches(
        family, "exact", plan, dw, d_a, d_out, stream, ops, prepare=ops is None, act=act
    )


def seed_launch(name: str, d_a, dw, d_out, m: int) -> tuple:
    """One validated seed-contract launch of kernel ``name`` on exactly ``d_a`` [m, K] / ``d_out``.

    Returns ``(dispatcher, grid, block, args, name)``, as :func:`launches`
    does per plan entry, for :func:`launch_all` or :func:`prebind`: a thin
    wrapper below the road (:mod:`q2gemv.host.call`) for the family modules'
    ``launch_raw`` and the benchmark's single launches. The family's ``launch_args`` validates it (rows, shapes,
    dtypes, alignment, weight size) before the kernel is looked up.
    """
    mod = registry.family(registry.get(name).family).seed()
    grid, args = mod.launch_args(name, d_a, dw, d_out, m)
    return mod.compiled(name, m), grid, registry.THREADS_PER_CTA, args, name


def prebind(launches_: list[tuple], stream=0) -> list[PreboundLaunch]:
    """``launches_`` (from :func:`launches`) as :class:`PreboundLaunch` objects, one per launch
    (PDL for a waiting kernel after the first, as in :class:`BoundPlan`)."""
    return _prebound(launches_, stream)


def launch_all(launches_: list[tuple], stream=0) -> None:
    """Enqueue ``launches_`` (from :func:`launches`) through numba's dispatcher on ``stream``."""
    for dispatcher, grid, block, args, _ in launches_:
        dispatcher[grid, block, stream](*args)


class BoundPlan:
    """The launches of one call, pre-bound: ``plan()`` enqueues them all on the bound stream.

    Built from :func:`launches` (already validated). On a GPU each is a
    :class:`~q2gemv.cuda.runtime.prebound.PreboundLaunch` (one ``cuLaunchKernel``);
    the device addresses are packed at bind time, so a BoundPlan is valid for
    exactly the buffers it was built from (the cache in
    :mod:`q2gemv.cuda.runtime.interop` keys it on their addresses, shapes, dtypes
    and the stream) and does not keep the caller's buffers alive (the device
    weight owning the cache keeps its own). ``keep`` holds Python objects for
    the plan's lifetime: the exact contract's workspace, and under the
    simulator (no addresses: the cache keys on object identity there) the
    caller's arrays.

    ``lock``: a lock held around the enqueueing (the exact contract's
    workspace: the prepare and the chunks of one call must not interleave
    with another thread's on the same stream). Under the simulator the
    simulator lock is held instead (one call at a time there).
    """

    __slots__ = ("_calls", "_lock", "keep", "names")

    def __init__(self, launches_: list[tuple], stream_handle: int = 0, *, lock=None, keep=()):
        self._calls = tuple(_prebound(launches_, stream_handle, keep_args=False))
        self.names = tuple(n for *_, n in launches_)
        self.keep = keep
        self._lock = SIMULATOR_LOCK if SIMULATED else lock

    def __call__(self) -> None:
        if self._lock is None:
            for call in self._calls:
                call()
            return
        with self._lock:
            for call in self._calls:
                call()

    def __len__(self) -> int:
        return len(self._calls)

    def __repr__(self) -> str:
        return f"BoundPlan({', '.join(self.names)})"


# A decode loop's calls differ only in their buffers: one bound plan per (buffers' addresses,
# shapes, dtypes, strides, stream, kernel, contract), per weight, at most this many per weight
# (the oldest is dropped first), and only for plans of at most BIND_MAX_LAUNCHES launches
# (a long plan is kernel-bound: binding it would cost more than it saves).
LAUNCH_CACHE_SIZE = 64
BIND_MAX_LAUNCHES = 64


def _handle(key) -> int:
    """The raw stream handle in a cache key (the simulator's streams have none: 0)."""
    return key[2] if type(key[2]) is int else 0


def _keep(a, out, stream) -> tuple:
    """What a bound plan must keep alive: nothing on a GPU (it holds addresses, keyed by
    address), the caller's objects under the simulator (keyed by identity there)."""
    from .prebound import SIMULATED

    return (a, out, stream) if SIMULATED else ()


_CACHE_LOCK = threading.Lock()  # misses only: lookups on the fast path take no lock


def _remember(cache: dict, key, bound) -> None:
    with _CACHE_LOCK:
        while len(cache) >= LAUNCH_CACHE_SIZE:
            cache.pop(next(iter(cache)), None)
        cache[key] = bound


# Exact-contract operands per (device, stream, M, K), reused by every later call there: a call
# allocates nothing once its shape has run on its stream, so it can be captured in a CUDA graph
# after a warm-up call (cudaMalloc is not allowed during capture), and the graph keeps reading
# the same buffers. Calls on one stream are ordered by the stream; the lock orders the
# enqueueing of one call's two steps against another thread's on the same stream.
_WORKSPACES: dict[tuple, object] = {}
_WORKSPACE_LOCK = threading.Lock()


def _stream_key(st) -> int:
    if not st:
        return 0
    try:
        return int(st)
    except TypeError:  # the simulator's streams have no handle
        return id(st)


def exact_workspace(m: int, k: int, st, exact, act: ActFormat = BF16):
    """The exact-contract operands of (this device, ``st``, the exact module ``exact``, m, k,
    the activation format ``act``).

    ``exact``: the module of the plan's exact kernel
    (:func:`~q2gemv.cuda.runtime.exact_kernel_of`); its ``Operands``
    (Q2_0: :class:`~q2gemv.cuda.q2_0.exact.ExactOperands`; NVFP4:
    :class:`~q2gemv.cuda.nvfp4.exact.W4Operands`). Allocated on first use and
    kept for the process (a few bytes per activation: about ``3 M K`` bytes);
    :func:`clear_workspaces` drops them (never while a captured CUDA graph that
    uses them may still replay).
    """
    device = getattr(cuda.get_current_device(), "id", 0)  # the simulator's device has no id
    key = (device, _stream_key(st), exact.__name__, int(m), int(k), act.name)
    ops = _WORKSPACES.get(key)
    if ops is None:
        ops = _WORKSPACES[key] = exact.Operands.allocate(m, k, st, act)
    return ops


def clear_workspaces() -> None:
    """Forget every exact-contract workspace (the buffers are freed when unused)."""
    with _WORKSPACE_LOCK:
        _WORKSPACES.clear()


def enqueue(route, plan, dw, d_a, d_out, st, key=None, cache=None, keep=(), act: ActFormat = BF16):
    """Enqueue ``plan`` (``(row0, rows, kernel)``) on device bits ``d_a`` (uint16 [M, K], M >= 1,
    format ``act``) into ``d_out`` (uint16 [M, N], the same format) on ``st``: the device edge
    of the road (:mod:`q2gemv.host.call`).

    ``route``: the call's registry entries (``registry.Route``: family, contract,
    launching module). ``"seed"`` runs ``plan`` as it is; ``"exact"`` runs the
    family's activation prepare then its exact GEMV per plan entry, with the
    operands in a per-(stream, M, K) workspace (:func:`exact_workspace`).
    Everything is checked before the first launch
    (:func:`q2gemv.cuda.runtime.launches`).

    ``key``, ``cache``: the call's cache key (:func:`q2gemv.host.arrays.call_key`)
    and the device weight's ``launch_cache`` (None: nothing is bound). With
    both, the validated launches are bound
    (:class:`~q2gemv.cuda.runtime.BoundPlan`) and stored under the key,
    so the next call with the same buffers, shapes, dtypes, stream, kernel and
    contract is a dictionary lookup and the launches (:func:`q2gemv.gemv`'s
    fast path). ``keep``: the caller's objects (``a``, ``out``, ``stream``) a
    bound plan holds under the simulator (:func:`_keep`).
    """
    bind = cache is not None and len(plan) <= BIND_MAX_LAUNCHES
    if route.contract != "exact":
        ls = _launches(route, plan, dw, d_a, d_out, st, None, act=act)
        if not bind:
            launch_all(ls, st)
            return
        bound = BoundPlan(ls, _handle(key), keep=_keep(*keep))
    else:
        with _WORKSPACE_LOCK:  # prepare + chunks of one call are enqueued together
            ops = exact_workspace(int(d_a.shape[0]), dw.k, st, route.module, act)
            ls = _launches(route, plan, dw, d_a, d_out, st, ops, act=act)
            if not bind:
                launch_all(ls, st)
                return
        bound = BoundPlan(ls, _handle(key), lock=_WORKSPACE_LOCK, keep=(ops, *_keep(*keep)))
    _remember(cache, key, bound)
    bound()


def _prebound(launches_: list[tuple], stream, **kw) -> list[PreboundLaunch]:
    """One PreboundLaunch per launch; PDL for a kernel that waits (:func:`grid_waits`) and is
    not its call's first launch (the first follows unrelated work in the stream), unless its
    build says ``no_pdl`` (measured slower so)."""
    return [
        PreboundLaunch(d, g, b, a, stream=stream, name=n, pdl=i > 0 and _overlaps(d, n), **kw)
        for i, (d, g, b, a, n) in enumerate(launches_)
    ]


def _overlaps(kernel, name: str) -> bool:
    """May this launch of kernel ``name`` start under PDL: its kernel waits, and its build does
    not say ``no_pdl``."""
    return grid_waits(name) and not getattr(kernel, "no_pdl", False)


def grid_waits(name: str) -> bool:
    """Whether kernel ``name`` may be launched with PDL after an earlier launch of its call
    (:attr:`q2gemv.dispatch.registry.KernelSpec.grid_wait`; a prepare is not a registered kernel)."""
    return any(s.name == name and s.grid_wait for s in registry.specs())


def check_bits(a_bits, k: int) -> None:
    """Host activation bits for :func:`run_host`'s callers: a uint16 numpy array [M, k].

    Raises TypeError / ValueError naming ``a_bits``.
    """
    if not isinstance(a_bits, np.ndarray) or a_bits.dtype != np.uint16:
        got = a_bits.dtype if isinstance(a_bits, np.ndarray) else type(a_bits).__name__
        raise TypeError(f"a_bits: expected uint16 bf16 bits (a numpy array), got {got}")
    if a_bits.ndim != 2 or a_bits.shape[1] != k:
        raise ValueError(f"a_bits: expected shape [M, K] = [M, {k}], got {a_bits.shape}")


def run_host(
    family: str, numerics: str, plan, a_bits, dw, stream=0, ops=None, *, d_a=None, act=BF16
) -> np.ndarray:
    """Host bf16 bits ``a_bits`` (uint16 [M, K], checked by the caller) -> uint16 [M, N] on the host.

    :func:`run_bits` of family ``family`` under contract ``numerics``, for
    callers below the road (the families' ``launch_raw``).
    """
    route = registry.route(registry.family(family), numerics, plan)
    return run_bits(route, plan, a_bits, dw, stream, ops, d_a=d_a, act=act)


def run_bits(
    route, plan, a_bits, dw, stream=0, ops=None, *, d_a=None, act: ActFormat = BF16
) -> np.ndarray:
    """Host bits ``a_bits`` (uint16 [M, K] of format ``act``, bf16 by default; checked by the
    caller) -> uint16 [M, N] of the same format on the host.

    The host edge of the road (:mod:`q2gemv.host.call`), ``route`` its
    resolved registry entries (``registry.Route``): uploads the
    activations (or takes ``d_a``, bits already on the device, with ``ops``
    their exact-contract operands: no prepare launch), validates every launch
    of ``plan`` (before any is enqueued), runs them through the dispatcher on
    ``stream`` (0 or a numba stream) and copies the result back.
    """
    m = int((a_bits if d_a is None else d_a).shape[0])
    out = np.empty((m, dw.n), dtype=np.uint16)
    if m == 0:
        return out
    if d_a is None:
        d_a = cuda.to_device(np.ascontiguousarray(a_bits), stream=stream)
    d_out = cuda.device_array((m, dw.n), dtype=np.uint16, stream=stream)
    ls = _launches(route, plan, dw, d_a, d_out, stream, ops, prepare=ops is None, act=act)
    launch_all(ls, stream)
    d_out.copy_to_host(out, stream=stream)
    if stream:
        stream.synchronize()
    return out


__all__ = [
    "ExactFamily",
    "exact_module",
    "exact_kernel_of",
    "prepare_device",
    "seed_launch",
    "launches",
    "launch_all",
    "BoundPlan",
    "run_host",
    "run_bits",
    "check_bits",
    "exact_plan",
    "exact_launches",
    "prebind",
    "enqueue",
    "exact_workspace",
    "clear_workspaces",
]

"""A call's activations (and, on the host, its ``out``), looked at once, in the form they came.

:func:`q2gemv.host.call.build` hands ``a`` here once; :func:`take` recognises
its form and runs that form's checks, in the road's order, each naming its
argument:

* ``"prepared"`` (:func:`q2gemv.prepare`'s result): the family and contract
  that serve it, K, ``out``, the backend, operands for that backend;
* ``"device"`` (a numba / CUDA-array-interface array or a CUDA tensor): the
  backend, shape and K (its bits and ``out`` are read by
  :mod:`q2gemv.cuda.runtime.interop` once the plan stands);
* ``"host"`` (bf16 or fp16 [K] or [M, K]): dtype, shape and K
  (:func:`~q2gemv.formats.act.as_act_rows`), the contract for that dtype
  (:func:`check_act`), ``out``, the backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dispatch import registry
from ..formats.act import BF16 as BF16_ACT
from ..formats.act import ActFormat, as_act_rows
from .arrays import device_activations
from .backends import default_backend
from .prepared import PreparedActivations


@dataclass(frozen=True)
class Operands:
    """What :func:`take` found: ``form``, ``a`` in it, ``m`` rows, the result's ``shape``.

    ``a``: uint16 bits [M, K] (host), the :class:`PreparedActivations`
    (prepared) or the caller's array (device, of ``kind`` ``"torch"``,
    ``"numba"`` or ``"cai"``). ``backend``: the backend the call runs on;
    ``stream``: device form only, the numba stream its launches go on (the
    host forms' is made by the road once the plan stands). ``act``: the activations'
    format (bf16 or fp16; the device form's is read with its bits, by the road).
    """

    form: str
    a: object
    m: int
    shape: tuple[int, ...]
    backend: str
    stream: object = None
    kind: str | None = None
    act: ActFormat = BF16_ACT


def weight_arrays(weight) -> dict[str, np.ndarray]:
    """The host arrays holding a weight's bytes, by attribute name (none for a device weight)."""
    found = registry.family_of(weight)
    if found is None or found[1]:
        return {}
    return {name: getattr(weight, name) for name in found[0].weight_arrays}


def check_out(out, a, shape: tuple[int, ...], weight=None, act: ActFormat = BF16_ACT) -> None:
    """Refuse an ``out`` that is not a writeable array of ``shape`` in the activations' dtype
    (``act``: bfloat16 or float16), or overlaps an input.

    Inputs are the activations ``a`` and the bytes of ``weight`` (when given):
    writing results over them would corrupt the call's own inputs (and, for
    a weight, every later call).
    """
    if not isinstance(out, np.ndarray) or out.dtype != act.dtype:
        got = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        why = "" if act == BF16_ACT else " (the dtype of a)"  # bf16: the message it always had
        raise TypeError(f"out: expected a {act.dtype} numpy array{why}, got {got}")
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out: expected a writeable array")
    if np.shares_memory(out, a):
        raise ValueError("out: must not alias the activations a")
    for name, arr in weight_arrays(weight).items():
        if np.shares_memory(out, arr):
            raise ValueError(f"out: must not overlap the weight's bytes (weight.{name})")


def check_act(mode: str, act: ActFormat) -> None:
    """The seed contract (its fp32-order kernels and references) is bf16-only: fp16 activations
    under it are a ValueError naming ``a``."""
    if mode == "seed" and act != BF16_ACT:
        raise ValueError(
            f"a: the seed contract (numerics='seed' or a seed kernel) is bf16-only, got "
            f"{act.name} activations; use numerics='exact' (the default) or bfloat16 activations"
        )


def pick_backend(backend: str | None, on_device: bool, default) -> str:
    """The backend a call runs on (``backend`` already checked by the road's argument checks).

    None: ``"cuda"`` for a device weight, else ``default()``. The reference
    backend cannot read a device weight (TypeError naming ``weight``).
    """
    if backend is None:
        backend = "cuda" if on_device else default()
    if backend == "reference" and on_device:
        raise TypeError("weight: the reference backend needs a host weight, not a device one")
    return backend


def take(a, weight, spec: registry.FamilySpec, mode: str, on_device: bool, backend, out,
         stream) -> Operands:  # fmt: skip
    """``a`` in its form, with that form's checks run (see the module docstring for the order)."""
    k = weight.k
    if isinstance(a, PreparedActivations):
        if not spec.prepared or mode != "exact":
            what = (
                f"an {spec.title} weight"
                if not spec.prepared
                else "numerics='seed' or a seed kernel"
            )
            raise ValueError(
                f"a: prepared activations (q2gemv.prepare) serve "
                f"{registry.prepared_family().title} weights under the exact contract only, "
                f"not {what}; pass the bf16 array instead"
            )
        if a.k != k:
            raise ValueError(f"a: expected K={k} columns (the weight's k), got {a.k}")
        shape = (weight.n,) if a.was_1d else (a.m, weight.n)
        if out is not None:
            check_out(out, a.bits, shape, weight, a.act)
        backend = pick_backend(backend, on_device, lambda: a.backend)
        if backend == "cuda" and a.m and a.operands is None:
            raise ValueError(
                "a: these activations were prepared for the reference backend (no device "
                "operands); call q2gemv.prepare(a, backend='cuda') for the cuda backend"
            )
        return Operands("prepared", a, a.m, shape, backend, act=a.act)
    on_gpu = device_activations(a, stream)  # (kind, stream, format) for activations on the GPU
    if on_gpu is not None:
        if backend not in (None, "cuda"):
            raise ValueError(
                f"backend: activations on the GPU need backend='cuda', got {backend!r}"
            )
        dims = tuple(a.shape)
        if len(dims) not in (1, 2):
            raise ValueError(f"a: expected shape [K] or [M, K], got {dims}")
        if dims[-1] != k:
            raise ValueError(f"a: expected K={k} columns (the weight's k), got {dims[-1]}")
        m = 1 if len(dims) == 1 else dims[0]
        shape = (weight.n,) if len(dims) == 1 else (m, weight.n)
        kind, st, act = on_gpu
        check_act(mode, act)
        return Operands("device", a, m, shape, "cuda", st, kind, act)
    bits, was_1d, act = as_act_rows(a, k)
    check_act(mode, act)
    m = bits.shape[0]
    shape = (weight.n,) if was_1d else (m, weight.n)
    if out is not None:
        check_out(out, a, shape, weight, act)
    backend = pick_backend(backend, on_device, default_backend)
    return Operands("host", bits, m, shape, backend, act=act)


__all__ = ["Operands", "take", "check_act", "check_out", "pick_backend", "weight_arrays"]

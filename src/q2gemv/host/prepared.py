"""``q2gemv.prepare``: convert activations once for several exact GEMVs on the same input.

Under the exact contract (:mod:`q2gemv.reference.exact`) every GEMV first
turns each activation row into fixed point (``exact_prepare`` on the GPU:
the row's exponent, three byte limbs per value, per-unit sums). Several
projections of one input (q/k/v, gate/up) can share that work::

    p = q2gemv.prepare(x)                 # x: bf16 [M, K] (host)
    q, k, v = (q2gemv.gemv(p, w) for w in (wq, wk, wv))   # each == gemv(x, w), bit for bit

On the cuda backend :func:`prepare` uploads the activations and runs the
exact contract's prepare once (the family's ``FamilySpec.prepared_kernel``
names the kernel that reads its operands); a :func:`q2gemv.gemv` call with
the prepared object then launches only ``q2_0_gemv_exact`` (nothing new is uploaded for a
device-resident weight, ``w.to_device()``; a host ``Q2Weight`` is uploaded
per call, as with plain arrays). On the reference backend it keeps the bits
(the reference is a value, not an order: there is nothing to precompute).

Only Q2_0 weights under ``numerics="exact"`` accept a prepared input; any
other use is a TypeError/ValueError naming ``a``. Activations already on the
GPU go to :func:`q2gemv.gemv` directly (it prepares them on the caller's
stream, :mod:`q2gemv.cuda.runtime.interop`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dispatch import registry
from ..formats._frozen import frozen
from ..formats.act import BF16, FP16, ActFormat
from ..formats.bf16 import as_bf16_bits
from .arrays import check_stream, is_device_array, numba_stream
from .backends import BACKENDS, default_backend, require_cuda, simulator_lock


@dataclass(frozen=True, eq=False)
class PreparedActivations:
    """Activations converted once by :func:`prepare`; pass it to :func:`q2gemv.gemv` as ``a``.

    Attributes:
        bits: uint16 bit patterns [M, K] (format ``act``), a private copy in immutable
            memory (:mod:`q2gemv.formats._frozen`: a view of a ``bytes``
            object, so ``bits.flags.writeable = True`` raises), so neither a
            later change to the caller's array nor a write through ``bits``
            can desynchronise them from the device operands.
        was_1d: the input was [K]; ``gemv`` then returns [N].
        backend: ``"reference"`` or ``"cuda"``: where the operands were made.
        operands: on the cuda backend, the device
            :class:`~q2gemv.cuda.q2_0.exact.ExactOperands` of ``exact_prepare``
            (None for M = 0 and on the reference backend).
        device_bits: the uploaded bits the operands were made from (kept alive
            with them; None where there are no operands).
        act: the activations' format (:mod:`q2gemv.formats.act`): bf16 or fp16, the
            format of every ``gemv`` result on them.
    """

    bits: np.ndarray
    was_1d: bool
    backend: str
    operands: object | None = None
    device_bits: object | None = None
    act: ActFormat = BF16

    def __post_init__(self) -> None:
        # A hand-built one holds its bits as prepare() does: in memory nothing can write.
        if isinstance(self.bits, np.ndarray):
            object.__setattr__(self, "bits", frozen(self.bits))

    @property
    def m(self) -> int:
        """The number of activation rows, M."""
        return int(self.bits.shape[0])

    @property
    def k(self) -> int:
        """Columns K (the weights it serves must have this k)."""
        return int(self.bits.shape[1])

    def __repr__(self) -> str:
        where = "device operands" if self.operands is not None else "host bits"
        fmt = "" if self.act == BF16 else f", act={self.act.name!r}"
        return (
            f"PreparedActivations(m={self.m}, k={self.k}, backend={self.backend!r}{fmt}, {where})"
        )


def prepare(a: np.ndarray, *, backend: str | None = None, stream=None) -> PreparedActivations:
    """Convert bf16 or fp16 activations once for any number of exact Q2_0 GEMVs on them.

    Args:
        a: ``ml_dtypes.bfloat16`` or ``np.float16`` host activations, [K] or [M, K], K a
            multiple of 64 (every Q2_0 weight's K is); the results of ``gemv`` on them
            have the same dtype.
        backend: ``"reference"`` or ``"cuda"``; default as :func:`q2gemv.gemv`
            (cuda where a GPU or the simulator serves, else reference). A
            prepared object serves ``gemv`` calls on its own backend (and on
            the reference backend, which needs only the bits).
        stream: cuda only: a numba stream or a raw ``cudaStream_t`` for the
            upload and ``exact_prepare``. :func:`prepare` waits for that
            stream before returning, so later calls on any stream may use
            the operands.

    Returns a :class:`PreparedActivations`; ``q2gemv.gemv(prepared, w)`` equals
    ``q2gemv.gemv(a, w)`` bit for bit for every Q2_0 weight ``w`` of ``k == K``.

    Raises:
        TypeError / ValueError naming ``a``, ``backend`` or ``stream``.
    """
    if is_device_array(a):
        raise TypeError(
            "a: prepare takes host bf16 activations; pass activations already on the GPU to "
            "q2gemv.gemv directly (it prepares them on the caller's stream)"
        )
    if isinstance(a, np.ndarray) and a.dtype == FP16.dtype:
        act, bits = FP16, a.view(np.uint16)
    else:
        act, bits = BF16, as_bf16_bits(a, "a")
    if bits.ndim not in (1, 2):
        raise ValueError(f"a: expected shape [K] or [M, K], got {bits.shape}")
    was_1d = bits.ndim == 1
    # A private copy in immutable memory (formats._frozen): not even
    # bits.flags.writeable = True can make it change behind the device operands.
    bits = frozen(np.ascontiguousarray(bits.reshape(1, -1) if was_1d else bits, dtype=np.uint16))
    spec = registry.prepared_family()
    if bits.shape[1] % spec.prepared_k_unit:
        raise ValueError(
            f"a: the exact contract's kernels need K a multiple of {spec.prepared_k_unit} (as "
            f"every {spec.title} weight has), got K={bits.shape[1]}"
        )
    if backend is None:
        backend = default_backend()
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    check_stream(stream)
    if backend == "reference" or bits.shape[0] == 0:
        if backend == "cuda":
            require_cuda()
        return PreparedActivations(bits, was_1d, backend, act=act)
    require_cuda()
    from numba import cuda

    from ..cuda.runtime import launcher

    st = numba_stream(stream)
    with simulator_lock():
        d_a = cuda.to_device(bits, stream=st)
        ops = launcher.prepare_device(registry.prepared_family().name, d_a, st, act=act)
        if st:
            st.synchronize()
        else:
            cuda.synchronize()
    return PreparedActivations(bits, was_1d, "cuda", ops, d_a, act)


__all__ = ["prepare", "PreparedActivations"]

"""Device-resident weights of both families: the :class:`DeviceWeight` protocol and :func:`to_device`.

Two ways to get a weight onto the GPU, for either family:

* upload a host weight once: ``q2gemv.to_device(w)`` (the same as
  ``w.to_device()`` for a :class:`~q2gemv.Q2Weight` or
  :class:`~q2gemv.Nvfp4Weight`);
* wrap bytes that already live on the GPU, without a host copy:
  ``DeviceQ2Weight.from_buffers(raw, n, k, group)`` and
  ``DeviceNvfp4Weight.from_buffers(packed, scales, global_scale)``
  (:mod:`q2gemv.cuda`), taking numba device arrays or anything with
  ``__cuda_array_interface__`` (torch CUDA tensors, CuPy arrays).

Either result is immutable and carries its own cache of bound launches
(:mod:`q2gemv.cuda.runtime.launcher`), so reuse one object across calls.
This module imports no numba until an upload is asked for; it finds a
weight's device class through its family spec (:func:`q2gemv.dispatch.registry.family_of`);
the formats reach it only through the hook of :mod:`q2gemv.formats._upload`.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from ..dispatch import registry
from ..formats._upload import register_uploader


@runtime_checkable
class DeviceWeight(Protocol):
    """What :func:`q2gemv.gemv` needs of a device-resident weight, of either family.

    Attributes:
        family: ``"q2_0"`` or ``"w4a16"`` (the :mod:`q2gemv.dispatch.registry` family).
        n: output features (rows). k: input features (columns).

    Implementations: :class:`q2gemv.cuda.DeviceQ2Weight`,
    :class:`q2gemv.cuda.DeviceNvfp4Weight`. Each has ``upload(host_weight,
    stream=0)`` and ``from_buffers(...)`` (device buffers, no host copy).
    """

    family: ClassVar[str]
    n: int
    k: int

    @classmethod
    def from_buffers(cls, *buffers, **kwargs) -> DeviceWeight:
        """Wrap the weight's bytes already on the GPU (no copy); arguments per family."""
        ...


def to_device(
    weight, stream=0, *, keep_gguf: bool = False, keep_packed: bool = False
) -> DeviceWeight:
    """The device-resident form of ``weight``, uploaded once (a device weight is returned as is).

    Args:
        weight: a :class:`~q2gemv.Q2Weight` or :class:`~q2gemv.Nvfp4Weight`
            (or an already device-resident weight).
        stream: the numba stream of the copies, or 0 (the default stream).
        keep_gguf: Q2_0 only: upload the GGUF bytes beside the execution
            layout (the seed contract's kernels read them; without, a seed
            call rebuilds them on the device once). False keeps the weight
            once on the device.
        keep_packed: NVFP4 only: upload ``packed`` and ``scales`` beside the
            execution layout, as ``keep_gguf`` for Q2_0.

    Imports numba on first use; needs a GPU or the CUDA simulator.

    Raises:
        TypeError naming ``weight`` for anything else.
        ValueError naming ``keep_gguf`` / ``keep_packed`` given (not False) for
        the other family's weight.
        ValueError (one line, saying how to get a backend, as ``gemv(backend="cuda")``)
        uploading a host weight where neither a GPU nor the simulator serves.
    """
    found = registry.family_of(weight)
    if found is not None:  # a host weight is uploaded by its family's device class
        spec, on_device = found
        if on_device:
            return weight
        from .backends import require_cuda

        require_cuda()  # else numba's multi-line CudaSupportError from deep inside the upload
        options = {"keep_gguf": keep_gguf, "keep_packed": keep_packed}
        options = {name: v for name, v in options.items() if v is not False}
        if not options:
            return spec.as_device_weight(weight, stream)
        for name, v in options.items():
            if name not in spec.upload_options:
                owner = next(f.title for f in registry.families() if name in f.upload_options)
                raise ValueError(
                    f"{name}: an upload option of {owner} weights only, "
                    f"got {v!r} for {type(weight).__name__}"
                )
        return spec.device_class().upload(weight, stream, **options)
    if isinstance(weight, DeviceWeight) and getattr(weight, "family", None) in registry.FAMILIES:
        return weight
    raise TypeError(
        f"weight: expected a {registry.host_weight_names()} or a device-resident weight, "
        f"got {type(weight).__name__}"
    )


register_uploader(to_device)

__all__ = ["DeviceWeight", "to_device"]

"""GGUF Q2_0 on the GPU: the device weight, the seed kernels, the exact kernel.

* :mod:`.weight` — :class:`DeviceQ2Weight` (the execution layout, and the
  block bytes where the seed kernels need them);
* :mod:`.layout` — the execution layout made and undone on the device;
* :mod:`.seed` — the seed-contract kernels (``q2_0_gemv``, the ``vec``
  template) and their launch arguments;
* :mod:`.exact` — ``exact_prepare`` and ``q2_0_gemv_exact`` (the exact contract).

The family's :class:`~q2gemv.dispatch.registry.FamilySpec` (in :mod:`q2gemv.dispatch.registry`)
names these modules; the runtime reaches them only through it.
"""

from .weight import DeviceQ2Weight, as_device_weight

__all__ = ["DeviceQ2Weight", "as_device_weight"]

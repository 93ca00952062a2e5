"""NVFP4 (W4A16) on the GPU: the device weight, the seed tiers, the exact kernel.

* :mod:`.weight` — :class:`DeviceNvfp4Weight` (the execution layout; packed codes as uint32
  words and E4M3 scales where the seed kernels need them);
* :mod:`.layout` — the device kernels making the execution layout and its inverse;
* :mod:`.seed` — the ``w4a16_gemv_batchm`` tiers (seed contract) and their launch arguments;
* :mod:`.exact` — the prepare and ``w4a16_gemv_exact`` (the exact contract).

The family's :class:`~q2gemv.dispatch.registry.FamilySpec` (in :mod:`q2gemv.dispatch.registry`)
names these modules; the runtime reaches them only through it.
"""

from .weight import DeviceNvfp4Weight, as_device_weight

__all__ = ["DeviceNvfp4Weight", "as_device_weight"]

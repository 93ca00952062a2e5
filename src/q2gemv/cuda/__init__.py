"""numba.cuda kernels (real GPU, or the CUDA simulator under NUMBA_ENABLE_CUDASIM=1).

Importing this subpackage imports numba; ``import q2gemv`` alone does not.
``DeviceQ2Weight`` / ``DeviceNvfp4Weight`` hold a weight uploaded once for reuse
(``q2gemv.to_device(w)`` = ``w.to_device()`` for either family), or wrap bytes already
on the GPU without a copy (``DeviceQ2Weight.from_buffers`` / ``DeviceNvfp4Weight.from_buffers``).

Layout (``docs/architecture.md``, "Where to add things"):

* :mod:`.runtime` — the launcher, pre-bound launches, device-array interop
  and device helpers; it knows no family (a family is looked up in
  :mod:`q2gemv.dispatch.registry`, never imported).
* :mod:`.q2_0`, :mod:`.nvfp4` — one package per weight family: ``weight``
  (the device weight), ``seed`` (the seed-contract kernels and their
  launch arguments), ``exact`` (the exact-contract kernel and its prepare).
* :mod:`.exact_contract` — the exact contract's device code every exact
  kernel shares (row exponents, fixed-point activations, the one rounding).
* :mod:`.ptx` — compile every registered kernel to PTX.
"""

from .nvfp4 import DeviceNvfp4Weight
from .nvfp4.seed import w4a16_gemv
from .q2_0 import DeviceQ2Weight

__all__ = ["DeviceQ2Weight", "DeviceNvfp4Weight", "w4a16_gemv"]

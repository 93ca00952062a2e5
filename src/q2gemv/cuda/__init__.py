"""numba.cuda kernels (real GPU, or the CUDA simulator under NUMBA_ENABLE_CUDASIM=1).

Importing this subpackage imports numba; ``import q2gemv`` alone does not.
``DeviceQ2Weight`` / ``DeviceNvfp4Weight`` hold a weight uploaded once for reuse
(``q2gemv.to_device(w)`` = ``w.to_device()`` for either family), or wrap bytes already
on the GPU without a copy (``DeviceQ2Weight.from_buffers`` / ``DeviceNvfp4Weight.from_buffers``).
"""

from .q2_0 import DeviceQ2Weight
from .w4a16 import DeviceNvfp4Weight, w4a16_gemv

__all__ = ["DeviceQ2Weight", "DeviceNvfp4Weight", "w4a16_gemv"]

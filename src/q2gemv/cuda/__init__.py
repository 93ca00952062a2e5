"""numba.cuda kernels (real GPU, or the CUDA simulator under NUMBA_ENABLE_CUDASIM=1).

Importing this subpackage imports numba; ``import q2gemv`` alone does not.
``DeviceQ2Weight`` / ``DeviceNvfp4Weight`` hold a weight uploaded once for reuse
(also reachable as ``Q2Weight.to_device()`` / ``DeviceNvfp4Weight.upload(w)``).
"""

from .q2_0 import DeviceQ2Weight
from .w4a16 import DeviceNvfp4Weight, w4a16_gemv

__all__ = ["DeviceQ2Weight", "DeviceNvfp4Weight", "w4a16_gemv"]

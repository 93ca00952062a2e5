"""numba.cuda kernels (real GPU, or the CUDA simulator under NUMBA_ENABLE_CUDASIM=1).

Importing this subpackage imports numba; ``import q2gemv`` alone does not.
"""

from .q2_0 import DeviceQ2Weight

__all__ = ["DeviceQ2Weight"]

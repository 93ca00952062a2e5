"""q2gemv: bit-exact low-bit decode GEMV kernels (GGUF Q2_0 ternary, NVFP4 W4A16).

Every numba.cuda kernel sits beside a NumPy reference (``q2gemv.reference``)
with the same bits. Two numerics contracts: ``exact`` (the default for both
families: the bf16 nearest to the exact sum, whatever the order) and
``seed`` (each kernel's documented fp32 order); ``gemv(..., numerics=)``
picks one. Importing this package is light: numba and the kernels load on
first use.

``__all__`` is what a user calls: :func:`gemv`, :func:`plan`, :func:`explain`,
:func:`prepare`, :func:`to_device`, the weight classes and their quantizers,
the loaders and the bit checks. The W4A16 tier machinery (``select_tier``,
``plan_w4a16``, the kill switches) lives in :mod:`q2gemv.dispatch.nvfp4_tiers`.
"""

from __future__ import annotations

from .api import explain, gemv, plan
from .formats.bf16 import BF16
from .formats.nvfp4 import Nvfp4Weight, global_scale_from_divisor
from .formats.q2_0 import Q2Weight, quantize_q2_0
from .golden.check import assert_bits_equal, compare_bits
from .host.device import DeviceWeight, to_device
from .host.prepared import PreparedActivations, prepare
from .io import load_nvfp4_weights, load_q2_weights

__version__ = "0.1.0"

__all__ = [
    "gemv",
    "plan",
    "explain",
    "prepare",
    "to_device",
    "Q2Weight",
    "Nvfp4Weight",
    "DeviceWeight",
    "PreparedActivations",
    "quantize_q2_0",
    "global_scale_from_divisor",
    "load_q2_weights",
    "load_nvfp4_weights",
    "BF16",
    "compare_bits",
    "assert_bits_equal",
    "__version__",
]

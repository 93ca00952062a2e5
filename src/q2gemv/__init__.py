"""q2gemv: bit-exact low-bit decode GEMV kernels (GGUF Q2_0 ternary, NVFP4 W4A16).

Every numba.cuda kernel sits beside a NumPy reference (``q2gemv.reference``)
with the same bits. Two numerics contracts: ``exact`` (the default for Q2_0:
the bf16 nearest to the exact sum, whatever the order) and ``seed`` (each
kernel's documented fp32 order; the default for NVFP4); ``gemv(...,
numerics=)`` picks one. Importing this package is light: numba and the
kernels load on first use.
"""

from __future__ import annotations

from .api import explain, gemv, plan
from .check import assert_bits_equal, compare_bits
from .device import DeviceWeight, to_device
from .formats.bf16 import BF16
from .formats.nvfp4 import Nvfp4Weight, global_scale_from_divisor
from .formats.q2_0 import Q2Weight, quantize_q2_0
from .prepared import PreparedActivations, prepare
from .tiers import (
    W4A16_BATCHM_WIDTHS,
    W4a16BatchmTiers,
    batch8_rt_enabled,
    exact_m_tiers_enabled,
    explain_tier,
    plan_w4a16,
    reload_env,
    select_tier,
)

__version__ = "0.1.0"

__all__ = [
    "gemv",
    "explain",
    "plan",
    "prepare",
    "to_device",
    "DeviceWeight",
    "PreparedActivations",
    "Nvfp4Weight",
    "global_scale_from_divisor",
    "plan_w4a16",
    "explain_tier",
    "batch8_rt_enabled",
    "reload_env",
    "W4A16_BATCHM_WIDTHS",
    "W4a16BatchmTiers",
    "exact_m_tiers_enabled",
    "select_tier",
    "BF16",
    "Q2Weight",
    "quantize_q2_0",
    "assert_bits_equal",
    "compare_bits",
    "__version__",
]

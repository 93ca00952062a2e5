"""Byte formulas, the FMA issue floor and the cold-weight rotation of ``q2gemv bench`` (pure).

The method they serve is in :mod:`q2gemv.bench`. Imports nothing of the
package but the format modules (block sizes).
"""

from __future__ import annotations

import math

from ..formats import q2_0 as q2fmt
from ..formats.nvfp4 import BLOCK as NVFP4_BLOCK

FAMILIES = ("q2_0", "w4a16", "bf16")
TORCH_KERNEL = "F.linear"
NVFP4_GROUP = NVFP4_BLOCK

FMA_LANES_PER_SM = 128  # fp32 FMA lanes per SM on sm_90
L2_ROTATE_FACTOR = 2  # rotated bytes must exceed this many L2s
H200_FALLBACK = {"sms": 132, "clock_khz": 1_980_000, "l2_bytes": 60 * 1024 * 1024}

BYTES_FORMULA = {
    "q2_0": "N*(K/group)*(2+group/4) + M*K*2 + M*N*2",
    "w4a16": "N*K/2 + N*K/16 + 4 + M*K*2 + M*N*2",
    "bf16": "N*K*2 + M*K*2 + M*N*2",
}
FMA_FLOOR_FORMULA = "N*K*M / (SMs*128*clock)"


# -- byte formulas, floors, rotation (pure) --------------------------------------


# family -> bytes of one weight [N, K] as its kernels stream it, given (n, k, group):
# the weight term of BYTES_FORMULA.
_WEIGHT_BYTES = {
    "q2_0": lambda n, k, group: n * (k // group) * q2fmt.block_bytes(group),
    "w4a16": lambda n, k, group: n * k // 2 + n * (k // NVFP4_BLOCK) + 4,
    "bf16": lambda n, k, group: n * k * 2,
}


def weight_bytes(family: str, n: int, k: int, group: int = 0) -> int:
    """Bytes of one weight [N, K] as the kernel streams it."""
    formula = _WEIGHT_BYTES.get(family) if isinstance(family, str) else None
    if formula is None:
        raise ValueError(f"family: expected one of {FAMILIES}, got {family!r}")
    return formula(n, k, group)


def bytes_moved(family: str, n: int, k: int, m: int, group: int = 0) -> int:
    """:data:`BYTES_FORMULA`: weight once + bf16 activations [M, K] + bf16 output [M, N]."""
    return weight_bytes(family, n, k, group) + m * k * 2 + m * n * 2


def fma_floor_s(n: int, k: int, m: int, sms: int, clock_hz: float) -> float:
    """N*K*M / (SMs * 128 * clock): every fp32 lane issuing one useful FMA per clock."""
    return n * k * m / (sms * FMA_LANES_PER_SM * clock_hz)


def rotation_copies(bytes_per_copy: int, l2_bytes: int, factor: int = L2_ROTATE_FACTOR) -> int:
    """Smallest count >= 2 of copies whose total strictly exceeds ``factor`` x L2."""
    if bytes_per_copy < 1:
        raise ValueError(f"bytes_per_copy: expected >= 1, got {bytes_per_copy}")
    return max(2, factor * l2_bytes // bytes_per_copy + 1)


def calls_per_graph(copies: int, min_calls: int) -> int:
    """Calls per timed sequence: a multiple of ``copies`` (unbroken rotation), >= ``min_calls``."""
    return copies * max(1, math.ceil(min_calls / copies))

"""NVFP4 weights on the device: :class:`DeviceNvfp4Weight` (uploaded once, or wrapped in place).

The device copy holds the packed E2M1 codes as uint32 words (eight codes a
word, :mod:`q2gemv.formats.nvfp4`'s nibble order), the E4M3 block scales'
bytes and the fp32 global scale; every W4A16 kernel reads that layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numba import cuda

from ...backends import simulator_lock
from ...formats.nvfp4 import BLOCK, Nvfp4Weight, check_global_scale
from ..runtime.interop import check_device_array


@dataclass(frozen=True)
class DeviceNvfp4Weight:
    """An :class:`~q2gemv.formats.nvfp4.Nvfp4Weight` uploaded once: reuse it across calls.

    Built by :meth:`upload`; a hand-built one is checked at construction:
    ``n``/``k`` ints (n >= 1, k a positive multiple of 16), ``wp`` uint32
    [n, k/8] and ``scales`` uint8 [n, k/16] C-contiguous device arrays, so a
    kernel never reads past them; ``global_scale`` by
    :func:`q2gemv.formats.nvfp4.check_global_scale`, then kept as ``np.float32``.
    """

    wp: object  # device uint32 [n, k/8]: the packed nibbles, two words per group
    scales: object  # device uint8 [n, k/16]: E4M3 bits
    global_scale: np.float32
    n: int
    k: int
    # bound launches of q2gemv.cuda.runtime.launcher, per call signature; lives and dies with the weight
    launch_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    family: ClassVar[str] = "w4a16"

    def __post_init__(self) -> None:
        for name in ("n", "k"):
            v = getattr(self, name)
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
            if v < 1:
                raise ValueError(f"{name}: expected >= 1, got {v}")
        if self.k % BLOCK:
            raise ValueError(f"k: expected a multiple of {BLOCK}, got {self.k}")
        n, k = int(self.n), int(self.k)
        check_device_array(self.wp, "wp", np.uint32, (n, k // 8))
        check_device_array(self.scales, "scales", np.uint8, (n, k // BLOCK))
        g = check_global_scale(self.global_scale)  # the host weight's rules and messages
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "global_scale", np.float32(g))

    @classmethod
    def upload(cls, w: Nvfp4Weight, stream=0) -> DeviceNvfp4Weight:
        if not isinstance(w, Nvfp4Weight):
            raise TypeError(f"weight: expected an Nvfp4Weight, got {type(w).__name__}")
        with simulator_lock():
            wp = cuda.to_device(w.packed.view(np.uint32), stream=stream)
            sc = cuda.to_device(w.scales, stream=stream)
        return cls(wp, sc, np.float32(w.global_scale), w.n, w.k)

    @classmethod
    def from_buffers(cls, packed, scales, global_scale: float = 1.0) -> DeviceNvfp4Weight:
        """Wrap an NVFP4 weight already on the GPU: no host copy, no device copy.

        Args:
            packed: the E2M1 codes on the device, uint8 [n, k/2] (two codes a
                byte, even k in the low nibble: :mod:`q2gemv.formats.nvfp4`) or
                the same bytes as uint32 [n, k/8]; C-contiguous, 4-byte aligned.
            scales: the E4M3 block scales' bits, uint8 [n, k/16], C-contiguous
                (a ``torch.float8_e4m3fn`` tensor: pass ``.view(torch.uint8)``).
            global_scale: the per-tensor multiplier: a real scalar or size-1
                array, rounded to fp32, checked by
                :func:`q2gemv.formats.nvfp4.check_global_scale` as
                :class:`~q2gemv.Nvfp4Weight` checks it (a finite value fp32
                cannot hold is refused; ``inf``/``nan`` are kept).

        Each buffer is a numba device array or anything with
        ``__cuda_array_interface__`` (CUDA torch tensor, CuPy array), kept alive
        by the weight; its bytes must not change while the weight is used.
        ``n`` and ``k`` come from ``packed``'s shape.

        Raises:
            TypeError / ValueError naming ``packed``, ``scales`` or ``global_scale``.
        """
        from ... import launch
        from ..runtime.interop import as_device_buffer

        d = as_device_buffer(packed, "packed")
        sc = as_device_buffer(scales, "scales")
        if d.ndim != 2 or not d.is_c_contiguous():
            raise ValueError(
                f"packed: expected a C-contiguous 2-D device array, got shape {d.shape}"
            )
        dt = np.dtype(d.dtype)
        if dt.kind not in "ui" or dt.itemsize not in (1, 4):
            raise TypeError(f"packed: expected uint8 [n, k/2] or uint32 [n, k/8], got {dt}")
        addr = launch.device_address(d)
        if addr is not None and addr % 4:
            raise ValueError(
                f"packed: expected a 4-byte aligned device buffer, got address {addr:#x}"
            )
        n = int(d.shape[0])
        k = int(d.shape[1]) * (2 if dt.itemsize == 1 else 8)
        if k < BLOCK or k % BLOCK:
            raise ValueError(
                f"packed: expected k a multiple of {BLOCK} (>= {BLOCK}), got shape {d.shape} (k={k})"
            )
        if dt != np.uint32:
            d = d.view(np.uint32) if dt.itemsize == 4 else d.view(np.uint8).view(np.uint32)
        if np.dtype(sc.dtype).itemsize == 1 and np.dtype(sc.dtype) != np.uint8:
            sc = sc.view(np.uint8)
        return cls(d, sc, global_scale, n, k)


def as_device_weight(weight, stream=0) -> DeviceNvfp4Weight:
    if isinstance(weight, DeviceNvfp4Weight):
        return weight
    if isinstance(weight, Nvfp4Weight):
        return DeviceNvfp4Weight.upload(weight, stream)
    raise TypeError(
        f"weight: expected an Nvfp4Weight or DeviceNvfp4Weight, got {type(weight).__name__}"
    )


__all__ = ["DeviceNvfp4Weight", "as_device_weight"]

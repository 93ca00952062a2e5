"""Q2_0 weights on the device: :class:`DeviceQ2Weight` (uploaded once, or wrapped in place).

The device copy holds the GGUF ``block_q2_0`` bytes as they are
(:mod:`q2gemv.formats.q2_0`), viewed as uint16 (codes) and float16 (the
inline scales); every Q2_0 kernel reads that layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numba import cuda

from ... import launch
from ...formats import q2_0 as fmt


@dataclass(frozen=True)
class DeviceQ2Weight:
    """A :class:`~q2gemv.Q2Weight` uploaded once: reuse it across calls.

    Built by :meth:`upload` (or ``Q2Weight.to_device()``); a hand-built one is
    checked at construction against (n, k, group), like ``Q2Weight``: ``b16``
    and ``bh`` must be 1-D C-contiguous device arrays (uint16, float16) of
    exactly ``n * row_bytes(k, group) / 2`` halves, the two views of one
    buffer. The size decides the group too: the same (n, k) takes 18 bytes
    per 64 codes at group 64 and 34 per 128 at group 128, so group-64 bytes
    declared as group 128 (or bytes for fewer rows than ``n``, which a kernel
    would read past) are refused naming ``b16``.
    """

    b16: object  # device uint16 view of the raw bytes
    bh: object  # device float16 view of the same bytes
    n: int
    k: int
    group: int
    # bound launches of q2gemv.cuda.runtime.launcher, per call signature; lives and dies with the weight
    launch_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    family: ClassVar[str] = "q2_0"

    def __post_init__(self) -> None:
        from ..runtime.interop import check_device_array

        group = fmt.check_group(self.group)
        fmt._check_nk(self.n, self.k, group)
        n, k = int(self.n), int(self.k)
        halves = n * fmt.row_bytes(k, group) // 2
        for name, arr, dt in (("b16", self.b16, np.uint16), ("bh", self.bh, np.float16)):
            if getattr(arr, "__cuda_ndarray__", False) and np.dtype(arr.dtype) == np.dtype(dt):
                if arr.ndim == 1 and arr.size != halves:
                    raise ValueError(
                        f"{name}: expected {halves} halves ({2 * halves} bytes) for n={n} k={k} "
                        f"group={group}, got {arr.size} ({2 * arr.size} bytes)"
                    )
            check_device_array(arr, name, dt, (halves,))
        if not self._same_buffer(self.b16, self.bh):
            raise ValueError("bh: expected the float16 view of b16's buffer (b16.view(np.float16))")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "group", group)

    @classmethod
    def upload(cls, w: fmt.Q2Weight, stream=0) -> DeviceQ2Weight:
        if not isinstance(w, fmt.Q2Weight):
            raise TypeError(f"weight: expected a Q2Weight, got {type(w).__name__}")
        from ...backends import simulator_lock

        with simulator_lock():
            d = cuda.to_device(w.raw.view(np.uint16), stream=stream)
        return cls(d, d.view(np.float16), w.n, w.k, w.group)

    @classmethod
    def from_buffers(cls, raw, n: int, k: int, group: int) -> DeviceQ2Weight:
        """Wrap GGUF ``block_q2_0`` bytes already on the GPU: no host copy, no device copy.

        Args:
            raw: the weight's bytes on the device, uint8 (or int8), C-contiguous,
                [n * row_bytes] or [n, row_bytes] (``row_bytes(k, group)`` bytes a
                row, the GGUF layout of :mod:`q2gemv.formats.q2_0`): a numba
                device array, or anything with ``__cuda_array_interface__`` (a
                CUDA ``torch.uint8`` tensor, a CuPy array), which the weight keeps
                alive. Its bytes must not change while the weight is used.
            n, k, group: the shape and block size (64 or 128), as for ``Q2Weight``.

        Raises:
            TypeError / ValueError naming ``raw`` (not a device array, wrong
            dtype, not contiguous, not 2-byte aligned, wrong size) or
            ``n``/``k``/``group``.
        """
        from ..runtime.interop import as_device_buffer

        group = fmt.check_group(group)
        fmt._check_nk(n, k, group)
        d = as_device_buffer(raw, "raw")
        if np.dtype(d.dtype).itemsize != 1 or np.dtype(d.dtype).kind not in "ui":
            raise TypeError(f"raw: expected uint8 bytes, got {d.dtype}")
        if not d.is_c_contiguous() or d.ndim not in (1, 2):
            raise ValueError(
                f"raw: expected a C-contiguous 1-D or 2-D byte array, got shape {d.shape}"
            )
        want = int(n) * fmt.row_bytes(int(k), group)
        if d.size != want:
            raise ValueError(
                f"raw: expected {want} bytes for n={n} k={k} group={group}, got {d.size}"
            )
        addr = launch.device_address(d)
        if addr is not None and addr % 2:
            raise ValueError(f"raw: expected a 2-byte aligned device buffer, got address {addr:#x}")
        flat = d.reshape(d.size)
        if np.dtype(flat.dtype) != np.uint8:
            flat = flat.view(np.uint8)
        b16 = flat.view(np.uint16)
        return cls(b16, b16.view(np.float16), int(n), int(k), group)

    @staticmethod
    def _same_buffer(x, y) -> bool:
        """Do device arrays ``x`` and ``y`` start at one address (the simulator: share memory)?"""
        try:
            return x.device_ctypes_pointer.value == y.device_ctypes_pointer.value
        except AttributeError:  # the simulator's arrays are NumPy underneath
            return np.shares_memory(np.asarray(x._ary), np.asarray(y._ary))


def as_device_weight(weight, stream=0) -> DeviceQ2Weight:
    if isinstance(weight, DeviceQ2Weight):
        return weight
    if isinstance(weight, fmt.Q2Weight):
        return DeviceQ2Weight.upload(weight, stream)
    raise TypeError(f"weight: expected a Q2Weight or DeviceQ2Weight, got {type(weight).__name__}")


__all__ = ["DeviceQ2Weight", "as_device_weight"]

"""NVFP4 weights on the device: :class:`DeviceNvfp4Weight` (uploaded once, or wrapped in place).

The device copy is the exact kernel's execution layout
(:mod:`q2gemv.formats.nvfp4_layout`, made by :mod:`q2gemv.cuda.nvfp4.layout` on
the device when the codes are already there); the packed E2M1 codes (as
uint32 words, eight codes a word, :mod:`q2gemv.formats.nvfp4`'s nibble order)
and the E4M3 scales' bytes are kept only where the seed contract's kernels
need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numba import cuda

from ...formats import nvfp4_layout as lay
from ...formats.nvfp4 import BLOCK, Nvfp4Weight, check_global_scale
from ...host.backends import simulator_lock
from ..runtime.interop import check_device_array
from ..runtime.once import fill_once
from . import layout as w4_layout


@dataclass(frozen=True)
class DeviceNvfp4Weight:
    """An :class:`~q2gemv.formats.nvfp4.Nvfp4Weight` on the device: reuse it across calls.

    It holds the weight in the exact kernel's execution layout
    (:mod:`q2gemv.formats.nvfp4_layout`: ``codes`` uint32, ``xscales`` uint8,
    ``zsum`` int64), and the raw arrays (``wp`` uint32 [n, k/8], the packed
    codes; ``scales`` uint8 [n, k/16], the E4M3 bits) only where they are
    needed:

    * :meth:`upload` (``Nvfp4Weight.to_device()``) builds the layout on the
      host and uploads only it: the device holds the weight once. With
      ``keep_packed=True`` it uploads ``wp``/``scales`` too (for the seed
      contract's kernels, which read them). Without, the first seed-contract
      call rebuilds them from the layout on the device (the tested inverse,
      once per weight; the weight's device memory then doubles).
    * :meth:`from_buffers` repacks packed codes and scales already on the
      device into a layout it owns (a snapshot: it keeps no reference to
      them; the seed contract's arrays are rebuilt from the layout, as after
      :meth:`upload`).
    * A hand-built one (``DeviceNvfp4Weight(wp, scales, global_scale, n, k)``)
      is checked at construction: ``n``/``k`` ints (n >= 1, k a positive
      multiple of 16), ``wp`` uint32 [n, k/8] and ``scales`` uint8 [n, k/16]
      C-contiguous device arrays, so a kernel never reads past them;
      ``global_scale`` by :func:`q2gemv.formats.nvfp4.check_global_scale`,
      then kept as ``np.float32``. Its layout is made on the device at its
      first exact-contract call. With ``wp`` and ``scales`` None, the layout
      must be given instead (``codes``, ``xscales``, ``zsum``: 1-D
      C-contiguous device arrays of the dtypes and sizes
      :mod:`~q2gemv.formats.nvfp4_layout` states for (n, k); ``zsum`` must be
      what :func:`~q2gemv.formats.nvfp4_layout.row_sums` gives for those codes
      and scales, NaN marks included: the exact kernel trusts it).

    The raw arrays and the layout must not change while the weight is used
    (:meth:`upload` and :meth:`from_buffers` own theirs).
    """

    wp: object  # device uint32 [n, k/8]: the packed nibbles, two words per block; or None
    scales: object  # device uint8 [n, k/16]: E4M3 bits; or None (see raw_parts)
    global_scale: np.float32
    n: int
    k: int
    codes: object = None  # device uint32 [layout.code_words(n, k)], or None (see exec_layout)
    xscales: object = None  # device uint8 [layout.scale_bytes(n, k)], or None
    zsum: object = None  # device int64 [layout.zsum_entries(n)], or None
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
        layout = (self.codes, self.xscales, self.zsum)
        if self.wp is None and self.scales is None:
            if any(x is None for x in layout):
                raise ValueError(
                    "wp: expected the packed codes and scales, or codes, xscales and zsum "
                    "(the layout)"
                )
        else:
            check_device_array(self.wp, "wp", np.uint32, (n, k // 8))
            check_device_array(self.scales, "scales", np.uint8, (n, k // BLOCK))
        if any(x is not None for x in layout):
            check_device_array(self.codes, "codes", np.uint32, (lay.code_words(n, k),))
            check_device_array(self.xscales, "xscales", np.uint8, (lay.scale_bytes(n, k),))
            check_device_array(self.zsum, "zsum", np.int64, (lay.zsum_entries(n),))
        g = check_global_scale(self.global_scale)  # the host weight's rules and messages
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "global_scale", np.float32(g))

    def exec_layout(self, stream=0) -> tuple:
        """``(codes, xscales, zsum)``: the execution layout, made on the device at first use if absent."""
        return fill_once(
            self,
            ("codes", "xscales", "zsum"),
            lambda: w4_layout.pack(self.wp, self.scales, self.n, self.k, stream),
        )

    def raw_parts(self, stream=0) -> tuple:
        """``(wp, scales)``: the raw arrays, rebuilt on the device from the layout at first use if absent.

        Only the seed contract's kernels read them; the rebuild is the exact
        inverse of the layout (:func:`q2gemv.cuda.nvfp4.layout.unpack`).
        """
        return fill_once(
            self,
            ("wp", "scales"),
            lambda: w4_layout.unpack(self.codes, self.xscales, self.n, self.k, stream),
        )

    def to_parts(self) -> tuple[np.ndarray, np.ndarray, np.float32]:
        """``(packed uint8 [n, k/2], scales uint8 [n, k/16], global_scale)``, copied to the host.

        ``Nvfp4Weight(*dw.to_parts())`` is the host weight again, bit for bit.
        """
        wp, scales = self.raw_parts()
        packed = wp.copy_to_host().view(np.uint8).reshape(self.n, self.k // 2)
        return packed, scales.copy_to_host(), self.global_scale

    @classmethod
    def upload(cls, w: Nvfp4Weight, stream=0, *, keep_packed: bool = False) -> DeviceNvfp4Weight:
        """``w`` on the device in the execution layout (and ``wp``/``scales`` if ``keep_packed``)."""
        if not isinstance(w, Nvfp4Weight):
            raise TypeError(f"weight: expected an Nvfp4Weight, got {type(w).__name__}")
        if not isinstance(keep_packed, bool):
            raise TypeError(f"keep_packed: expected a bool, got {type(keep_packed).__name__}")
        codes, xscales, zsum = lay.to_exec_layout(w.packed, w.scales, w.n, w.k)
        wp = sc = None
        with simulator_lock():
            d_codes = cuda.to_device(codes, stream=stream)
            d_xscales = cuda.to_device(xscales, stream=stream)
            d_zsum = cuda.to_device(zsum, stream=stream)
            if keep_packed:
                wp = cuda.to_device(w.packed.view(np.uint32), stream=stream)
                sc = cuda.to_device(w.scales, stream=stream)
        g = np.float32(w.global_scale)
        return cls(wp, sc, g, w.n, w.k, d_codes, d_xscales, d_zsum)

    @classmethod
    def from_buffers(cls, packed, scales, global_scale: float = 1.0) -> DeviceNvfp4Weight:
        """An NVFP4 weight already on the GPU: no host copy.

        ``packed`` and ``scales`` are repacked on the device, on the default
        stream, into an execution layout the weight owns; the weight is that
        snapshot and keeps no reference to them. Every call reads the
        snapshot: the exact kernel the layout, the seed contract's kernels and
        :meth:`to_parts` the arrays rebuilt from it at first use (the tested
        inverse; the weight's device memory then doubles). A later write to
        ``packed`` or ``scales`` does not reach the weight (make a new one).

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
        ``__cuda_array_interface__`` (CUDA torch tensor, CuPy array), read once, here.
        ``n`` and ``k`` come from ``packed``'s shape.

        Raises:
            TypeError / ValueError naming ``packed``, ``scales`` or ``global_scale``.
        """
        from ...dispatch import plan
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
        addr = plan.device_address(d)
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
        dw = cls(d, sc, global_scale, n, k)  # the hand-built weight's checks
        codes, xscales, zsum = w4_layout.pack(d, sc, n, k)  # returns once written
        return cls(None, None, dw.global_scale, n, k, codes, xscales, zsum)


def as_device_weight(weight, stream=0, contract: str = "exact") -> DeviceNvfp4Weight:
    """``weight`` on the device: as it is, or uploaded for one call of ``contract``'s kernels
    (``"seed"``: ``packed``/``scales`` only, the layout made only if an exact call follows)."""
    if isinstance(weight, DeviceNvfp4Weight):
        return weight
    if isinstance(weight, Nvfp4Weight):
        if contract == "seed":
            with simulator_lock():
                wp = cuda.to_device(weight.packed.view(np.uint32), stream=stream)
                sc = cuda.to_device(weight.scales, stream=stream)
            return DeviceNvfp4Weight(wp, sc, np.float32(weight.global_scale), weight.n, weight.k)
        return DeviceNvfp4Weight.upload(weight, stream)
    raise TypeError(
        f"weight: expected an Nvfp4Weight or DeviceNvfp4Weight, got {type(weight).__name__}"
    )


__all__ = ["DeviceNvfp4Weight", "as_device_weight"]

"""Q2_0 weights on the device: :class:`DeviceQ2Weight` (uploaded once, or wrapped in place).

The device copy is the exact kernel's execution layout
(:mod:`q2gemv.formats.q2_0_layout`, made by :mod:`q2gemv.cuda.q2_0.layout` on
the device); the GGUF ``block_q2_0`` bytes (:mod:`q2gemv.formats.q2_0`),
viewed as uint16 (codes) and float16 (the inline scales), are kept only
where the seed contract's kernels need them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numba import cuda

from ...dispatch import plan
from ...formats import q2_0 as fmt
from ...formats import q2_0_layout as lay
from ..runtime.once import fill_once
from . import layout as q2_layout


@dataclass(frozen=True)
class DeviceQ2Weight:
    """A :class:`~q2gemv.Q2Weight` on the device: reuse it across calls.

    It holds the weight in the exact kernel's execution layout
    (:mod:`q2gemv.formats.q2_0_layout`: ``codes`` uint32, ``scales`` uint16),
    and the GGUF bytes (``b16``/``bh``, two views of one buffer) only where
    they are needed:

    * :meth:`upload` (``Q2Weight.to_device()``) builds the layout on the host
      and uploads only it: the device holds the weight once. With
      ``keep_gguf=True`` it uploads the GGUF bytes too (for the seed
      contract's kernels, which read them). Without, the first seed-contract
      call rebuilds them from the layout on the device (the tested inverse,
      once per weight; the weight's device memory then doubles).
    * :meth:`from_buffers` repacks GGUF bytes already on the device into a
      layout it owns (a snapshot: it keeps no reference to them; the seed
      contract's bytes are rebuilt from the layout, as after :meth:`upload`).
    * A hand-built one (``DeviceQ2Weight(b16, bh, n, k, group)``) is checked at
      construction against (n, k, group), like ``Q2Weight``: ``b16`` and ``bh``
      must be 1-D C-contiguous device arrays (uint16, float16) of exactly
      ``n * row_bytes(k, group) / 2`` halves, the two views of one buffer.
      The size decides the group too: the same (n, k) takes 18 bytes per 64
      codes at group 64 and 34 per 128 at group 128, so group-64 bytes
      declared as group 128 (or bytes for fewer rows than ``n``, which a
      kernel would read past) are refused naming ``b16``. Its layout is
      made on the device at its first exact-contract call.

    The GGUF bytes and the layout must not change while the weight is used
    (:meth:`upload` and :meth:`from_buffers` own theirs).
    """

    b16: object  # device uint16 view of the GGUF bytes, or None (see gguf_halves)
    bh: object  # device float16 view of the same bytes, or None
    n: int
    k: int
    group: int
    codes: object = None  # device uint32 [layout.code_words(n, k)], or None (see exec_layout)
    scales: object = None  # device uint16 [layout.scale_halves(n, k, group)], or None
    # each row tile's base shift for one-word accumulators (lay.accumulator_bases), made from
    # the scales with the layout: device int32 [tiles], and whether every tile has one
    acc_bases: object = field(default=None, init=False, repr=False, compare=False)
    acc_one_word: object = field(default=None, init=False, repr=False, compare=False)
    # bound launches of q2gemv.cuda.runtime.launcher, per call signature; dies with the weight
    launch_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    family: ClassVar[str] = "q2_0"

    def __post_init__(self) -> None:
        from ..runtime.interop import check_device_array

        group = fmt.check_group(self.group)
        n, k = fmt._check_nk(self.n, self.k, group)  # Python ints (fmt.as_size)
        if self.b16 is None and self.bh is None:
            if self.codes is None or self.scales is None:
                raise ValueError("b16: expected the GGUF bytes, or codes and scales (the layout)")
        else:
            halves = n * fmt.row_bytes(k, group) // 2
            for name, arr, dt in (("b16", self.b16, np.uint16), ("bh", self.bh, np.float16)):
                if getattr(arr, "__cuda_ndarray__", False) and np.dtype(arr.dtype) == np.dtype(dt):
                    if arr.ndim == 1 and arr.size != halves:
                        raise ValueError(
                            f"{name}: expected {halves} halves ({2 * halves} bytes) for n={n} "
                            f"k={k} group={group}, got {arr.size} ({2 * arr.size} bytes)"
                        )
                check_device_array(arr, name, dt, (halves,))
            if not self._same_buffer(self.b16, self.bh):
                raise ValueError(
                    "bh: expected the float16 view of b16's buffer (b16.view(np.float16))"
                )
        if self.codes is not None or self.scales is not None:
            check_device_array(self.codes, "codes", np.uint32, (lay.code_words(n, k),))
            check_device_array(self.scales, "scales", np.uint16, (lay.scale_halves(n, k, group),))
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "group", group)

    def exec_layout(self, stream=0) -> tuple:
        """``(codes, scales)``: the execution layout, made on the device at first use if absent."""
        return fill_once(
            self,
            ("codes", "scales"),
            lambda: q2_layout.pack(self.b16, self.n, self.k, self.group, stream),
        )

    def accumulator_bases(self, stream=0) -> tuple:
        """``(bases, one_word)``: :func:`q2gemv.formats.q2_0_layout.accumulator_bases` of the
        layout's scales on the device (int32 [tiles]), and whether every tile has a base (then
        the batched exact kernel keeps one-word accumulators). Made at first use from the
        scales (copied to the host once, unless :meth:`upload` had them)."""

        _, scales = self.exec_layout(stream)  # first: fill_once's lock is not reentrant

        def make() -> tuple:
            from ...host.backends import simulator_lock

            with simulator_lock():
                host = scales.copy_to_host(stream=stream)
                if hasattr(stream, "synchronize"):  # an asynchronous copy on a stream
                    stream.synchronize()
            return self._bases_on_device(host, stream)

        return fill_once(self, ("acc_bases", "acc_one_word"), make)

    def _bases_on_device(self, host_scales: np.ndarray, stream=0) -> tuple:
        from ...host.backends import simulator_lock

        bases = lay.accumulator_bases(host_scales, self.n, self.k, self.group)
        with simulator_lock():
            d = cuda.to_device(bases, stream=stream)
        return d, bool((bases != lay.NO_BASE).all())

    def gguf_halves(self, stream=0) -> tuple:
        """``(b16, bh)``: the GGUF bytes, rebuilt on the device from the layout at first use if absent.

        Only the seed contract's kernels read them; the rebuild is the exact
        inverse of the layout (:func:`q2gemv.cuda.q2_0.layout.unpack`).
        """

        def make() -> tuple:
            b16 = q2_layout.unpack(self.codes, self.scales, self.n, self.k, self.group, stream)
            return b16, b16.view(np.float16)

        return fill_once(self, ("b16", "bh"), make)

    def to_gguf(self) -> np.ndarray:
        """The weight's GGUF ``block_q2_0`` bytes, copied to the host (uint8 [n * row_bytes])."""
        b16, _ = self.gguf_halves()
        return b16.copy_to_host().view(np.uint8)

    @classmethod
    def upload(cls, w: fmt.Q2Weight, stream=0, *, keep_gguf: bool = False) -> DeviceQ2Weight:
        """``w`` on the device in the execution layout (and its GGUF bytes if ``keep_gguf``)."""
        if not isinstance(w, fmt.Q2Weight):
            raise TypeError(f"weight: expected a Q2Weight, got {type(w).__name__}")
        if not isinstance(keep_gguf, bool):
            raise TypeError(f"keep_gguf: expected a bool, got {type(keep_gguf).__name__}")
        from ...host.backends import simulator_lock

        codes, scales = lay.to_exec_layout(w.raw, w.n, w.k, w.group)
        with simulator_lock():
            d_codes = cuda.to_device(codes, stream=stream)
            d_scales = cuda.to_device(scales, stream=stream)
            d = cuda.to_device(w.raw.view(np.uint16), stream=stream) if keep_gguf else None
        bh = None if d is None else d.view(np.float16)
        dw = cls(d, bh, w.n, w.k, w.group, d_codes, d_scales)
        bases = dw._bases_on_device(scales, stream)
        fill_once(dw, ("acc_bases", "acc_one_word"), lambda: bases)
        return dw

    @classmethod
    def from_buffers(cls, raw, n: int, k: int, group: int) -> DeviceQ2Weight:
        """A weight of GGUF ``block_q2_0`` bytes already on the GPU: no host copy.

        ``raw`` is repacked on the device, on the default stream, into an
        execution layout the weight owns; the weight is that snapshot of
        ``raw``'s bytes and keeps no reference to ``raw``. Every call reads
        the snapshot: the exact kernel the layout, the seed contract's kernels
        and :meth:`to_gguf` the GGUF bytes rebuilt from it at first use (the
        tested inverse; the weight's device memory then doubles). A later
        write to ``raw`` does not reach the weight (make a new one).

        Args:
            raw: the weight's bytes on the device, uint8 (or int8), C-contiguous,
                [n * row_bytes] or [n, row_bytes] (``row_bytes(k, group)`` bytes a
                row, the GGUF layout of :mod:`q2gemv.formats.q2_0`): a numba
                device array, or anything with ``__cuda_array_interface__`` (a
                CUDA ``torch.uint8`` tensor, a CuPy array), read once, here.
            n, k, group: the shape and block size (64 or 128), as for ``Q2Weight``.

        Raises:
            TypeError / ValueError naming ``raw`` (not a device array, wrong
            dtype, not contiguous, not 2-byte aligned, wrong size) or
            ``n``/``k``/``group``.
        """
        from ..runtime.interop import as_device_buffer

        group = fmt.check_group(group)
        n, k = fmt._check_nk(n, k, group)  # Python ints: no fixed-width overflow below
        d = as_device_buffer(raw, "raw")
        if np.dtype(d.dtype).itemsize != 1 or np.dtype(d.dtype).kind not in "ui":
            raise TypeError(f"raw: expected uint8 bytes, got {d.dtype}")
        if not d.is_c_contiguous() or d.ndim not in (1, 2):
            raise ValueError(
                f"raw: expected a C-contiguous 1-D or 2-D byte array, got shape {d.shape}"
            )
        want = n * fmt.row_bytes(k, group)
        if d.size != want:
            raise ValueError(
                f"raw: expected {want} bytes for n={n} k={k} group={group}, got {d.size}"
            )
        addr = plan.device_address(d)
        if addr is not None and addr % 2:
            raise ValueError(f"raw: expected a 2-byte aligned device buffer, got address {addr:#x}")
        flat = d.reshape(d.size)
        if np.dtype(flat.dtype) != np.uint8:
            flat = flat.view(np.uint8)
        b16 = flat.view(np.uint16)
        cls(b16, b16.view(np.float16), n, k, group)  # the hand-built weight's checks
        codes, scales = q2_layout.pack(b16, n, k, group)  # returns once written
        return cls(None, None, n, k, group, codes, scales)

    @staticmethod
    def _same_buffer(x, y) -> bool:
        """Do device arrays ``x`` and ``y`` start at one address (the simulator: share memory)?"""
        try:
            return x.device_ctypes_pointer.value == y.device_ctypes_pointer.value
        except AttributeError:  # the simulator's arrays are NumPy underneath
            return np.shares_memory(np.asarray(x._ary), np.asarray(y._ary))


def as_device_weight(weight, stream=0, contract: str = "exact") -> DeviceQ2Weight:
    """``weight`` on the device: as it is, or uploaded for one call of ``contract``'s kernels
    (``"seed"``: the GGUF bytes only, the layout made only if an exact call follows)."""
    if isinstance(weight, DeviceQ2Weight):
        return weight
    if isinstance(weight, fmt.Q2Weight):
        if contract == "seed":
            from ...host.backends import simulator_lock

            with simulator_lock():
                d = cuda.to_device(weight.raw.view(np.uint16), stream=stream)
            return DeviceQ2Weight(d, d.view(np.float16), weight.n, weight.k, weight.group)
        return DeviceQ2Weight.upload(weight, stream)
    raise TypeError(f"weight: expected a Q2Weight or DeviceQ2Weight, got {type(weight).__name__}")


__all__ = ["DeviceQ2Weight", "as_device_weight"]

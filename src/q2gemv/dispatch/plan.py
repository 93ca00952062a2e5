"""Launch geometry and batch chunking: pure functions, tested exhaustively on the CPU.

The thread maps (fixed by the seed, and by the references' operation order):

* ``q2_0_gemv`` (baseline): 2 warps per output row, 4 rows per 256-thread
  CTA, grid ``ceil(N / 4)``.
* ``q2_0_gemv_vec`` and ``q2_0_gemv_vec_batchm`` ("candidate B"): 1 warp per
  output row, 8 rows per 256-thread CTA, grid ``ceil(N / 8)``.

``q2_0_gemv_vec_batchm`` stages at most :data:`Q2_BATCHM_MAX_M` activation
rows per launch; a caller with more rows is served by successive launches
over row chunks, with the [M, K] input and [M, N] output advanced by whole
bf16 rows. Rows are independent and every row's arithmetic is the M=1
kernel's, so chunking is numerically inert.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from . import registry
from .registry import Q2_BATCHM_MAX_M as Q2_BATCHM_MAX_M  # re-exported: the registry's numbers
from .registry import Q2_EXACT_MAX_M as Q2_EXACT_MAX_M
from .registry import THREADS_PER_CTA as THREADS_PER_CTA

BF16_BYTES = 2
# Live read-only view of the registry (q2gemv.dispatch.registry): kernel -> output rows per CTA.
Q2_ROWS_PER_CTA = registry.rows_per_cta_table("q2_0")


def div_ceil(a: int, b: int) -> int:
    """Integer ``ceil(a / b)`` for ints ``a >= 0`` and ``b >= 1`` (no float rounding)."""
    return -(-a // b)


def q2_grid(kernel: str, n: int) -> tuple[int, int, int]:
    """Grid of ``kernel`` for ``n`` output rows; the block is always (256, 1, 1)."""
    try:
        rows = Q2_ROWS_PER_CTA[kernel]
    except KeyError:
        raise ValueError(
            f"kernel: expected one of {sorted(Q2_ROWS_PER_CTA)}, got {kernel!r}"
        ) from None
    if n < 1:
        raise ValueError(f"n: expected >= 1, got {n}")
    return (div_ceil(n, rows), 1, 1)


def batchm_row_chunks(m: int, max_m: int = Q2_BATCHM_MAX_M) -> Iterator[tuple[int, int]]:
    """``(r0, rows)`` chunks: contiguous from 0, 1 <= rows <= max_m, summing to m.

    Empty when m == 0.
    """
    if m < 0:
        raise ValueError(f"m: expected >= 0, got {m}")
    if max_m < 1:
        raise ValueError(f"max_m: expected >= 1, got {max_m}")
    for r0 in range(0, m, max_m):
        yield r0, min(max_m, m - r0)


def check_chunks(chunks, m: int, max_m: int, multiple: int = 1) -> list[tuple[int, int]]:
    """``(row0, rows)`` chunks of a launch plan, checked: ``batchm_row_chunks(m, max_m)`` if None.

    The chunks must cover rows ``0..m`` once, in order, each ``1..max_m``
    rows starting at a multiple of ``multiple``; ValueError naming ``plan``.
    """
    if chunks is None:
        return list(batchm_row_chunks(m, max_m))
    chunks = [(int(r0), int(rows)) for r0, rows in chunks]
    nxt = 0
    for r0, rows in chunks:
        if r0 != nxt or not 1 <= rows <= max_m or r0 % multiple:
            at = f" starting at multiples of {multiple}" if multiple > 1 else ""
            raise ValueError(
                f"plan: expected chunks of 1..{max_m} rows{at} from row {nxt}, got {chunks}"
            )
        nxt += rows
    if nxt != m:
        raise ValueError(f"plan: expected chunks covering {m} rows, got {chunks}")
    return chunks


# The kernels take row counts and offsets as int32: no plan goes beyond this many rows
# (q2gemv.plan, q2gemv.dispatch.nvfp4_tiers.plan_w4a16 / explain_tier / select_tier all refuse more).
PLAN_MAX_M = 2**31 - 1


class ChunkPlan(Sequence):
    """Launches ``(row0, rows, kernel)`` of ``m`` rows in chunks of ``step``, never materialised.

    ``kernel_of(rows)`` names the kernel of a chunk of ``rows`` rows (only the
    last chunk can be shorter). Indexing, ``len`` and iteration cost O(1) per
    entry, so a plan for 2**31 rows costs nothing until it is walked; it
    compares equal to the list of its entries.
    """

    def __init__(self, m: int, step: int, kernel_of: Callable[[int], str]):
        if m < 0 or step < 1:
            raise ValueError(f"m, step: expected m >= 0 and step >= 1, got {m}, {step}")
        self.m, self.step, self._kernel_of = int(m), int(step), kernel_of

    def __len__(self) -> int:
        return div_ceil(self.m, self.step)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"plan index {i} out of range for {n} launches")
        r0 = j * self.step
        rows = min(self.step, self.m - r0)
        return (r0, rows, self._kernel_of(rows))

    def __eq__(self, other) -> bool:
        if isinstance(other, (list, tuple, ChunkPlan)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        n = len(self)
        if n <= 4:
            return repr(list(self))
        return f"ChunkPlan({n} launches: {self[0]}, {self[1]}, ..., {self[-1]})"


def plan_launches(weight, spec, mode: str, m: int, kernel: str | None):
    """The launches ``(row0, rows, kernel)`` of ``m`` rows, never materialised (arguments checked).

    ``spec`` is the weight's :class:`~q2gemv.dispatch.registry.FamilySpec`, ``kernel`` the
    forced kernel or None. ``mode`` ``"exact"``: the kernel's chunks of its ``max_m``
    rows; ``"seed"``: the family's seed rule.
    """
    if mode == "exact":
        name = spec.exact_kernel if kernel is None else kernel
        return ChunkPlan(m, registry.get(name).max_m, lambda rows: name)
    return registry.resolve(spec.seed_plan)(weight, m, kernel)


def batchm_launch_chunks(
    m: int, k: int, n: int, max_m: int = Q2_BATCHM_MAX_M
) -> Iterator[tuple[int, int, int]]:
    """``(input_byte_offset, output_byte_offset, rows)`` for each batchm launch.

    ``m`` activation rows of ``k`` bf16 values each, ``n`` output columns,
    at most ``max_m`` rows per launch (chunks as :func:`batchm_row_chunks`,
    whose ValueErrors it raises). BF16 row strides: the input is [M, K], the output [M, N]; e.g. m=17,
    k=256, n=5 -> (0, 0, 8), (4096, 80, 8), (8192, 160, 1).
    """
    for r0, rows in batchm_row_chunks(m, max_m):
        yield r0 * k * BF16_BYTES, r0 * n * BF16_BYTES, rows


def check_launch_rows(kernel: str, d_a, d_out, m: int, max_m: int, n: int, k: int) -> None:
    """Refuse one launch's rows before anything is enqueued.

    ``m`` must be an int in 1..``max_m`` (what ``kernel`` stages per launch);
    ``d_a`` must be uint16 bf16 bits of shape (m, k) and ``d_out`` of shape
    (m, n). Raises TypeError/ValueError naming ``m``, ``a`` or ``out``.
    """
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
        raise TypeError(f"m: expected an int, got {type(m).__name__}")
    if not 1 <= m <= max_m:
        raise ValueError(f"m: kernel {kernel} serves 1..{max_m} rows per launch, got {m}")
    for arg, arr, want in (("a", d_a, (m, k)), ("out", d_out, (m, n))):
        if np.dtype(arr.dtype) != np.uint16:
            raise TypeError(f"{arg}: expected uint16 bf16 bits, got {arr.dtype}")
        if tuple(arr.shape) != want:
            raise ValueError(f"{arg}: expected shape {want}, got {tuple(arr.shape)}")


MAX_WEIGHT_HALVES = 2**32  # the vec kernels index a weight's uint16 halves in 32 bits


def check_weight_halves(kernel: str, halves: int) -> None:
    """Refuse a weight of ``halves`` uint16 halves that ``kernel``'s 32-bit indices cannot reach.

    That is 8 GiB of Q2_0 bytes in one tensor (e.g. N=131072, K=262144 at
    group 128), far beyond any GEMV weight; kernels of ``index_bits == 64``
    (the baseline) have no limit.
    """
    if registry.get(kernel).index_bits == 32 and halves >= MAX_WEIGHT_HALVES:
        raise ValueError(
            f"weight: kernel {kernel} indexes the weight in 32 bits: expected fewer than "
            f"2**32 uint16 halves (8 GiB), got {halves} (use kernel='q2_0_gemv')"
        )


def device_address(arr) -> int | None:
    """The device address of ``arr`` (a numba device array); None where there is none (the simulator)."""
    try:
        return int(arr.device_ctypes_pointer.value or 0)
    except AttributeError:
        return None


def check_alignment(kernel: str, d_a, align: int) -> None:
    """Refuse activations ``d_a`` whose device address is not a multiple of ``align`` bytes.

    ``kernel`` (its name, for the message) reads activations ``align`` bytes at a time; buffers
    that numba, torch or CuPy allocate (and their row slices, K being a
    multiple of 64) always qualify; a view that starts mid-buffer may not.
    """
    addr = device_address(d_a)
    if addr is not None and addr % align:
        raise ValueError(
            f"a: kernel {kernel} reads activations {align} bytes at a time: expected a "
            f"{align}-byte aligned device buffer, got address {addr:#x} "
            "(copy it, e.g. .clone(), or use kernel='q2_0_gemv')"
        )

"""``q2gemv bench``: decode-GEMV GPU times against the read ceiling, the FMA floor and torch bf16.

Method (docs/measurements.md, "How to measure"), all in one process and one run:

* **Cold weights.** Every (family, shape) gets C copies of its weight,
  activations and output, C the smallest count >= 2 whose total exceeds
  2 x the L2 (its size read from the device); consecutive calls
  rotate through the copies, so no call finds its weight in L2.
* **GPU time only.** A case is a sequence of L calls (L a multiple of C, so
  the rotation continues unbroken across repeats), captured once into a CUDA
  graph and replayed; CUDA events bracket each replay (or, with
  ``--timing sleep``, the calls are queued behind a spin kernel). The time of
  a case is the median over ``--repeats`` (>= 5) replays of replay time / L.
  Kernels are launched through :class:`~q2gemv.cuda.runtime.prebound.PreboundLaunch`
  (one driver call each), torch through ``F.linear``.
* **Bytes moved** (the minimum a call must move; a chunked call still counts
  the weight once, so chunking shows up as lower GB/s):

  ======  ==========================================================
  Q2_0    N*(K/group)*(2+group/4) + M*K*2 + M*N*2
  NVFP4   N*K/2 + N*K/16 + 4 + M*K*2 + M*N*2   (codes, E4M3 scales, fp32 global)
  bf16    N*K*2 + M*K*2 + M*N*2                 (torch ``F.linear``, weight [N, K])
  ======  ==========================================================

  effective GB/s = bytes / time (1 GB = 1e9 B); % of the read ceiling =
  GB/s / the streaming-read ceiling measured in the same run (a numba kernel
  reading 2 GiB with one ``ld.global.v4.u32`` = 16 B per thread per load; the
  faster of two grid shapes, at the start and end of the run).
* **FMA issue floor** = N*K*M / (SMs * 128 * clock), SMs and clock read from
  the device: the time if every fp32 lane issued one useful FMA per clock.
  ``pct_fma_floor`` = 100 * floor / time (100 = at the floor).
* **torch bf16** ``F.linear(a [M, K], w [N, K])``, the same shape and M, also
  cold and graph-replayed; ``speedup_vs_bf16`` = bf16 time / kernel time.
* Q2_0 ``q2_0_gemv_vec_batchm`` at M is also compared with M x the time of
  the M=1 kernel ``q2_0_gemv_vec`` (``speedup_vs_m1_x_m``).

Every case's output (copy 0) is compared bit for bit with an eager
``launch_raw`` of the same chunks (column ``check``): it proves the
pre-bound argument packing, not the kernel (``q2gemv verify`` does that).

Outputs under ``--out`` (default ``./q2gemv-bench``, never ``benchmarks/results``
unless named; ``PREFIX`` defaults to the device, ``h200`` on an H200, ``simulator``
under the simulator; existing files are kept unless ``--overwrite``): ``PREFIX_gemv.csv``
(one row per case), ``PREFIX_ceiling.csv``, ``PREFIX_launch_overhead.csv``
(host us per launch: numba dispatcher vs ``launch_raw`` vs pre-bound),
``PREFIX_graph_check.csv`` (pre-bound launch captured in a torch CUDA graph
on its stream, replayed, compared with an eager launch), ``PREFIX_summary.md``
and ``PREFIX_run.json``; with ``--plot``, ``PREFIX_gemv.png`` (and
``PREFIX_w4a16_tiers.png``), drawn by :mod:`q2gemv.bench.plot`.

Every registered kernel can be timed (``--kernels NAME``): the seed kernels
one pre-bound launch per chunk, the exact contract's (``q2_0_gemv_exact``,
``w4a16_gemv_exact``, the defaults) as the public call runs them: the
family's prepare over all M rows, then the GEMV per chunk (role ``exact``).

The modules, each importing only those above it (no cycle; nothing in the
package core imports this subpackage; ``tests/bench/test_formulas.py`` checks both):

==============  ================================================================
``formulas``    byte formulas, FMA floor, rotation (pure)
``matrix``      shapes, M values, :class:`Case`, :func:`build_cases`, :class:`Settings` (pure)
``results``     derived columns, CSV, tables, summary, output files (pure)
``plot``        the figures of a CSV (matplotlib, imported when drawing)
``timing``      CUDA-graph / spin-kernel / eager timers, read kernels (numba; no
                other bench module)
``runner``      the GPU half: rotated buffers, timed cases, ceiling, host overhead
                (numba, torch when present)
``command``     the options and :func:`run`; imports ``runner`` only when a run starts
==============  ================================================================

Importing ``q2gemv.bench`` loads the pure modules and ``command``, not numba.
"""

from .command import add_arguments, run
from .formulas import (
    BYTES_FORMULA,
    FAMILIES,
    FMA_FLOOR_FORMULA,
    FMA_LANES_PER_SM,
    H200_FALLBACK,
    L2_ROTATE_FACTOR,
    NVFP4_GROUP,
    TORCH_KERNEL,
    bytes_moved,
    calls_per_graph,
    fma_floor_s,
    rotation_copies,
    weight_bytes,
)
from .matrix import (
    MAX_M,
    MS,
    Q2_BATCHM,
    Q2_M1_REFERENCE,
    QUICK_MS,
    QUICK_SHAPES,
    SHAPES,
    SIM_EXAMPLE_SHAPE,
    SIM_MAX_M,
    SIM_MAX_NK,
    W4A16_MAX_M,
    W4A16_SWEEP_SHAPES,
    W4A16_TABLE_TIERS,
    Case,
    Settings,
    build_cases,
    chunks,
    exact_kernel_table,
    kernel_names,
    parse_ints,
    parse_shapes,
    parse_tokens,
    q2_kernel_table,
    simulator_refusals,
)
from .results import (
    CEILING_FIELDS,
    DEFAULT_OUT,
    FIELDS,
    GRAPH_FIELDS,
    OUTPUT_SUFFIXES,
    OVERHEAD_FIELDS,
    PREBOUND_PATH,
    PREBOUND_TARGET_US,
    SIM_PREFIX,
    Report,
    base_meta,
    case_row,
    derive,
    device_prefix,
    free_prefix,
    headline_rows,
    headline_table,
    md_table,
    progress_line,
    q2_batchm_table,
    q2_m1_table,
    read_csv,
    summary_markdown,
    text_summary,
    w4a16_tier_table,
    write_csv,
    write_outputs,
)

__all__ = [
    "BYTES_FORMULA",
    "CEILING_FIELDS",
    "Case",
    "DEFAULT_OUT",
    "FAMILIES",
    "FIELDS",
    "FMA_FLOOR_FORMULA",
    "FMA_LANES_PER_SM",
    "GRAPH_FIELDS",
    "H200_FALLBACK",
    "L2_ROTATE_FACTOR",
    "MAX_M",
    "MS",
    "NVFP4_GROUP",
    "OUTPUT_SUFFIXES",
    "OVERHEAD_FIELDS",
    "PREBOUND_PATH",
    "PREBOUND_TARGET_US",
    "Q2_BATCHM",
    "Q2_M1_REFERENCE",
    "QUICK_MS",
    "QUICK_SHAPES",
    "Report",
    "SHAPES",
    "SIM_EXAMPLE_SHAPE",
    "SIM_MAX_M",
    "SIM_MAX_NK",
    "SIM_PREFIX",
    "Settings",
    "TORCH_KERNEL",
    "W4A16_MAX_M",
    "W4A16_SWEEP_SHAPES",
    "W4A16_TABLE_TIERS",
    "add_arguments",
    "base_meta",
    "build_cases",
    "bytes_moved",
    "calls_per_graph",
    "case_row",
    "chunks",
    "derive",
    "device_prefix",
    "exact_kernel_table",
    "fma_floor_s",
    "free_prefix",
    "headline_rows",
    "headline_table",
    "kernel_names",
    "md_table",
    "parse_ints",
    "parse_shapes",
    "parse_tokens",
    "progress_line",
    "q2_batchm_table",
    "q2_kernel_table",
    "q2_m1_table",
    "read_csv",
    "rotation_copies",
    "run",
    "simulator_refusals",
    "summary_markdown",
    "text_summary",
    "w4a16_tier_table",
    "weight_bytes",
    "write_csv",
    "write_outputs",
]

"""The Q2_0 exact family's launches: the unbatched builds or one batched launch per chunk.

The exact-family interface of :mod:`q2gemv.cuda.runtime.launcher` (``ExactFamily``) for
``q2_0_gemv_exact``: the prepare of :mod:`q2gemv.cuda.q2_0.exact`, then per chunk of up to
:data:`~q2gemv.cuda.q2_0.exact.MAX_M` rows one launch of the batched build
(:mod:`q2gemv.cuda.q2_0.exact_batched`) where :func:`~q2gemv.cuda.q2_0.exact.batched_for`
says so, else the unbatched launches of up to 8 rows. A module of its own because it uses
both kernel modules (the batched one builds on the unbatched one's device code).
"""

from __future__ import annotations

from ...dispatch import plan
from . import exact, exact_batched

PREPARE = exact.PREPARE
Operands = exact.ExactOperands
check_k = exact.check_k
prepare_launch = exact.prepare_launch
ptx_specs = exact.ptx_specs
NAME = "q2_0_gemv_exact"


def q2_launches(ops, dw, d_out, chunks=None) -> list[tuple]:
    """``(kernel, grid, block, args)`` of each launch of a ``q2_0_gemv_exact`` call: validated
    as :func:`q2gemv.cuda.q2_0.exact.q2_launches` does, before anything is launched;
    ``chunks`` the ``(row0, rows)`` of each chunk (default: chunks of ``MAX_M`` rows)."""
    operands = exact.checked_operands(ops, dw, d_out, NAME)
    launches = []
    for r0, rows in plan.check_chunks(chunks, ops.m, exact.MAX_M):
        if exact.batched_for(dw.n, dw.k, rows):
            launches.append(exact_batched.one_launch(ops, dw, d_out, r0, rows, operands))
        else:
            launches += exact.unbatched(ops, dw, d_out, [(r0, rows)], operands)
    return launches


def chunk_launches(ops, dw, d_out, rows_of) -> list[tuple]:
    return q2_launches(ops, dw, d_out, rows_of)

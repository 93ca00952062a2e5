"""torch modules and ops over q2gemv's GEMV (needs torch); :mod:`q2gemv.torch` re-exports them."""

"""Bit layouts of the formats q2gemv reads and writes: one module per format."""

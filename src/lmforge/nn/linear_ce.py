"""Moved to ``lmforge.nn.kernels.linear_ce``; this module re-exports its names so that old imports keep working.
(Patch module state, e.g. in a test, there: this one only holds references.)"""

from lmforge.nn.kernels.linear_ce import (
    CHUNK_ROWS,
    IGNORE,
    MIN_CHUNK_ROWS,
    auto_chunk_rows,
    linear_cross_entropy,
)

__all__ = ["CHUNK_ROWS", "IGNORE", "MIN_CHUNK_ROWS", "auto_chunk_rows", "linear_cross_entropy"]

"""Moved to ``lmforge.nn.kernels.tied_embedding``; this module re-exports its names so that old imports keep
working. (Patch module state, e.g. in a test, there: this one only holds references.)"""

from lmforge.nn.kernels.tied_embedding import (
    MAX_WALK,
    _TiedLookup,
    embed_tokens,
    find_tied_lookup,
    hand_over,
    tied_linear,
)

__all__ = ["MAX_WALK", "_TiedLookup", "embed_tokens", "find_tied_lookup", "hand_over", "tied_linear"]

"""Moved to ``lmforge.nn.kernels.packed_dropout`` (the dropout) and ``lmforge.nn.kernels.dropout_attention`` (the
attention with dropout); this module re-exports their names so that old imports keep working. (Patch module state,
e.g. in a test, in those modules: this one only holds references.)"""

from lmforge.nn.kernels.dropout_attention import ATTENTION_CACHE_SHARE, dropout_attention
from lmforge.nn.kernels.packed_dropout import Dropout, dropout, keep_mask, scaled_keep_mask, uses_packed_masks

__all__ = ["ATTENTION_CACHE_SHARE", "Dropout", "dropout", "dropout_attention", "keep_mask", "scaled_keep_mask",
           "uses_packed_masks"]

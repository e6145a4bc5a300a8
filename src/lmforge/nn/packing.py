"""Moved to ``lmforge.nn.kernels.packing``; this module re-exports its names so that old imports keep working."""

from lmforge.nn.kernels.packing import PACK_ABOVE, Packing

__all__ = ["PACK_ABOVE", "Packing"]

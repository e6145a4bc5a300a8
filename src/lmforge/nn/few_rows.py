"""Moved to ``lmforge.nn.kernels.few_rows``; this module re-exports its names so that old imports keep working.
(Patch module state, e.g. the chosen forms in a test, there: this one only holds references.)"""

from lmforge.nn.kernels.few_rows import FORMS, MAX_ROWS, project_rows

__all__ = ["FORMS", "MAX_ROWS", "project_rows"]

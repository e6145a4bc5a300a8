"""Errors a user can cause. The CLI prints them as one line and exits non-zero; library callers catch them."""

from __future__ import annotations


class LmforgeError(ValueError):
    """A problem with user input (a file, an option, a checkpoint). The message names it and the fix."""


class InputFileError(LmforgeError):
    """A file or folder given on the command line or to a loader is missing, empty or malformed."""

"""``python -m lmforge.demo``: the old spelling of ``lmforge demo`` (``make demo``), kept working.

The demo's steps are ``lmforge.recipes.demo``; its options and printing are ``lmforge.commands.demo``.
"""

from __future__ import annotations

import sys

from lmforge.commands.demo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())

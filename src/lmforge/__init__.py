"""lmforge: from attention to transfer learning, with the real algorithms from the papers."""

__version__ = "0.1.0"

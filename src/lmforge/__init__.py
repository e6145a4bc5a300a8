"""lmforge: from attention to transfer learning, with the real algorithms from the papers."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # ``lmforge.pipeline`` without importing torch when only the version or the CLI is needed
    if name == "pipeline":
        from lmforge.pipelines import pipeline

        return pipeline
    raise AttributeError(f"module 'lmforge' has no attribute {name!r}")

"""lmforge: from attention to transfer learning, with the real algorithms from the papers.

The package root only names the entry points, imported on first use (so that ``lmforge --help`` and
``lmforge.__version__`` need no PyTorch): ``lmforge.pipeline`` (``lmforge.pipelines``) and the model folders'
``lmforge.from_pretrained`` / ``load_pretrained`` / ``save_pretrained`` / ``load_backbone``
(``lmforge.persistence``).
"""

__version__ = "0.1.0"

_PERSISTENCE = ("from_pretrained", "load_pretrained", "save_pretrained", "load_backbone")


def __getattr__(name: str):
    if name == "pipeline":
        from lmforge.pipelines import pipeline

        return pipeline
    if name in _PERSISTENCE:
        import lmforge.persistence

        return getattr(lmforge.persistence, name)
    raise AttributeError(f"module 'lmforge' has no attribute {name!r}")

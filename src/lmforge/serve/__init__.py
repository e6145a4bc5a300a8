"""``lmforge serve``: a model folder behind JSON endpoints (FastAPI + uvicorn), with dynamic micro-batching.

    from lmforge.serve import create_app
    app = create_app("runs/sst2", max_batch=32, max_length=512)   # then: uvicorn.run(app, port=8000)

FastAPI and uvicorn are optional (``pip install 'lmforge[serve]'``): importing this package does not import them;
``create_app`` does. ``app.py`` holds the app and the model wrapper, ``schemas.py`` the request/response bodies and
the limits, ``batcher.py`` the micro-batcher, ``loadgen.py`` a load generator for the tests and the benchmark.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from lmforge.errors import LmforgeError

__all__ = ["create_app", "require_serving"]

SERVING_PACKAGES = ("fastapi", "uvicorn")


def require_serving(packages: tuple[str, ...] = SERVING_PACKAGES) -> None:
    """Raise ``LmforgeError`` naming the install command when FastAPI or uvicorn is missing."""
    missing = []
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules, a broken install
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise LmforgeError(f"lmforge serve needs {' and '.join(missing)} (not installed here): "
                           "pip install 'lmforge[serve]'")


def create_app(model_dir: Any, **options: Any) -> Any:
    """A FastAPI app serving ``model_dir``; see ``lmforge.serve.app.create_app`` for the options."""
    require_serving(("fastapi",))
    from lmforge.serve.app import create_app as build

    return build(model_dir, **options)

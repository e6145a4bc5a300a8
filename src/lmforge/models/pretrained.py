"""Deprecated: model folders moved out of ``lmforge.models`` (which builds models and knows no heads).

- ``lmforge.persistence``: ``load_pretrained``, ``from_pretrained``, ``load_backbone``, ``save_pretrained``,
  ``read_config`` (any folder, heads and tasks included); also ``lmforge.from_pretrained`` etc.
- ``lmforge.utils.model_folder``: the folder format (``CONFIG_NAME``, ``WEIGHTS_NAME``, ``dedupe_tied``,
  ``read_weights``, ``read_safetensors_header``, ``load_state``, ``check_fits``, ``Loaded``).
- ``lmforge.models.loading``: ``build_backbone``, ``check_memory``; ``lmforge.heads.build_model``.

Every name still resolves here for one release, with a ``DeprecationWarning`` naming its new place. The names of the
persistence layer resolve through the package root (``lmforge.persistence`` is above this package, which must not
import it).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_BASE = ("CONFIG_NAME", "WEIGHTS_NAME", "FORMAT_VERSION", "Loaded", "dedupe_tied", "read_weights",
         "read_safetensors_header", "load_state", "check_fits")
_MODELS = ("build_backbone", "check_memory")
_ROOT = ("load_pretrained", "from_pretrained", "load_backbone", "save_pretrained")


def __getattr__(name: str) -> Any:
    if name in _BASE:
        where, module = "lmforge.utils.model_folder", importlib.import_module("lmforge.utils.model_folder")
    elif name in _MODELS:
        where, module = "lmforge.models.loading", importlib.import_module("lmforge.models.loading")
    elif name in _ROOT:
        import lmforge

        where, module = "lmforge.persistence", lmforge
    else:
        raise AttributeError(f"module 'lmforge.models.pretrained' has no attribute {name!r} (it moved: see "
                             "lmforge.persistence, lmforge.utils.model_folder and lmforge.models.loading)")
    warnings.warn(f"lmforge.models.pretrained.{name} moved to {where}.{name}; the old name goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return getattr(module, name)

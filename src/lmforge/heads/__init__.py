"""Small task heads over a backbone's hidden states; each owns its loss. ``TaskModel`` composes them.

``build_head(spec, config, backbone)`` rebuilds a head from the description stored in a checkpoint's
``config.json`` (``{"type": name, **options}``).
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError
from lmforge.heads.base import TaskModel

# head type -> (module, builder function name); builders take (config, backbone, **options)
_BUILDERS = {
    "pretraining": ("lmforge.heads.pretraining", "build_pretraining_head"),
    "mlm": ("lmforge.heads.pretraining", "build_mlm_head"),
    "span": ("lmforge.heads.pretraining", "build_span_head"),
}


def build_head(spec: dict[str, Any], config: ModelConfig, backbone: nn.Module) -> nn.Module:
    options = dict(spec)
    kind = options.pop("type", None)
    if kind not in _BUILDERS:
        raise LmforgeError(f"unknown head type {kind!r}; choose one of {', '.join(_BUILDERS)}")
    module, name = _BUILDERS[kind]
    head = getattr(importlib.import_module(module), name)(config, backbone, **options)
    head.head_config = {"type": kind, **options}
    return head


__all__ = ["TaskModel", "build_head"]

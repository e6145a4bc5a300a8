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
    "sequence_classification": ("lmforge.heads.classification", "build_sequence_head"),
    "token_classification": ("lmforge.heads.token", "build_token_head"),
    "span_classification": ("lmforge.heads.span", "build_span_head"),
    "qa": ("lmforge.heads.qa", "build_qa_head"),
}
# a head spec may carry the fine-tuning task's settings under this key (how to read and featurize inputs); it is
# kept in ``head.head_config`` (so saved in config.json) but not passed to the builder
TASK_KEY = "task"


def build_head(spec: dict[str, Any], config: ModelConfig, backbone: nn.Module) -> nn.Module:
    options = dict(spec)
    kind = options.pop("type", None)
    task = options.pop(TASK_KEY, None)
    if kind not in _BUILDERS:
        raise LmforgeError(f"unknown head type {kind!r}; choose one of {', '.join(_BUILDERS)}")
    module, name = _BUILDERS[kind]
    head = getattr(importlib.import_module(module), name)(config, backbone, **options)
    head.head_config = {"type": kind, **options, **({TASK_KEY: task} if task is not None else {})}
    return head


__all__ = ["TASK_KEY", "TaskModel", "build_head"]

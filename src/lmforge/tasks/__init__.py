"""Fine-tuning tasks: reading, featurizing, decoding and scoring for each head (see ``lmforge.tasks.base``)."""

from __future__ import annotations

import importlib
from typing import Any

from lmforge.config import TaskConfig
from lmforge.errors import LmforgeError
from lmforge.tasks.base import FeatureData, Task, TaskObjective

# task name -> (module, class)
_TASKS = {
    "sequence": ("lmforge.tasks.sequence", "SequenceTask"),
    "pair": ("lmforge.tasks.sequence", "SequenceTask"),
    "token": ("lmforge.tasks.token", "TokenTask"),
    "span": ("lmforge.tasks.span", "SpanTask"),
    "qa": ("lmforge.tasks.qa", "QATask"),
    "choice": ("lmforge.tasks.choice", "ChoiceTask"),
}


def _task_class(name: str) -> type[Task]:
    if name not in _TASKS:
        raise LmforgeError(f"unknown task {name!r}; choose one of {', '.join(_TASKS)}")
    module, cls = _TASKS[name]
    return getattr(importlib.import_module(module), cls)


def make_task(config: TaskConfig) -> Task:
    """A new task (labels not fitted yet)."""
    return _task_class(config.task)(config)


def task_from_head_spec(spec: dict[str, Any]) -> Task:
    """The task of a fine-tuned model, from its head description (config.json ``head``)."""
    name = (spec.get("task") or {}).get("task", "sequence")
    return _task_class(name).from_head_spec(spec)


__all__ = ["FeatureData", "Task", "TaskObjective", "make_task", "task_from_head_spec"]

"""Small task heads over a backbone's hidden states; each owns its loss. ``TaskModel`` composes them.

``build_head(spec, config, backbone)`` rebuilds a head from the description stored in a checkpoint's
``config.json`` (``{"type": name, **options}``).
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable
from typing import Any

from torch import nn

from lmforge.config import ModelConfig, coerce
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
    "multiple_choice": ("lmforge.heads.choice", "build_choice_head"),
    # ELECTRA (Clark et al. 2020): generator + discriminator heads for pretraining; the discriminator's head alone
    "electra": ("lmforge.heads.electra", "build_electra_head"),
    "rtd": ("lmforge.heads.electra", "build_rtd_head"),
}
# a head spec may carry the fine-tuning task's settings under this key (how to read and featurize inputs); it is
# kept in ``head.head_config`` (so saved in config.json) but not passed to the builder
TASK_KEY = "task"


def build_head(spec: dict[str, Any], config: ModelConfig, backbone: nn.Module) -> nn.Module:
    """The head that ``spec`` (``{"type": name, **options}``) describes, over ``backbone``.

    Raises:
        LmforgeError: the spec is malformed (see ``check_head_spec``) or the head rejects its options.
    """
    options = check_head_spec(spec)
    kind, task = spec["type"], spec.get(TASK_KEY)
    head = _builder(kind)(config, backbone, **options)
    head.head_config = {"type": kind, **options, **({TASK_KEY: task} if task is not None else {})}
    return head


def check_head_spec(spec: Any, where: str = "head") -> dict[str, Any]:
    """Check a head description against its builder's signature; return the builder's options, typed.

    Every option must be a keyword of the head type's builder (whose annotations give the types), the builder's
    required options (e.g. ``labels``) must be there, and a ``task`` table must be valid task settings for a task
    that uses this head type. Checking here, not in the builder call, turns a hand-edited ``config.json`` into one
    clear line instead of a TypeError deep in fine-tuning, evaluation or serving.

    Raises:
        LmforgeError: naming ``where``, the offending key and what is valid.
    """
    if not isinstance(spec, dict):
        raise LmforgeError(f"{where}: expected an object such as {{\"type\": \"qa\"}}, got {spec!r:.80}")
    options = {k: v for k, v in spec.items() if k not in ("type", TASK_KEY)}
    kind = spec.get("type")
    if not isinstance(kind, str) or kind not in _BUILDERS:
        raise LmforgeError(f"{where}: unknown head type {kind!r:.80}; choose one of {', '.join(_BUILDERS)}")
    builder = _builder(kind)
    params = list(inspect.signature(builder).parameters.values())[2:]  # after (config, backbone)
    valid = [p.name for p in params]
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise LmforgeError(f"{where}: unknown option(s) {', '.join(map(repr, unknown))} of a {kind!r} head; valid "
                           f"options are {', '.join(valid) or 'none'}")
    missing = [p.name for p in params if p.default is p.empty and p.name not in options]
    if missing:
        raise LmforgeError(f"{where}: a {kind!r} head needs {', '.join(map(repr, missing))}"
                           + (" (the label names, in id order)" if "labels" in missing else ""))
    hints = typing.get_type_hints(builder)
    typed = {k: coerce(v, hints[k], f"{where}.{k}") for k, v in options.items()}
    # nn.Dropout's own complaint is a bare ValueError
    if typed.get("dropout") is not None and not 0.0 <= typed["dropout"] < 1.0:
        raise LmforgeError(f"{where}.dropout: {typed['dropout']} must be in [0, 1)")
    return typed  # the task settings saved beside the head are checked where tasks are known (persistence)


def build_model(config: ModelConfig, head: dict[str, Any] | None) -> nn.Module:
    """The module a model folder describes: the backbone of ``config``, under the head ``head`` describes (a
    ``TaskModel``) unless ``head`` is None. The ``build`` that ``lmforge.models.loading.load_folder`` takes."""
    from lmforge.models.loading import build_backbone

    backbone = build_backbone(config)
    if head is None:
        return backbone
    return TaskModel(backbone, build_head(head, config, backbone))


def _builder(kind: str) -> Callable[..., nn.Module]:
    module, name = _BUILDERS[kind]
    return getattr(importlib.import_module(module), name)


__all__ = ["TASK_KEY", "TaskModel", "build_head", "build_model", "check_head_spec"]

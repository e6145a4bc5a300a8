"""Losses that need a model and a batch (each follows the contract of ``lmforge.objectives.base``), and the registry
of pretraining objectives (``lmforge.objectives.registry``). Imports are lazy, so that reading the registry (the
command line does, for ``--objective``) does not import PyTorch."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "ObjectiveOutput": "lmforge.objectives.base",
    "CausalLMObjective": "lmforge.objectives.causal_lm",
    "AWDLMObjective": "lmforge.objectives.awd_lm",
    "MaskedLMObjective": "lmforge.objectives.masked_lm",
    "Seq2SeqObjective": "lmforge.objectives.seq2seq",
    "ElectraObjective": "lmforge.objectives.electra",
    "DenoisingObjective": "lmforge.objectives.denoise",
    "OBJECTIVES": "lmforge.objectives.registry",
    "PretrainingObjective": "lmforge.objectives.registry",
    "get_objective": "lmforge.objectives.registry",
    "register_objective": "lmforge.objectives.registry",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'lmforge.objectives' has no attribute {name!r}")


__all__ = list(_WHERE)

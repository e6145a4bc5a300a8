"""Causal language modelling (GPT): predict each next token; batches hold ``input_ids``, ``labels`` (the next
tokens, -100 at padding) and ``attention_mask``. The loss is the mean cross-entropy over predicted tokens.

A model that exposes its output projection (``output_weight``, as ``Decoder``) and can skip it
(``return_logits=False``) is scored by ``lmforge.nn.linear_ce``: the projection, the loss, the accuracy and the
projection's gradient in one pass over row chunks, so the (B, T, V) logits are never held. Any other model is
scored from its logits (the same numbers to fp32 round-off)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.nn.linear_ce import linear_cross_entropy
from lmforge.objectives.base import ObjectiveOutput, unwrapped

IGNORE = -100


class CausalLMObjective:
    """Args: fused: score with ``linear_cross_entropy`` when the model allows it (False: always from logits)."""

    def __init__(self, fused: bool = True) -> None:
        self.fused = fused

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"lm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        labels = batch["labels"]  # (B, T)
        valid = labels != IGNORE
        n = int(valid.sum())
        weight = getattr(unwrapped(model), "output_weight", None) if self.fused else None
        if isinstance(weight, Tensor):
            out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"), return_logits=False)
            hidden = out.last_hidden_state  # (B, T, D)
            loss, correct = linear_cross_entropy(hidden.flatten(0, 1), weight, labels.flatten(),
                                                 ignore_index=IGNORE)
            return ObjectiveOutput({"lm": (loss, n)}, {"lm_accuracy": (correct, n)})
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"))
        logits = out.logits  # (B, T, V)
        # ignore_index instead of gathering the valid rows: a gather would copy the whole (N, V) logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        correct = ((logits.detach().argmax(-1) == labels) & valid).sum()
        return ObjectiveOutput({"lm": (loss, n)}, {"lm_accuracy": (correct, n)})

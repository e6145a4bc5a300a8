"""Causal language modelling (GPT): predict each next token; batches hold ``input_ids``, ``labels`` (the next
tokens, -100 at padding) and ``attention_mask``. The loss is the mean cross-entropy over predicted tokens."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput

IGNORE = -100


class CausalLMObjective:
    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"lm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"))
        labels = batch["labels"]
        valid = labels != IGNORE  # (B, T)
        logits = out.logits[valid].float()  # (N, V)
        targets = labels[valid]  # (N,)
        loss = F.cross_entropy(logits, targets, reduction="sum")
        correct = (logits.argmax(-1) == targets).sum()
        n = targets.numel()
        return ObjectiveOutput({"lm": (loss, n)}, {"lm_accuracy": (correct, n)})

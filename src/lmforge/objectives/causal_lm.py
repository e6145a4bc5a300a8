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
        labels = batch["labels"]  # (B, T)
        logits = out.logits  # (B, T, V)
        # ignore_index instead of gathering the valid rows: a gather would copy the whole (N, V) logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="sum")
        valid = labels != IGNORE
        correct = ((logits.detach().argmax(-1) == labels) & valid).sum()
        n = int(valid.sum())
        return ObjectiveOutput({"lm": (loss, n)}, {"lm_accuracy": (correct, n)})

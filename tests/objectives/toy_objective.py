"""A toy pretraining objective, added the way the registry promises: this one file, with one registry entry.

Masked LM with label smoothing (Szegedy et al. 2016): the target distribution puts ``1 - eps`` on the original token
and spreads ``eps`` over the vocabulary. It cuts single contiguous segments (SpanBERT's plan) and masks by the run's
``data.masking``.
"""

from __future__ import annotations

import torch.nn.functional as F

from lmforge.objectives.base import ObjectiveOutput
from lmforge.objectives.registry import PretrainingObjective, register_objective

NAME = "toy-smoothed-mlm"
IGNORE = -100


class SmoothedMaskedLM:
    """``objective(model, batch)`` under the contract of ``lmforge.objectives.base``: one loss term."""

    def __init__(self, smoothing: float = 0.1) -> None:
        self.smoothing = smoothing

    def counts(self, batch):
        return {"smooth_mlm": int((batch["mlm_labels"] != IGNORE).sum())}

    def __call__(self, model, batch) -> ObjectiveOutput:
        selected = batch["mlm_labels"] != IGNORE
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                    token_type_ids=batch.get("token_type_ids"), masked_positions=selected)
        targets = batch["mlm_labels"][selected]
        logits = out.mlm_logits.float()
        loss = F.cross_entropy(logits, targets, reduction="sum", label_smoothing=self.smoothing)
        correct = (logits.argmax(-1) == targets).sum()
        return ObjectiveOutput({"smooth_mlm": (loss, targets.numel())},
                               {"smooth_mlm_accuracy": (correct, targets.numel())})


TOY = PretrainingObjective(NAME, "toy: masked LM with label smoothing", arch="encoder", plan="segments",
                           head={"type": "mlm"}, loss=lambda data: SmoothedMaskedLM())


def register() -> PretrainingObjective:
    return register_objective(TOY)

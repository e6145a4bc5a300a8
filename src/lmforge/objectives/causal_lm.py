"""Causal language modelling (GPT): predict each next token; batches hold ``input_ids``, ``labels`` (the next
tokens, -100 at padding) and ``attention_mask``. The loss is the mean cross-entropy over predicted tokens.

A model that exposes its output projection (``output_weight``, as ``Decoder``) and can skip it
(``return_logits=False``) is scored by ``lmforge.nn.kernels.linear_ce``: the projection, the loss, the accuracy and the
projection's gradient in one pass over row chunks, so the (B, T, V) logits are never held. Any other model is
scored from its logits (the same numbers to fp32 round-off)."""

from __future__ import annotations

from torch import Tensor, nn

from lmforge.heads.base import next_token_cross_entropy
from lmforge.objectives.base import ObjectiveOutput, unwrapped

IGNORE = -100


class CausalLMObjective:
    """Args: fused: score from the final states (``lmforge.nn.kernels.linear_ce``) when the model allows it (False:
    always from logits). Both go through ``lmforge.heads.base.next_token_cross_entropy``."""

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
            loss, correct = next_token_cross_entropy(labels, hidden=hidden, weight=weight, ignore_index=IGNORE)
        else:
            out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"))
            loss, correct = next_token_cross_entropy(labels, logits=out.logits, ignore_index=IGNORE,
                                                     accuracy=True)  # logits (B, T, V)
        return ObjectiveOutput({"lm": (loss, n)}, {"lm_accuracy": (correct, n)})

"""Permutation language modelling (XLNet, Yang et al. 2019): predict the target tokens of a random factorisation
order, each from the tokens before it in the order, with the query stream of two-stream attention.

Batches follow plan ``"plm"`` of ``lmforge.data.pretraining``: ``input_ids``, ``attention_mask``, ``token_type_ids``,
``perm_mask`` (B, T, T) (the query stream's mask, True = may not see), ``target_mapping`` (B, N, T),
``target_mask`` (B, N) and ``labels`` (B, N) (-100 on padding rows).

The model runs once on the whole batch (``model(input_ids, attention_mask=..., perm_mask=..., target_mapping=...,
return_logits="query", logits_rows=...)``): the query stream's states of the real prediction rows go through the
model's LM head (tied, or its own with tie_embeddings=false) inside its forward, so the vocabulary projection runs
only where something is predicted, and
under DistributedDataParallel the LM head takes part in the wrapped forward (several processes train as one).

One loss term ``plm``: the cross-entropy summed over the real targets (item count = their number; the Trainer
divides by the count over the whole step); metric ``plm_accuracy`` (argmax = label). With the identity order and
every token a target the loss is a causal LM's: token t predicted from the tokens before it (tested in
``tests/objectives/test_plm.py``).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lmforge.objectives.base import ObjectiveOutput
from lmforge.objectives.masked_lm import constant_guess_hits

IGNORE = -100


class PLMObjective:
    """``objective(model, batch)`` for an ``XLNet`` on plan ``"plm"`` batches (see the module docstring)."""

    # the Trainer logs this term's summed item count (the predicted tokens) as ``predicted_tokens``
    predicted_tokens_term = "plm"

    def counts(self, batch: dict[str, Tensor]) -> dict[str, int]:
        return {"plm": int((batch["labels"] != IGNORE).sum())}

    def __call__(self, model: nn.Module, batch: dict[str, Tensor]) -> ObjectiveOutput:
        labels = batch["labels"]  # (B, N)
        real = labels != IGNORE  # the real prediction rows (target_mask, from the labels so that counts agree)
        out = model(batch["input_ids"], attention_mask=batch.get("attention_mask"),
                    token_type_ids=batch.get("token_type_ids"), perm_mask=batch["perm_mask"],
                    target_mapping=batch["target_mapping"], return_logits="query", logits_rows=real)
        targets = labels[real]  # (n,)
        logits = out.logits.float()  # (n, V), in row-major order of ``real``; fp32 even under bf16
        loss = F.cross_entropy(logits, targets, reduction="sum")
        correct = (logits.detach().argmax(-1) == targets).sum()
        n = targets.numel()
        # the accuracy beside its plateau, the best constant guess (lmforge.recipes.pretrain.plateau_warning)
        return ObjectiveOutput({"plm": (loss, n)}, {"plm_accuracy": (correct, n),
                                                    "plm_constant_accuracy": (constant_guess_hits(targets), n)})
